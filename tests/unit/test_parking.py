"""The parking lot of quiet connections (gateway/connection/parking.py), over socket pairs:
a parked socket that gets bytes resumes its connection in a task of the lot, unless the
connection says they were only heartbeats; a resume asked for by the connection itself
happens once; the connections still parked when the lot stops are closed; the lot keeps
the heartbeats of those that hand them over: it writes them, wakes the connection for more
than heartbeats and for a silent client, and hands the times back on a resume."""

from __future__ import annotations

import socket

import trio
import trio.testing

from starlight_py.gateway.connection.parking import ParkingLot


class Parked:
    def __init__(self, sock: socket.socket, heartbeats_only: bool = False) -> None:
        self.sock = sock
        self.heartbeats_only = heartbeats_only
        self.looked = 0
        self.resumed = 0
        self.closed = False
        self.woken: list[tuple[str, bytes]] = []
        self.lot = ParkingLot()  # set by the tests that hand over heartbeats
        self.times: tuple[float, float] | None = None

    def needs_task(self) -> bool:
        self.looked += 1
        if self.heartbeats_only:
            self.sock.recv(1024)  # read them: the socket is not readable any more
            return False
        return True

    async def resume(self) -> None:
        self.resumed += 1

    def close_parked(self) -> None:
        self.closed = True
        self.sock.close()

    def parked_input(self, data: bytes) -> None:
        self.woken.append(("input", data))
        self.lot.resume(self.sock.fileno())

    def parked_output(self, data: bytes) -> None:
        self.woken.append(("output", data))
        self.lot.resume(self.sock.fileno())

    def parked_silence(self) -> None:
        self.woken.append(("silence", b""))
        self.times = self.lot.resume(self.sock.fileno())


def pair() -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    return ours, theirs


async def settle() -> None:
    for _ in range(20):
        await trio.sleep(0.01)


def test_bytes_resume_a_parked_connection_once_and_heartbeats_do_not() -> None:
    lot = ParkingLot()
    (a, a_peer), (b, b_peer) = pair(), pair()
    talker, beater = Parked(a), Parked(b, heartbeats_only=True)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lot.run)
            await settle()
            assert lot.park(a.fileno(), talker) and lot.park(b.fileno(), beater)
            assert not lot.park(a.fileno(), talker)  # already parked
            assert len(lot) == 2
            await settle()
            assert (talker.looked, talker.resumed) == (0, 0)  # nothing to read yet
            b_peer.send(b"\x08\x00\x00\x00\x00\x00\x00\xce" * 2)
            a_peer.send(b"a frame")
            await settle()
            assert (talker.resumed, beater.resumed, beater.looked) == (1, 0, 1)
            assert len(lot) == 1 and lot.resumed == 1
            a_peer.send(b"more")  # not parked any more: the lot does not look
            await settle()
            assert talker.looked == 1
            lot.resume(b.fileno())  # the connection asks (output to write, a close)
            lot.resume(b.fileno())
            await settle()
            assert beater.resumed == 1 and len(lot) == 0
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert not talker.closed and not beater.closed
    for sock in (a, a_peer, b, b_peer):
        sock.close()


def test_the_connections_still_parked_are_closed_when_the_lot_stops() -> None:
    lot = ParkingLot()
    ours, theirs = pair()
    parked = Parked(ours)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lot.run)
            await settle()
            assert lot.park(ours.fileno(), parked)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert parked.closed and len(lot) == 0
    assert theirs.recv(10) == b""  # the peer sees the end
    theirs.close()


def test_nothing_parks_while_the_lot_is_not_running() -> None:
    ours, theirs = pair()
    assert not ParkingLot().park(ours.fileno(), Parked(ours))
    ours.close()
    theirs.close()


class Broken(Parked):
    def needs_task(self) -> bool:
        raise RuntimeError("broken")


def test_a_connection_that_fails_to_be_looked_at_is_resumed_and_the_lot_goes_on() -> None:
    lot = ParkingLot()
    (a, a_peer), (b, b_peer) = pair(), pair()
    broken, fine = Broken(a), Parked(b)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lot.run)
            await settle()
            assert lot.park(a.fileno(), broken) and lot.park(b.fileno(), fine)
            a_peer.send(b"x")
            await settle()
            b_peer.send(b"y")
            await settle()
            assert (broken.resumed, fine.resumed) == (1, 1)
            nursery.cancel_scope.cancel()

    trio.run(main)
    for sock in (a, a_peer, b, b_peer):
        sock.close()


HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"


def test_the_lot_keeps_the_heartbeats_handed_to_it_and_wakes_for_the_rest() -> None:
    lot = ParkingLot()
    (a, a_peer), (b, b_peer) = pair(), pair()
    talker, silent = Parked(a), Parked(b)
    talker.lot = silent.lot = lot

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lot.run)
            await trio.sleep(1)
            start = trio.current_time()
            assert not lot.keep_beats(a.fileno(), 10.0, start, start)  # not parked
            assert lot.park(a.fileno(), talker) and lot.park(b.fileno(), silent)
            assert lot.keep_beats(a.fileno(), 10.0, start, start)
            assert lot.keep_beats(b.fileno(), 10.0, start, start)
            await trio.sleep(4.6)
            assert a_peer.recv(100, socket.MSG_DONTWAIT) == HEARTBEAT  # due 4.5 s in
            assert b_peer.recv(100, socket.MSG_DONTWAIT) == HEARTBEAT
            for _ in range(5):  # the talker's client beats every 4 s; the other says nothing
                a_peer.send(HEARTBEAT * 2)
                await trio.sleep(4)
            assert silent.woken == [("silence", b"")]  # 20 s without a word
            assert silent.resumed == 1 and silent.times is not None
            assert silent.times[1] == start
            assert talker.woken == []
            a_peer.send(HEARTBEAT + b"\x01\x00")
            await trio.sleep(0.1)
            assert talker.woken == [("input", b"\x01\x00")] and talker.resumed == 1
            assert len(lot) == 0 and len(lot.beats) == 0
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    for sock in (a, a_peer, b, b_peer):
        sock.close()
