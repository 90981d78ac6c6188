"""How many messages of one read may share a Pulsar entry (model/batch_share.py)."""

from __future__ import annotations

from starlight_py.model.batch_share import SHARED_UNLIMITED, queue_share, topic_share


def test_a_queue_without_consumers_gets_one_message_per_entry() -> None:
    assert queue_share([]) == 1


def test_a_sole_consumer_takes_up_to_its_prefetch() -> None:
    assert queue_share([10]) == 10
    assert queue_share([1]) == 1
    assert queue_share([0]) is None  # unlimited


def test_competing_consumers_share_the_smallest_prefetch() -> None:
    assert queue_share([10, 10, 10, 10]) == 2  # a burst of 10 still reaches all four
    assert queue_share([10, 3]) == 1
    assert queue_share([250, 200]) == 100
    assert queue_share([1, 1]) == 1  # prefetch-1 workers: one message per entry
    assert queue_share([0, 0]) == SHARED_UNLIMITED // 2
    assert queue_share([0, 8]) == 4  # the unlimited one does not limit
    assert queue_share([5] * 20) == 1  # never below one


def test_a_topic_takes_the_smallest_share_of_its_queues() -> None:
    assert topic_share([]) == 1  # nobody reads it
    assert topic_share([None]) is None
    assert topic_share([None, 8, 4]) == 4
    assert topic_share([8, 1, None]) == 1
