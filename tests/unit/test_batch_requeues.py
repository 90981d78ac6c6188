"""Requeues of batch messages wait for the rest of their entry
(gateway/consume/batch_requeues.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlight_py.gateway.consume.batch_requeues import MARGIN, BatchRequeues
from starlight_py.model.positions import MessageIdRecord
from tests.support.chunked import Chunked

GROUPING = 0.1


@dataclass
class Handle:
    sent_back: list[Any] = field(default_factory=list)
    closed: bool = False

    def negative_acknowledge(self, message: Any) -> None:
        self.sent_back.append(message)


@dataclass(eq=False)
class Message:
    handle: Handle
    position: MessageIdRecord


def entry(handle: Handle, size: int, entry_id: int = 7) -> list[Message]:
    return [Message(handle, MessageIdRecord(3, entry_id, index)) for index in range(size)]


def requeues() -> tuple[BatchRequeues, list[Any]]:
    spawned: list[Any] = []
    return BatchRequeues(GROUPING, spawned.append), spawned


def test_a_message_alone_in_its_entry_goes_back_at_once() -> None:
    handle = Handle()
    alone = Message(handle, MessageIdRecord(3, 7))
    made, spawned = requeues()
    made.negative_acknowledge(alone, lambda: [])
    assert handle.sent_back == [alone]
    assert (len(made), spawned) == (0, [])


def test_a_batch_message_waits_while_its_consumer_holds_the_rest_of_its_entry() -> None:
    handle = Handle()
    messages = entry(handle, 3)
    held = [messages[1], messages[2]]
    made, spawned = requeues()
    made.negative_acknowledge(messages[0], lambda: held)
    assert len(spawned) == 1  # the task that looks again
    made.check(0.0)
    made.check(10.0)
    assert handle.sent_back == []  # its neighbours are still held
    held.clear()  # acknowledged
    made.check(10.0)
    made.check(10.0 + GROUPING)  # their acknowledgements may not be sent yet
    assert handle.sent_back == []
    made.check(10.0 + GROUPING + MARGIN)
    assert handle.sent_back == [messages[0]]
    assert len(made) == 0


def test_messages_of_one_entry_go_back_together() -> None:
    handle = Handle()
    messages = entry(handle, 3)
    made, _ = requeues()
    made.negative_acknowledge(messages[0], lambda: [messages[2]])
    made.negative_acknowledge(messages[1], lambda: [messages[2]])
    made.check(0.0)
    assert len(made) == 1
    made.negative_acknowledge(messages[2], lambda: [])  # the last one: nothing held now
    made.check(1.0)
    made.check(1.0 + GROUPING + MARGIN)
    assert handle.sent_back == messages


def test_other_entries_and_other_consumers_do_not_hold_it_back() -> None:
    handle, other = Handle(), Handle()
    messages = entry(handle, 2)
    elsewhere = entry(handle, 2, entry_id=8) + entry(other, 2)
    made, _ = requeues()
    made.negative_acknowledge(messages[0], lambda: elsewhere)
    made.check(0.0)
    made.check(GROUPING + MARGIN)
    assert handle.sent_back == [messages[0]]


def test_what_a_closed_consumer_held_is_forgotten() -> None:
    handle = Handle()
    messages = entry(handle, 2)
    made, _ = requeues()
    made.negative_acknowledge(messages[0], lambda: [messages[1]])
    handle.closed = True  # the broker gave back everything it held
    made.check(0.0)
    assert (len(made), handle.sent_back) == (0, [])


def test_a_chunked_message_goes_back_at_once() -> None:
    handle = Handle()
    chunked = Chunked(handle)
    made, _ = requeues()
    made.negative_acknowledge(chunked, lambda: [])
    assert handle.sent_back == [chunked]


@dataclass
class GroupingHandle(Handle):
    ack_grouping_ms: int = 1000


def test_a_consumer_that_groups_longer_holds_its_requeues_longer() -> None:
    handle = GroupingHandle()
    messages = entry(handle, 2)
    made, _ = requeues()
    made.negative_acknowledge(messages[0], lambda: [])
    made.check(0.0)
    made.check(GROUPING + MARGIN)  # the default grouping time is not this consumer's
    assert handle.sent_back == []
    made.check(1.0 + MARGIN)
    assert handle.sent_back == [messages[0]]
