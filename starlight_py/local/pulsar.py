"""Pulsar standalone (broker + bookie + RocksDB metadata) in one local JVM."""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

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
from starlight_py.local.process import LogScanner, ServerProcess, Startup

READY_LOG_LINE = "messaging service is ready"

# The options Pulsar's own bin/pulsar passes; the --add-opens let its Netty and
# BookKeeper reach JDK internals (direct memory, CPU stats) on Java 17+.
PULSAR_JVM_OPENS = (
    "-Djava.net.preferIPv4Stack=true",
    "-Djute.maxbuffer=10485760",
    "--add-opens",
    "java.base/java.io=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.util.zip=ALL-UNNAMED",
    "--add-opens",
    "java.management/sun.management=ALL-UNNAMED",
    "--add-opens",
    "jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dorg.apache.pulsar.shade.io.netty.tryReflectionSetAccessible=true",
    "--add-opens",
    "java.base/java.nio=ALL-UNNAMED",
    "--add-opens",
    "java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-opens",
    "java.base/jdk.internal.platform=ALL-UNNAMED",
    "-Dzookeeper.4lw.commands.whitelist=*",
    "-Dzookeeper.snapshot.trust.empty=true",
)
# A JVM out of memory limps on with threads dead and clients timing out; exiting lets
# whoever started it see the death and start it again (supervision.py).
EXIT_ON_OUT_OF_MEMORY = "-XX:+ExitOnOutOfMemoryError"

# The standalone's broker keeps a managed ledger, cursors and stats per topic (each AMQP
# queue has its own), and its bookie and metadata store share the same heap.
# 10,000 idle queues ran in 1 GiB (docs/operations.md#queue-metrics); 2 GiB, what Pulsar's
# own bin/pulsar gives a standalone, adds room for topology churn on top. It starts at
# 256 MiB and grows only when needed; direct memory (entry cache, network buffers) stays 1 GiB.
PULSAR_STANDALONE_HEAP = "2g"
_PULSAR_JVM_OPTIONS = (
    "-Xms256m",
    f"-Xmx{PULSAR_STANDALONE_HEAP}",
    "-XX:MaxDirectMemorySize=1g",
    EXIT_ON_OUT_OF_MEMORY,
    *PULSAR_JVM_OPENS,
)

_PROPERTY_KEY = re.compile(r"^\s*([^\s=:#!]+)\s*[=:]")


def override_properties(text: str, overrides: Mapping[str, str]) -> str:
    """Set keys in a Java ``.properties`` text, keeping every other line as it was.

    Every active line of an overridden key is rewritten in place (comments are left alone);
    keys the text lacks are appended at the end. Raises nothing.
    """
    lines = text.splitlines()
    seen: set[str] = set()
    for index, line in enumerate(lines):
        match = _PROPERTY_KEY.match(line)
        if match is not None and match.group(1) in overrides:
            key = match.group(1)
            lines[index] = f"{key}={overrides[key]}"
            seen.add(key)
    missing = [key for key in overrides if key not in seen]
    if missing:
        lines += ["", "# Added by starlight-py"]
        lines += [f"{key}={overrides[key]}" for key in missing]
    return "\n".join(lines) + "\n"


# x-delayed-message exchanges with very many pending messages: the bucket-based tracker keeps
# their index in snapshot buckets in BookKeeper and loads each bucket's next segment as it
# comes due, where the default in-memory tracker holds every pending message's entry in the
# broker's heap. A bucket is sealed (written out) when its ledger is complete, so ledgers
# must roll by size: with Pulsar's 10-minute minimum between rollovers, a million messages
# published in 4 minutes sat in one unsealed bucket, all in memory (32 MiB of index).
# Rollover then comes at managedLedgerMaxEntriesPerLedger (50,000 entries).
DELAYED_INDEX_BROKER_SETTINGS = {
    "delayedDeliveryTrackerFactoryClassName": (
        "org.apache.pulsar.broker.delayed.BucketDelayedDeliveryTrackerFactory"
    ),
    "managedLedgerMinLedgerRolloverTimeMinutes": "0",
}


# Not needed by the proxy, but its latency at low rates (docs/operations.md#what-pulsar-needs,
# measured in docs/performance.md), set on the local standalone and cluster:
# - a subscription that has read everything looks for a new entry at once, not up to 10 ms
#   later (broker);
LOW_LATENCY_BROKER_SETTINGS = {"managedLedgerNewEntriesCheckDelayInMillis": "0"}
# - a bookie writes its journal out as soon as nothing else waits, not up to
#   journalMaxGroupWaitMSec later; under load entries still group (bookie).
LOW_LATENCY_BOOKIE_SETTINGS = {"journalFlushWhenQueueEmpty": "true"}


def standalone_conf(
    template: str,
    *,
    broker_port: int,
    web_port: int,
    extra_properties: Mapping[str, str] | None = None,
) -> str:
    """The distribution's ``standalone.conf`` adapted to one private loopback instance;
    ``extra_properties`` (authentication, TLS ports...) are set last and win.

    Raises nothing.
    """
    return override_properties(
        template,
        {
            "brokerServicePort": str(broker_port),
            "webServicePort": str(web_port),
            "bindAddress": LOOPBACK,
            "advertisedAddress": LOOPBACK,
            # Topics of idle AMQP queues must not vanish behind the proxy's back.
            "brokerDeleteInactiveTopicsEnabled": "false",
            # One bookie: any larger ensemble could never be formed.
            "managedLedgerDefaultEnsembleSize": "1",
            "managedLedgerDefaultWriteQuorum": "1",
            "managedLedgerDefaultAckQuorum": "1",
            # x-delayed-message exchanges: never hand out a delayed message before its time
            # (Pulsar's default lets it go up to one tick early), and check every 100 ms
            # rather than every second, so it is not much later either.
            "isDelayedDeliveryDeliverAtTimeStrict": "true",
            "delayedDeliveryTickTimeMillis": "100",
            # ... and keep the index of the pending ones in BookKeeper, a bounded part of
            # it in memory, not all of it in the broker's heap (a million pending messages
            # in one queue; docs/operations.md#what-pulsar-needs).
            **DELAYED_INDEX_BROKER_SETTINGS,
            # pulsarProducerBatching: a message of a batch entry is acknowledged (and
            # negatively acknowledged) alone, not with its whole batch.
            "acknowledgmentAtBatchIndexLevelEnabled": "true",
            # Competing consumers get a burst in turns, as on RabbitMQ.
            ROUND_ROBIN_BATCH: IN_TURNS,
            # ... and those acknowledgements survive a topic reload (backend/batching_support.py).
            CURSOR_CLOSE_TO_METADATA_STORE: CURSOR_CLOSE_TO_LEDGER,
            # Stream offsets: every entry carries the index of its last message in the topic
            # (x-stream-offset, docs/mapping.md#stream-queues), also handed to Pulsar clients.
            **STREAM_OFFSET_BROKER_SETTINGS,
            # Many idle topics (a topic per queue and per topic-exchange binding): the
            # entry cache's eviction walks every managed ledger; 10 passes a second, not
            # the standalone.conf's 100 (34 ms/s of Pulsar's CPU with 1,000 idle topics).
            "managedLedgerCacheEvictionFrequency": "10",
            "managedLedgerCacheEvictionIntervalMs": "100",
            # The per-queue metrics read the broker's topic stats, computed this often (the
            # default is 60 s, the first time a minute after start).
            "statsUpdateFrequencyInSecs": "5",
            "statsUpdateInitialDelayInSecs": "5",
            # Latency at low rates: the proxy's p50 at 300 msg/s 8.1 -> 0.8 ms with both.
            **LOW_LATENCY_BROKER_SETTINGS,
            **LOW_LATENCY_BOOKIE_SETTINGS,  # the standalone's bookie reads this file too
            **(extra_properties or {}),
        },
    )


class PulsarStandalone:
    """A local Pulsar standalone whose state lives in ``data_dir``.

    Ports left as None are picked once, at construction, so ``service_url`` is known before
    ``start()`` and stays the same across restarts. ``stop()`` then ``start()`` reuses the
    same data: topics and unacknowledged messages survive.
    """

    def __init__(
        self,
        data_dir: Path,
        broker_port: int | None = None,
        web_port: int | None = None,
        *,
        distribution: Path | None = None,
        log: Log = log_to_stderr,
        extra_properties: Mapping[str, str] | None = None,
        admin_token: str = "",
    ) -> None:
        """``distribution`` defaults to :func:`ensure_pulsar_distribution` at first start.
        ``extra_properties`` are written into its ``standalone.conf`` over ours (e.g.
        ``authenticationEnabled``, ``brokerServicePortTls``); with authentication on, the
        readiness check sends ``admin_token`` (a JWT of a super-user role) as a bearer token.

        Raises nothing (ports and java are checked by ``start()``).
        """
        self.data_dir = data_dir.resolve()
        self.broker_port = broker_port if broker_port is not None else free_port()
        self.web_port = web_port if web_port is not None else free_port()
        # BookKeeper names the bookie after host:port and records that name in each
        # ledger's metadata; a different port after a restart would orphan every ledger.
        self._bookie_port = free_port()
        self._distribution = distribution
        self._log = log
        self._extra_properties = dict(extra_properties or {})
        self._admin_token = admin_token
        self._process = ServerProcess("Pulsar standalone", self.data_dir / "pulsar.log")

    @property
    def service_url(self) -> str:
        """Binary protocol URL for Pulsar clients, ``pulsar://127.0.0.1:<broker_port>``."""
        return f"pulsar://{LOOPBACK}:{self.broker_port}"

    @property
    def web_url(self) -> str:
        """Admin/REST URL, ``http://127.0.0.1:<web_port>``."""
        return f"http://{LOOPBACK}:{self.web_port}"

    @property
    def log_path(self) -> Path:
        """File receiving the JVM's stdout and stderr (appended across restarts)."""
        return self._process.log_path

    @property
    def pid(self) -> int | None:
        """Pid of the running JVM, which is also its process group id; None when stopped."""
        return self._process.pid

    def is_running(self) -> bool:
        """Whether the JVM is up (not necessarily ready yet). Raises nothing."""
        return self._process.is_running()

    def start(self, timeout: float = 180) -> None:
        """Start Pulsar and return once it serves clients; no-op if already running.

        Ready means its log says "messaging service is ready" and the admin API lists the
        ``public/default`` namespace (created a second or two after that line).

        Raises:
            LocalInfraError: java or the distribution is unavailable, a port is taken, the
                JVM exited, or ``timeout`` seconds passed (the JVM is then killed; the
                message carries the end of its log).
        """
        if self.is_running():
            return
        startup = self.launch(timeout)
        startup.wait()
        self._log(f"Pulsar standalone ready after {time.monotonic() - startup.started:.1f} s")

    def launch(self, timeout: float = 180) -> Startup:
        """Start the JVM without waiting; the result tells when it serves clients (see
        :meth:`start`), at once when it was already running.

        Raises:
            LocalInfraError: java or the distribution is unavailable, a port is taken, or
                the configuration cannot be written.
        """
        if self.is_running():
            return Startup(self._process, lambda: True, timeout, "nothing")
        distribution = self._distribution
        if distribution is None:
            distribution = self._distribution = ensure_pulsar_distribution(log=self._log)
        java = find_java()
        ensure_port_free(self.broker_port, "Pulsar broker")
        ensure_port_free(self.web_port, "Pulsar web service")
        ensure_port_free(self._bookie_port, "Pulsar's bookie")
        conf_path = self.data_dir / "standalone.conf"
        template_path = distribution / "conf" / "standalone.conf"
        try:
            template = template_path.read_text()
        except OSError as e:
            raise LocalInfraError(
                f"cannot read {template_path} ({e.strerror}); is {distribution} a Pulsar "
                "binary distribution?"
            ) from e
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            conf_path.write_text(
                standalone_conf(
                    template,
                    broker_port=self.broker_port,
                    web_port=self.web_port,
                    extra_properties={
                        **backlog_plugin_settings(distribution, self._log),
                        **self._extra_properties,
                    },
                )
            )
        except OSError as e:
            raise LocalInfraError(f"cannot write {conf_path}: {e.strerror}") from e
        argv = [
            java,
            *_PULSAR_JVM_OPTIONS,
            *jvm_logging_options(distribution, self.data_dir / "logs"),
            f"-Dpulsar.config.file={conf_path}",
            "-cp",
            java_classpath(distribution),
            "org.apache.pulsar.PulsarStandaloneStarter",
            "--config",
            str(conf_path),
            "-nfw",  # no functions worker
            "-nss",  # no stream storage
            "-a",
            LOOPBACK,
            "--bookkeeper-port",
            str(self._bookie_port),
            "--bookkeeper-dir",
            str(self.data_dir / "bk"),
            "--metadata-dir",
            str(self.data_dir / "metadata"),
        ]
        self._log(f"starting Pulsar standalone on {self.service_url} (log: {self.log_path})")
        self._process.launch(argv, cwd=self.data_dir)
        ready_line = LogScanner(self.log_path, self._process.log_offset, READY_LOG_LINE)
        return Startup(
            self._process,
            lambda: (
                ready_line.found() and default_namespace_listed(self.web_url, self._admin_token)
            ),
            timeout,
            f'"{READY_LOG_LINE}" in the log and public/default in the admin API',
        )

    def exit_code(self) -> int | None:
        """How the last run ended (negative: killed by that signal); None while it runs or
        after :meth:`stop`. Raises nothing."""
        return self._process.exit_code()

    def log_tail(self) -> list[str]:
        """The last lines the current (or last) run wrote to its log. Raises nothing."""
        return self._process.log_tail()

    def stop(self, timeout: float = 30) -> None:
        """Stop the JVM (SIGTERM, then SIGKILL after ``timeout`` s); idempotent.

        Raises:
            LocalInfraError: the JVM survived SIGKILL.
        """
        self._process.stop(timeout)

    def __enter__(self) -> PulsarStandalone:
        """Start (see :meth:`start`, which raises LocalInfraError) and return self."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Stop; raises LocalInfraError only if the JVM survives SIGKILL."""
        self.stop()


# Loopback requests must not be sent to an HTTP proxy from the environment.
_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def default_namespace_listed(web_url: str, token: str = "") -> bool:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"{web_url}/admin/v2/namespaces/public", headers=headers)
    try:
        with _NO_PROXY_OPENER.open(request, timeout=2) as reply:
            namespaces = json.load(reply)
    # Before the tenant exists the broker answers 404 {"reason":"Tenant not found"}.
    except (OSError, urllib.error.URLError, http.client.HTTPException, ValueError):
        return False
    return isinstance(namespaces, list) and "public/default" in namespaces
