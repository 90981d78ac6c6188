"""The servers a benchmark run starts and stops, and what it reads of them in /proc.

Every process started here runs in its own session (process group id = pid) and is stopped
with SIGTERM to the group, then SIGKILL; ``cli`` registers each stop in an ExitStack right
after the start, so Ctrl-C or a failure anywhere still stops them all. ZooKeeper and Pulsar
come from ``starlight_py.local`` (whose atexit hook is a second safety net).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from starlight_py.local import (
    LocalInfraError,
    PulsarStandalone,
    ZooKeeperServer,
    endpoints_from_env,
    ensure_pulsar_distribution,
    free_port,
)

LOOPBACK = "127.0.0.1"


def say(line: str) -> None:
    print(f"[bench] {line}", flush=True)


class BenchError(Exception):
    """A server could not be started (the message says which and why)."""


@dataclass(frozen=True)
class PulsarEndpoints:
    service_url: str
    web_url: str
    zookeeper: str
    pulsar_pid: int | None  # None when the servers are someone else's (environment)
    zookeeper_pid: int | None = None  # the local ZooKeeper's JVM, when it is ours


def add_pulsar_set(parser: argparse.ArgumentParser, more_help: str = "") -> None:
    """The benches' repeatable ``--pulsar-set KEY=VALUE`` (read by `pulsar_settings`)."""
    parser.add_argument(
        "--pulsar-set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="a key of the local Pulsar standalone's standalone.conf (repeatable)" + more_help,
    )


def pulsar_settings(pairs: Sequence[str]) -> dict[str, str]:
    """``--pulsar-set KEY=VALUE`` pairs as a dict. Raises BenchError for a malformed one."""
    settings: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise BenchError(f"--pulsar-set takes KEY=VALUE, not {pair!r}")
        settings[key.strip()] = value.strip()
    return settings


def start_pulsar(
    stack: ExitStack,
    base: Path,
    cluster: bool = False,
    pulsar_settings: Mapping[str, str] | None = None,
) -> PulsarEndpoints:
    """ZooKeeper + Pulsar standalone under ``base`` (``cluster``: 2 brokers and 3 bookies,
    see :func:`start_pulsar_cluster`), or the STARLIGHT_* endpoints. ``pulsar_settings``
    go into the standalone's standalone.conf over starlight-py's (not the cluster's).

    Raises BenchError.
    """
    try:
        external = endpoints_from_env()
    except LocalInfraError as e:
        raise BenchError(str(e)) from e
    if external is not None:
        say(f"using Pulsar {external.pulsar_service_url} and ZooKeeper {external.zookeeper}")
        return PulsarEndpoints(
            external.pulsar_service_url, external.pulsar_web_url, external.zookeeper, None
        )
    try:
        distribution = ensure_pulsar_distribution(log=say)
        zookeeper = ZooKeeperServer(base / "zookeeper", distribution=distribution, log=say)
        stack.callback(_quietly, "ZooKeeper", zookeeper.stop)
        zookeeper.start()
        if cluster:
            return replace(
                start_pulsar_cluster(stack, base, zookeeper.connect_string),
                zookeeper_pid=zookeeper.pid,
            )
        pulsar = PulsarStandalone(
            base / "pulsar",
            distribution=distribution,
            log=say,
            extra_properties=pulsar_settings,
        )
        stack.callback(_quietly, "Pulsar", pulsar.stop)
        pulsar.start()
    except LocalInfraError as e:
        raise BenchError(str(e)) from e
    return PulsarEndpoints(
        pulsar.service_url, pulsar.web_url, zookeeper.connect_string, pulsar.pid, zookeeper.pid
    )


def start_pulsar_cluster(stack: ExitStack, base: Path, zookeeper: str) -> PulsarEndpoints:
    """2 brokers and 3 bookies (ensemble 3, quorums 2) on ``zookeeper``, run by one child
    process (``python -m starlight_py.local.pulsar_cluster``) whose descendants are every
    JVM: Pulsar's CPU is that process's. Raises BenchError."""
    ready = base / "pulsar-cluster.json"
    ready.unlink(missing_ok=True)
    process = GroupProcess(
        "Pulsar cluster",
        [
            sys.executable,
            "-m",
            "starlight_py.local.pulsar_cluster",
            "--zookeeper",
            zookeeper,
            "--dir",
            str(base / "pulsar-cluster"),
            "--ready-file",
            str(ready),
        ],
        base / "pulsar-cluster.log",
    )
    say(f"starting a Pulsar cluster of 2 brokers and 3 bookies (log: {process.log_path})")
    process.start()
    stack.callback(process.stop, 60.0)
    deadline = time.monotonic() + 300
    while not ready.exists():
        if not process.alive() or time.monotonic() > deadline:
            raise BenchError(f"the Pulsar cluster did not start:\n{process.log_tail()}")
        time.sleep(0.5)
    urls = json.loads(ready.read_text())
    say(f"Pulsar cluster ready: {urls['service_url']}, admin {urls['web_url']}")
    return PulsarEndpoints(urls["service_url"], urls["web_url"], zookeeper, process.pid)


def _quietly(name: str, stop: Callable[[], None]) -> None:
    say(f"stopping {name}")
    try:
        stop()
    except LocalInfraError as e:
        say(f"could not stop {name}: {e}")


class GroupProcess:
    """A child process in its own session, output appended to a log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def start(self) -> None:
        """Raises BenchError when the executable cannot be started."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log_file:
            try:
                self.popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.cwd,
                    start_new_session=True,
                )
            except OSError as e:
                raise BenchError(f"cannot start {self.name} ({self.argv[0]}): {e}") from e

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the group, SIGKILL after ``grace`` s; also kills group members that
        outlive the leader. Idempotent; raises nothing."""
        popen = self.popen
        if popen is None:
            return
        pgid = popen.pid
        if popen.poll() is None:
            _signal_group(pgid, signal.SIGTERM)
            try:
                popen.wait(grace)
            except subprocess.TimeoutExpired:
                say(f"{self.name} ignored SIGTERM for {grace:g} s: SIGKILL")
                _signal_group(pgid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(10)
        # The leader is reaped; a pgid stays reserved while any member lives, so these
        # pids are ours.
        for pid in group_members(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.popen = None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_bytes()[-16384:].decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after "(comm)": state ppid pgrp session ... utime(index 11) stime(12)
    return text[text.rfind(")") + 2 :].split()


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and int(fields[2]) == pgid:
                members.append(int(entry))
    return members


_TICKS = os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in the group (threads included)."""
    total = 0
    for pid in group_members(pgid):
        fields = _stat_fields(pid)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])
    return total / _TICKS


def host_busy_seconds() -> float:
    """CPU seconds spent not idle since boot, summed over every CPU of the host."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    # guest time is already counted in user and nice
    return (sum(fields[:8]) - idle) / _TICKS


def rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class RssSampler:
    """Reads VmRSS of one pid every ``interval`` seconds in a daemon thread."""

    def __init__(self, pid: int, interval: float = 1.0) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int]] = []  # (monotonic seconds, KiB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)

    def start(self) -> RssSampler:
        self.sample()
        self._thread.start()
        return self

    def sample(self) -> int | None:
        kib = rss_kib(self.pid)
        if kib is not None:
            self.samples.append((time.monotonic(), kib))
        return kib

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sample()

    def max_between(self, start: float, end: float) -> int | None:
        values = [kib for t, kib in self.samples if start <= t <= end]
        return max(values) if values else None


def wait_tcp(port: int, timeout: float, alive: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=1):
            return True
        time.sleep(0.2)
    return False


def amqp_handshake(url: str) -> str:
    """Open and close one pika connection; returns the server's product + version.

    Raises whatever pika raises.
    """
    import pika  # type: ignore[import-untyped]  # noqa: PLC0415

    params = pika.URLParameters(url)
    params.socket_timeout = 5
    params.stack_timeout = 10
    params.connection_attempts = 1
    conn = pika.BlockingConnection(params)
    try:
        props = getattr(conn, "_impl").server_properties or {}  # noqa: B009
    finally:
        conn.close()

    def text(value: object) -> str:
        return value.decode() if isinstance(value, bytes) else str(value or "")

    return f"{text(props.get('product'))} {text(props.get('version'))}".strip()


# --- the proxy -------------------------------------------------------------------------


def worker_pids(supervisor: int, count: int, timeout: float = 30.0) -> list[int]:
    """The pids of `serve --workers` processes under `supervisor`, once `count` run.

    Raises BenchError."""
    deadline = time.monotonic() + timeout
    path = Path(f"/proc/{supervisor}/task/{supervisor}/children")
    while True:
        try:
            pids = sorted(int(p) for p in path.read_text().split())
        except OSError:
            pids = []
        if len(pids) >= count:
            return pids[:count]
        if time.monotonic() > deadline:
            raise BenchError(f"the proxy started {len(pids)} of {count} workers")
        time.sleep(0.1)


def start_proxy(
    stack: ExitStack,
    base: Path,
    endpoints: PulsarEndpoints,
    extra_settings: Sequence[str] = (),
    cprofile_out: Path | None = None,
    workers: int = 1,
    code: Path | None = None,
) -> tuple[GroupProcess, str]:
    """`python -m starlight_py serve` as a subprocess; returns it and its amqp:// URL.
    `code`: a checkout to run the proxy from instead of this one.

    Raises BenchError.
    """
    port = free_port()
    settings = [
        f"brokerServiceURL={endpoints.service_url}",
        f"brokerWebServiceURL={endpoints.web_url}",
        f"configurationStoreServers={endpoints.zookeeper}",
        f"amqpListeners=amqp://{LOOPBACK}:{port}",
        "amqpAutoCreateNamespaces=true",
        *extra_settings,
    ]
    profile = ["-m", "cProfile", "-o", str(cprofile_out)] if cprofile_out else []
    argv = [sys.executable, *profile, "-m", "starlight_py", "serve"]
    if workers != 1:
        argv += ["--workers", str(workers)]
    for setting in settings:
        argv += ["--set", setting]
    env = None
    if code is not None:
        if not (code / "starlight_py").is_dir():
            raise BenchError(f"--proxy-code {code}: no starlight_py/ there")
        env = {**os.environ, "PYTHONPATH": str(code.resolve())}
    proxy = GroupProcess("proxy", argv, base / "proxy.log", env=env, cwd=code)
    say(f"starting the proxy on {LOOPBACK}:{port} (log: {proxy.log_path})")
    proxy.start()
    # The proxy exits on SIGTERM through its own signal handler (cProfile then writes).
    stack.callback(_stop_logged, proxy, 30.0)
    url = f"amqp://guest:guest@{LOOPBACK}:{port}/%2F"
    if not wait_tcp(port, 60, proxy.alive):
        raise BenchError(f"the proxy did not listen within 60 s:\n{proxy.log_tail()}")
    try:
        amqp_handshake(url)
    except Exception as e:
        raise BenchError(f"the proxy listens but the AMQP handshake failed: {e}") from e
    return proxy, url


def private_proxy(
    stack: ExitStack, prefix: str, keep: bool = False, code: Path | None = None
) -> str:
    """ZooKeeper, Pulsar standalone and one proxy in a new temporary folder (removed when
    `stack` closes unless `keep`), for the scripts that measure one behaviour; returns the
    proxy's amqp:// URL. Raises BenchError."""
    work_dir = Path(tempfile.mkdtemp(prefix=prefix))
    if keep:
        say(f"servers and logs stay in {work_dir}")
    else:
        stack.callback(shutil.rmtree, work_dir, True)
    endpoints = start_pulsar(stack, work_dir)
    return start_proxy(stack, work_dir, endpoints, code=code)[1]


def _stop_logged(process: GroupProcess, grace: float) -> None:
    if process.popen is not None:
        say(f"stopping {process.name}")
    process.stop(grace)


# --- RabbitMQ ----------------------------------------------------------------------------

_RABBITMQ_SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")


def rabbitmq_script() -> str | None:
    # Debian's /usr/sbin/rabbitmq-server is a wrapper that `su`s to the rabbitmq user,
    # which could not write our temporary folders; the real script runs as anyone.
    if _RABBITMQ_SCRIPT.exists():
        return str(_RABBITMQ_SCRIPT)
    return shutil.which("rabbitmq-server")


def _epmd_running() -> bool:
    try:
        with socket.create_connection((LOOPBACK, 4369), timeout=1):
            return True
    except OSError:
        return False


def start_rabbitmq(stack: ExitStack, base: Path) -> tuple[GroupProcess, str]:
    """Launch a private RabbitMQ node (not waiting for it; see wait_rabbitmq); returns it
    and its amqp:// URL.

    Raises BenchError when rabbitmq-server is not installed.
    """
    script = rabbitmq_script()
    if script is None:
        raise BenchError(
            "rabbitmq-server is not installed (Debian: apt-get install rabbitmq-server)"
        )
    home = base / "rabbitmq"
    home.mkdir(parents=True, exist_ok=True)
    (home / "enabled_plugins").write_text("[].\n")
    port = free_port()
    env = {
        **os.environ,
        "HOME": str(home),  # its own Erlang cookie
        "RABBITMQ_NODENAME": f"starlight-bench-{os.getpid()}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": LOOPBACK,
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(free_port()),
        "RABBITMQ_MNESIA_BASE": str(home / "mnesia"),
        "RABBITMQ_LOG_BASE": str(home / "log"),
        "RABBITMQ_PID_FILE": str(home / "rabbitmq.pid"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(home / "advanced.config"),
        "RABBITMQ_CONF_ENV_FILE": str(home / "rabbitmq-env.conf"),
    }
    epmd_was_running = _epmd_running()
    server = GroupProcess("RabbitMQ", [script], home / "server.log", env=env, cwd=home)
    say(f"starting RabbitMQ on {LOOPBACK}:{port} (log: {server.log_path})")
    if not epmd_was_running:
        stack.callback(_kill_epmd)
    server.start()
    stack.callback(_stop_logged, server, 30.0)
    return server, f"amqp://guest:guest@{LOOPBACK}:{port}/%2F"


def _kill_epmd() -> None:
    # Erlang starts epmd as a daemon outside our process group when none runs; `epmd
    # -kill` only stops it when no node is registered any more.
    epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [epmd, "-kill"], timeout=5, capture_output=True, check=False, stdin=subprocess.DEVNULL
        )


def wait_rabbitmq(server: GroupProcess, url: str, timeout: float = 90) -> str:
    """Wait until the node answers an AMQP handshake; returns its version string.

    Raises BenchError.
    """
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if not server.alive():
            raise BenchError(f"RabbitMQ exited while starting:\n{server.log_tail()}")
        try:
            return amqp_handshake(url)
        except Exception as e:
            last = f"{type(e).__name__}: {e}"
            time.sleep(0.5)
    raise BenchError(f"RabbitMQ did not accept AMQP within {timeout:g} s ({last})")
