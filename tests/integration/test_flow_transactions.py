"""Transactions as RabbitMQ does them: tx.select buffers a channel's publishes and acks until
tx.commit (publishes in order, mandatory returns at commit) and tx.rollback drops them;
acks rolled back leave the messages unacked (never requeued by the rollback); consuming and
basic.get are not transactional; mode errors and commit/rollback outside a transaction are
406. Every test but the one on our buffer limit also passes against a real RabbitMQ."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aio_pika
import pika
import pika.exceptions
import pytest
from pamqp import body as pamqp_body
from pamqp import commands, frame
from pamqp import header as pamqp_header
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.integration.conftest import Broker, ProxyFactory
from tests.support.amqp_fixtures import (
    Created,
    Deliveries,
    closes_channel,
    confirming_channel,
    get_one,
    next_reply,
    pump,
    raw_channel,
)

NAME_PREFIX = "flow"  # of the names made here (the `created` fixture reads it)


# --- helpers ------------------------------------------------------------------------


def declare_and_publish(connection: BlockingConnection, queue: str, count: int) -> list[bytes]:
    """Declares `queue` and publishes m0..m<count-1> to it with confirms (outside any
    transaction)."""
    channel = confirming_channel(connection)
    channel.queue_declare(queue)
    bodies = [f"m{i}".encode() for i in range(count)]
    for body in bodies:
        channel.basic_publish("", queue, body)
    channel.close()
    return bodies


def drain_flags(
    channel: BlockingChannel, queue: str, expected: int, timeout: float = 5.0, settle: float = 0.3
) -> list[tuple[bytes, bool]]:
    """(body, redelivered) of what basic.get (auto-ack) finds: polls until `expected`
    messages came or `timeout`, then `settle` seconds more so that extra ones show up too."""
    got: list[tuple[bytes, bool]] = []
    deadline = time.monotonic() + timeout
    quiet_until: float | None = None
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            got.append((body, method.redelivered))
            continue
        now = time.monotonic()
        if quiet_until is None and (len(got) >= expected or now >= deadline):
            quiet_until = now + settle
        if quiet_until is not None and now >= quiet_until:
            return got
        time.sleep(0.02)


def bodies_in(connection: BlockingConnection, queue: str, expected: int) -> list[bytes]:
    return [body for body, _ in drain_flags(connection.channel(), queue, expected)]


def tx_consumer(
    connection: BlockingConnection, queue: str, expected: int, prefetch: int = 0
) -> tuple[BlockingChannel, Deliveries]:
    """A transactional channel consuming `queue`, pumped until `expected` deliveries."""
    channel = connection.channel()
    channel.tx_select()
    if prefetch:
        channel.basic_qos(prefetch_count=prefetch)
    deliveries = Deliveries()
    channel.basic_consume(queue, deliveries)
    pump([connection], lambda: len(deliveries) >= expected)
    assert len(deliveries) == expected
    return channel, deliveries


# --- publishes ----------------------------------------------------------------------


def test_publishes_rolled_back_never_arrive(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    connection = connect()
    channel = connection.channel()
    channel.queue_declare(queue)
    channel.tx_select()
    for i in range(3):
        channel.basic_publish("", queue, f"dropped{i}".encode())
    channel.tx_rollback()
    channel.basic_publish("", queue, b"kept")
    channel.tx_commit()
    assert bodies_in(connect(), queue, 1) == [b"kept"]


def test_publishes_arrive_only_at_commit_and_in_order(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    connection = connect()
    channel = connection.channel()
    channel.queue_declare(queue)
    channel.tx_select()
    bodies = [f"m{i}".encode() for i in range(20)]
    for body in bodies:
        channel.basic_publish("", queue, body)
    # A round trip on the same connection: every publish above reached the broker.
    channel.basic_qos(prefetch_count=0)
    reader = connect().channel()
    assert reader.queue_declare(queue, passive=True).method.message_count == 0
    assert reader.basic_get(queue, auto_ack=True)[0] is None
    channel.tx_commit()
    assert bodies_in(connect(), queue, 20) == bodies


def test_uncommitted_publishes_are_lost_with_the_channel(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    connection = connect()
    channel = connection.channel()
    channel.queue_declare(queue)
    channel.tx_select()
    channel.basic_publish("", queue, b"never")
    channel.close()
    assert bodies_in(connect(), queue, 0) == []


def test_a_transaction_goes_on_after_each_commit(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    connection = connect()
    channel = connection.channel()
    channel.queue_declare(queue)
    channel.tx_select()
    channel.basic_publish("", queue, b"first")
    channel.tx_commit()
    channel.basic_publish("", queue, b"second")
    channel.tx_rollback()
    channel.tx_select()  # a second select is a no-op
    channel.basic_publish("", queue, b"third")
    channel.tx_commit()
    channel.tx_commit()  # an empty commit is fine
    assert bodies_in(connect(), queue, 2) == [b"first", b"third"]


def test_mandatory_returns_come_at_commit_and_not_after_rollback(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    nowhere = created.queue("nowhere")  # never declared: routed nowhere
    connection = connect()
    channel = connection.channel()
    returned: list[bytes] = []
    channel.add_on_return_callback(lambda _ch, _method, _props, body: returned.append(body))
    channel.tx_select()
    channel.basic_publish("", nowhere, b"rolled-back", mandatory=True)
    channel.basic_qos(prefetch_count=0)  # a round trip: the publish reached the broker
    pump([connection], lambda: bool(returned), timeout=0.5)
    channel.tx_rollback()
    channel.basic_publish("", nowhere, b"committed", mandatory=True)
    channel.tx_commit()
    pump([connection], lambda: bool(returned))
    assert returned == [b"committed"]


def test_publish_to_a_missing_exchange_fails_at_once_and_loses_the_transaction(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    missing = created.exchange("missing")
    connection = connect()
    channel = connection.channel()
    channel.queue_declare(queue)
    channel.tx_select()
    channel.basic_publish("", queue, b"before")
    channel.basic_publish(missing, "k", b"lost")
    # Not at commit: the next round trip already finds the channel closed.
    error = closes_channel(connection, lambda: channel.basic_qos(prefetch_count=0))
    assert error.reply_code == 404
    assert error.reply_text == f"NOT_FOUND - no exchange '{missing}' in vhost '/'"
    assert bodies_in(connect(), queue, 0) == []


# --- acks -------------------------------------------------------------------------


def test_acks_rolled_back_leave_the_messages_unacked_not_requeued(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    declare_and_publish(connect(), queue, 3)
    consumer = connect()
    channel, deliveries = tx_consumer(consumer, queue, 3)
    channel.basic_ack(deliveries.tags[-1], multiple=True)
    channel.tx_rollback()
    # Not requeued: nothing comes again while the channel lives, and none is ready.
    pump([consumer], lambda: len(deliveries) > 3, timeout=0.5)
    assert len(deliveries) == 3
    assert connect().channel().queue_declare(queue, passive=True).method.message_count == 0
    # Still unacked: closing the channel requeues all three.
    channel.close()
    got = drain_flags(connect().channel(), queue, 3)
    assert sorted(got) == [(b"m0", True), (b"m1", True), (b"m2", True)]


def test_acks_rolled_back_can_be_given_again(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    declare_and_publish(connect(), queue, 2)
    consumer = connect()
    channel, deliveries = tx_consumer(consumer, queue, 2)
    channel.basic_ack(deliveries.tags[0])
    channel.tx_rollback()
    channel.basic_ack(deliveries.tags[0])  # unknown tag (406) if the rollback had dropped it
    channel.tx_commit()
    channel.close()
    assert drain_flags(connect().channel(), queue, 1) == [(b"m1", True)]


def test_acks_committed_are_final(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    declare_and_publish(connect(), queue, 3)
    consumer = connect()
    channel, deliveries = tx_consumer(consumer, queue, 3)
    channel.basic_ack(deliveries.tags[0])
    channel.basic_ack(deliveries.tags[2])
    channel.tx_commit()
    channel.close()
    assert drain_flags(connect().channel(), queue, 1) == [(b"m1", True)]


def test_uncommitted_acks_are_lost_with_the_channel(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    declare_and_publish(connect(), queue, 2)
    consumer = connect()
    channel, _ = tx_consumer(consumer, queue, 2)
    channel.basic_ack(0, multiple=True)
    channel.basic_qos(prefetch_count=0)  # a round trip: the ack reached the broker
    channel.close()
    assert sorted(drain_flags(connect().channel(), queue, 2)) == [(b"m0", True), (b"m1", True)]


def test_acks_in_a_transaction_free_prefetch_only_at_commit(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    declare_and_publish(connect(), queue, 2)
    consumer = connect()
    channel, deliveries = tx_consumer(consumer, queue, 1, prefetch=1)
    channel.basic_ack(deliveries.tags[0])
    pump([consumer], lambda: len(deliveries) > 1, timeout=0.5)
    assert deliveries.flags == [(b"m0", False)]
    channel.tx_commit()
    pump([consumer], lambda: len(deliveries) > 1)
    assert deliveries.flags == [(b"m0", False), (b"m1", False)]


def test_nack_with_requeue_takes_effect_at_commit(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    declare_and_publish(connect(), queue, 1)
    consumer = connect()
    channel, deliveries = tx_consumer(consumer, queue, 1)
    channel.basic_nack(deliveries.tags[0], requeue=True)
    pump([consumer], lambda: len(deliveries) > 1, timeout=0.5)
    assert len(deliveries) == 1
    channel.tx_commit()
    pump([consumer], lambda: len(deliveries) > 1)
    assert deliveries.flags == [(b"m0", False), (b"m0", True)]


def test_reject_without_requeue_rolled_back_then_committed(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    declare_and_publish(connect(), queue, 2)
    consumer = connect()
    channel, deliveries = tx_consumer(consumer, queue, 2)
    channel.basic_reject(deliveries.tags[0], requeue=False)
    channel.tx_rollback()
    channel.basic_reject(deliveries.tags[1], requeue=False)
    channel.tx_commit()
    channel.close()
    # m0's reject was rolled back (requeued with the channel); m1's was committed (dropped).
    assert drain_flags(connect().channel(), queue, 1) == [(b"m0", True)]


def test_basic_get_inside_a_transaction_delivers_at_once(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    declare_and_publish(connect(), queue, 2)
    channel = connect().channel()
    channel.tx_select()
    method, _, body = get_one(channel, queue)
    assert (body, method.redelivered) == (b"m0", False)
    channel.basic_ack(method.delivery_tag)
    channel.tx_rollback()
    second, _, body = get_one(channel, queue)
    assert body == b"m1"
    channel.basic_ack(second.delivery_tag)
    channel.tx_commit()
    channel.close()
    # m0's ack was rolled back: it comes back; m1's was committed.
    assert drain_flags(connect().channel(), queue, 1) == [(b"m0", True)]


def test_recover_in_a_transaction_requeues_only_what_it_has_not_settled(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    declare_and_publish(connect(), queue, 2)
    channel = connect().channel()
    channel.tx_select()
    first, _, _ = get_one(channel, queue)
    get_one(channel, queue)
    channel.basic_ack(first.delivery_tag)
    channel.basic_recover(requeue=True)
    channel.tx_commit()
    channel.close()
    assert drain_flags(connect().channel(), queue, 1) == [(b"m1", True)]


def test_consume_transform_publish_is_all_or_nothing(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    source, target = created.queue("src"), created.queue("dst")
    declare_and_publish(connect(), source, 1)
    connection = connect()
    channel = connection.channel()
    channel.queue_declare(target)
    channel.tx_select()
    method, _, body = get_one(channel, source)
    channel.basic_publish("", target, body.upper())
    channel.basic_ack(method.delivery_tag)
    channel.tx_rollback()
    channel.basic_qos(prefetch_count=0)
    assert connect().channel().basic_get(target, auto_ack=True)[0] is None
    # Rolled back: the message is still ours, unacked; do it again and commit.
    channel.basic_publish("", target, body.upper())
    channel.basic_ack(method.delivery_tag)
    channel.tx_commit()
    channel.close()
    assert bodies_in(connect(), target, 1) == [b"M0"]
    assert bodies_in(connect(), source, 0) == []


# --- errors -------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["commit", "rollback"])
def test_commit_or_rollback_outside_a_transaction_is_406(
    connection: BlockingConnection, action: str
) -> None:
    channel = connection.channel()
    error = closes_channel(connection, getattr(channel, f"tx_{action}"))
    assert error.reply_code == 406
    assert error.reply_text == "PRECONDITION_FAILED - channel is not transactional"


def test_confirm_select_on_a_transactional_channel_is_406(
    connection: BlockingConnection,
) -> None:
    channel = connection.channel()
    channel.tx_select()
    error = closes_channel(connection, channel.confirm_delivery)
    assert error.reply_code == 406
    assert error.reply_text == "PRECONDITION_FAILED - cannot switch from tx to confirm mode"


def test_tx_select_on_a_confirm_channel_is_406(connection: BlockingConnection) -> None:
    channel = confirming_channel(connection)
    error = closes_channel(connection, channel.tx_select)
    assert error.reply_code == 406
    assert error.reply_text == "PRECONDITION_FAILED - cannot switch from confirm to tx mode"


def test_double_ack_in_one_transaction_is_406(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    declare_and_publish(connect(), queue, 1)
    connection = connect()
    channel = connection.channel()
    channel.tx_select()
    method, _, _ = get_one(channel, queue)
    channel.basic_ack(method.delivery_tag)
    channel.basic_ack(method.delivery_tag)
    error = closes_channel(connection, channel.tx_commit)
    assert error.reply_code == 406
    assert error.reply_text == f"PRECONDITION_FAILED - unknown delivery tag {method.delivery_tag}"
    # The transaction died with the channel: the message is back.
    assert drain_flags(connect().channel(), queue, 1) == [(b"m0", True)]


def test_unknown_tag_in_a_transaction_is_406_at_once(connection: BlockingConnection) -> None:
    channel = connection.channel()
    channel.tx_select()
    channel.basic_ack(99)
    error = closes_channel(connection, lambda: channel.basic_qos(prefetch_count=0))
    assert error.reply_code == 406
    assert error.reply_text == "PRECONDITION_FAILED - unknown delivery tag 99"


def test_a_commit_sent_right_after_a_failing_method_commits_nothing(
    broker: Broker, connect: Callable[[], BlockingConnection], created: Created
) -> None:
    """publish, an ack of an unknown tag and tx.commit in one write: the channel is closed
    by the ack, and what follows (the commit) is discarded, so the publish never lands."""
    queue = created.queue()
    connect().channel().queue_declare(queue)
    with raw_channel(broker) as client:
        client.send_method(1, commands.Tx.Select())
        assert isinstance(next_reply(client), commands.Tx.SelectOk)
        payload = b"must-not-land"
        data = frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
        data += frame.marshal(
            pamqp_header.ContentHeader(0, len(payload), commands.Basic.Properties()), 1
        )
        data += frame.marshal(pamqp_body.ContentBody(payload), 1)
        data += frame.marshal(commands.Basic.Ack(delivery_tag=7), 1)
        data += frame.marshal(commands.Tx.Commit(), 1)
        client.send(data)
        close = next_reply(client)
        assert isinstance(close, commands.Channel.Close)
        assert (close.reply_code, close.reply_text) == (
            406,
            "PRECONDITION_FAILED - unknown delivery tag 7",
        )
        client.send_method(1, commands.Channel.CloseOk())
        # The channel number is free again, and nothing else was answered on it.
        assert isinstance(client.open_channel(1), commands.Channel.OpenOk)
    assert bodies_in(connect(), queue, 0) == []


# --- another client -------------------------------------------------------------------


def test_aio_pika_transaction_commits_and_rolls_back(broker: Broker, created: Created) -> None:
    queue_name = created.queue()

    async def scenario() -> list[bytes]:
        connection = await aio_pika.connect(broker.url())
        try:
            channel = await connection.channel(publisher_confirms=False)
            await channel.declare_queue(queue_name)
            transaction = channel.transaction()
            await transaction.select()
            for body in (b"a1", b"a2"):
                await channel.default_exchange.publish(aio_pika.Message(body), queue_name)
            await transaction.rollback()
            await channel.default_exchange.publish(aio_pika.Message(b"b1"), queue_name)
            await transaction.commit()
            reader = await connection.channel()
            queue = await reader.get_queue(queue_name)
            got: list[bytes] = []
            deadline = time.monotonic() + 5
            while not got and time.monotonic() < deadline:
                message = await queue.get(no_ack=True, fail=False)
                if message is None:
                    await asyncio.sleep(0.02)
                else:
                    got.append(message.body)
            # Anything else (the rolled back ones) would be there by now too.
            await asyncio.sleep(0.3)
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                got.append(message.body)
            return got
        finally:
            await connection.close()

    assert asyncio.run(scenario()) == [b"b1"]


# --- our buffer limit ---------------------------------------------------------------


def test_a_transaction_past_the_buffer_limit_closes_the_channel_with_406(
    proxy_only: None, start_proxy: ProxyFactory, created: Created
) -> None:
    # amqpMaxMessageSize=1024: a connection's transactions may buffer 16 KiB.
    proxy = start_proxy(amqpMaxMessageSize="1024")
    url = f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F"
    queue = created.queue()
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.queue_declare(queue)
        channel.tx_select()
        for _ in range(12):  # 12 x (1000 + overhead) fit
            channel.basic_publish("", queue, b"x" * 1000)
        channel.basic_qos(prefetch_count=0)

        def overflow() -> None:
            # The channel closes at the publish past the limit: pika may report it during
            # a later publish (it reads while it writes) or at the commit.
            for _ in range(8):
                channel.basic_publish("", queue, b"x" * 1000)
            channel.tx_commit()

        error = closes_channel(connection, overflow)
        assert error.reply_code == 406
        assert error.reply_text.startswith("PRECONDITION_FAILED - transaction too large")
        assert "16384 bytes" in error.reply_text
        checker = connection.channel()
        assert checker.queue_declare(queue, passive=True).method.message_count == 0
        # A new transaction on another channel starts from nothing.
        channel = connection.channel()
        channel.tx_select()
        channel.basic_publish("", queue, b"small")
        channel.tx_commit()
        assert bodies_in(connection, queue, 1) == [b"small"]
    finally:
        connection.close()
