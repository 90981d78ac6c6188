"""A standalone ZooKeeper server for starlight-py's own metadata.

It is separate from Pulsar's metadata store on purpose: tests stop and restart it (same
port, same data) to simulate a metadata outage without disturbing Pulsar.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from types import TracebackType

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
from starlight_py.local.process import ServerProcess, Startup


def zoo_cfg(data_dir: Path, port: int) -> str:
    """The ``zoo.cfg`` of a single loopback server storing its data in ``data_dir``.

    Raises nothing.
    """
    settings = {
        "tickTime": "2000",
        # ZooKeeper's default floor is 2 * tickTime; tests ask for 4 s sessions to see
        # expiry quickly, so allow anything from 2 s.
        "minSessionTimeout": "2000",
        "maxSessionTimeout": "60000",
        "dataDir": str(data_dir),
        "clientPort": str(port),
        "clientPortAddress": LOOPBACK,
        # The default of 60 connections per client IP is reached by a test session in
        # which every client comes from 127.0.0.1.
        "maxClientCnxns": "0",
        "admin.enableServer": "false",
        "4lw.commands.whitelist": "*",
        # A local development server: an fsync per write makes tests slow, and a process
        # crash loses nothing (the page cache survives it); only an OS crash could.
        "forceSync": "no",
        # Keep a long-lived local data folder from growing without bound.
        "autopurge.snapRetainCount": "3",
        "autopurge.purgeInterval": "1",
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


# Everything ZooKeeper holds lives in its heap: the topology of every vhost (queues,
# exchanges, bindings, users, policies), a watch per cached folder, each proxy's ephemeral
# znodes, and at snapshot time a serialized copy of the whole tree. 256 MiB (what it had)
# ran out of heap in a long session of heavy topology work. The znodes of 10,000 queues
# (50,000 of the proxy's sizes, written directly) kept 47 MiB live after a full GC, so
# 1 GiB leaves room for churn, sessions and snapshots on top (docs/operations.md). The
# maximum is only reserved address space: the heap grows when it has to.
ZOOKEEPER_HEAP = "1g"

ZOOKEEPER_JVM_OPTIONS = (
    f"-Xmx{ZOOKEEPER_HEAP}",
    # A JVM out of heap limps on with threads dead and clients timing out; exiting lets
    # whoever started it see the death and start it again.
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.net.preferIPv4Stack=true",
    "-Dzookeeper.4lw.commands.whitelist=*",
    "-Dzookeeper.admin.enableServer=false",
    # Lets a server killed before its first snapshot start again on its own logs.
    "-Dzookeeper.snapshot.trust.empty=true",
)


class ZooKeeperServer:
    """A local ZooKeeper whose data lives in ``data_dir``; restartable with data kept.

    A port left as None is picked once, at construction, so ``connect_string`` is known
    before ``start()`` and stays the same across restarts.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        distribution: Path | None = None,
        log: Log = log_to_stderr,
    ) -> None:
        """``distribution`` defaults to :func:`ensure_pulsar_distribution` (its jars).

        Raises nothing (the port and java are checked by ``start()``).
        """
        self.data_dir = data_dir.resolve()
        self.port = port if port is not None else free_port()
        self._distribution = distribution
        self._log = log
        self._process = ServerProcess("ZooKeeper", self.data_dir / "zookeeper.log")

    @property
    def connect_string(self) -> str:
        """What ZooKeeper clients connect to, ``127.0.0.1:<port>``."""
        return f"{LOOPBACK}:{self.port}"

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

    def start(self, timeout: float = 60) -> None:
        """Start ZooKeeper and return once it answers ``ruok``; no-op if already running.

        Raises:
            LocalInfraError: java or the distribution is unavailable, the port is taken,
                the JVM exited, or ``timeout`` seconds passed (the JVM is then killed; the
                message carries the end of its log).
        """
        if self.is_running():
            return
        startup = self.launch(timeout)
        startup.wait()
        self._log(f"ZooKeeper ready after {time.monotonic() - startup.started:.1f} s")

    def launch(self, timeout: float = 60) -> Startup:
        """Start the JVM without waiting; the result tells when it answers ``ruok`` (at
        once when it was already running).

        Raises:
            LocalInfraError: java or the distribution is unavailable, the port is taken or
                the configuration cannot be written.
        """
        if self.is_running():
            return Startup(self._process, lambda: True, timeout, "nothing")
        distribution = self._distribution
        if distribution is None:
            distribution = self._distribution = ensure_pulsar_distribution(log=self._log)
        java = find_java()
        ensure_port_free(self.port, "ZooKeeper")
        config_path = self.data_dir / "zoo.cfg"
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            config_path.write_text(zoo_cfg(self.data_dir / "data", self.port))
        except OSError as e:
            raise LocalInfraError(f"cannot write {config_path}: {e.strerror}") from e
        argv = [
            java,
            *ZOOKEEPER_JVM_OPTIONS,
            *jvm_logging_options(distribution, self.data_dir / "logs"),
            "-cp",
            java_classpath(distribution),
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            str(config_path),
        ]
        self._log(f"starting ZooKeeper on {self.connect_string} (log: {self.log_path})")
        self._process.launch(argv, cwd=self.data_dir)
        return Startup(
            self._process,
            lambda: _answers_imok(self.port),
            timeout,
            "`ruok` to be answered with `imok`",
        )

    def exit_code(self) -> int | None:
        """How the last run ended (negative: killed by that signal); None while it runs or
        after :meth:`stop`. Raises nothing."""
        return self._process.exit_code()

    def log_tail(self) -> list[str]:
        """The last lines the current (or last) run wrote to its log. Raises nothing."""
        return self._process.log_tail()

    def stop(self, timeout: float = 15) -> None:
        """Stop the JVM (SIGTERM, then SIGKILL after ``timeout`` s); idempotent.

        Raises:
            LocalInfraError: the JVM survived SIGKILL.
        """
        self._process.stop(timeout)

    def restart(self) -> None:
        """Stop, then start again on the same port with the same data.

        Raises:
            LocalInfraError: as :meth:`stop` and :meth:`start`.
        """
        self.stop()
        self.start()

    def __enter__(self) -> ZooKeeperServer:
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


def _answers_imok(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1) as connection:
            connection.sendall(b"ruok")
            answer = b""
            # The server answers and closes; a short read loop tolerates split packets.
            while len(answer) < 4:
                chunk = connection.recv(16)
                if not chunk:
                    break
                answer += chunk
    except OSError:
        return False
    return answer == b"imok"
