"""The scale bench's Java load generator (``java/ScaleLoad.java``): fetched, compiled, run.

Theory of operation, as for PerfTest in ``perftest_install``: Maven copies
``com.rabbitmq:amqp-client`` and its dependencies from Maven Central (users' mirrors and
``~/.m2`` apply) into ``scale-load-<version>/lib`` under the bench's cache folder; javac
compiles ``ScaleLoad.java`` next to them into ``classes-<hash of the source>``, so an edited
source is compiled anew and an unchanged one never again. A marker file in each says it is
complete; a file lock serialises processes that fetch at the same time.

The generator prints one ``@scale {json}`` line per event (``ScaleEvent``); ``run_load``
reads them as they come, hands each to the caller (which reads the servers' CPU at the
edges of the idle and traffic windows) and returns them all.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlight_py.bench.infra import BenchError
from starlight_py.bench.watched_process import WatchedProcess
from starlight_py.local import LocalInfraError, default_cache_dir, find_java
from starlight_py.local.distribution import exclusive_lock, make_cache_dir, run_maven

AMQP_CLIENT_VERSION = "5.22.0"
MAIN_CLASS = "ScaleLoad"
SOURCE = Path(__file__).parent / "java" / f"{MAIN_CLASS}.java"
EVENT_PREFIX = "@scale "
_MARKER = ".starlight-fetch-complete"
# The JVM's heap: 10,000 channels and their consumers need far less; a bound keeps a
# runaway generator from taking the machine's memory from the servers.
_JVM_OPTIONS = ("-Xms256m", "-Xmx1g", "-XX:+UseSerialGC")

Log = Callable[[str], None]

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.starlight-py</groupId>
  <artifactId>scale-load-fetch</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>com.rabbitmq</groupId>
      <artifactId>amqp-client</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""


@dataclass(frozen=True)
class ScaleEvent:
    """One ``@scale`` line: its event name, its fields, and when we read it (monotonic)."""

    name: str
    fields: dict[str, Any]
    at: float

    def number(self, key: str) -> float | None:
        value = self.fields.get(key)
        return float(value) if isinstance(value, int | float) else None


def parse_event(line: str, at: float = 0.0) -> ScaleEvent | None:
    """The event on a line the generator printed, or None for any other line (the Java
    client's own warnings, a half-written line)."""
    text = line.strip()
    if not text.startswith(EVENT_PREFIX):
        return None
    try:
        fields = json.loads(text[len(EVENT_PREFIX) :])
    except ValueError:
        return None
    if not isinstance(fields, dict) or not isinstance(fields.get("event"), str):
        return None
    return ScaleEvent(str(fields.pop("event")), fields, at)


def generator_arguments(settings: Mapping[str, object]) -> list[str]:
    """``key=value`` arguments, in a stable order; floats that are whole print as ints."""
    arguments = []
    for key in sorted(settings):
        value = settings[key]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        arguments.append(f"{key}={value}")
    return arguments


# --- fetching and compiling ---------------------------------------------------------------


def source_digest(source: Path = SOURCE) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()[:12]


def ensure_load_generator(
    cache_dir: Path | None = None, version: str = AMQP_CLIENT_VERSION, log: Log = print
) -> list[str]:
    """The command that runs ScaleLoad (java, its options and class path, the class),
    fetching amqp-client and compiling the source the first time.

    Raises:
        BenchError: java, javac or mvn is missing, Maven or javac fails, or the cache
            folder is not writable.
    """
    try:
        java = find_java()
        root = cache_dir if cache_dir is not None else default_cache_dir()
        home = root / f"scale-load-{version}"
        make_cache_dir(root)
        with exclusive_lock(root / f".scale-load-{version}.lock", "amqp-client", log):
            if not (home / _MARKER).is_file():
                _fetch(root, home, version, log)
            classes = home / f"classes-{source_digest()}"
            if not (classes / _MARKER).is_file():
                _compile(java, home / "lib", classes, log)
    except LocalInfraError as e:
        raise BenchError(str(e)) from e
    class_path = f"{classes}{os.pathsep}{home / 'lib' / '*'}"
    return [java, *_JVM_OPTIONS, "-cp", class_path, MAIN_CLASS]


def _fetch(root: Path, home: Path, version: str, log: Log) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LocalInfraError(
            f"`mvn` (Apache Maven) was not found on PATH; it is needed once to fetch "
            f"com.rabbitmq:amqp-client {version} from Maven Central (apt-get install maven)"
        )
    log(f"fetching com.rabbitmq:amqp-client {version} with Maven into {home} (once)")
    work = Path(tempfile.mkdtemp(prefix=f".fetch-scale-load-{version}-", dir=root))
    try:
        (work / "pom.xml").write_text(_POM.format(version=version))
        run_maven(
            [
                mvn,
                "-B",
                "-f",
                str(work / "pom.xml"),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={work / 'lib'}",
                "-DincludeScope=runtime",
            ],
            work,
            "com.rabbitmq:amqp-client",
            lambda line: log(f"  mvn: {line}"),
            lambda line: any(word in line for word in ("Download", "ERROR", "BUILD")),
        )
        jars = sorted(p.name for p in (work / "lib").glob("*.jar"))
        if f"amqp-client-{version}.jar" not in jars:
            raise LocalInfraError(f"Maven copied {jars}, without amqp-client-{version}.jar")
        if home.exists():  # no marker: an interrupted copy
            shutil.rmtree(home)
        home.mkdir(parents=True)
        os.rename(work / "lib", home / "lib")
        (home / _MARKER).write_text("\n".join(jars) + "\n")
    except OSError as e:
        raise LocalInfraError(f"could not write amqp-client into {root}: {e}") from e
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _compile(java: str, lib: Path, classes: Path, log: Log) -> None:
    javac = shutil.which("javac") or str(Path(java).with_name("javac"))
    if not Path(javac).exists() and shutil.which(javac) is None:
        raise LocalInfraError("`javac` was not found: the scale bench needs a JDK, not a JRE")
    shutil.rmtree(classes, ignore_errors=True)
    classes.mkdir(parents=True)
    log(f"compiling {SOURCE.name} into {classes}")
    try:
        done = subprocess.run(
            [javac, "-d", str(classes), "-cp", str(lib / "*"), str(SOURCE)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise LocalInfraError(f"cannot run javac: {e}") from e
    if done.returncode != 0:
        raise LocalInfraError(f"javac failed:\n{(done.stdout + done.stderr)[-4000:]}")
    (classes / _MARKER).write_text(source_digest() + "\n")


# --- running ---------------------------------------------------------------------------


@dataclass
class LoadRun:
    """Every event of one generator run, and how it ended."""

    events: list[ScaleEvent] = field(default_factory=list)
    exit_code: int | None = None
    error: str | None = None  # the generator's own, or why we stopped it
    tail: str = ""  # its last lines, for a failure

    def first(self, name: str) -> ScaleEvent | None:
        return next((e for e in self.events if e.name == name), None)


def run_load(
    command: Sequence[str],
    settings: Mapping[str, object],
    log_path: Path,
    on_event: Callable[[ScaleEvent], None],
    timeout: float,
) -> LoadRun:
    """Run the generator with ``settings`` (its key=value arguments) until it exits or
    ``timeout`` seconds pass; ``on_event`` gets each event as it arrives.

    Raises BenchError when the process cannot be started.
    """
    process = WatchedProcess("ScaleLoad", [*command, *generator_arguments(settings)], log_path)
    run = LoadRun()
    deadline = time.monotonic() + timeout
    try:
        while True:
            line = process.next_line(deadline)
            if line is None:
                if process.ended:
                    break
                if time.monotonic() >= deadline:
                    run.error = f"no end after {timeout:.0f} s: stopped"
                    break
                continue
            event = parse_event(line.text, line.at)
            if event is None:
                continue
            run.events.append(event)
            if event.name == "error" and run.error is None:
                run.error = f"{event.fields.get('phase', '?')}: {event.fields.get('message')}"
            on_event(event)
    finally:
        process.stop(grace=10.0)
        run.exit_code = process.exit_code()
        run.tail = process.tail()
    if run.error is None and run.exit_code not in (0, None):
        run.error = f"the generator exited with {run.exit_code}:\n{run.tail}"
    return run
