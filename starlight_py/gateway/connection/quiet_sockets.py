"""Quiet connections are not woken by their clients' heartbeats.

An idle AMQP connection still gets its client's heartbeat every half interval, and each
one used to wake the connection's reader task: on two cores a wake-up of an idle process
costs about 300 µs of CPU whatever it then does, so 5,000 idle connections cost the proxy
tens of milliseconds of CPU a second for frames that say nothing.

A plain TCP connection that has received nothing but heartbeats for `quiet_after` seconds
(10 by default, amqpQuietConnectionAfterMillis) raises its socket's receive low-water mark
(SO_RCVLOWAT) to QUIET_LOW_WATER bytes, one more than a heartbeat frame: the kernel then
wakes the reader only for more than a lone heartbeat (any other frame is at least 9
bytes), or for the end of the connection. The heartbeats that wait in the socket are
drained by the connection's timer (`drain_heartbeats`), which wakes anyway to send the
proxy's heartbeats and to check the client's, so that they count as heard; what a drain
reads after them goes to the connection's reader. A frame other than a heartbeat is read
at once, as before; after it the mark is back to one byte. A connection goes quiet only
between frames (a drain must read from a frame's start). Plain TCP only (a TLS
connection's bytes cannot be judged before decryption).
"""

from __future__ import annotations

import os
import socket

from starlight_py.gateway.connection.parked_beats import HEARTBEAT_FRAME, READ_SIZE
from starlight_py.gateway.connection.parking import ParkingLot

QUIET_LOW_WATER = len(HEARTBEAT_FRAME) + 1
# s: a connection with no channel parks after this long with nothing but heartbeats (or
# after `quiet_after`, when shorter). Soon, so that a burst of new connections does not
# hold a task each for long: the memory of their tasks is reused by the next ones instead
# of staying with the process.
PARK_AFTER = 1.0


def leading_heartbeats(data: bytes | bytearray) -> int:
    """How many whole heartbeat frames `data` starts with."""
    size = len(HEARTBEAT_FRAME)
    if only_heartbeats(data):
        return len(data) // size
    count = 0
    while data[count * size : (count + 1) * size] == HEARTBEAT_FRAME:
        count += 1
    return count


def only_heartbeats(data: bytes | bytearray) -> bool:
    """Whether `data` is one or more whole heartbeat frames and nothing else."""
    size = len(HEARTBEAT_FRAME)
    if not data or data[0] != HEARTBEAT_FRAME[0] or len(data) % size:
        return False  # the usual answer, for the reads of a busy connection, found cheaply
    return data == HEARTBEAT_FRAME * (len(data) // size)


def set_low_water(fd: int, quiet: bool) -> bool:
    """Raise (`quiet`) or lower the receive low-water mark of the socket of `fd`; False
    when the socket refuses (closed meanwhile)."""
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=fd)
    except OSError:
        return False  # closed
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, QUIET_LOW_WATER if quiet else 1)
    except OSError:
        return False
    finally:
        sock.detach()  # the descriptor stays the connection's
    return True


def drain_heartbeats(fd: int) -> tuple[int, bytes | None]:
    """Read what waits in the socket of `fd`, the stream being at a frame's start, with one
    non-blocking read: how many heartbeats lead it, and what came after them (None when
    nothing did; b"" when the socket ended or broke; else those bytes, for the reader)."""
    try:
        data = os.read(fd, READ_SIZE)
    except BlockingIOError:
        return 0, None  # nothing waits
    except OSError:
        return 0, b""  # broken: the reader sees it as an end
    if not data:
        return 0, b""
    beats = leading_heartbeats(data)
    rest = data[beats * len(HEARTBEAT_FRAME) :]
    return beats, rest or None


class QuietSockets:
    """The process's quiet connections, counted (metrics), and the lot where those with no
    channel are parked (parking.py)."""

    def __init__(self, quiet_after: float) -> None:
        """`quiet_after`: seconds with nothing but heartbeats received before a
        connection's socket wakes it only for more."""
        self.quiet_after = quiet_after
        self.park_after = min(quiet_after, PARK_AFTER)
        self.quiet = 0  # connections whose socket has the raised mark now
        self._heartbeats = 0  # drained by the connections' timers, since the start
        self.parking = ParkingLot()

    def __len__(self) -> int:
        return self.quiet

    @property
    def heartbeats(self) -> int:
        """The client heartbeats drained since the start, by the connections' timers and by
        the parking lot (metrics)."""
        return self._heartbeats + self.parking.beats.heard

    def drained(self, beats: int) -> None:
        """A connection's timer drained `beats` heartbeats."""
        self._heartbeats += beats
