"""The heartbeats of parked connections, kept in one table (parking.py).

A parked connection keeps no task, but it still owes its client a heartbeat every half
interval, and it must notice when the client says nothing for two intervals. Done by a
call of each connection's own timer, that is a Python call per connection every half
interval, and with thousands of parked connections those calls were most of what the
proxy spent while idle. Here each parked connection with a heartbeat is a row of one
table, and the parking lot's task goes through the rows that are due, a step at a time (a
second, or a twentieth of the row's heartbeat when that is shorter). For each row due:

- it reads the socket: the client's heartbeats (one at a time waits there, below the
  socket's raised mark: quiet_sockets.py) count as heard;
- when the proxy's heartbeat is due (half an interval after the last one, a step early at
  most), it writes one;
- it reports only what needs the connection: more than heartbeats read, or the end of the
  socket (`MORE`, with those bytes); a heartbeat the socket did not take whole (`STUCK`,
  with what it did not take); two intervals with nothing heard (`MISSED`).

Reading at each pass matters: the client sends its heartbeats about as often as the proxy
(every half interval), so the read a pass makes anyway keeps at most one heartbeat in the
socket, below the mark, and the epoll set is not woken for them. Read less often, every
second heartbeat of every connection would wake the process on its own (at 5,000 parked
connections, 83 wake-ups a second, half again the CPU of the whole table). The sockets the
lot's epoll set reports readable (two heartbeats pass the mark) are read here as well
(`drain`), and a socket of a parked connection without a row comes back as `READY`, for
the lot to look at it the usual way.

The same table is compiled (`starlight_py.amqp._native.ParkedBeats`, native/src/parked_beats.rs)
when the package was built with Rust; the one here does the same with a heap instead of a
scan (a Python pass over every row each step would cost more than it saves), and is what
the compiled one is held to (tests/unit/test_parked_beats.py).
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
from typing import Protocol

# A heartbeat frame on channel 0, as clients send it (type 8, channel 0, size 0, frame end).
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"
READ_SIZE = 64 * 1024  # what one read of a quiet socket takes at most (as the reader's)

MORE = 1
STUCK = 2
MISSED = 3
READY = 4

# (file descriptor, MORE/STUCK/MISSED/READY, bytes: what was read, or not written)
Event = tuple[int, int, bytes]


class Beats(Protocol):
    """What the parking lot needs of a table (this module's, or the compiled one)."""

    heard: int  # heartbeats read, since the start

    def __len__(self) -> int: ...

    def add(
        self, fd: int, heartbeat: float, last_sent: float, last_received: float, now: float
    ) -> float:
        """Keep the heartbeats of the socket of `fd` (`heartbeat` seconds, the last sent
        and received at those times of trio's clock); when its row is due."""
        ...

    def remove(self, fd: int) -> tuple[float, float] | None:
        """Keep them no more: when the last heartbeat was sent and one was received."""
        ...

    def drain(self, ready: list[tuple[int, int]], now: float) -> list[Event]:
        """Read the sockets of `ready` (the epoll set's (fd, events))."""
        ...

    def tick(self, now: float) -> tuple[list[Event], float]:
        """Do what is due at `now`; the events, and when a row is due next (inf: none)."""
        ...


def step_of(heartbeat: float) -> float:
    """How late (or, to send, how early) a row's work may be done: rows due within one
    step share a pass."""
    return min(1.0, heartbeat / 20)


def due_of(heartbeat: float, last_sent: float, last_received: float, now: float) -> float:
    """When a row is next due: its next heartbeat to send, or the client's missed,
    rounded up to a step (and after `now`)."""
    step = step_of(heartbeat)
    due = min(last_sent + heartbeat / 2 - step, last_received + 2 * heartbeat)
    if due <= now:
        return next_step(heartbeat, now)
    return math.ceil(due / step) * step


def next_step(heartbeat: float, now: float) -> float:
    """The step after `now`'s."""
    step = step_of(heartbeat)
    return math.ceil((now + step) / step) * step


class _Row:
    __slots__ = ("heartbeat", "last_received", "last_sent", "sequence")

    def __init__(self, heartbeat: float, last_sent: float, last_received: float) -> None:
        self.heartbeat = heartbeat
        self.last_sent = last_sent
        self.last_received = last_received
        self.sequence = 0  # of its entry in the heap that counts


class ParkedBeats:
    """The table in Python."""

    def __init__(self, frame: bytes, read_size: int) -> None:
        self._frame = frame
        self._read_size = read_size
        self._rows: dict[int, _Row] = {}
        self._heap: list[tuple[float, int, int]] = []  # (due, sequence, fd)
        self._sequence = itertools.count(1)
        self.heard = 0

    def __len__(self) -> int:
        return len(self._rows)

    def add(
        self, fd: int, heartbeat: float, last_sent: float, last_received: float, now: float
    ) -> float:
        row = self._rows[fd] = _Row(heartbeat, last_sent, last_received)
        return self._schedule(fd, row, due_of(heartbeat, last_sent, last_received, now))

    def remove(self, fd: int) -> tuple[float, float] | None:
        row = self._rows.pop(fd, None)
        if row is None:
            return None
        if len(self._heap) > 64 and len(self._heap) > 2 * len(self._rows):
            self._heap = [entry for entry in self._heap if self._counts(entry)]
            heapq.heapify(self._heap)
        return row.last_sent, row.last_received

    def drain(self, ready: list[tuple[int, int]], now: float) -> list[Event]:
        events: list[Event] = []
        for fd, _ in ready:
            row = self._rows.get(fd)
            if row is None:
                events.append((fd, READY, b""))
                continue
            rest = self._read(fd, row, now)
            if rest is not None:
                events.append((fd, MORE, rest))
        return events

    def tick(self, now: float) -> tuple[list[Event], float]:
        events: list[Event] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if not self._counts(entry):
                continue
            fd = entry[2]
            row = self._rows[fd]
            event = self._beat(fd, row, now)
            if event is None:
                due = due_of(row.heartbeat, row.last_sent, row.last_received, now)
            else:
                events.append(event)  # the connection takes its row back (soon)
                due = next_step(row.heartbeat, now)
            self._schedule(fd, row, due)
        while heap and not self._counts(heap[0]):
            heapq.heappop(heap)
        return events, heap[0][0] if heap else math.inf

    def _beat(self, fd: int, row: _Row, now: float) -> Event | None:
        heartbeat = row.heartbeat
        rest = self._read(fd, row, now)
        if rest is not None:
            return fd, MORE, rest
        if now - row.last_received > 2 * heartbeat:
            return fd, MISSED, b""
        if now >= row.last_sent + heartbeat / 2 - step_of(heartbeat):
            frame = self._frame
            try:
                sent = os.write(fd, frame)
            except OSError:
                sent = 0  # full or broken: the connection's writer finds out which
            row.last_sent = now
            if sent < len(frame):
                return fd, STUCK, frame[sent:]
        return None

    def _read(self, fd: int, row: _Row, now: float) -> bytes | None:
        """What follows the heartbeats waiting in the socket (b"": its end), or None."""
        try:
            data = os.read(fd, self._read_size)
        except BlockingIOError:
            return None
        except OSError:
            return b""  # broken: the connection's reader sees it as an end
        if not data:
            return b""
        frame = self._frame
        size = len(frame)
        beats = 0
        while data[beats * size : (beats + 1) * size] == frame:
            beats += 1
        if beats:
            row.last_received = now
            self.heard += beats
        rest = data[beats * size :]
        return rest or None

    def _schedule(self, fd: int, row: _Row, due: float) -> float:
        row.sequence = next(self._sequence)
        heapq.heappush(self._heap, (due, row.sequence, fd))
        return due

    def _counts(self, entry: tuple[float, int, int]) -> bool:
        row = self._rows.get(entry[2])
        return row is not None and row.sequence == entry[1]
