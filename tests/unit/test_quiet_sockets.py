"""Quiet connections (gateway/connection/quiet_sockets.py), over real loopback TCP
sockets: with the raised low-water mark a lone heartbeat does not make the socket
readable and anything more does; the timers' drain reads heartbeats only, never a frame."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator

import pytest

from starlight_py.gateway.connection.quiet_sockets import (
    HEARTBEAT_FRAME,
    drain_heartbeats,
    leading_heartbeats,
    only_heartbeats,
    set_low_water,
)

FRAME = b"\x01\x00\x01\x00\x00\x00\x04\x00\x14\x00\x28\xce"  # a method frame, any


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(the proxy's end, non-blocking; the client's end)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        client = socket.create_connection(listener.getsockname())
        ours, _ = listener.accept()
    ours.setblocking(False)
    yield ours, client
    ours.close()
    client.close()


def readable(sock: socket.socket, settle: float = 0.05) -> bool:
    time.sleep(settle)  # loopback delivers at once; a margin for a busy machine
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def test_only_whole_heartbeat_frames_are_heartbeats() -> None:
    assert only_heartbeats(HEARTBEAT_FRAME)
    assert only_heartbeats(HEARTBEAT_FRAME * 3)
    assert only_heartbeats(bytearray(HEARTBEAT_FRAME))
    assert not only_heartbeats(b"")
    assert not only_heartbeats(HEARTBEAT_FRAME[:4])
    assert not only_heartbeats(HEARTBEAT_FRAME + FRAME)
    assert not only_heartbeats(b"\x08\x00\x01\x00\x00\x00\x00\xce")  # channel 1


def test_a_lone_heartbeat_does_not_wake_a_quiet_socket_and_a_frame_does(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, client = pair
    assert set_low_water(ours.fileno(), True)
    client.sendall(HEARTBEAT_FRAME)
    assert not readable(ours)
    client.sendall(FRAME)
    assert readable(ours)
    assert ours.recv(100) == HEARTBEAT_FRAME + FRAME


def test_the_end_of_the_connection_wakes_a_quiet_socket(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, client = pair
    assert set_low_water(ours.fileno(), True)
    client.close()
    assert readable(ours)
    assert ours.recv(100) == b""


def test_lowering_the_mark_again_wakes_for_a_heartbeat(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, client = pair
    assert set_low_water(ours.fileno(), True)
    assert set_low_water(ours.fileno(), False)
    client.sendall(HEARTBEAT_FRAME)
    assert readable(ours)


def test_the_drain_reads_heartbeats_and_hands_on_anything_after_them(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, client = pair
    assert drain_heartbeats(ours.fileno()) == (0, None)  # nothing there
    client.sendall(HEARTBEAT_FRAME * 2)
    time.sleep(0.05)
    assert drain_heartbeats(ours.fileno()) == (2, None)
    client.sendall(HEARTBEAT_FRAME + FRAME + HEARTBEAT_FRAME)
    time.sleep(0.05)
    # What follows the first frame other than a heartbeat is the reader's, as it came.
    assert drain_heartbeats(ours.fileno()) == (1, FRAME + HEARTBEAT_FRAME)
    client.sendall(FRAME[:5])  # the start of a frame is not a heartbeat either
    time.sleep(0.05)
    assert drain_heartbeats(ours.fileno()) == (0, FRAME[:5])
    client.close()
    time.sleep(0.05)
    assert drain_heartbeats(ours.fileno()) == (0, b"")  # the end


def test_leading_heartbeats_are_counted_up_to_the_first_other_byte() -> None:
    assert leading_heartbeats(b"") == 0
    assert leading_heartbeats(HEARTBEAT_FRAME * 3) == 3
    assert leading_heartbeats(HEARTBEAT_FRAME * 2 + FRAME + HEARTBEAT_FRAME) == 2
    assert leading_heartbeats(HEARTBEAT_FRAME[:7]) == 0


def test_a_closed_descriptor_is_refused_quietly() -> None:
    sock = socket.socket()
    fd = sock.fileno()
    sock.close()
    assert set_low_water(fd, True) is False
    assert drain_heartbeats(fd) == (0, b"")
