"""The poll(2)-based wait kazoo's connection thread uses (metadata/kazoo_handler.py) keeps
kazoo's own select contract, on real sockets."""

from __future__ import annotations

import os
import resource
import socket
import time
from collections.abc import Iterator

import pytest
from kazoo.handlers.utils import selector_select

from starlight_py.metadata.kazoo_handler import PollingThreadingHandler, poll_select


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_nothing_to_read_waits_for_the_timeout(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _ = pair
    started = time.monotonic()
    assert poll_select([a], [], [], 0.05) == ([], [], [])
    assert time.monotonic() - started >= 0.04


def test_a_readable_socket_is_returned_as_readable(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    b.sendall(b"x")
    assert poll_select([a], [], [], 1.0) == ([a], [], [])


def test_a_writable_socket_is_returned_as_writable(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, _ = pair
    assert poll_select([], [a], [], 1.0) == ([], [a], [])


def test_asked_for_both_it_answers_as_kazoo_does(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    writable = selector_select([a], [a], [], 1.0)
    assert writable[0] == [] and writable[1] and all(s is a for s in writable[1])
    assert poll_select([a], [a], [], 1.0) == writable
    b.sendall(b"x")
    readable = selector_select([a], [a], [], 1.0)
    assert readable[0] and readable[1] == []
    assert poll_select([a], [a], [], 1.0) == readable


def test_a_closed_peer_wakes_a_reader(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    b.close()
    assert poll_select([a], [], [], 1.0) == ([a], [], [])


def test_descriptors_are_accepted_as_numbers_and_objects(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    b.sendall(b"x")
    assert poll_select([a.fileno()], [], [], 1.0) == ([a.fileno()], [], [])


def test_a_closed_descriptor_and_a_negative_timeout_are_refused() -> None:
    a, b = socket.socketpair()
    fd = a.fileno()
    a.close()
    b.close()
    with pytest.raises(ValueError):
        poll_select([fd], [], [], 1.0)
    c, d = socket.socketpair()
    with c, d, pytest.raises(ValueError):
        poll_select([c], [], [], -1)


def test_descriptors_above_1024_work() -> None:
    """select(2) cannot take them; a proxy with thousands of connections has them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"this process may open only {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    a, b = socket.socketpair()
    try:
        high = a.dup()
        moved = os.dup2(high.fileno(), 1500)
        high.close()
        b.sendall(b"x")
        assert poll_select([moved], [], [], 1.0) == ([moved], [], [])
        os.close(moved)
    finally:
        a.close()
        b.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_handler_waits_with_it(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    b.sendall(b"x")
    assert PollingThreadingHandler().select([a], [], [], 1.0) == ([a], [], [])
