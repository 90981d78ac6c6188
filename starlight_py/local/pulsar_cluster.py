"""A real Pulsar cluster on this machine: bookies and brokers as separate JVMs that keep
their metadata in an existing ZooKeeper (issue 21).

Where :class:`~starlight_py.local.pulsar.PulsarStandalone` is one JVM with one broker and
one bookie, this is what users run: several brokers that own topic bundles and hand them
over (unloads, bundle splits, a dead broker), and several bookies writing each entry to a
write quorum. Sized for a small machine (small heaps and caches); every part can be killed
and started again on the same ports with the same data.

Layout of ``data_dir``: ``bookie-<i>/`` (journal, ledgers, bookkeeper.conf, log),
``broker-<i>/`` (broker.conf, log), ``metadata-initialized`` (a marker written once the
cluster's metadata exists in ZooKeeper).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from starlight_py.backend.batching_support import (
    CURSOR_CLOSE_TO_LEDGER,
    CURSOR_CLOSE_TO_METADATA_STORE,
)
from starlight_py.backend.dispatch_turns import IN_TURNS, ROUND_ROBIN_BATCH
from starlight_py.backend.stream_index import STREAM_OFFSET_BROKER_SETTINGS
from starlight_py.local.backlog_plugin import backlog_plugin_settings
from starlight_py.local.distribution import (
    Log,
    ensure_pulsar_distribution,
    find_java,
    java_classpath,
    jvm_logging_options,
    log_to_stderr,
)
from starlight_py.local.errors import LocalInfraError
from starlight_py.local.ports import LOOPBACK, ensure_port_free, free_port
from starlight_py.local.process import LogScanner, ServerProcess, spawn, stop_together
from starlight_py.local.pulsar import (
    DELAYED_INDEX_BROKER_SETTINGS,
    EXIT_ON_OUT_OF_MEMORY,
    LOW_LATENCY_BOOKIE_SETTINGS,
    LOW_LATENCY_BROKER_SETTINGS,
    PULSAR_JVM_OPENS,
    READY_LOG_LINE,
    default_namespace_listed,
    override_properties,
)

CLUSTER_NAME = "starlight-local"

_BOOKIE_JVM = ("-Xms64m", "-Xmx256m", "-XX:MaxDirectMemorySize=256m", EXIT_ON_OUT_OF_MEMORY)
_BROKER_JVM = ("-Xms128m", "-Xmx512m", "-XX:MaxDirectMemorySize=512m", EXIT_ON_OUT_OF_MEMORY)
_BOOKIE_READY_LINE = "Started component bookie-server"

# What the proxy relies on from every broker (docs/operations.md#what-pulsar-needs), the
# same as the local standalone sets.
BROKER_SETTINGS_THE_PROXY_NEEDS = {
    "brokerDeleteInactiveTopicsEnabled": "false",
    "isDelayedDeliveryDeliverAtTimeStrict": "true",
    "delayedDeliveryTickTimeMillis": "100",
    **DELAYED_INDEX_BROKER_SETTINGS,
    "acknowledgmentAtBatchIndexLevelEnabled": "true",
    ROUND_ROBIN_BATCH: IN_TURNS,
    CURSOR_CLOSE_TO_METADATA_STORE: CURSOR_CLOSE_TO_LEDGER,
    "statsUpdateFrequencyInSecs": "5",
    "statsUpdateInitialDelayInSecs": "5",
    **STREAM_OFFSET_BROKER_SETTINGS,
}


def bookie_conf(
    template: str, *, port: int, data_dir: Path, zookeeper: str, stats_port: int
) -> str:
    """The distribution's ``bookkeeper.conf`` for one loopback bookie with small caches.

    Raises nothing."""
    return override_properties(
        template,
        {
            "bookiePort": str(port),
            "advertisedAddress": LOOPBACK,
            "allowLoopback": "true",
            "journalDirectory": str(data_dir / "journal"),
            "journalDirectories": str(data_dir / "journal"),
            "ledgerDirectories": str(data_dir / "ledgers"),
            "metadataServiceUri": f"zk+hierarchical://{zookeeper}/ledgers",
            "zkServers": zookeeper,
            "httpServerEnabled": "false",
            "prometheusStatsHttpPort": str(stats_port),
            "enableStatistics": "false",
            "dbStorage_writeCacheMaxSizeMb": "32",
            "dbStorage_readAheadCacheMaxSizeMb": "32",
            "dbStorage_rocksDB_blockCacheSize": str(16 * 1024 * 1024),
            "dbStorage_rocksDB_writeBufferSizeMB": "8",
            "journalPreAllocSizeMB": "4",
            "numReadWorkerThreads": "2",
            # A nearly full disk must not turn every bookie read-only under the tests.
            "diskUsageThreshold": "0.99",
            "diskUsageWarnThreshold": "0.98",
            **LOW_LATENCY_BOOKIE_SETTINGS,
        },
    )


def broker_conf(
    template: str,
    *,
    broker_port: int,
    web_port: int,
    zookeeper: str,
    bookies: int,
    extra_properties: Mapping[str, str] | None = None,
) -> str:
    """The distribution's ``broker.conf`` for one loopback broker of the local cluster:
    ensemble 3 / write quorum 2 / ack quorum 2 when there are 3 bookies (fewer bookies:
    all of them). Raises nothing."""
    ensemble = min(3, bookies)
    quorum = min(2, bookies)
    return override_properties(
        template,
        {
            "metadataStoreUrl": f"zk:{zookeeper}",
            "configurationMetadataStoreUrl": f"zk:{zookeeper}",
            "clusterName": CLUSTER_NAME,
            "brokerServicePort": str(broker_port),
            "webServicePort": str(web_port),
            "bindAddress": LOOPBACK,
            "advertisedAddress": LOOPBACK,
            "managedLedgerDefaultEnsembleSize": str(ensemble),
            "managedLedgerDefaultWriteQuorum": str(quorum),
            "managedLedgerDefaultAckQuorum": str(quorum),
            "functionsWorkerEnabled": "false",
            "numIOThreads": "2",
            "numHttpServerThreads": "8",
            "managedLedgerCacheSizeMB": "64",
            **BROKER_SETTINGS_THE_PROXY_NEEDS,
            **LOW_LATENCY_BROKER_SETTINGS,
            **(extra_properties or {}),
        },
    )


class _JvmPart:
    """What a bookie and a broker share: one JVM in its own process group, with a log."""

    _process: ServerProcess

    @property
    def process(self) -> ServerProcess:
        return self._process

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def log_path(self) -> Path:
        return self._process.log_path

    def is_running(self) -> bool:
        return self._process.is_running()

    def kill(self) -> None:
        """kill -9, and wait until it is gone. Raises LocalInfraError."""
        self._process.stop(0)

    def stop(self, timeout: float = 30) -> None:
        self._process.stop(timeout)


class Bookie(_JvmPart):
    """One BookKeeper bookie JVM; same port and data across restarts."""

    def __init__(self, index: int, data_dir: Path, zookeeper: str, log: Log) -> None:
        self.index = index
        self.data_dir = data_dir
        self.port = free_port()
        self._stats_port = free_port()
        self._zookeeper = zookeeper
        self._log = log
        self._process = ServerProcess(f"bookie {index}", data_dir / "bookie.log")

    def launch(self, distribution: Path, java: str) -> None:
        """Start the JVM (see :meth:`wait_until_ready`). Raises LocalInfraError."""
        if self.is_running():
            return
        ensure_port_free(self.port, f"bookie {self.index}")
        conf = self.data_dir / "bookkeeper.conf"
        _write(
            conf,
            bookie_conf(
                _read(distribution / "conf" / "bookkeeper.conf"),
                port=self.port,
                data_dir=self.data_dir,
                zookeeper=self._zookeeper,
                stats_port=self._stats_port,
            ),
        )
        argv = [
            java,
            *_BOOKIE_JVM,
            *PULSAR_JVM_OPENS,
            *jvm_logging_options(distribution, self.data_dir / "logs"),
            "-cp",
            java_classpath(distribution),
            "org.apache.bookkeeper.server.Main",
            "--conf",
            str(conf),
        ]
        self._log(f"starting bookie {self.index} on {LOOPBACK}:{self.port}")
        self._process.launch(argv, cwd=self.data_dir)

    def wait_until_ready(self, timeout: float = 120) -> None:
        """Raises LocalInfraError: it exited or was not serving within ``timeout``."""
        line = LogScanner(self.log_path, self._process.log_offset, _BOOKIE_READY_LINE)
        self._process.wait_until_ready(
            lambda: line.found() and _accepts(self.port),
            timeout,
            f'"{_BOOKIE_READY_LINE}" in its log',
        )


class Broker(_JvmPart):
    """One Pulsar broker JVM; same ports across restarts."""

    def __init__(
        self,
        index: int,
        data_dir: Path,
        zookeeper: str,
        bookies: int,
        log: Log,
        extra_properties: Mapping[str, str] | None = None,
    ) -> None:
        self.index = index
        self.data_dir = data_dir
        self.broker_port = free_port()
        self.web_port = free_port()
        self._zookeeper = zookeeper
        self._bookies = bookies
        self._log = log
        self._extra = dict(extra_properties or {})
        self._process = ServerProcess(f"broker {index}", data_dir / "broker.log")

    @property
    def service_address(self) -> str:
        return f"{LOOPBACK}:{self.broker_port}"

    @property
    def web_url(self) -> str:
        return f"http://{LOOPBACK}:{self.web_port}"

    def launch(self, distribution: Path, java: str) -> None:
        """Start the JVM (see :meth:`wait_until_ready`). Raises LocalInfraError."""
        if self.is_running():
            return
        ensure_port_free(self.broker_port, f"broker {self.index}")
        ensure_port_free(self.web_port, f"broker {self.index}'s web service")
        conf = self.data_dir / "broker.conf"
        _write(
            conf,
            broker_conf(
                _read(distribution / "conf" / "broker.conf"),
                broker_port=self.broker_port,
                web_port=self.web_port,
                zookeeper=self._zookeeper,
                bookies=self._bookies,
                extra_properties={
                    **backlog_plugin_settings(distribution, self._log),
                    **self._extra,
                },
            ),
        )
        argv = [
            java,
            *_BROKER_JVM,
            *PULSAR_JVM_OPENS,
            *jvm_logging_options(distribution, self.data_dir / "logs"),
            "-cp",
            java_classpath(distribution),
            "org.apache.pulsar.PulsarBrokerStarter",
            "--broker-conf",
            str(conf),
        ]
        self._log(f"starting broker {self.index} on pulsar://{self.service_address}")
        self._process.launch(argv, cwd=self.data_dir)

    def wait_until_ready(self, timeout: float = 180) -> None:
        """Raises LocalInfraError: it exited or was not serving within ``timeout``."""
        line = LogScanner(self.log_path, self._process.log_offset, READY_LOG_LINE)
        self._process.wait_until_ready(
            lambda: line.found() and default_namespace_listed(self.web_url),
            timeout,
            f'"{READY_LOG_LINE}" in its log and public/default in its admin API',
        )


class PulsarCluster:
    """``brokers`` brokers and ``bookies`` bookies keeping their metadata in the ZooKeeper
    at ``zookeeper`` (``host:port``). The same interface as PulsarStandalone where the
    local cluster uses it (``service_url``, ``web_url``, ``start``, ``stop``,
    ``is_running``, ``log_path``), plus each part for fault tests."""

    def __init__(
        self,
        data_dir: Path,
        zookeeper: str,
        *,
        brokers: int = 2,
        bookies: int = 3,
        distribution: Path | None = None,
        log: Log = log_to_stderr,
        extra_properties: Mapping[str, str] | None = None,
    ) -> None:
        """Raises ValueError: fewer than one broker or bookie."""
        if brokers < 1 or bookies < 1:
            raise ValueError("a Pulsar cluster needs at least one broker and one bookie")
        self.data_dir = data_dir.resolve()
        self._zookeeper = zookeeper
        self._distribution = distribution
        self._log = log
        self.bookies = [
            Bookie(i, self.data_dir / f"bookie-{i}", zookeeper, log) for i in range(bookies)
        ]
        self.brokers = [
            Broker(i, self.data_dir / f"broker-{i}", zookeeper, bookies, log, extra_properties)
            for i in range(brokers)
        ]

    @property
    def service_url(self) -> str:
        """Every broker, as pulsar-client takes a multi-host URL: it looks topics up on
        whichever answers."""
        return "pulsar://" + ",".join(b.service_address for b in self.brokers)

    @property
    def web_url(self) -> str:
        """Every broker's admin API; the proxy's admin client tries them in turn."""
        return ",".join(b.web_url for b in self.brokers)

    @property
    def log_path(self) -> Path:
        return self.brokers[0].log_path

    def is_running(self) -> bool:
        parts: list[Bookie | Broker] = [*self.bookies, *self.brokers]
        return all(p.is_running() for p in parts)

    def not_running(self) -> list[str]:
        return [f"bookie {b.index}" for b in self.bookies if not b.is_running()] + [
            f"broker {b.index}" for b in self.brokers if not b.is_running()
        ]

    def summary(self) -> list[str]:
        """One line per part, for printing. Raises nothing."""
        return [
            *(
                f"Pulsar broker {b.index}: pulsar://{b.service_address}, admin {b.web_url} "
                f"(log: {b.log_path})"
                for b in self.brokers
            ),
            *(f"bookie {b.index}: 127.0.0.1:{b.port} (log: {b.log_path})" for b in self.bookies),
        ]

    def _tools(self) -> tuple[Path, str]:
        distribution = self._distribution
        if distribution is None:
            distribution = self._distribution = ensure_pulsar_distribution(log=self._log)
        return distribution, find_java()

    def start(self) -> None:
        """Start every part that is not running; return when each serves. Raises
        LocalInfraError (the parts started are stopped again)."""
        started = time.monotonic()
        distribution, java = self._tools()
        try:
            self._initialize_metadata(distribution, java)
            for bookie in self.bookies:
                bookie.launch(distribution, java)
            for bookie in self.bookies:
                bookie.wait_until_ready()
            for broker in self.brokers:
                broker.launch(distribution, java)
            for broker in self.brokers:
                broker.wait_until_ready()
        except BaseException:
            self.stop()
            raise
        self._log(
            f"Pulsar cluster of {len(self.brokers)} brokers and {len(self.bookies)} bookies "
            f"ready after {time.monotonic() - started:.1f} s"
        )

    def start_broker(self, index: int) -> None:
        """Start broker ``index`` again. Raises IndexError, LocalInfraError."""
        distribution, java = self._tools()
        broker = self.brokers[index]
        broker.launch(distribution, java)
        broker.wait_until_ready()

    def start_bookie(self, index: int) -> None:
        """Start bookie ``index`` again. Raises IndexError, LocalInfraError."""
        distribution, java = self._tools()
        bookie = self.bookies[index]
        bookie.launch(distribution, java)
        bookie.wait_until_ready()

    def stop(self, timeout: float = 30) -> None:
        """Stop the brokers together, then the bookies together (a broker closes its ledgers
        on the bookies as it goes); idempotent. Raises LocalInfraError (the first part that
        survived SIGKILL), after trying every part."""
        errors: list[LocalInfraError] = []
        for tier in (self.brokers, self.bookies):
            try:
                stop_together([part.process for part in tier], timeout)
            except LocalInfraError as e:
                errors.append(e)
        if errors:
            raise errors[0]

    def _initialize_metadata(self, distribution: Path, java: str) -> None:
        marker = self.data_dir / "metadata-initialized"
        if marker.exists():
            return
        first = self.brokers[0]
        argv = [
            java,
            "-Xmx256m",
            *PULSAR_JVM_OPENS,
            *jvm_logging_options(distribution, self.data_dir / "logs"),
            "-cp",
            java_classpath(distribution),
            "org.apache.pulsar.PulsarClusterMetadataSetup",
            "--cluster",
            CLUSTER_NAME,
            "--metadata-store",
            f"zk:{self._zookeeper}",
            "--configuration-metadata-store",
            f"zk:{self._zookeeper}",
            "--web-service-url",
            first.web_url,
            "--broker-service-url",
            f"pulsar://{first.service_address}",
        ]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.data_dir / "initialize-cluster-metadata.log"
        self._log(f"initializing the cluster's metadata in ZooKeeper {self._zookeeper}")
        with log_path.open("wb") as out:
            try:
                # A child of ours like the servers: it dies with us (process.py).
                setup = spawn(argv, stdout=out, stderr=subprocess.STDOUT)
            except OSError as e:
                raise LocalInfraError(f"initialize-cluster-metadata failed: {e}") from e
            try:
                returncode = setup.wait(180)
            except BaseException as e:
                setup.kill()
                setup.wait()
                if isinstance(e, subprocess.TimeoutExpired):
                    raise LocalInfraError(f"initialize-cluster-metadata failed: {e}") from e
                raise
        if returncode != 0:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
            raise LocalInfraError(f"initialize-cluster-metadata exited with {returncode}:\n{tail}")
        marker.write_text(CLUSTER_NAME + "\n")


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1):
            return True
    except OSError:
        return False


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise LocalInfraError(
            f"cannot read {path} ({e.strerror}); is it a Pulsar binary distribution?"
        ) from e


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        raise LocalInfraError(f"cannot write {path}: {e.strerror}") from e


def main(argv: list[str] | None = None) -> int:
    """`python -m starlight_py.local.pulsar_cluster`: run a cluster on an existing ZooKeeper
    until SIGTERM or Ctrl-C, in one process whose children are every broker and bookie (the
    bench charges Pulsar's CPU to this process's descendants). Once ready, writes
    `{"service_url": ..., "web_url": ...}` to `--ready-file`. Returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m starlight_py.local.pulsar_cluster")
    parser.add_argument("--zookeeper", required=True, help="host:port of the metadata store")
    parser.add_argument("--dir", type=Path, required=True, help="data and logs")
    parser.add_argument("--brokers", type=int, default=2)
    parser.add_argument("--bookies", type=int, default=3)
    parser.add_argument("--ready-file", type=Path, required=True)
    args = parser.parse_args(argv)
    cluster = PulsarCluster(args.dir, args.zookeeper, brokers=args.brokers, bookies=args.bookies)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        cluster.start()
        written = args.ready_file.with_suffix(".tmp")
        written.write_text(
            json.dumps({"service_url": cluster.service_url, "web_url": cluster.web_url})
        )
        written.replace(args.ready_file)  # whole, or not at all, for whoever waits on it
        while True:
            time.sleep(3600)
    except LocalInfraError as e:
        print(f"error: {e}", flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cluster.stop()


if __name__ == "__main__":
    raise SystemExit(main())
