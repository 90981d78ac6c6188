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

When the lot's task ends (the proxy stops), the sockets of the connections still parked
are closed.
"""

from __future__ import annotations

import contextlib
import logging
import select
from typing import Protocol

import trio

log = logging.getLogger("starlight.connection")

# What one look at the epoll set takes at most; more are taken at the next look.
_BATCH = 256


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


class ParkingLot:
    def __init__(self) -> None:
        self._epoll: select.epoll | None = None
        self._parked: dict[int, Parkable] = {}
        self._nursery: trio.Nursery | None = None
        self.resumed = 0  # since the start (metrics)

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

    def resume(self, fd: int) -> None:
        """The connection parked on `fd` needs its task again: it gets a new one."""
        connection = self._parked.pop(fd, None)
        if connection is None:
            return
        if self._epoll is not None:
            with contextlib.suppress(OSError):  # closed meanwhile: the reader finds out
                self._epoll.unregister(fd)
        self.resumed += 1
        if self._nursery is not None:
            self._nursery.start_soon(connection.resume)

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

    async def run(self) -> None:
        """Until cancelled: resume the parked connections whose sockets have more than a
        heartbeat to read (or an end)."""
        self._epoll = epoll = select.epoll()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                while True:
                    await trio.lowlevel.wait_readable(epoll.fileno())
                    for fd, _ in epoll.poll(0, _BATCH):
                        if self._wants_task(fd):
                            self.resume(fd)
        finally:
            self._nursery = None
            parked, self._parked = list(self._parked.values()), {}
            for connection in parked:
                try:
                    connection.close_parked()
                except Exception:
                    log.exception("closing a parked connection failed")
            self._epoll = None
            trio.lowlevel.notify_closing(epoll.fileno())
            epoll.close()
