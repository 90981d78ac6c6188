"""CPU per message of the server processes, read from /proc over the measured window.

A reading is taken when the window opens and one when it closes (``CpuMeter``); the
difference, divided by the messages consumed in that same window, is the CPU a message cost
each server. A server is the process group of its first process (``infra`` starts each in
its own session) and the groups of that process's descendants (``server_members``), so
the figure covers every process and thread of it: the ``serve --workers`` supervisor and
each worker (every one in a group of its own), RabbitMQ's beam and its helpers, the Pulsar
JVM.

For the proxy the window is also split by thread: ``/proc/<pid>/task/<tid>/stat`` of every
thread, grouped by its name (``comm``) with trailing numbers dropped, so "Trio thread 12"
and "Trio thread 40" are one group. Threads that ended inside the window took their CPU
with them from the task list (the process total keeps it): that remainder is reported as
``EXITED_THREADS``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

EXITED_THREADS = "(ended threads)"
_TICKS = os.sysconf("SC_CLK_TCK")
# "pulsar-io-2-1" -> "pulsar-io", "Trio thread 12" -> "Trio thread", "python3" stays.
_TRAILING_NUMBER = re.compile(r"(?:[-_ .#:]\d+)+$")
# Clock ticks are 10 ms: a remainder below this is rounding, not ended threads.
_NEGLIGIBLE_SECONDS = 0.02


@dataclass(frozen=True)
class ThreadCpu:
    name: str  # comm, as the kernel has it (15 characters at most)
    seconds: float


@dataclass(frozen=True)
class CpuReading:
    """CPU seconds used so far, per server; per thread for the one being split."""

    at: float  # time.monotonic()
    processes: dict[str, float]
    threads: dict[int, ThreadCpu] = field(default_factory=dict)  # tid -> usage


@dataclass(frozen=True)
class CpuWindow:
    """CPU seconds each server used between two readings."""

    seconds: float  # wall-clock length of the window
    processes: dict[str, float]
    threads: dict[str, float]  # thread group -> CPU seconds (the split server only)

    def us_per_message(self, messages: int) -> dict[str, float]:
        return _per_message(self.processes, messages)

    def threads_us_per_message(self, messages: int) -> dict[str, float]:
        return _per_message(self.threads, messages)

    def percent_of_one_core(self) -> dict[str, float]:
        if self.seconds <= 0:
            return {}
        return {name: round(100 * cpu / self.seconds, 1) for name, cpu in self.processes.items()}


def _per_message(cpu_seconds: Mapping[str, float], messages: int) -> dict[str, float]:
    result = {}
    for name, seconds in cpu_seconds.items():
        value = us_per_message(seconds, messages)
        if value is not None:
            result[name] = value
    return result


def us_per_message(cpu_seconds: float, messages: int) -> float | None:
    """Microseconds of CPU per message, or None when no message was counted."""
    if messages <= 0:
        return None
    return round(cpu_seconds / messages * 1e6, 1)


def thread_group(comm: str) -> str:
    """The name threads are grouped under: ``comm`` without its trailing numbers."""
    stripped = _TRAILING_NUMBER.sub("", comm.strip())
    return stripped or comm.strip() or "?"


def window_between(before: CpuReading, after: CpuReading, split: str | None) -> CpuWindow:
    """The CPU used between two readings. ``split`` names the server whose threads were
    read; its total minus the sum of its threads' is ``EXITED_THREADS``."""
    processes = {
        name: max(0.0, after.processes[name] - before.processes.get(name, 0.0))
        for name in after.processes
    }
    threads: dict[str, float] = {}
    for tid, usage in after.threads.items():
        earlier = before.threads.get(tid)
        # A tid seen twice under another name was reused by a new thread: count it new.
        start = earlier.seconds if earlier is not None and earlier.name == usage.name else 0.0
        group = thread_group(usage.name)
        threads[group] = threads.get(group, 0.0) + max(0.0, usage.seconds - start)
    if split is not None and split in processes and (before.threads or after.threads):
        remainder = processes[split] - sum(threads.values())
        if remainder > _NEGLIGIBLE_SECONDS:
            threads[EXITED_THREADS] = remainder
    return CpuWindow(round(after.at - before.at, 3), processes, threads)


@dataclass(frozen=True)
class ProcessStat:
    """What the window needs of one process's /proc/<pid>/stat."""

    ppid: int
    pgrp: int
    cpu_seconds: float  # user + system, all its threads (ended ones included)


def read_processes() -> dict[int, ProcessStat]:
    """Every process on the host, from one pass over /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _read_stat(Path(f"/proc/{entry}/stat"))
            if stat is not None:
                fields = stat[1]
                cpu = (int(fields[11]) + int(fields[12])) / _TICKS
                table[int(entry)] = ProcessStat(int(fields[1]), int(fields[2]), cpu)
    return table


def server_members(root: int, table: Mapping[int, ProcessStat]) -> list[int]:
    """The processes of the server whose first process is ``root`` (a process group
    leader): its group, and the groups of every process descending from it. ``serve
    --workers`` starts each worker in a group of its own, so the group alone would miss
    them; a worker restarted by the supervisor is found anew at every reading."""
    children: dict[int, list[int]] = {}
    for pid, stat in table.items():
        children.setdefault(stat.ppid, []).append(pid)
    groups, pending = {root}, [root]
    while pending:
        for child in children.get(pending.pop(), []):
            groups.add(table[child].pgrp)
            pending.append(child)
    return sorted(pid for pid, stat in table.items() if stat.pgrp in groups)


def read_threads(pids: Sequence[int]) -> dict[int, ThreadCpu]:
    """Every thread of these processes, with its CPU seconds so far."""
    threads: dict[int, ThreadCpu] = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # the process ended meanwhile
        for tid_text in tids:
            stat = _read_stat(Path(f"/proc/{pid}/task/{tid_text}/stat"))
            if stat is not None:
                name, fields = stat
                threads[int(tid_text)] = ThreadCpu(
                    name, (int(fields[11]) + int(fields[12])) / _TICKS
                )
    return threads


def _read_stat(path: Path) -> tuple[str, list[str]] | None:
    """The name in a /proc stat file and the fields after it: state, ppid, pgrp, ...,
    utime (index 11), stime (12). None when the process or thread is gone."""
    try:
        text = path.read_text()
    except OSError:
        return None
    # "pid (comm) state ...": comm may hold spaces and parentheses itself.
    return text[text.find("(") + 1 : text.rfind(")")], text[text.rfind(")") + 2 :].split()


class CpuMeter:
    """Reads the servers' CPU when the measured window opens and when it closes.

    ``processes`` maps a server's name to its first process (a process group leader, see
    ``server_members``); ``split`` names the one whose threads are read too (the proxy), or
    None.
    """

    def __init__(self, processes: Mapping[str, int], split: str | None = None) -> None:
        self.processes = dict(processes)
        self.split = split if split in self.processes else None
        self._start: CpuReading | None = None
        self._end: CpuReading | None = None

    def read(self) -> CpuReading:
        table = read_processes()
        members = {name: server_members(root, table) for name, root in self.processes.items()}
        usage = {
            name: sum(table[pid].cpu_seconds for pid in pids) for name, pids in members.items()
        }
        threads = read_threads(members[self.split]) if self.split else {}
        return CpuReading(time.monotonic(), usage, threads)

    def open_window(self) -> None:
        self._start = self.read()

    def close_window(self) -> None:
        self._end = self.read()

    def window(self) -> CpuWindow | None:
        """The CPU used in the window, or None when it was not both opened and closed."""
        if self._start is None or self._end is None:
            return None
        return window_between(self._start, self._end, self.split)
