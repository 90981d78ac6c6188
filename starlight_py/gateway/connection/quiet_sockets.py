"""The sockets of quiet connections, read together a few dozen times a second.

An idle AMQP connection still gets its client's heartbeat every half interval. Read by the
connection's own task, each heartbeat costs a wake-up of that task: on two cores about
200 µs of CPU, so 5,000 idle connections cost the process tens of milliseconds of CPU a
second for frames that say nothing. A connection that has exchanged nothing but heartbeats
for `quiet_after` seconds (10 by default, amqpQuietConnectionAfterMillis) parks its
socket here instead: one task asks the kernel every TICK seconds, in one `epoll_wait`
that does not block, which parked sockets have bytes, reads them, and counts a read that
holds heartbeat frames only as a heartbeat heard, without waking the connection. Anything
else the client sends wakes its connection with the bytes read; so does anything the proxy
sends it (a delivery), so that a connection in use reads its socket itself again.

The price: the first frame a client sends after a quiet spell waits up to TICK seconds.
Plain TCP connections only (a TLS connection's bytes cannot be judged before decryption).
"""

from __future__ import annotations

import contextlib
import os
import select
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

# A heartbeat frame on channel 0, as clients send it (type 8, channel 0, size 0, frame end).
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"
TICK = 0.025  # seconds between two looks at the parked sockets
READ_SIZE = 65536


def only_heartbeats(data: bytes | bytearray) -> bool:
    """Whether `data` is one or more whole heartbeat frames and nothing else."""
    size = len(HEARTBEAT_FRAME)
    if not data or data[0] != HEARTBEAT_FRAME[0] or len(data) % size:
        return False  # the usual answer, for the reads of a busy connection, found cheaply
    return data == HEARTBEAT_FRAME * (len(data) // size)


@dataclass(eq=False)
class _Parked:
    heard: Callable[[], None]
    woken: trio.Event = field(default_factory=trio.Event)
    data: bytes | None = None  # what woke it (b"": closed or broken); None: `wake`


class QuietSockets:
    """Parked sockets of the process's quiet connections (trio thread only)."""

    def __init__(self, quiet_after: float, tick: float = TICK) -> None:
        """`quiet_after`: seconds with nothing but heartbeats either way before a
        connection parks its socket here."""
        self.quiet_after = quiet_after
        self.tick = tick
        self._parked: dict[int, _Parked] = {}
        self._epoll: select.epoll | None = None
        self._any_parked = trio.Event()
        self.heartbeats = 0  # heard while parked, since the start (metrics, tests)
        self.wakes = 0  # parked connections woken by what their client sent

    def __len__(self) -> int:
        return len(self._parked)

    async def wait(self, fd: int, heard: Callable[[], None]) -> bytes | None:
        """Park `fd` (a plain TCP socket, non-blocking) until its client sends more than
        heartbeats: the bytes read then (b"" when it closed the socket or it broke); None
        after `wake`. `heard()` is called for each read of heartbeats only meanwhile.
        Cancelling the wait takes the socket back, with nothing read lost."""
        if self._epoll is None:
            self._epoll = select.epoll()
        parked = _Parked(heard)
        self._epoll.register(fd, select.EPOLLIN | select.EPOLLRDHUP)
        self._parked[fd] = parked
        self._any_parked.set()
        try:
            await parked.woken.wait()
        finally:
            self._unpark(fd, parked)
        return parked.data

    def wake(self, fd: int) -> None:
        """The connection of `fd` has something to do: it reads its socket itself again."""
        parked = self._parked.get(fd)
        if parked is not None:
            parked.woken.set()

    def _unpark(self, fd: int, parked: _Parked) -> None:
        if self._parked.get(fd) is parked:
            del self._parked[fd]
            if self._epoll is not None:
                # Closed meanwhile: the kernel dropped it already.
                with contextlib.suppress(OSError, ValueError):
                    self._epoll.unregister(fd)

    async def run(self) -> None:
        """Look at the parked sockets every `tick` seconds while there are any."""
        while True:
            await self._any_parked.wait()
            while self._parked:
                await trio.sleep(self.tick)
                self.read_ready()
            self._any_parked = trio.Event()

    def read_ready(self) -> None:
        """Read every parked socket that has bytes (or an end), without blocking."""
        if self._epoll is None or not self._parked:
            return
        for fd, _ in self._epoll.poll(0):
            parked = self._parked.get(fd)
            if parked is None or parked.woken.is_set():
                continue
            try:
                data = os.read(fd, READ_SIZE)
            except BlockingIOError:
                continue
            except OSError:
                data = b""  # reset by the peer: the same end as a close
            if only_heartbeats(data):
                self.heartbeats += 1
                parked.heard()
                continue
            self.wakes += 1
            parked.data = data
            parked.woken.set()
            self._unpark(fd, parked)
