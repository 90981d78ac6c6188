"""Parked connections keep no task.

A connection is mostly waiting, and a waiting trio task is not free: the task, its
coroutine frames, its nursery and cancel scopes and the events it waits on come to about
9 KiB a connection, most of what an idle connection costs. A plain TCP connection with no
channel that has received nothing but heartbeats for a second (`PARK_AFTER`, or
`quiet_after` when shorter; quiet_sockets.py) is therefore *parked*: its reader task
ends, its socket (whose raised low-water mark lets heartbeats wait in it) joins one epoll
set of the process, and the process's timers
(connection_timers.py) go on sending the proxy's heartbeats and draining the client's,
writing straight to the socket. What only a task can do brings it back, in a task of
this lot's nursery, where it goes on as before:

- the client sends more than a heartbeat, or closes the socket (the epoll set reports it;
  heartbeats that pile up past the socket's mark are read by the lot, and it stays parked);
- the proxy has more to write than the socket takes at once, or closes the connection
  (a missed heartbeat, an expired credential, a shutdown: `ClientConnection._wake_writer`).

The heartbeats of a parked connection (most have one) are kept by the lot too, as a row
of one table (parked_beats.py, compiled when built), and the connection leaves the
process's timers while it is parked: the lot's task writes the heartbeats that are due, a
pass a second, with no Python call per connection. What a row reports (more than
heartbeats, a heartbeat the socket did not take, a client silent for two intervals)
resumes its connection, which takes its heartbeat times back.

When the lot's task ends (the proxy stops), the sockets of the connections still parked
are closed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import select
from typing import Protocol

import trio

from starlight_py.amqp import compiled
from starlight_py.gateway.connection import parked_beats
from starlight_py.gateway.connection.parked_beats import (
    HEARTBEAT_FRAME,
    MISSED,
    MORE,
    READ_SIZE,
    READY,
    STUCK,
    Beats,
)

log = logging.getLogger("starlight.connection")

# What one look at the epoll set takes at most; more are taken at the next look.
_BATCH = 256


def new_beats() -> Beats:
    """The table of parked connections' heartbeats: compiled when it was built."""
    if compiled.parked_beats is not None:
        table: Beats = compiled.parked_beats(HEARTBEAT_FRAME, READ_SIZE)
        return table
    return parked_beats.ParkedBeats(HEARTBEAT_FRAME, READ_SIZE)


class Parkable(Protocol):
    def needs_task(self) -> bool:
        """Its socket has something to read: False when that was only heartbeats (read
        and counted by the call: two of them pass the socket's mark), True when the
        connection is to resume."""
        ...

    async def resume(self) -> None:
        """Go on in the task this is called in, until the connection ends or parks again."""
        ...

    def close_parked(self) -> None:
        """The proxy stops while the connection is parked: close its socket, now."""
        ...

    def parked_input(self, data: bytes) -> None:
        """Its row read more than heartbeats (`data`: what followed them; b"": the socket
        ended): the connection resumes, to read it."""
        ...

    def parked_output(self, data: bytes) -> None:
        """The socket took only part of a heartbeat its row wrote: `data` is the rest,
        for the connection's writer."""
        ...

    def parked_silence(self) -> None:
        """Its row heard nothing from the client for two heartbeat intervals."""
        ...


class ParkingLot:
    def __init__(self, beats: Beats | None = None) -> None:
        self._epoll: select.epoll | None = None
        self._parked: dict[int, Parkable] = {}
        self._nursery: trio.Nursery | None = None
        self.resumed = 0  # since the start (metrics)
        self.beats = beats if beats is not None else new_beats()
        self._following = math.inf  # when a row of `beats` is due next
        self._sleep: trio.CancelScope | None = None  # the task's wait, until then

    def __len__(self) -> int:
        return len(self._parked)

    def park(self, fd: int, connection: Parkable) -> bool:
        """Watch `fd` for `connection`, which keeps no task from now on; False when it
        cannot be parked (the lot is not running, the socket is gone)."""
        if self._nursery is None or self._epoll is None or fd in self._parked:
            return False
        try:
            self._epoll.register(fd, select.EPOLLIN | select.EPOLLRDHUP)
        except OSError:
            return False
        self._parked[fd] = connection
        return True

    def keep_beats(self, fd: int, heartbeat: float, last_sent: float, last_received: float) -> bool:
        """Keep the heartbeats of the connection parked on `fd` (`heartbeat` seconds; the
        last sent and received at those times of trio's clock) until it resumes; False
        when it is not parked here."""
        if fd not in self._parked:
            return False
        due = self.beats.add(fd, heartbeat, last_sent, last_received, trio.current_time())
        if due < self._following:
            self._following = due
            if self._sleep is not None:
                self._sleep.deadline = due
        return True

    def resume(self, fd: int) -> tuple[float, float] | None:
        """The connection parked on `fd` needs its task again: it gets a new one. When
        the lot kept its heartbeats: when it last sent one and heard one."""
        times = self.beats.remove(fd)
        connection = self._parked.pop(fd, None)
        if connection is None:
            return times
        if self._epoll is not None:
            with contextlib.suppress(OSError):  # closed meanwhile: the reader finds out
                self._epoll.unregister(fd)
        self.resumed += 1
        if self._nursery is not None:
            self._nursery.start_soon(connection.resume)
        return times

    def _wants_task(self, fd: int) -> bool:
        connection = self._parked.get(fd)
        if connection is None:
            return False
        try:
            return connection.needs_task()
        except Exception:
            # Its own task will find out what is wrong; the lot must go on for the others.
            log.exception("a parked connection could not be looked at")
            return True

    def _handle(self, events: list[parked_beats.Event]) -> None:
        for fd, kind, data in events:
            if kind == READY:
                if self._wants_task(fd):
                    self.resume(fd)
                continue
            connection = self._parked.get(fd)
            if connection is None:
                self.beats.remove(fd)
                continue
            try:
                if kind == MORE:
                    connection.parked_input(data)
                elif kind == STUCK:
                    connection.parked_output(data)
                elif kind == MISSED:
                    connection.parked_silence()
            except Exception:
                log.exception("a parked connection could not be woken")
                self.resume(fd)

    async def run(self) -> None:
        """Until cancelled: keep the heartbeats of the parked connections, and resume
        those whose sockets have more than a heartbeat to read (or an end)."""
        self._epoll = epoll = select.epoll()
        beats = self.beats
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                while True:
                    with trio.move_on_at(self._following) as sleep:
                        self._sleep = sleep
                        await trio.lowlevel.wait_readable(epoll.fileno())
                    self._sleep = None
                    now = trio.current_time()
                    ready = epoll.poll(0, _BATCH)
                    if ready:
                        self._handle(beats.drain(ready, now))
                    if now >= self._following:
                        events, self._following = beats.tick(now)
                        self._handle(events)
        finally:
            self._nursery = None
            self._sleep = None
            for fd in self._parked:
                beats.remove(fd)
            parked, self._parked = list(self._parked.values()), {}
            for connection in parked:
                try:
                    connection.close_parked()
                except Exception:
                    log.exception("closing a parked connection failed")
            self._epoll = None
            trio.lowlevel.notify_closing(epoll.fileno())
            epoll.close()
