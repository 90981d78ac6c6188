"""The table of parked connections' heartbeats (gateway/connection/parked_beats.py and its
compiled form, native/src/parked_beats.rs), over socket pairs and a clock the tests set:
both write the proxy's heartbeat when it is due and say when the next one is, read the
client's at each pass over a row, report more than heartbeats, the
end of a socket, a heartbeat the socket did not take and two silent intervals, and do it
alike, row for row, over a long random run."""

from __future__ import annotations

import random
import socket
from collections.abc import Callable, Iterator

import pytest

from starlight_py.amqp import _native
from starlight_py.gateway.connection import parked_beats
from starlight_py.gateway.connection.parked_beats import (
    HEARTBEAT_FRAME,
    MISSED,
    MORE,
    READY,
    STUCK,
    Beats,
)

HB = HEARTBEAT_FRAME


def python_table() -> Beats:
    return parked_beats.ParkedBeats(HB, 4096)


def native_table() -> Beats:
    table: Beats = _native.ParkedBeats(HB, 4096)
    return table


TABLES = [pytest.param(python_table, id="python"), pytest.param(native_table, id="native")]


@pytest.fixture
def pairs() -> Iterator[Callable[[], tuple[socket.socket, socket.socket]]]:
    made: list[socket.socket] = []

    def pair() -> tuple[socket.socket, socket.socket]:
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        theirs.setblocking(False)
        made.extend((ours, theirs))
        return ours, theirs

    yield pair
    for sock in made:
        sock.close()


def received(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except BlockingIOError:
        return b""


@pytest.mark.parametrize("new", TABLES)
def test_a_row_writes_the_heartbeat_when_due_and_says_when_the_next_is(new, pairs) -> None:
    table = new()
    ours, theirs = pairs()
    # 10 s heartbeat, last sent and heard at 0: the next is due at 5 s, half a second early
    # at most (its step is a twentieth of the heartbeat).
    assert table.add(ours.fileno(), 10.0, 0.0, 0.0, 0.0) == 4.5
    assert len(table) == 1
    assert table.tick(4.4) == ([], 4.5)
    assert received(theirs) == b""
    events, following = table.tick(4.5)
    assert events == [] and following == 9.0
    assert received(theirs) == HB
    assert table.remove(ours.fileno()) == (4.5, 0.0)
    assert table.remove(ours.fileno()) is None and len(table) == 0
    assert table.tick(100.0) == ([], float("inf"))


@pytest.mark.parametrize("new", TABLES)
def test_the_clients_heartbeats_are_read_at_each_pass_over_the_row(new, pairs) -> None:
    table = new()
    ours, theirs = pairs()
    table.add(ours.fileno(), 10.0, 0.0, 0.0, 0.0)
    theirs.send(HB)
    assert table.tick(4.4) == ([], 4.5)  # not due: not read
    assert table.heard == 0
    events, following = table.tick(4.5)
    assert events == [] and table.heard == 1 and following == 9.0
    assert table.tick(9.0)[0] == []  # nothing waits: nothing heard
    theirs.send(HB * 3)
    assert table.tick(13.5)[0] == [] and table.heard == 4
    assert table.remove(ours.fileno()) == (13.5, 13.5)


@pytest.mark.parametrize("new", TABLES)
def test_two_silent_intervals_are_reported_and_the_row_is_due_again_a_step_later(
    new, pairs
) -> None:
    table = new()
    ours, _ = pairs()
    table.add(ours.fileno(), 2.0, 0.0, 0.0, 0.0)  # step 0.1
    for now in (0.9, 1.8, 2.7, 3.6):
        assert table.tick(now)[0] == []
    events, following = table.tick(4.1)
    assert events == [(ours.fileno(), MISSED, b"")]
    assert following == pytest.approx(4.2)


@pytest.mark.parametrize("new", TABLES)
def test_more_than_heartbeats_and_the_end_are_reported_with_what_followed(new, pairs) -> None:
    table = new()
    (a, a_peer), (b, b_peer), (c, _) = pairs(), pairs(), pairs()
    for sock in (a, b, c):
        table.add(sock.fileno(), 60.0, 0.0, 0.0, 0.0)
    a_peer.send(HB * 2 + b"\x01\x00\x01")  # two heartbeats, then the start of a frame
    b_peer.close()
    events = table.drain([(a.fileno(), 1), (b.fileno(), 1), (99999, 1), (c.fileno(), 1)], 7.0)
    assert events == [
        (a.fileno(), MORE, b"\x01\x00\x01"),
        (b.fileno(), MORE, b""),
        (99999, READY, b""),
    ]
    assert table.heard == 2
    assert table.remove(a.fileno()) == (0.0, 7.0)
    assert table.remove(c.fileno()) == (0.0, 0.0)  # nothing waited: nothing heard
    # The row that moved into the removed one's place is still the same socket's.
    assert table.remove(b.fileno()) == (0.0, 0.0)


@pytest.mark.parametrize("new", TABLES)
def test_a_heartbeat_the_socket_does_not_take_is_handed_back(new, pairs) -> None:
    table = new()
    ours, _theirs = pairs()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    try:
        while True:
            ours.send(b"x" * 4096)
    except BlockingIOError:
        pass
    table.add(ours.fileno(), 10.0, 0.0, 0.0, 0.0)
    events, _ = table.tick(4.5)
    assert events == [(ours.fileno(), STUCK, HB)]
    assert table.remove(ours.fileno()) == (4.5, 0.0)


@pytest.mark.parametrize("new", TABLES)
def test_adding_a_row_again_replaces_it(new, pairs) -> None:
    table = new()
    ours, _ = pairs()
    table.add(ours.fileno(), 10.0, 0.0, 0.0, 0.0)
    assert table.add(ours.fileno(), 60.0, 100.0, 100.0, 100.0) == 129.0
    assert len(table) == 1
    assert table.tick(120.0) == ([], 129.0)


def test_both_tables_do_the_same_row_for_row_over_a_long_random_run(pairs) -> None:
    rng = random.Random(42)
    rows = 24
    heartbeats = (1.0, 2.0, 10.0, 60.0)
    tables = {"python": python_table(), "native": native_table()}
    sockets = {name: [pairs() for _ in range(rows)] for name in tables}
    index = {
        name: {ours.fileno(): at for at, (ours, _) in enumerate(sockets[name])} for name in tables
    }
    kept: set[int] = set()
    now = 0.0
    for _ in range(3000):
        now += rng.choice((0.05, 0.1, 0.25, 0.5, 1.0, 3.0))
        at = rng.randrange(rows)
        action = rng.random()
        outcomes = {}
        for name, table in tables.items():
            ours, theirs = sockets[name][at]
            result: object = None
            if action < 0.1 and at not in kept:
                result = table.add(ours.fileno(), heartbeats[at % 4], now - 1, now - 2, now)
            elif action < 0.15 and at in kept:
                result = table.remove(ours.fileno())
            elif action < 0.4:
                theirs.send(HB)
            elif action < 0.42:
                theirs.send(HB + b"\x01")
            # The epoll set reports some sockets now and then, kept or not.
            ready = [(sockets[name][i][0].fileno(), 1) for i in [*sorted(kept)[:3], at]]
            drained = table.drain(ready, now) if action > 0.9 else []
            events, following = table.tick(now)
            reported = [(index[name][fd], kind, data) for fd, kind, data in drained + events]
            for fd, kind, _ in drained + events:
                if kind != READY:
                    table.remove(fd)  # the connection takes its row back
            outcomes[name] = (
                result,
                sorted(reported),
                following,
                table.heard,
                len(table),
                [received(peer) for _, peer in sockets[name]],
            )
        assert outcomes["python"] == outcomes["native"], now
        if action < 0.1:
            kept.add(at)
        elif action < 0.15:
            kept.discard(at)
        kept -= {row for row, kind, _ in outcomes["python"][1] if kind != READY}
    assert tables["python"].heard > 100  # the run did read heartbeats
