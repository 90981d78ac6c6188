"""Messages a Pulsar consumer is handed again (gateway/consume/returns.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from starlight_py.gateway.consume.returns import DELAY_PROPERTY, Returns
from starlight_py.model.positions import MessageIdRecord
from tests.support.chunked import Chunked


@dataclass(eq=False)
class Message:
    handle: object
    position: MessageIdRecord
    properties: dict[str, str] = field(default_factory=dict)


HANDLE = object()


def at(*entries: int, handle: object = HANDLE) -> list[Message]:
    return [Message(handle, MessageIdRecord(5, entry)) for entry in entries]


def test_messages_in_order_are_not_returns() -> None:
    returns = Returns()
    first, second = at(1, 2), at(3, 4)
    assert returns.sort(HANDLE, first, lambda: []) == first
    assert returns.sort(HANDLE, second, lambda: []) == second
    assert not any(returns.returned(m) for m in first + second)


def test_a_message_from_behind_the_furthest_position_is_a_return() -> None:
    returns = Returns()
    returns.sort(HANDLE, at(1, 2, 3), lambda: [])
    again = at(2, 4)  # position 2 came before: handed again (a reload, say)
    assert returns.sort(HANDLE, again, lambda: []) == again
    assert returns.returned(again[0])
    assert not returns.returned(again[0])  # asked once
    assert not returns.returned(again[1])
    later = at(4)  # 4 is the furthest now: a second 4 is behind it too
    assert returns.sort(HANDLE, later, lambda: []) == later
    assert returns.returned(later[0])


def test_a_copy_of_what_the_channel_holds_is_dropped() -> None:
    returns = Returns()
    delivered = at(1, 2, 3)
    returns.sort(HANDLE, delivered, lambda: [])
    again = at(1, 2, 3)
    kept = returns.sort(HANDLE, again, lambda: [delivered[1]])  # 2 is still held
    assert [m.position.entry_id for m in kept] == [1, 3]
    assert returns.returned(kept[0]) and returns.returned(kept[1])


def test_holdings_of_another_pulsar_consumer_do_not_count() -> None:
    returns, other = Returns(), object()
    returns.sort(HANDLE, at(1, 2), lambda: [])
    again = at(1)
    assert returns.sort(HANDLE, again, lambda: at(1, handle=other)) == again


def test_pulsar_consumers_are_followed_apart() -> None:
    returns, other = Returns(), object()
    returns.sort(HANDLE, at(7), lambda: [])
    theirs = at(3, handle=other)
    assert returns.sort(other, theirs, lambda: []) == theirs
    assert not returns.returned(theirs[0])


def test_delayed_messages_come_late_by_design() -> None:
    returns = Returns()
    returns.sort(HANDLE, at(1, 2, 3), lambda: [])
    delayed = Message(HANDLE, MessageIdRecord(5, 1), {DELAY_PROPERTY: "5000"})
    assert returns.sort(HANDLE, [delayed], lambda: [delayed]) == [delayed]
    assert not returns.returned(delayed)


def test_a_message_without_a_position_is_passed_on_unjudged() -> None:
    returns = Returns()
    chunked = Chunked(HANDLE)
    batch = [*at(1), chunked, *at(4)]
    assert returns.sort(HANDLE, batch, lambda: []) == batch
    assert returns.sort(HANDLE, [chunked], lambda: []) == [chunked]
    assert not returns.returned(chunked)
    held = [chunked, *at(4)]
    assert returns.sort(HANDLE, at(4), lambda: held) == []  # 4 is held: a copy
