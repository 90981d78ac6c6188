"""One starlight proxy as a separate OS process (``python -m starlight_py serve``).

Tests that kill, pause or restart a proxy need it outside the test's own interpreter; an
operator's local cluster runs several of them side by side.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import starlight_py
from starlight_py.amqp.framing import FRAME_METHOD, PROTOCOL_HEADER
from starlight_py.local.distribution import Log, log_to_stderr
from starlight_py.local.ports import LOOPBACK, ensure_port_free, free_port
from starlight_py.local.process import ServerProcess
from starlight_py.units import SECONDS

# Where `import starlight_py` found this code: the child runs the same code, installed or
# not.
_SOURCE_ROOT = Path(starlight_py.__file__).resolve().parent.parent
# connection.start is class 10, method 10; both follow the 7-byte frame header.
_CONNECTION_START = (10).to_bytes(2, "big") + (10).to_bytes(2, "big")
_FRAME_START_LEN = 11


def answers_amqp(port: int, host: str = LOOPBACK, timeout: float = 2 * SECONDS) -> bool:
    """Whether an AMQP 0-9-1 server on ``host:port`` answers the protocol header with
    connection.start (what a client sees first). Raises nothing."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as connection:
            connection.sendall(PROTOCOL_HEADER)
            reply = b""
            while len(reply) < _FRAME_START_LEN:
                chunk = connection.recv(_FRAME_START_LEN - len(reply))
                if not chunk:
                    return False
                reply += chunk
    except OSError:
        return False
    return reply[0] == FRAME_METHOD and reply[1:3] == b"\0\0" and reply[7:11] == _CONNECTION_START


class ProxyProcess:
    """``starlight-proxy serve`` listening on ``127.0.0.1:<port>``, restartable there.

    ``settings`` are configuration keys passed with ``--set`` (see :mod:`starlight_py.config`);
    ``amqpListeners`` is set from the port. A port left as None is picked once, at
    construction, so the URL stays the same across restarts.
    """

    def __init__(
        self,
        name: str,
        log_path: Path,
        settings: Mapping[str, str],
        port: int | None = None,
        *,
        log: Log = log_to_stderr,
        workers: int = 1,
    ) -> None:
        """``name`` is used in messages and logs ("proxy 0").

        Raises:
            ValueError: ``settings`` sets ``amqpListeners`` (the port decides it).
        """
        if "amqpListeners" in settings:
            raise ValueError("amqpListeners is set from the port; do not pass it in settings")
        self.name = name
        self.port = port if port is not None else free_port()
        self.settings = {**settings, "amqpListeners": f"amqp://{LOOPBACK}:{self.port}"}
        self._log = log
        self.workers = workers  # `serve --workers N` (starlight_py/workers.py)
        self._process = ServerProcess(name, log_path)
        self._launched_at = time.monotonic()

    @property
    def url(self) -> str:
        """``amqp://guest:guest@127.0.0.1:<port>/%2F``, for clients that bypass HAProxy."""
        return f"amqp://guest:guest@{LOOPBACK}:{self.port}/%2F"

    @property
    def log_path(self) -> Path:
        """File receiving the proxy's log (appended across restarts)."""
        return self._process.log_path

    @property
    def pid(self) -> int | None:
        """Pid of the running proxy (also its process group id); None when stopped."""
        return self._process.pid

    def is_running(self) -> bool:
        """Whether the process is up (not necessarily serving yet). Raises nothing."""
        return self._process.is_running()

    def launch(self) -> None:
        """Start the process without waiting for it; a no-op when already running.

        Raises:
            LocalInfraError: the port is taken, or Python cannot be started.
        """
        if self.is_running():
            return
        ensure_port_free(self.port, f"{self.name} AMQP listener")
        argv = [sys.executable, "-m", "starlight_py", "serve"]
        if self.workers != 1:
            argv += ["--workers", str(self.workers)]
        for key, value in self.settings.items():
            argv += ["--set", f"{key}={value}"]
        python_path = os.pathsep.join(
            part for part in (str(_SOURCE_ROOT), os.environ.get("PYTHONPATH", "")) if part
        )
        environment = {**os.environ, "PYTHONPATH": python_path, "PYTHONUNBUFFERED": "1"}
        self._log(f"starting {self.name} on {LOOPBACK}:{self.port} (log: {self.log_path})")
        self._launched_at = time.monotonic()
        self._process.launch(argv, cwd=self.log_path.parent, env=environment)

    def wait_until_ready(self, timeout: float = 60 * SECONDS) -> None:
        """Return once the proxy answers AMQP clients; stop it if it does not.

        Raises:
            LocalInfraError: the process exited, or ``timeout`` seconds passed (it is then
                stopped; the message carries the end of its log).
        """
        self._process.wait_until_ready(
            lambda: answers_amqp(self.port), timeout, "connection.start on its port"
        )
        self._log(f"{self.name} ready after {time.monotonic() - self._launched_at:.1f} s")

    def start(self, timeout: float = 60 * SECONDS) -> None:
        """:meth:`launch`, then :meth:`wait_until_ready`; a no-op when already running.

        Raises:
            LocalInfraError: as those two.
        """
        if self.is_running():
            return
        self.launch()
        self.wait_until_ready(timeout)

    def send_signal(self, signum: signal.Signals) -> None:
        """Send ``signum`` to the proxy's process group. Raises nothing."""
        self._process.send_signal(signum)

    def wait_exited(self, timeout: float = 30 * SECONDS) -> int | None:
        """Wait for the proxy to exit (after a signal); returns its exit code.

        Raises:
            LocalInfraError: it still runs after ``timeout`` seconds.
        """
        return self._process.wait_exited(timeout)

    def stop(self, timeout: float = 15 * SECONDS) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL after ``timeout`` s; idempotent.

        Raises:
            LocalInfraError: the process survived SIGKILL.
        """
        self._process.stop(timeout)
