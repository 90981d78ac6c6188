"""StreamNative's pulsar-spark connector jar, fetched once from Maven Central and cached.

Theory of operation: the connector's main artifact is a shaded jar that already carries its
Pulsar client and admin libraries (its published pom lists no runtime dependency Spark does
not provide), so one file is the whole install. It is downloaded over HTTPS into the cache
folder the Pulsar distribution uses (``$STARLIGHT_CACHE_DIR``, see
:func:`starlight_py.local.distribution.default_cache_dir`), checked against a SHA-1 (pinned
here for the default version, Maven Central's ``.sha1`` file for others), and published by
one rename, so a jar under its final name is always complete. A file lock keeps two
processes from downloading it at the same time.

Versions: the connector is built per Spark minor version and Scala binary version. The
default is the build Maven Central serves for Scala 2.12 that runs on the pyspark pinned in
pyproject.toml (3.5.x, Scala 2.12); docs/spark.md says how to pick another.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from starlight_py.local.distribution import Log, default_cache_dir, log_to_stderr
from starlight_py.local.errors import LocalInfraError

CONNECTOR_GROUP = "io.streamnative.connectors"
SCALA_BINARY_VERSION = "2.12"
CONNECTOR_ARTIFACT = f"pulsar-spark-connector_{SCALA_BINARY_VERSION}"
CONNECTOR_VERSION = "3.1.1.4"
"""Built for Spark 3.1 with Pulsar client 2.4 (shaded); tested here with pyspark 3.5 and a
Pulsar 4.0 broker (tests/integration/test_spark_jobs.py)."""

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
REPOSITORY_ENV = "STARLIGHT_MAVEN_REPOSITORY"
"""Set to a Maven repository URL (a mirror, an Artifactory) to fetch the jar from there."""

_PINNED_SHA1 = {
    (CONNECTOR_ARTIFACT, "3.1.1.4"): "1c901ac8ac7cf9fb0667da1d215b6c090d663f81",
}
_DOWNLOAD_TIMEOUT = 120.0  # seconds without progress before giving up
_CHUNK = 1 << 20


def connector_coordinates(version: str = CONNECTOR_VERSION) -> str:
    """``group:artifact:version``, as ``spark-submit --packages`` wants it."""
    return f"{CONNECTOR_GROUP}:{CONNECTOR_ARTIFACT}:{version}"


def connector_url(version: str = CONNECTOR_VERSION, repository: str | None = None) -> str:
    """Where the jar lives in a Maven repository (default: ``$STARLIGHT_MAVEN_REPOSITORY``,
    else Maven Central)."""
    base = (repository or os.environ.get(REPOSITORY_ENV) or MAVEN_CENTRAL).rstrip("/")
    group_path = CONNECTOR_GROUP.replace(".", "/")
    name = f"{CONNECTOR_ARTIFACT}-{version}.jar"
    return f"{base}/{group_path}/{CONNECTOR_ARTIFACT}/{version}/{name}"


def ensure_connector_jar(
    cache_dir: Path | None = None,
    version: str = CONNECTOR_VERSION,
    log: Log = log_to_stderr,
) -> Path:
    """Return the connector jar in the cache, downloading it the first time.

    Raises:
        LocalInfraError: the cache folder is not writable, the repository cannot be reached
            or has no such version, or the download does not match its checksum.
    """
    root = cache_dir if cache_dir is not None else default_cache_dir()
    target = root / "spark" / f"{CONNECTOR_ARTIFACT}-{version}.jar"
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LocalInfraError(
            f"cannot create the cache folder {target.parent}: {e.strerror}; "
            "set STARLIGHT_CACHE_DIR to a writable folder"
        ) from e
    with _exclusive_lock(target.parent / f".{target.name}.lock"):
        if not target.is_file():  # another process may have fetched it while we waited
            _download(version, target, log)
    return target


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    try:
        handle = path.open("a")
    except OSError as e:
        raise LocalInfraError(f"cannot create the lock file {path}: {e.strerror}") from e
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _download(version: str, target: Path, log: Log) -> None:
    url = connector_url(version)
    log(f"Fetching the pulsar-spark connector {connector_coordinates(version)} from {url}")
    expected = _PINNED_SHA1.get((CONNECTOR_ARTIFACT, version)) or _fetch_text(url + ".sha1")
    expected = expected.split()[0].strip().lower()
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    try:
        digest = hashlib.sha1(usedforsecurity=False)
        with os.fdopen(handle, "wb") as out, _open(url) as response:
            while chunk := response.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != expected:
            raise LocalInfraError(
                f"{url} does not match its SHA-1 (got {digest.hexdigest()}, expected "
                f"{expected}); a proxy or mirror may have altered it"
            )
        os.rename(temporary, target)
    except OSError as e:
        raise LocalInfraError(f"could not write {target}: {e}; check free disk space") from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    log(f"pulsar-spark connector ready: {target}")


def _open(url: str) -> Any:
    # The response (an http.client.HTTPResponse) closes itself at the end of a `with`.
    try:
        response = urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT)
    except urllib.error.HTTPError as e:
        raise LocalInfraError(
            f"{url} answered HTTP {e.code}: this connector version is not in that "
            f"repository (set {REPOSITORY_ENV} to a mirror that has it, or choose another "
            "version, see docs/spark.md)"
        ) from e
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        raise LocalInfraError(
            f"cannot reach {url} ({e}); check the network, or set {REPOSITORY_ENV} to a "
            "Maven repository this machine can reach"
        ) from e
    return response


def _fetch_text(url: str) -> str:
    with _open(url) as response:
        return bytes(response.read()).decode("ascii", "replace")
