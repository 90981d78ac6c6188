"""Server processes that do not outlive the Python process that started them.

Theory of operation: every server runs in its own session, so its process group id equals
its pid, with stdout and stderr appended to one log file. Stopping sends SIGTERM to the
group, waits, then sends SIGKILL. A module-level registry holds every process that is still
running, and an ``atexit`` hook stops them when the interpreter exits normally (return from
main, ``sys.exit``, an uncaught exception, Ctrl+C turned into KeyboardInterrupt).

What the hook cannot cover: SIGKILL of the Python process, or any signal whose default
action ends it without running ``atexit`` (e.g. an unhandled SIGTERM). That is why each
server gets its own process group: whoever supervises us can stop a leftover server with
``kill -- -<pid>``. PR_SET_PDEATHSIG is deliberately not used: it fires when the *thread*
that spawned the child exits, and callers start servers from worker threads
(``trio.to_thread``) that come and go.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path

from starlight_py.local.errors import LocalInfraError

_LOG_TAIL_LINES = 30
_POLL_INTERVAL = 0.2
_KILL_WAIT = 10.0
_FAILED_START_GRACE = 5.0
_AT_EXIT_GRACE = 15.0

_running: set[ServerProcess] = set()
_running_lock = threading.Lock()


class ServerProcess:
    """One long-running child process with its output in a log file."""

    def __init__(self, name: str, log_path: Path) -> None:
        """``name`` is used in messages ("Pulsar standalone"). Raises nothing."""
        self.name = name
        self.log_path = log_path
        self._popen: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    @property
    def pid(self) -> int | None:
        """Pid (and process group id) of the running process, else None."""
        return self._popen.pid if self.is_running() and self._popen is not None else None

    @property
    def log_offset(self) -> int:
        """Where the output of the current run starts in the log file."""
        return self._log_offset

    def is_running(self) -> bool:
        """Whether the process was started and has not exited. Raises nothing."""
        return self._popen is not None and self._popen.poll() is None

    def launch(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None) -> None:
        """Start ``argv`` in its own process group, appending its output to the log.

        ``env`` replaces the environment when given (default: inherit ours).

        Raises:
            LocalInfraError: the executable cannot be started.
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Append rather than truncate: after a restart the previous run's output is often
        # what explains the failure.
        with self.log_path.open("ab") as log_file:
            log_file.write(f"\n===== {self.name} starting at {datetime.now()} =====\n".encode())
            log_file.flush()
            self._log_offset = log_file.tell()
            try:
                self._popen = subprocess.Popen(
                    list(argv),
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=None if env is None else dict(env),
                    start_new_session=True,
                )
            except OSError as e:
                raise LocalInfraError(f"could not start {self.name} ({argv[0]}): {e}") from e
        with _running_lock:
            _running.add(self)

    def wait_until_ready(
        self, is_ready: Callable[[], bool], timeout: float, waiting_for: str
    ) -> None:
        """Poll ``is_ready`` until it returns True; stop the process on any failure.

        ``waiting_for`` describes the readiness condition for the timeout message.

        Raises:
            LocalInfraError: the process exited, or ``timeout`` seconds passed; the message
                carries the last lines of the log.
        """
        deadline = time.monotonic() + timeout
        try:
            while True:
                popen = self._popen
                code = popen.poll() if popen is not None else None
                if popen is None or code is not None:
                    raise LocalInfraError(
                        f"{self.name} exited with code {code} before it was ready. "
                        f"{self._log_excerpt()}"
                    )
                if is_ready():
                    return
                if time.monotonic() > deadline:
                    raise LocalInfraError(
                        f"{self.name} was not ready after {timeout:g} s (waiting for "
                        f"{waiting_for}), so it was stopped. {self._log_excerpt()}"
                    )
                time.sleep(_POLL_INTERVAL)
        except BaseException:
            # Also on KeyboardInterrupt: a half-started JVM must not stay behind, and there is
            # nothing in it worth a long graceful shutdown.
            self.stop(_FAILED_START_GRACE)
            raise

    def send_signal(self, signum: signal.Signals) -> None:
        """Send ``signum`` to the process group; does nothing when it is not running.

        Used to simulate crashes (SIGKILL) and hangs (SIGSTOP). Raises nothing.
        """
        popen = self._popen
        if popen is not None and popen.poll() is None:
            _signal_group(popen.pid, signum)

    def wait_exited(self, timeout: float) -> int | None:
        """Wait until the process has exited, then forget it; returns its exit code.

        Returns None when it was not started (or already forgotten).

        Raises:
            LocalInfraError: it is still running after ``timeout`` seconds.
        """
        popen = self._popen
        if popen is None:
            return None
        try:
            code = popen.wait(timeout)
        except subprocess.TimeoutExpired as e:
            raise LocalInfraError(
                f"{self.name} (pid {popen.pid}) still runs {timeout:g} s after it was told to exit"
            ) from e
        self._popen = None
        with _running_lock:
            _running.discard(self)
        return code

    def stop(self, timeout: float) -> None:
        """SIGTERM the process group, wait up to ``timeout`` s, then SIGKILL it.

        Idempotent: does nothing when the process is not running.

        Raises:
            LocalInfraError: the process survived SIGKILL (stuck in the kernel).
        """
        popen = self._popen
        if popen is None:
            return
        # Signal the group only while the leader is unreaped: after wait() its id may be
        # reused by an unrelated process group. The JVM has no children of its own.
        if popen.poll() is None:
            _signal_group(popen.pid, signal.SIGTERM)
            # A process stopped with SIGSTOP (a simulated hang) acts on SIGTERM only once
            # it runs again.
            _signal_group(popen.pid, signal.SIGCONT)
            try:
                popen.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(popen.pid, signal.SIGKILL)
                try:
                    popen.wait(_KILL_WAIT)
                except subprocess.TimeoutExpired as e:
                    raise LocalInfraError(
                        f"{self.name} (pid {popen.pid}) did not die after SIGKILL"
                    ) from e
        self._popen = None
        with _running_lock:
            _running.discard(self)

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> list[str]:
        """Last ``lines`` lines the current (or last) run wrote. Raises nothing."""
        try:
            with self.log_path.open("rb") as log_file:
                size = log_file.seek(0, os.SEEK_END)
                # 64 KiB comfortably holds 30 lines, even Java stack-trace lines.
                log_file.seek(max(self._log_offset, size - 64 * 1024))
                text = log_file.read().decode(errors="replace")
        except OSError:
            return []
        return text.splitlines()[-lines:]

    def _log_excerpt(self) -> str:
        tail = self.log_tail()
        if not tail:
            return f"It wrote nothing to {self.log_path}."
        return f"Last lines of {self.log_path}:\n" + "\n".join(tail)


class LogScanner:
    """Finds one needle in a growing log file without re-reading what it already saw."""

    def __init__(self, path: Path, start: int, needle: str) -> None:
        """Look for ``needle`` from byte ``start`` of ``path`` on. Raises nothing."""
        self._path = path
        self._position = start
        self._needle = needle.encode()
        self._carry = b""
        self._found = False

    def found(self) -> bool:
        """Whether the needle has appeared yet. Raises nothing (an unreadable log is False)."""
        if self._found:
            return True
        try:
            with self._path.open("rb") as log_file:
                log_file.seek(self._position)
                chunk = log_file.read()
        except OSError:
            return False
        self._position += len(chunk)
        window = self._carry + chunk
        self._found = self._needle in window
        # Keep enough of the end to match a needle split across two reads.
        self._carry = window[max(0, len(window) - len(self._needle) + 1) :]
        return self._found


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def stop_all_servers(grace: float = _AT_EXIT_GRACE) -> None:
    """Stop every server this process started and has not stopped yet.

    All get SIGTERM at once and share ``grace`` seconds before SIGKILL, so exiting with
    several servers up does not take the sum of their shutdown times. Raises nothing.
    """
    with _running_lock:
        leftovers = list(_running)
    for server in leftovers:
        popen = server._popen
        if popen is not None and popen.poll() is None:
            _signal_group(popen.pid, signal.SIGTERM)
            _signal_group(popen.pid, signal.SIGCONT)
    deadline = time.monotonic() + grace
    for server in leftovers:
        # No second SIGTERM (stop() would send one): a Python server handles the first and
        # may die of the next before it has shut down cleanly.
        try:
            server.wait_exited(max(0.0, deadline - time.monotonic()))
        except LocalInfraError:
            with contextlib.suppress(LocalInfraError):
                server.stop(0)


atexit.register(stop_all_servers)
