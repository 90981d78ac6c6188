"""What runs on this machine, read from /proc: for tests that must leave nothing behind."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether ``pid`` runs. A zombie does not: it is dead, only not yet reaped (an orphan
    may wait a while for a reaper that is not a real init)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state follows the command name, which is in parentheses and may hold spaces.
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def still_alive(pids: Iterable[int], timeout: float = 30.0) -> list[int]:
    """Those of ``pids`` still alive once they all died or ``timeout`` seconds passed."""
    remaining = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        remaining = [pid for pid in remaining if alive(pid)]
        if not remaining or time.monotonic() > deadline:
            return remaining
        time.sleep(0.1)


def living_processes_mentioning(text: str) -> list[int]:
    """Pids of living processes whose command line contains ``text``."""
    needle = text.encode()
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if needle in cmdline.read_bytes() and alive(int(cmdline.parent.name)):
                found.append(int(cmdline.parent.name))
        except OSError:  # it exited while we looked
            continue
    return found


def process_group(pgid: int) -> list[int]:
    """Living processes of process group ``pgid``: a server and whatever it started."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command: state, ppid, pgrp.
        if int(fields[2]) == pgid and alive(int(stat.parent.name)):
            members.append(int(stat.parent.name))
    return members


def children_of(pid: int) -> list[int]:
    """Living processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and alive(int(stat.parent.name)):
            found.append(int(stat.parent.name))
    return found
