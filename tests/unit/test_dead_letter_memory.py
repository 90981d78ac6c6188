"""One message read again is not dead-lettered twice (core/dead_letter_memory.py)."""

from __future__ import annotations

import pytest

from starlight_py.core.dead_letter_memory import DeadLetterMemory, Seen


def test_a_message_dies_once_then_its_copies_are_only_acknowledged() -> None:
    memory: DeadLetterMemory[str] = DeadLetterMemory()
    assert memory.see(("sub", 1), "first") is Seen.NEW
    assert memory.finish(("sub", 1), stored=True) == []
    assert memory.see(("sub", 1), "again") is Seen.STORED
    assert memory.see(("sub", 1), "and again") is Seen.STORED


def test_copies_read_while_the_first_is_on_its_way_are_handed_back_with_its_outcome() -> None:
    memory: DeadLetterMemory[str] = DeadLetterMemory()
    assert memory.see("k", "first") is Seen.NEW
    assert memory.see("k", "second") is Seen.ON_ITS_WAY
    assert memory.see("k", "third") is Seen.ON_ITS_WAY
    assert memory.finish("k", stored=True) == ["second", "third"]
    assert memory.see("k", "fourth") is Seen.STORED


def test_a_refused_dead_letter_is_forgotten_so_the_message_dies_again_later() -> None:
    memory: DeadLetterMemory[str] = DeadLetterMemory()
    memory.see("k", "first")
    memory.see("k", "second")
    assert memory.finish("k", stored=False) == ["second"]  # both go back to the queue
    assert len(memory) == 0
    assert memory.see("k", "later") is Seen.NEW


def test_other_keys_are_other_messages() -> None:
    memory: DeadLetterMemory[str] = DeadLetterMemory()
    memory.see(("a", 1), "x")
    memory.finish(("a", 1), stored=True)
    assert memory.see(("b", 1), "y") is Seen.NEW  # another subscription
    assert memory.see(("a", 2), "z") is Seen.NEW  # another position


def test_only_the_last_stored_are_remembered_the_latest_seen_kept_longest() -> None:
    memory: DeadLetterMemory[str] = DeadLetterMemory(capacity=2)
    for key in (1, 2):
        memory.see(key, "")
        memory.finish(key, stored=True)
    assert memory.see(1, "") is Seen.STORED  # 1 seen again: now the newest
    memory.see(3, "")
    memory.finish(3, stored=True)  # 2, the oldest, goes
    assert len(memory) == 2
    assert memory.see(1, "") is Seen.STORED
    assert memory.see(2, "") is Seen.NEW


def test_finishing_an_unknown_key_hands_back_nothing() -> None:
    memory: DeadLetterMemory[str] = DeadLetterMemory()
    assert memory.finish("never seen", stored=False) == []
    assert len(memory) == 0


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        DeadLetterMemory(capacity=0)
