"""A load generator process whose output lines are read as they come, with their arrival time.

PerfTest and pulsar-perf print one line per reporting interval; the measured window starts
and ends when given lines arrive, and the CPU of the servers is read at those moments (see
``cpu``). So lines are read live by a thread, stamped with ``time.monotonic()`` on arrival,
copied to a log file (for a post-mortem) and queued for the case runner.

The process runs in its own session, like the servers of ``infra``: stopping it signals
the whole group (``bin/pulsar-perf`` is a bash script that execs java, PerfTest is java).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from starlight_py.bench.infra import BenchError, group_members

_TAIL_LINES = 40


@dataclass(frozen=True)
class OutputLine:
    """One line the process printed, and when we read it (``time.monotonic()``)."""

    text: str
    at: float


class WatchedProcess:
    """A child process in its own session; its stdout and stderr, line by line."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._lines: queue.Queue[OutputLine | None] = queue.Queue()
        self._tail: deque[str] = deque(maxlen=_TAIL_LINES)
        self._ended = False
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )
        except OSError as e:
            raise BenchError(f"cannot start {name} ({argv[0]}): {e}") from e
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._popen.pid

    def _read(self) -> None:
        assert self._popen.stdout is not None
        with self.log_path.open("ab") as log_file:
            for raw in self._popen.stdout:
                log_file.write(raw)
                log_file.flush()
                text = raw.decode(errors="replace").rstrip()
                self._tail.append(text)
                self._lines.put(OutputLine(text, time.monotonic()))
        self._lines.put(None)

    def next_line(self, until: float) -> OutputLine | None:
        """The next line, waiting until ``until`` (monotonic) at most.

        Returns None at that deadline or when the output has ended (see ``ended``).
        """
        if self._ended:
            return None
        try:
            line = self._lines.get(timeout=max(0.0, until - time.monotonic()))
        except queue.Empty:
            return None
        if line is None:
            self._ended = True
        return line

    @property
    def ended(self) -> bool:
        """True once every line has been handed out and the output is closed."""
        return self._ended

    def wait_for(self, marker: str, timeout: float) -> bool:
        """Read lines until one contains ``marker``; False at the timeout or end of output."""
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            line = self.next_line(until)
            if line is None:
                if self.ended:
                    return False
                continue
            if marker in line.text:
                return True
        return False

    def drain(self, timeout: float) -> list[OutputLine]:
        """Every line until the output ends or ``timeout`` seconds pass."""
        until = time.monotonic() + timeout
        lines = []
        while not self._ended and time.monotonic() < until:
            line = self.next_line(until)
            if line is not None:
                lines.append(line)
        return lines

    def exit_code(self) -> int | None:
        return self._popen.poll()

    def tail(self, lines: int = 12) -> str:
        return "\n".join(list(self._tail)[-lines:])

    def stop(self, first: signal.Signals = signal.SIGTERM, grace: float = 15.0) -> None:
        """Send ``first`` to the group (SIGINT lets the Java tools print their final
        summary), SIGKILL after ``grace`` seconds. Idempotent; raises nothing."""
        if self._popen.poll() is None:
            _signal_group(self._popen.pid, first)
            try:
                self._popen.wait(grace)
            except subprocess.TimeoutExpired:
                _signal_group(self._popen.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._popen.wait(10)
        # A member the leader forked may outlive it; the group id stays reserved (ours)
        # while any member lives, so these pids are ours.
        for pid in group_members(self._popen.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._reader.join(5)
        if self._popen.stdout is not None:
            with contextlib.suppress(OSError):
                self._popen.stdout.close()


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
