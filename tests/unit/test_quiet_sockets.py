"""Quiet connections' sockets read together (gateway/connection/quiet_sockets.py), over
real socket pairs: heartbeats counted without waking the connection, anything else handed
over whole, a wake or a cancel taking the socket back with nothing lost."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import trio

from starlight_py.gateway.connection.quiet_sockets import (
    HEARTBEAT_FRAME,
    QuietSockets,
    only_heartbeats,
)

FRAME = b"\x01\x00\x01\x00\x00\x00\x04\x00\x14\x00\x28\xce"  # a method frame, any


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    yield ours, theirs
    ours.close()
    theirs.close()


def test_only_whole_heartbeat_frames_are_heartbeats() -> None:
    assert only_heartbeats(HEARTBEAT_FRAME)
    assert only_heartbeats(HEARTBEAT_FRAME * 3)
    assert only_heartbeats(bytearray(HEARTBEAT_FRAME))
    assert not only_heartbeats(b"")
    assert not only_heartbeats(HEARTBEAT_FRAME[:4])
    assert not only_heartbeats(HEARTBEAT_FRAME + FRAME)
    assert not only_heartbeats(b"\x08\x00\x01\x00\x00\x00\x00\xce")  # channel 1


def test_heartbeats_are_heard_and_the_next_frame_is_handed_over(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = pair
    heard: list[int] = []

    async def main() -> bytes | None:
        quiet = QuietSockets(quiet_after=1.0, tick=0.001)
        result: list[bytes | None] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(quiet.run)

            async def park() -> None:
                result.append(await quiet.wait(ours.fileno(), lambda: heard.append(1)))

            nursery.start_soon(park)
            await trio.sleep(0.01)
            assert len(quiet) == 1
            for count in range(1, 4):
                theirs.send(HEARTBEAT_FRAME)
                with trio.fail_after(10):
                    while len(heard) < count:
                        await trio.sleep(0.001)
            assert not result  # heartbeats never woke it
            theirs.send(FRAME)
            with trio.fail_after(10):
                while not result:
                    await trio.sleep(0.001)
            assert len(quiet) == 0
            assert (quiet.heartbeats, quiet.wakes) == (3, 1)
            nursery.cancel_scope.cancel()
        return result[0]

    assert trio.run(main) == FRAME
    assert len(heard) == 3


def test_a_wake_returns_none_and_leaves_the_bytes_in_the_socket(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = pair

    async def main() -> bytes | None:
        quiet = QuietSockets(quiet_after=1.0, tick=0.001)
        got: bytes | None = b"unset"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(quiet.run)

            async def park() -> None:
                nonlocal got
                got = await quiet.wait(ours.fileno(), lambda: None)

            nursery.start_soon(park)
            await trio.sleep(0.01)
            quiet.wake(ours.fileno())
            theirs.send(FRAME)  # after the wake: the connection reads it itself
            await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        return got

    assert trio.run(main) is None
    assert ours.recv(100) == FRAME


def test_a_closed_peer_is_an_end(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair

    async def main() -> bytes | None:
        quiet = QuietSockets(quiet_after=1.0, tick=0.001)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(quiet.run)
            theirs.close()
            with trio.fail_after(10):
                got = await quiet.wait(ours.fileno(), lambda: None)
            nursery.cancel_scope.cancel()
        return got

    assert trio.run(main) == b""


def test_a_cancelled_wait_takes_the_socket_back_with_nothing_read(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = pair

    async def main() -> int:
        quiet = QuietSockets(quiet_after=1.0, tick=60.0)  # it never looks
        with trio.move_on_after(0.05):
            await quiet.wait(ours.fileno(), lambda: None)
        theirs.send(FRAME)
        quiet.read_ready()  # not parked any more: nothing is read
        return len(quiet)

    assert trio.run(main) == 0
    assert ours.recv(100) == FRAME


def test_the_task_sleeps_while_nothing_is_parked() -> None:
    async def main() -> None:
        quiet = QuietSockets(quiet_after=1.0, tick=0.001)
        looks = 0
        original = quiet.read_ready

        def counted() -> None:
            nonlocal looks
            looks += 1
            original()

        quiet.read_ready = counted  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(quiet.run)
            await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
        assert looks == 0

    trio.run(main)
