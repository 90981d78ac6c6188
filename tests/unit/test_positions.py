"""Positions compared the way the SubscriptionCleaner needs with batched messages."""

from __future__ import annotations

from starlight_py.model.positions import MessageIdRecord


def test_a_batched_message_ends_at_its_entry() -> None:
    end = MessageIdRecord(7, 3, batch_index=9)
    assert end.entry() == MessageIdRecord(7, 3)
    # The cursor's mark-delete position is an entry: 7:3 means the whole batch is acked.
    assert not MessageIdRecord.parse_position("7:3") < end.entry()
    assert MessageIdRecord.parse_position("7:2") < end.entry()
    # Compared as is, the acked entry would look short of its own last message forever.
    assert MessageIdRecord.parse_position("7:3") < end


def test_an_unbatched_position_is_its_own_entry() -> None:
    position = MessageIdRecord(7, 3)
    assert position.entry() is position
