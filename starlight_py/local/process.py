"""Server processes that do not outlive the Python process that started them.

Theory of operation: every server runs in its own session, so its process group id equals
its pid, with stdout and stderr appended to one log file. Stopping sends SIGTERM to the
group, waits, then sends SIGKILL. A module-level registry holds every process that is still
running, and an ``atexit`` hook stops them when the interpreter exits normally (return from
main, ``sys.exit``, an uncaught exception, Ctrl+C turned into KeyboardInterrupt).

The hook cannot run when the Python process is killed (SIGKILL, the OOM killer, a signal
whose default action ends it). For that, every child asks Linux for a parent-death signal
(``prctl(PR_SET_PDEATHSIG, SIGKILL)``) between fork and exec: it is killed the moment its
parent goes, however the parent went. SIGKILL rather than SIGTERM because nobody is left to
escalate if a JVM's shutdown hangs, and a kill loses nothing a crash would not (what the
servers acknowledged is in their logs).

The signal is tied to the *thread* that forked the child, not to the process: a child
forked from a ``trio.to_thread`` worker would be killed when that worker retires, long
before our process ends. So every child is forked by one spawner thread that never
returns: it exists until the process itself is gone, whichever thread asked for the child.
A server's own children are not covered by its parent-death signal; the JVMs started here
start none, and ``stop()`` signals the whole process group anyway.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO

from starlight_py.local.errors import LocalInfraError

_LOG_TAIL_LINES = 30
_POLL_INTERVAL = 0.2
_KILL_WAIT = 10.0
_FAILED_START_GRACE = 5.0
_AT_EXIT_GRACE = 15.0
# fork and exec take milliseconds; this only bounds a wait that should never be long.
_SPAWN_WAIT = 30.0

_PR_SET_PDEATHSIG = 1
# The child's exit status when its parent died before the parent-death signal was armed.
_ORPHANED_AT_BIRTH = 125

_running: set[ServerProcess] = set()
_running_lock = threading.Lock()


class _SpawnRequest:
    """One child to fork, and what came of it (a Popen or the OSError)."""

    def __init__(self, argv: list[str], options: dict[str, object]) -> None:
        self.argv = argv
        self.options = options
        self.done = threading.Event()
        self.popen: subprocess.Popen[bytes] | None = None
        self.error: OSError | None = None


def _load_prctl() -> Callable[..., int] | None:
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # not Linux: children then outlive a killed parent
    return prctl


def _arm_parent_death_signal(prctl: Callable[..., int], parent: int) -> Callable[[], None]:
    """What the child runs between fork and exec. Kept to calls that take no lock another
    thread of the parent could have held at the fork: a foreign function resolved before
    it, ``getppid`` and ``_exit``."""
    sigkill = int(signal.SIGKILL)

    def in_the_child() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill)
        # The parent may have died between fork and prctl: the signal is then never sent,
        # and we have been handed to another reaper already.
        if os.getppid() != parent:
            os._exit(_ORPHANED_AT_BIRTH)

    return in_the_child


class _Spawner:
    """The thread that forks every child (see the module docstring for why one)."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[_SpawnRequest] = queue.SimpleQueue()
        self._prctl = _load_prctl()
        self._thread = threading.Thread(target=self._serve, name="server-spawner", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        # Never returns: its end would send the parent-death signal to every child.
        while True:
            request = self._requests.get()
            try:
                preexec = (
                    None
                    if self._prctl is None
                    else _arm_parent_death_signal(self._prctl, os.getpid())
                )
                # preexec_fn runs Python in the forked child of a threaded process; what it
                # runs (above) takes no lock another thread could hold.
                request.popen = subprocess.Popen(
                    request.argv,
                    preexec_fn=preexec,  # noqa: PLW1509
                    **request.options,  # type: ignore[call-overload]
                )
            except OSError as e:
                request.error = e
            except BaseException as e:  # a bug: report it to the caller, keep serving
                request.error = OSError(f"cannot start {request.argv[0]}: {e!r}")
            finally:
                request.done.set()

    def spawn(self, argv: list[str], options: dict[str, object]) -> subprocess.Popen[bytes]:
        request = _SpawnRequest(argv, options)
        self._requests.put(request)
        try:
            request.done.wait()
        except BaseException:
            # Interrupted (Ctrl-C) while the child was being made: it must not run on
            # unseen until our exit.
            if request.done.wait(_SPAWN_WAIT) and request.popen is not None:
                _signal_group(request.popen.pid, signal.SIGKILL)
                request.popen.kill()
                request.popen.wait()
            raise
        if request.error is not None:
            raise request.error
        assert request.popen is not None
        return request.popen


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _forget_spawner() -> None:
    # A forked copy of this process has no spawner thread (fork copies only the caller).
    global _spawner, _spawner_lock  # noqa: PLW0603
    _spawner = None
    _spawner_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_spawner)


def spawn(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    stdout: IO[bytes] | int | None = None,
    stderr: IO[bytes] | int | None = None,
    own_session: bool = True,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` as a child that dies with this process, even by SIGKILL (Linux).

    Like ``subprocess.Popen`` with stdin from /dev/null; ``own_session`` puts it in a
    session and process group of its own, so a Ctrl-C in the terminal reaches only us and
    we stop it in order. Safe to call from any thread.

    Raises:
        OSError: the executable cannot be started.
    """
    global _spawner  # noqa: PLW0603
    with _spawner_lock:
        if _spawner is None:
            _spawner = _Spawner()
        spawner = _spawner
    options: dict[str, object] = {
        "cwd": cwd,
        "env": None if env is None else dict(env),
        "stdin": subprocess.DEVNULL,
        "stdout": stdout,
        "stderr": stderr,
        "start_new_session": own_session,
    }
    return spawner.spawn(list(argv), options)


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
                self._popen = spawn(
                    argv, cwd=cwd, env=env, stdout=log_file, stderr=subprocess.STDOUT
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
        Startup(self, is_ready, timeout, waiting_for).wait()

    def exit_code(self) -> int | None:
        """How the last run ended (``Popen.returncode``: negative for a signal); None while
        it runs or when it never started. Raises nothing."""
        popen = self._popen
        return None if popen is None else popen.poll()

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

    def log_excerpt(self) -> str:
        """The end of its log for messages, see :func:`log_excerpt`. Raises nothing."""
        return log_excerpt(self.log_path, self.log_tail())


def log_excerpt(path: Path, tail: Sequence[str]) -> str:
    """A message's account of a log: its last lines, or that it is empty. Raises nothing."""
    if not tail:
        return f"It wrote nothing to {path}."
    return f"Last lines of {path}:\n" + "\n".join(tail)


class Startup:
    """One launch of a server on its way to ready, checked one step at a time, so a caller
    can wait in whatever way suits it (a sleeping loop, or trio between its checks)."""

    def __init__(
        self,
        process: ServerProcess,
        is_ready: Callable[[], bool],
        timeout: float,
        waiting_for: str,
    ) -> None:
        """The clock starts now. Raises nothing."""
        self.process = process
        self.started = time.monotonic()
        self._is_ready = is_ready
        self._timeout = timeout
        self._waiting_for = waiting_for

    def ready(self) -> bool:
        """Whether the server is ready now; may block for a probe's own timeout.

        Raises:
            LocalInfraError: the process exited, or the timeout passed (the process is then
                stopped); the message carries the last lines of the log.
        """
        process = self.process
        code = process.exit_code()
        if code is not None or not process.is_running():
            raise LocalInfraError(
                f"{process.name} exited with code {code} before it was ready. "
                f"{process.log_excerpt()}"
            )
        if self._is_ready():
            return True
        if time.monotonic() - self.started > self._timeout:
            process.stop(_FAILED_START_GRACE)
            raise LocalInfraError(
                f"{process.name} was not ready after {self._timeout:g} s (waiting for "
                f"{self._waiting_for}), so it was stopped. {process.log_excerpt()}"
            )
        return False

    def wait(self) -> None:
        """Return once :meth:`ready`; stop the process on any failure.

        Raises:
            LocalInfraError: as :meth:`ready`.
        """
        try:
            while not self.ready():
                time.sleep(_POLL_INTERVAL)
        except BaseException:
            # Also on KeyboardInterrupt: a half-started JVM must not stay behind, and there is
            # nothing in it worth a long graceful shutdown.
            self.process.stop(_FAILED_START_GRACE)
            raise


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


def stop_together(servers: Sequence[ServerProcess], grace: float) -> None:
    """Stop ``servers`` at once: all get SIGTERM, share ``grace`` seconds, then SIGKILL.

    So stopping several takes the longest of their shutdowns, not the sum. Raises:
        LocalInfraError: one survived SIGKILL (the others are stopped first).
    """
    for server in servers:
        popen = server._popen
        if popen is not None and popen.poll() is None:
            _signal_group(popen.pid, signal.SIGTERM)
            _signal_group(popen.pid, signal.SIGCONT)
    deadline = time.monotonic() + grace
    errors: list[LocalInfraError] = []
    for server in servers:
        # No second SIGTERM (stop() would send one): a Python server handles the first and
        # may die of the next before it has shut down cleanly.
        try:
            server.wait_exited(max(0.0, deadline - time.monotonic()))
        except LocalInfraError:
            try:
                server.stop(0)
            except LocalInfraError as e:
                errors.append(e)
    if errors:
        raise errors[0]


def stop_all_servers(grace: float = _AT_EXIT_GRACE) -> None:
    """Stop every server this process started and has not stopped yet, together (see
    :func:`stop_together`). Raises nothing."""
    with _running_lock:
        leftovers = list(_running)
    with contextlib.suppress(LocalInfraError):
        stop_together(leftovers, grace)


atexit.register(stop_all_servers)
