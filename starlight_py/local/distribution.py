"""The Apache Pulsar binary distribution, fetched once through Maven and cached.

Theory of operation: the ``bin`` tar.gz attached to
``org.apache.pulsar:pulsar-server-distribution`` on Maven Central holds everything both of
our servers need: Pulsar's ``lib/`` (which also carries ZooKeeper's jars) and its ``conf/``.
Maven fetches it (so users' mirrors, proxies and ``~/.m2`` cache apply), Python's tarfile
extracts it into a temporary folder next to the cache entry, and one rename publishes it.
A marker file inside the published folder says the extract was complete; a folder without
it is redone. A file lock serialises processes that fetch at the same time (parallel test
runs, a CI warm-up racing a test), and whoever waited re-checks the marker before doing any
work.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from starlight_py.local.download_progress import (
    DownloadProgress,
    artifact_folder,
    maven_local_repository,
)
from starlight_py.local.errors import LocalInfraError

PULSAR_VERSION = "4.0.8"
"""Newest 4.0.x LTS release on Maven Central when this was written."""

MIN_JAVA_MAJOR = 17
"""Pulsar 4.0 runs on Java 17 or newer."""

_ARTIFACT = "org.apache.pulsar:pulsar-server-distribution"
_SIZE_HINT = "about 250 MB"
_EXPECTED_BYTES = 245 * 1024 * 1024
_MARKER = ".starlight-extract-complete"
_MAVEN_TAIL_LINES = 15
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_INSTALL_JAVA_HINT = (
    "install OpenJDK 17 or newer (e.g. `sudo apt-get install openjdk-17-jre-headless`) "
    "and make sure `java` is on PATH (or JAVA_HOME points at it)"
)

Log = Callable[[str], None]


def log_to_stderr(line: str) -> None:
    """Print one progress line to stderr, flushed so it interleaves with Maven's output."""
    print(line, file=sys.stderr, flush=True)


def default_cache_dir() -> Path:
    """Where downloads are kept between runs.

    ``$STARLIGHT_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/starlight-py``, else
    ``~/.cache/starlight-py``. Raises nothing; the folder may not exist yet.
    """
    explicit = os.environ.get("STARLIGHT_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "starlight-py"
    return Path.home() / ".cache" / "starlight-py"


def find_java() -> str:
    """Return the ``java`` executable to run Pulsar and ZooKeeper with.

    ``$JAVA_HOME/bin/java`` when that exists, else ``java`` from PATH.

    Raises:
        LocalInfraError: no java found, it does not run, or it is older than Java 17.
    """
    java = _locate_java()
    _check_java_version(java)
    return java


def _locate_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    on_path = shutil.which("java")
    if on_path is None:
        raise LocalInfraError(
            "`java` was not found on PATH. Pulsar and ZooKeeper run on the JVM: "
            f"{_INSTALL_JAVA_HINT}."
        )
    return on_path


# Starting a JVM just to read its version costs ~100 ms; servers are started many times
# per test session with the same java.
@functools.cache
def _check_java_version(java: str) -> None:
    try:
        result = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LocalInfraError(f"could not run `{java} -version` ({e}); {_INSTALL_JAVA_HINT}") from e
    # `java -version` writes to stderr; some wrappers write to stdout.
    output = result.stderr + result.stdout
    if result.returncode != 0:
        raise LocalInfraError(
            f"`{java} -version` failed with exit code {result.returncode}: "
            f"{output.strip()[:500]}; {_INSTALL_JAVA_HINT}"
        )
    major = java_major_version(output)
    # An unknown format (an exotic vendor) is given the benefit of the doubt: if it is too
    # old, the JVM's own class-version error in the server log will say so.
    if major is not None and major < MIN_JAVA_MAJOR:
        raise LocalInfraError(
            f"{java} is Java {major}, but Pulsar needs Java {MIN_JAVA_MAJOR} or newer; "
            f"{_INSTALL_JAVA_HINT}"
        )


def java_major_version(version_output: str) -> int | None:
    """Major Java version from ``java -version`` output (``"1.8.0_381"`` is 8), or None.

    Raises nothing.
    """
    match = re.search(r'version "([^"]+)"', version_output)
    if match is None:
        return None
    parts = re.split(r"[._+-]", match.group(1))
    try:
        first = int(parts[0])
        # Before Java 9 the version read "1.<major>".
        return int(parts[1]) if first == 1 and len(parts) > 1 else first
    except ValueError:
        return None


def ensure_pulsar_distribution(
    cache_dir: Path | None = None,
    version: str = PULSAR_VERSION,
    log: Log = log_to_stderr,
) -> Path:
    """Return the extracted ``apache-pulsar-<version>`` folder, fetching it the first time.

    Later calls (from any process) reuse the cache under ``cache_dir`` (default:
    :func:`default_cache_dir`). The first call prints what it fetches through ``log`` and
    lets Maven's own download lines show.

    Raises:
        LocalInfraError: java is missing or older than 17, ``mvn`` is missing or fails, the
            cache folder is not writable, or the archive is corrupt.
    """
    # Checked first even when the cache is warm: the distribution is useless without java,
    # and Maven needs it too.
    find_java()
    root = cache_dir if cache_dir is not None else default_cache_dir()
    target = root / f"apache-pulsar-{version}"
    if (target / _MARKER).is_file():
        return target
    make_cache_dir(root)
    with exclusive_lock(root / f".pulsar-{version}.lock", f"Pulsar {version}", log):
        # Another process may have finished the job while we waited for the lock.
        if not (target / _MARKER).is_file():
            _fetch_and_publish(root, target, version, log)
    return target


def make_cache_dir(root: Path) -> None:
    """Create the cache folder; raises LocalInfraError when it cannot."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LocalInfraError(
            f"cannot create the cache folder {root}: {e.strerror}; "
            "set STARLIGHT_CACHE_DIR to a writable folder"
        ) from e


@contextlib.contextmanager
def exclusive_lock(path: Path, what: str, log: Log) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) while fetching `what` into its
    folder; another process fetching the same waits, and says so. Raises LocalInfraError
    when the lock file cannot be created."""
    try:
        handle = path.open("a")
    except OSError as e:
        raise LocalInfraError(f"cannot create the lock file {path}: {e.strerror}") from e
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another process that is fetching {what} into {path.parent}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch_and_publish(root: Path, target: Path, version: str, log: Log) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LocalInfraError(
            f"`mvn` (Apache Maven) was not found on PATH; it is needed once to fetch Pulsar "
            f"{version} from Maven Central. Install it (e.g. `sudo apt-get install maven`), "
            "or point STARLIGHT_PULSAR_URL, STARLIGHT_PULSAR_WEB_URL and STARLIGHT_ZOOKEEPER "
            "at servers you already run."
        )
    # We hold the lock, so any fetch folder left here is from a run that was interrupted.
    for leftover in root.glob(f".fetch-pulsar-{version}-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    coordinates = f"{_ARTIFACT}:{version}:tar.gz:bin"
    log(
        f"Fetching Apache Pulsar {version} ({coordinates}, {_SIZE_HINT}) with Maven from "
        f"Maven Central (or your configured mirror) into {root}. This happens once; later "
        "runs reuse it."
    )
    work = Path(tempfile.mkdtemp(prefix=f".fetch-pulsar-{version}-", dir=root))
    try:
        tarball = _maven_copy(mvn, coordinates, work, log)
        log(f"Extracting {tarball.name} ...")
        started = time.monotonic()
        extracted = _extract(tarball, work / "extract", f"apache-pulsar-{version}")
        (extracted / _MARKER).write_text(f"{coordinates}\n")
        # A folder without the marker is a half-finished extract from some older or foreign
        # run; ours are complete before they get this name.
        if target.exists():
            shutil.rmtree(target)
        os.rename(extracted, target)
        elapsed = time.monotonic() - started
        log(f"Pulsar {version} is ready in {target} (extracted in {elapsed:.0f} s)")
    except OSError as e:
        raise LocalInfraError(
            f"could not write Pulsar {version} into {root}: {e}; check free disk space "
            "(about 300 MB are needed) or set STARLIGHT_CACHE_DIR to another folder"
        ) from e
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _maven_copy(mvn: str, coordinates: str, work: Path, log: Log) -> Path:
    download = work / "download"
    # -B: no progress bars or colours. Maven's own lines (one per plugin file, hundreds)
    # are not shown, only its warnings and errors (and its last lines if it fails); one
    # progress line follows the 250 MB file instead.
    repository = maven_local_repository(os.environ, Path.home())
    with DownloadProgress(
        f"Downloading Pulsar ({coordinates})",
        artifact_folder(repository, coordinates),
        _EXPECTED_BYTES,
        log,
    ):
        tail = run_maven(
            [
                mvn,
                "-B",
                "dependency:copy",
                f"-Dartifact={coordinates}",
                f"-DoutputDirectory={download}",
            ],
            work,
            coordinates,
            log,
            shown=lambda line: line.startswith(("[ERROR]", "[WARNING]")),
        )
    tarballs = sorted(download.glob("*.tar.gz"))
    if not tarballs:
        raise LocalInfraError(
            f"Maven reported success but left no .tar.gz in {download}; last lines of its "
            "output:\n" + "\n".join(tail)
        )
    return tarballs[0]


def run_maven(
    command: list[str],
    work: Path,
    what: str,
    log: Log,
    shown: Callable[[str], bool] = lambda line: True,
) -> list[str]:
    """Run Maven in the folder `work` to fetch `what`, passing the lines `shown` accepts to
    `log`; returns the last lines of its output. Raises LocalInfraError when Maven cannot
    run or fails (with those lines and where to look)."""
    tail: deque[str] = deque(maxlen=_MAVEN_TAIL_LINES)
    # cwd is the work folder: run where another pom.xml lives, Maven would build that
    # project's context first.
    try:
        maven = subprocess.Popen(
            command,
            cwd=work,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
    except OSError as e:
        raise LocalInfraError(f"cannot run {command[0]}: {e}") from e
    with maven:
        try:
            assert maven.stdout is not None
            for raw in maven.stdout:
                # Maven 3.8 emits colour resets even in batch mode.
                line = _ANSI_ESCAPE.sub("", raw).rstrip()
                tail.append(line)
                if shown(line):
                    log(line)
            code = maven.wait()
        finally:
            if maven.poll() is None:
                maven.kill()
    if code != 0:
        raise LocalInfraError(
            f"Maven could not fetch {what} (`mvn` exit code {code}). Check that Maven "
            "Central (https://repo.maven.apache.org/maven2) or your mirror is reachable from "
            "this machine (proxies are configured in ~/.m2/settings.xml). Last lines of "
            "Maven's output:\n" + "\n".join(tail)
        )
    return list(tail)


def _extract(tarball: Path, destination: Path, folder_name: str) -> Path:
    try:
        with tarfile.open(tarball, "r:gz") as archive:
            # The "data" filter refuses absolute paths, links out of the tree and device
            # files; it exists from Python 3.11.4 on.
            if hasattr(tarfile, "data_filter"):
                archive.extractall(destination, filter="data")
            else:  # pragma: no cover - Python 3.11.0-3.11.3
                archive.extractall(destination)
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise LocalInfraError(
            f"could not extract {tarball.name}: {e}. The copy in Maven's cache may be "
            "corrupt: delete ~/.m2/repository/org/apache/pulsar/pulsar-server-distribution "
            "and try again"
        ) from e
    extracted = destination / folder_name
    for required in ("lib", "conf/standalone.conf", "conf/log4j2.yaml"):
        if not (extracted / required).exists():
            raise LocalInfraError(
                f"{tarball.name} does not contain {folder_name}/{required}; it is not the "
                "Pulsar binary distribution this launcher expects"
            )
    return extracted


def java_classpath(distribution: Path) -> str:
    """Classpath holding every jar of the distribution (the JVM expands the ``*``).

    Raises nothing.
    """
    return str(distribution / "lib" / "*")


def jvm_logging_options(distribution: Path, log_dir: Path) -> list[str]:
    """JVM options that send Pulsar's log4j2 output to stdout (captured by our log file).

    ``log_dir`` receives any file appender log4j2 insists on creating. Raises nothing.
    """
    return [
        f"-Dlog4j.configurationFile={distribution / 'conf' / 'log4j2.yaml'}",
        "-Dpulsar.log.appender=Console",
        "-Dpulsar.routing.appender.default=Console",
        f"-Dpulsar.log.dir={log_dir}",
        "-Dpulsar.log.immediateFlush=true",
        "-Dlog4j2.is.webapp=false",
    ]
