"""The broker plugin that counts subscription backlogs in messages, built for local brokers.

Pulsar's stats count a backlog in entries; with producer batching an entry holds many
messages (docs/performance.md#producer-batching-what-it-buys-and-what-it-changes). The
plugin (``broker_plugin/MessageBacklogServlet.java``) is an "additional servlet" that
answers ``GET /starlight/backlog?topic=...`` with each subscription's backlog in messages,
from the cursor's state and the message index every entry carries under
``AppendIndexMetadataInterceptor``.

It is compiled here with ``javac`` against the Pulsar distribution's own jars (no Maven, no
download) into a NAR in the cache, once per source and distribution, and the local
standalone and cluster brokers load it (:func:`plugin_broker_settings`). Brokers run by
operators can load the same NAR (``starlight-proxy broker-plugin --output DIR``;
docs/operations.md#what-pulsar-needs).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import zipfile
from importlib import resources
from pathlib import Path

from starlight_py.backend.stream_index import INDEX_INTERCEPTOR
from starlight_py.local.distribution import (
    Log,
    default_cache_dir,
    exclusive_lock,
    log_to_stderr,
    make_cache_dir,
)
from starlight_py.local.errors import LocalInfraError

PLUGIN_NAME = "starlight-backlog"
NAR_FILE = f"{PLUGIN_NAME}.nar"
BASE_PATH = "/starlight"  # MessageBacklogPlugin.BASE_PATH
_SOURCES = ("MessageBacklogServlet.java", "MessageBacklogPlugin.java")
_DESCRIPTOR = "additional_servlet.yml"
_COMPILE_TIMEOUT = 300.0


def plugin_sources() -> dict[str, bytes]:
    """The plugin's Java sources and service descriptor, by file name. Raises nothing."""
    folder = resources.files("starlight_py.local").joinpath("broker_plugin")
    return {name: folder.joinpath(name).read_bytes() for name in (*_SOURCES, _DESCRIPTOR)}


def plugin_fingerprint(sources: dict[str, bytes], distribution: Path) -> str:
    """What a built NAR depends on: the sources and the distribution it was compiled
    against. Raises nothing."""
    digest = hashlib.sha256(str(distribution.resolve()).encode())
    for name in sorted(sources):
        digest.update(name.encode() + b"\0" + sources[name] + b"\0")
    return digest.hexdigest()[:16]


def plugin_broker_settings(plugin_dir: Path) -> dict[str, str]:
    """Broker settings that load the plugin from ``plugin_dir`` (the folder holding
    ``starlight-backlog.nar``) and give every entry its message index. Raises nothing."""
    return {
        "brokerEntryMetadataInterceptors": INDEX_INTERCEPTOR,
        "additionalServletDirectory": str(plugin_dir),
        "additionalServlets": PLUGIN_NAME,
    }


def backlog_plugin_settings(distribution: Path, log: Log = log_to_stderr) -> dict[str, str]:
    """`plugin_broker_settings` of the plugin built for `distribution`; none (and a line
    in `log` saying what is lost) when it cannot be built, e.g. without a JDK's javac: the
    broker then runs without it. Raises nothing."""
    try:
        return plugin_broker_settings(ensure_backlog_plugin(distribution, log=log))
    except LocalInfraError as e:
        log(
            f"Pulsar starts without the starlight-backlog plugin ({e}); with "
            "pulsarProducerBatching=true queue counts are then in Pulsar entries"
        )
        return {}


def ensure_backlog_plugin(
    distribution: Path, cache_dir: Path | None = None, log: Log = log_to_stderr
) -> Path:
    """The folder holding ``starlight-backlog.nar`` built against ``distribution``,
    compiling it first if no build of these sources is cached.

    Raises:
        LocalInfraError: javac is missing or fails, or the cache is not writable.
    """
    _check_distribution(distribution)
    sources = plugin_sources()
    root = (cache_dir if cache_dir is not None else default_cache_dir()) / "broker-plugin"
    target = root / plugin_fingerprint(sources, distribution)
    if (target / NAR_FILE).is_file():
        return target
    make_cache_dir(root)
    with exclusive_lock(root / ".lock", "the broker plugin", log):
        if (target / NAR_FILE).is_file():
            return target
        log(f"building the broker plugin {NAR_FILE} (javac, once) into {target}")
        with tempfile.TemporaryDirectory(dir=root) as work_dir:
            work = Path(work_dir)
            nar = build_nar(sources, distribution, work)
            staged = work / "published"
            staged.mkdir()
            shutil.move(str(nar), staged / NAR_FILE)
            if target.exists():
                shutil.rmtree(target)
            staged.rename(target)
    return target


def build_nar(sources: dict[str, bytes], distribution: Path, work: Path) -> Path:
    """Compile ``sources`` against the distribution's jars and pack them as a NAR in
    ``work``; returns its path.

    Raises:
        LocalInfraError: javac is missing or fails.
    """
    _check_distribution(distribution)
    javac = _find_javac()
    source_dir = work / "src"
    classes = work / "classes"
    source_dir.mkdir()
    classes.mkdir()
    java_files = []
    for name, text in sources.items():
        (source_dir / name).write_bytes(text)
        if name.endswith(".java"):
            java_files.append(str(source_dir / name))
    command = [
        javac,
        "-nowarn",
        "--release",
        "17",
        "-cp",
        str(distribution / "lib" / "*"),
        "-d",
        str(classes),
        *java_files,
    ]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LocalInfraError(f"cannot run {javac}: {e}") from e
    if done.returncode != 0:
        raise LocalInfraError(
            f"javac failed to build the broker plugin:\n{(done.stderr or done.stdout)[:3000]}"
        )
    nar = work / NAR_FILE
    with zipfile.ZipFile(nar, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(
            "META-INF/MANIFEST.MF",
            f"Manifest-Version: 1.0\nNar-Id: {PLUGIN_NAME}\nNar-Version: 1\n",
        )
        archive.writestr(f"META-INF/services/{_DESCRIPTOR}", sources[_DESCRIPTOR])
        for path in sorted(classes.rglob("*.class")):
            archive.write(path, path.relative_to(classes).as_posix())
    return nar


def _check_distribution(distribution: Path) -> None:
    if not any((distribution / "lib").glob("org.apache.pulsar-pulsar-broker-*.jar")):
        raise LocalInfraError(
            f"{distribution} is not an unpacked Apache Pulsar binary distribution "
            "(no lib/org.apache.pulsar-pulsar-broker-*.jar to compile the broker plugin against)"
        )


def _find_javac() -> str:
    javac = shutil.which("javac")
    if javac is None:
        raise LocalInfraError(
            "`javac` was not found on PATH; the local Pulsar's broker plugin is compiled "
            "with it (install a JDK 17, e.g. `apt-get install openjdk-17-jdk-headless`)"
        )
    return javac
