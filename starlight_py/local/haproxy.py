"""HAProxy in front of several local proxies: one AMQP address for a whole cluster.

Theory of operation: HAProxy runs in TCP mode, so it never parses AMQP traffic; it only
picks a proxy per client connection (round robin) and checks every proxy twice a second by
sending the AMQP protocol header and expecting the start of a ``connection.start`` method
frame. Two failed checks mark a proxy down and cut the connections it still had
(``on-marked-down shutdown-sessions``), so clients notice a dead proxy at once instead of
waiting for heartbeats; one good check brings it back. A connect refused by a proxy that
has just died is retried on another one (``option redispatch``), so clients rarely see the
gap between the crash and the failed checks.

HAProxy runs in the foreground (``-db``) as a :class:`ServerProcess`, in its own process
group, logging to stdout (the log file). Its admin socket in the data folder answers
``show stat``, which is how we learn what it thinks of each proxy.
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from starlight_py.amqp.framing import FRAME_METHOD, PROTOCOL_HEADER
from starlight_py.local.distribution import Log, log_to_stderr
from starlight_py.local.errors import LocalInfraError
from starlight_py.local.ports import LOOPBACK, ensure_port_free, free_port
from starlight_py.local.process import ServerProcess
from starlight_py.units import MILLISECONDS, SECONDS

DEBIAN_HAPROXY = "/usr/sbin/haproxy"
BACKEND_NAME = "proxies"
FRONTEND_NAME = "amqp"

_INSTALL_HINT = (
    "install HAProxy (Debian/Ubuntu: `sudo apt-get install haproxy`; Fedora: "
    "`sudo dnf install haproxy`; macOS: `brew install haproxy`) and make sure `haproxy` is "
    "on PATH"
)
_APT_TIMEOUT = 600 * SECONDS
_POLL_INTERVAL = 0.1 * SECONDS
_STATS_TIMEOUT = 2 * SECONDS
# AF_UNIX paths are limited to 108 bytes on Linux.
_MAX_SOCKET_PATH = 100

# The check's expectation, on the hexadecimal form of the reply (see "rbinary" in HAProxy's
# configuration manual): a method frame (type 1) on channel 0, any 4-byte size, then class
# 10 method 10, i.e. connection.start. Hex digits may come in either case.
_CONNECTION_START_HEX = f"^{FRAME_METHOD:02x}0000[0-9A-Fa-f]{{8}}000[Aa]000[Aa]"
_CONNECTION_START_PREFIX_LEN = 11


def find_haproxy(log: Log = log_to_stderr) -> str:
    """Return the ``haproxy`` executable, installing the Debian package when we can.

    Looks on PATH, then at ``/usr/sbin/haproxy`` (sbin is often not on a user's PATH). When
    neither exists and we run as root on a system with apt-get, runs ``apt-get update`` and
    ``apt-get install -y haproxy`` (saying so through ``log``).

    Raises:
        LocalInfraError: HAProxy is missing and cannot be installed here; the message says
            how to install it.
    """
    found = _locate_haproxy()
    if found is not None:
        return found
    apt_get = shutil.which("apt-get")
    if os.geteuid() != 0 or apt_get is None:
        raise LocalInfraError(f"HAProxy is not installed: {_INSTALL_HINT}")
    log("HAProxy is not installed; installing the Debian package: apt-get install -y haproxy")
    _run_apt([apt_get, "update"])
    _run_apt([apt_get, "install", "-y", "--no-install-recommends", "haproxy"])
    found = _locate_haproxy()
    if found is None:
        raise LocalInfraError(
            f"apt-get installed haproxy but no `haproxy` executable was found: {_INSTALL_HINT}"
        )
    log(f"HAProxy installed: {found}")
    return found


def _locate_haproxy() -> str | None:
    on_path = shutil.which("haproxy")
    if on_path is not None:
        return on_path
    if os.access(DEBIAN_HAPROXY, os.X_OK):
        return DEBIAN_HAPROXY
    return None


def _run_apt(argv: list[str]) -> None:
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=environment,
            timeout=_APT_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LocalInfraError(f"`{' '.join(argv)}` failed ({e}); {_INSTALL_HINT}") from e
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        raise LocalInfraError(
            f"`{' '.join(argv)}` exited with code {result.returncode}; {_INSTALL_HINT}. "
            f"Its last lines:\n{tail}"
        )


def server_name(index: int) -> str:
    """HAProxy's name for the proxy number ``index`` (``proxy0``, ``proxy1``...)."""
    return f"proxy{index}"


def _duration(seconds: float) -> str:
    return f"{round(seconds / MILLISECONDS)}ms"


def haproxy_config(
    port: int,
    backend_ports: Sequence[int],
    stats_socket: Path,
    *,
    check_interval: float = 500 * MILLISECONDS,
    balance: str = "roundrobin",
    send_proxy: bool = False,
) -> str:
    """HAProxy configuration for a TCP frontend on ``127.0.0.1:port`` spreading AMQP clients
    over proxies listening on ``127.0.0.1:<backend_ports[i]>`` (named by :func:`server_name`).

    Raises:
        ValueError: no backend port, a ``check_interval`` under 1 ms, or a ``balance``
            other than roundrobin or leastconn.
    """
    if not backend_ports:
        raise ValueError("at least one backend port is required")
    if check_interval < 1 * MILLISECONDS:
        raise ValueError(f"check_interval must be at least 1 ms, not {check_interval!r} s")
    if balance not in ("roundrobin", "leastconn"):
        raise ValueError(f"balance must be roundrobin or leastconn, not {balance!r}")
    interval = _duration(check_interval)
    # send_proxy: a PROXY protocol v2 header first on every connection, health checks too
    # (the proxies then run with amqpProxyProtocol=true).
    proxy_options = " send-proxy-v2 check-send-proxy" if send_proxy else ""
    check_connect = " send-proxy" if send_proxy else ""
    servers = "".join(
        f"    server {server_name(index)} {LOOPBACK}:{backend_port} check{proxy_options}\n"
        for index, backend_port in enumerate(backend_ports)
    )
    return f"""\
# Written by starlight-py (starlight_py/local/haproxy.py) at every start; edits are lost.
global
    log stdout format raw local0 info
    # Two cores are plenty for a local cluster; more threads only compete with the JVMs.
    nbthread 1
    stats socket {stats_socket} mode 600 level admin

defaults
    mode tcp
    log global
    option tcplog
    option dontlognull
    timeout connect 2s
    # AMQP connections live for hours and may be quiet between heartbeats (60 s by
    # default, none at all if a client turns them off): keep idle ones open.
    timeout client 3h
    timeout server 3h
    timeout check 2s
    # A connect refused by a proxy that just died goes to another proxy at once, before
    # the health checks have noticed.
    retries 3
    option redispatch 1

frontend {FRONTEND_NAME}
    bind {LOOPBACK}:{port}
    default_backend {BACKEND_NAME}

backend {BACKEND_NAME}
    balance {balance}
    option tcp-check
    tcp-check connect{check_connect}
    # The AMQP 0-9-1 protocol header; a live proxy answers with connection.start.
    tcp-check send-binary {PROTOCOL_HEADER.hex()}
    tcp-check expect min-recv {_CONNECTION_START_PREFIX_LEN} rbinary {_CONNECTION_START_HEX}
    default-server inter {interval} fall 2 rise 1 on-marked-down shutdown-sessions
{servers}"""


@dataclass(frozen=True)
class BackendServer:
    """One proxy as HAProxy sees it (a row of ``show stat``)."""

    name: str
    """Server name, e.g. ``proxy0``."""

    status: str
    """``UP``, ``DOWN``, ``MAINT``, or a transition such as ``UP 1/2`` (one check failed)."""

    check_status: str
    """Result of the last health check: ``L7OK`` passed; ``L4CON`` refused, ``L7RSP``
    wrong answer, ``L4TOUT``/``L7TOUT`` timed out; ``INI`` none finished yet."""

    current_sessions: int
    """Client connections it serves now."""

    total_sessions: int
    """Client connections it has been given since HAProxy started."""

    @property
    def is_up(self) -> bool:
        """Whether it gets new connections: UP, with a health check passed."""
        return self.status == "UP" and self.check_status == "L7OK"

    @property
    def is_down(self) -> bool:
        """Whether HAProxy has marked it down (it gets no new connections)."""
        return self.status == "DOWN"


def parse_show_stat(text: str) -> list[BackendServer]:
    """The servers of our backend in the CSV answer of ``show stat``.

    Raises:
        LocalInfraError: the answer is not the CSV HAProxy sends.
    """
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# "):
        raise LocalInfraError(f"unexpected answer to `show stat`: {text[:200]!r}")
    rows = csv.DictReader([lines[0][2:], *lines[1:]])
    servers = []
    try:
        for row in rows:
            if row["pxname"] != BACKEND_NAME or row["svname"] in ("FRONTEND", "BACKEND"):
                continue
            servers.append(
                BackendServer(
                    name=row["svname"],
                    status=row["status"],
                    check_status=row["check_status"],
                    current_sessions=int(row["scur"] or 0),
                    total_sessions=int(row["stot"] or 0),
                )
            )
    except (KeyError, ValueError) as e:
        raise LocalInfraError(f"unexpected answer to `show stat`: {e}") from e
    return servers


class HAProxy:
    """A local HAProxy spreading AMQP clients over proxies on ``backend_ports``.

    Its port, left as None, is picked once at construction, so ``amqp_url`` is known before
    ``start()`` and stays the same across restarts. Files go to ``data_dir``: the
    configuration, the log and (when its path is short enough) the admin socket.
    """

    def __init__(
        self,
        data_dir: Path,
        backend_ports: Sequence[int],
        port: int | None = None,
        *,
        check_interval: float = 500 * MILLISECONDS,
        balance: str = "roundrobin",
        send_proxy: bool = False,
        log: Log = log_to_stderr,
    ) -> None:
        """Raises ValueError for arguments :func:`haproxy_config` refuses."""
        self.send_proxy = send_proxy
        self.data_dir = data_dir.resolve()
        self.port = port if port is not None else free_port()
        self.backend_ports = tuple(backend_ports)
        self.check_interval = check_interval
        self.balance = balance
        self._log = log
        self._socket_dir: Path | None = None
        # Built now so a bad argument fails at construction, not at start.
        haproxy_config(
            self.port,
            self.backend_ports,
            Path("check"),
            check_interval=check_interval,
            balance=balance,
            send_proxy=send_proxy,
        )
        self._process = ServerProcess("HAProxy", self.data_dir / "haproxy.log")

    @property
    def amqp_url(self) -> str:
        """``amqp://guest:guest@127.0.0.1:<port>/%2F``: the cluster's address for clients."""
        return f"amqp://guest:guest@{LOOPBACK}:{self.port}/%2F"

    @property
    def config_path(self) -> Path:
        """The generated configuration file."""
        return self.data_dir / "haproxy.cfg"

    @property
    def log_path(self) -> Path:
        """File receiving HAProxy's log (connections, health-check state changes)."""
        return self._process.log_path

    @property
    def stats_socket(self) -> Path:
        """The admin socket (``show stat``, ``disable server``...)."""
        inside = self.data_dir / "haproxy.sock"
        if len(str(inside)) <= _MAX_SOCKET_PATH:
            return inside
        if self._socket_dir is None:
            self._socket_dir = Path(tempfile.mkdtemp(prefix="starlight-haproxy-"))
        return self._socket_dir / "haproxy.sock"

    @property
    def pid(self) -> int | None:
        """Pid of the running HAProxy (also its process group id); None when stopped."""
        return self._process.pid

    def is_running(self) -> bool:
        """Whether HAProxy is up. Raises nothing."""
        return self._process.is_running()

    def start(self, timeout: float = 30 * SECONDS) -> None:
        """Write the configuration, start HAProxy, return once its admin socket answers.

        Does not wait for the proxies behind it: see :meth:`wait_until_servers_up`. A
        no-op when already running.

        Raises:
            LocalInfraError: HAProxy is missing and cannot be installed, the port is taken,
                it exited (e.g. a configuration error: the message has its log), or it did
                not answer within ``timeout`` seconds.
        """
        if self.is_running():
            return
        executable = find_haproxy(self._log)
        ensure_port_free(self.port, "HAProxy")
        config = haproxy_config(
            self.port,
            self.backend_ports,
            self.stats_socket,
            check_interval=self.check_interval,
            balance=self.balance,
            send_proxy=self.send_proxy,
        )
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.config_path.write_text(config)
            # A socket left by a killed HAProxy would make it refuse to start.
            self.stats_socket.unlink(missing_ok=True)
        except OSError as e:
            raise LocalInfraError(f"cannot write {self.config_path}: {e.strerror}") from e
        self._log(f"starting HAProxy on {LOOPBACK}:{self.port} (log: {self.log_path})")
        self._process.launch([executable, "-db", "-f", str(self.config_path)], cwd=self.data_dir)
        self._process.wait_until_ready(
            self._answers_stats, timeout, f"its admin socket {self.stats_socket}"
        )

    def stop(self, timeout: float = 10 * SECONDS) -> None:
        """Stop HAProxy (SIGTERM, then SIGKILL after ``timeout`` s); idempotent.

        Raises:
            LocalInfraError: it survived SIGKILL.
        """
        self._process.stop(timeout)
        with contextlib.suppress(OSError):
            self.stats_socket.unlink(missing_ok=True)

    def command(self, line: str) -> str:
        """Send one command to the admin socket and return the answer.

        Raises:
            LocalInfraError: HAProxy does not answer.
        """
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                connection.settimeout(_STATS_TIMEOUT)
                connection.connect(str(self.stats_socket))
                connection.sendall(line.encode() + b"\n")
                chunks = []
                # Without "prompt" mode HAProxy answers one command and closes.
                while chunk := connection.recv(65536):
                    chunks.append(chunk)
        except OSError as e:
            raise LocalInfraError(
                f"HAProxy's admin socket {self.stats_socket} did not answer `{line}`: {e}"
            ) from e
        return b"".join(chunks).decode(errors="replace")

    def servers(self) -> list[BackendServer]:
        """What HAProxy thinks of each proxy right now.

        Raises:
            LocalInfraError: HAProxy does not answer.
        """
        return parse_show_stat(self.command("show stat"))

    def wait_until_servers_up(self, count: int, timeout: float = 30 * SECONDS) -> None:
        """Wait until at least ``count`` proxies are up (a health check passed).

        Raises:
            LocalInfraError: HAProxy stopped, or ``timeout`` seconds passed; the message
                lists each proxy's state.
        """
        self._wait_for(
            lambda servers: sum(server.is_up for server in servers) >= count,
            timeout,
            f"{count} prox{'y' if count == 1 else 'ies'} to be up",
        )

    def wait_until_server(self, name: str, *, up: bool, timeout: float = 30 * SECONDS) -> None:
        """Wait until the proxy ``name`` is up (``up=True``) or marked down.

        Raises:
            LocalInfraError: no such server, HAProxy stopped, or ``timeout`` seconds passed.
        """

        def reached(servers: list[BackendServer]) -> bool:
            for server in servers:
                if server.name == name:
                    return server.is_up if up else server.is_down
            raise LocalInfraError(f"HAProxy has no server named {name!r}")

        self._wait_for(reached, timeout, f"{name} to be {'up' if up else 'down'}")

    def _wait_for(
        self,
        reached: Callable[[list[BackendServer]], bool],
        timeout: float,
        waiting_for: str,
    ) -> None:
        deadline = time.monotonic() + timeout
        servers: list[BackendServer] = []
        while True:
            if not self.is_running():
                raise LocalInfraError(
                    f"HAProxy is not running (waiting for {waiting_for}); see {self.log_path}"
                )
            try:
                servers = self.servers()
            except LocalInfraError:
                servers = []
            else:
                if reached(servers):
                    return
            if time.monotonic() > deadline:
                states = ", ".join(
                    f"{server.name} {server.status} ({server.check_status})" for server in servers
                )
                raise LocalInfraError(
                    f"HAProxy: still waiting for {waiting_for} after {timeout:g} s; "
                    f"servers: {states or 'unknown'}; see {self.log_path}"
                )
            time.sleep(_POLL_INTERVAL)

    def _answers_stats(self) -> bool:
        try:
            self.command("show info")
        except LocalInfraError:
            return False
        return True

    def __enter__(self) -> HAProxy:
        """Start (see :meth:`start`, which raises LocalInfraError) and return self."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Stop; raises LocalInfraError only if HAProxy survives SIGKILL."""
        self.stop()
