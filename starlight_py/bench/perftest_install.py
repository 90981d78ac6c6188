"""RabbitMQ PerfTest (the Java load generator), fetched once through Maven and cached.

Theory of operation, as for Pulsar's distribution in ``starlight_py.local.distribution``:
Maven resolves ``com.rabbitmq:perf-test`` and its dependencies from Maven Central (so users'
mirrors, proxies and ``~/.m2`` cache apply) with ``dependency:copy-dependencies`` on a
throwaway pom, into a temporary folder next to the cache entry; one rename publishes it as
``perftest-<version>/lib/*.jar``. A marker file inside says the copy was complete; a folder
without it is redone. A file lock serialises processes that fetch at the same time, and
whoever waited re-checks the marker first. About 8 MB in 25 jars.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from starlight_py.local import LocalInfraError, default_cache_dir, find_java
from starlight_py.local.distribution import exclusive_lock, make_cache_dir, run_maven

PERFTEST_VERSION = "2.22.1"
PERFTEST_MAIN_CLASS = "com.rabbitmq.perf.PerfTest"
_MARKER = ".starlight-fetch-complete"

Log = Callable[[str], None]

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.starlight-py</groupId>
  <artifactId>perftest-fetch</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>com.rabbitmq</groupId>
      <artifactId>perf-test</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""


def ensure_perftest(
    cache_dir: Path | None = None, version: str = PERFTEST_VERSION, log: Log = print
) -> Path:
    """Return the ``perftest-<version>`` folder (its ``lib/`` holds every jar), fetching it
    the first time; ``log`` receives progress lines and Maven's own.

    Raises:
        LocalInfraError: java or ``mvn`` is missing, Maven fails, or the cache folder is
            not writable.
    """
    find_java()  # PerfTest is useless without it, and Maven needs it too
    root = cache_dir if cache_dir is not None else default_cache_dir()
    target = root / f"perftest-{version}"
    if (target / _MARKER).is_file():
        return target
    make_cache_dir(root)
    with exclusive_lock(root / f".perftest-{version}.lock", f"PerfTest {version}", log):
        if not (target / _MARKER).is_file():  # another process may have done it meanwhile
            _fetch_and_publish(root, target, version, log)
    return target


def perftest_command(home: Path, java: str) -> list[str]:
    """The command line that runs PerfTest from ``home``, before its own arguments."""
    return [java, "-cp", str(home / "lib" / "*"), PERFTEST_MAIN_CLASS]


def _fetch_and_publish(root: Path, target: Path, version: str, log: Log) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LocalInfraError(
            f"`mvn` (Apache Maven) was not found on PATH; it is needed once to fetch RabbitMQ "
            f"PerfTest {version} from Maven Central. Install it (e.g. `sudo apt-get install "
            "maven`), or run the Python clients instead: --clients python"
        )
    # We hold the lock, so a fetch folder left here is from an interrupted run.
    for leftover in root.glob(f".fetch-perftest-{version}-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    log(
        f"Fetching RabbitMQ PerfTest {version} (com.rabbitmq:perf-test and its dependencies, "
        f"about 8 MB) with Maven into {target}. This happens once; later runs reuse it."
    )
    work = Path(tempfile.mkdtemp(prefix=f".fetch-perftest-{version}-", dir=root))
    try:
        (work / "pom.xml").write_text(_POM.format(version=version))
        staged = work / f"perftest-{version}"
        _maven_copy_dependencies(mvn, work, staged / "lib", log)
        jars = sorted(p.name for p in (staged / "lib").glob("*.jar"))
        if f"perf-test-{version}.jar" not in jars:
            raise LocalInfraError(
                f"Maven reported success but perf-test-{version}.jar is not among the "
                f"{len(jars)} jars it copied to {staged / 'lib'}"
            )
        (staged / _MARKER).write_text("\n".join(jars) + "\n")
        if target.exists():  # no marker: a half-finished copy of some older run
            shutil.rmtree(target)
        os.rename(staged, target)
        log(f"PerfTest {version} is ready in {target} ({len(jars)} jars)")
    except OSError as e:
        raise LocalInfraError(f"could not write PerfTest {version} into {root}: {e}") from e
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _maven_copy_dependencies(mvn: str, work: Path, lib: Path, log: Log) -> None:
    # -B: no progress bars or colours, but not -q: a first fetch shows its downloads.
    run_maven(
        [
            mvn,
            "-B",
            "-f",
            str(work / "pom.xml"),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={lib}",
            "-DincludeScope=runtime",
        ],
        work,
        "com.rabbitmq:perf-test",
        lambda line: log(f"  mvn: {line}"),
        lambda line: any(word in line for word in ("Download", "ERROR", "BUILD")),
    )
