"""The pure part of AMQP transactions: which tags an ack/nack/reject settles inside a
transaction, the 406s, and the bound on buffered publishes."""

from __future__ import annotations

import pytest
from pamqp import commands

from starlight_py.amqp.errors import PreconditionFailed
from starlight_py.amqp.transactions import (
    PUBLISH_OVERHEAD,
    BufferedPublish,
    BufferedSettlement,
    ChannelTransaction,
    TransactionLimit,
)

ACK = (60, 80)


def publish(size: int) -> BufferedPublish:
    return BufferedPublish(
        commands.Basic.Publish(exchange="", routing_key="q"),
        commands.Basic.Properties(),
        b"x" * size,
        b"",
    )


def test_ack_multiple_settles_every_open_tag_up_to_it() -> None:
    tx = ChannelTransaction()
    tx.add_settlement([1, 2, 3, 4], 3, True, None, ACK)
    assert tx.settlements == [BufferedSettlement((1, 2, 3), None, ACK)]
    # Tag 0 with multiple: what is still open, not what this transaction settled already.
    tx.add_settlement([1, 2, 3, 4], 0, True, True, (60, 120))
    assert tx.settlements[-1] == BufferedSettlement((4,), True, (60, 120))


def test_a_tag_settled_in_the_transaction_is_unknown_the_second_time() -> None:
    tx = ChannelTransaction()
    tx.add_settlement([5], 5, False, None, ACK)
    with pytest.raises(PreconditionFailed, match="unknown delivery tag 5"):
        tx.add_settlement([5], 5, False, False, (60, 90))


def test_unknown_tags_are_406_and_multiple_accepts_a_tag_above_open_ones() -> None:
    tx = ChannelTransaction()
    with pytest.raises(PreconditionFailed, match="unknown delivery tag 9") as info:
        tx.add_settlement([1, 2], 9, False, None, ACK)
    assert info.value.method == ACK
    tx.add_settlement([1, 2], 9, True, None, ACK)  # as outside a transaction: covers 1 and 2
    assert tx.settlements == [BufferedSettlement((1, 2), None, ACK)]
    with pytest.raises(PreconditionFailed, match="unknown delivery tag 9"):
        tx.add_settlement([1, 2], 9, True, None, ACK)  # nothing open below it any more


def test_ack_zero_multiple_with_nothing_open_records_nothing() -> None:
    tx = ChannelTransaction()
    tx.add_settlement([], 0, True, None, ACK)
    assert tx.settlements == []


def test_rollback_forgets_settled_tags_and_publishes() -> None:
    tx = ChannelTransaction()
    tx.add_publish(publish(10), TransactionLimit(10_000), 0)
    tx.add_settlement([1], 1, False, None, ACK)
    tx.discard()
    assert (tx.publishes, tx.settlements, tx.size) == ([], [], 0)
    tx.add_settlement([1], 1, False, None, ACK)  # open again after the rollback


def test_take_hands_over_in_order_and_starts_afresh() -> None:
    tx = ChannelTransaction()
    first, second = publish(1), publish(2)
    tx.add_publish(first, TransactionLimit(10_000), 0)
    tx.add_publish(second, TransactionLimit(10_000), 0)
    tx.add_settlement([3], 3, False, None, ACK)
    assert tx.take() == ([first, second], [BufferedSettlement((3,), None, ACK)])
    assert (tx.publishes, tx.settled_tags, tx.size) == ([], set(), 0)


def test_the_limit_counts_this_channel_and_the_rest_of_the_connection() -> None:
    size = 100 + PUBLISH_OVERHEAD
    limit = TransactionLimit(3 * size)
    tx = ChannelTransaction()
    tx.add_publish(publish(100), limit, size)
    tx.add_publish(publish(100), limit, size)  # exactly at the limit
    with pytest.raises(PreconditionFailed, match="transaction too large") as info:
        tx.add_publish(publish(0), limit, size)
    assert info.value.method == (60, 40)
    assert tx.size == 2 * size


def test_the_limit_is_sixteen_maximal_messages() -> None:
    assert TransactionLimit.for_message_size(4 * 1024 * 1024).max_bytes == 64 * 1024 * 1024
