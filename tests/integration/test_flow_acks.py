"""Acknowledgements as RabbitMQ 3.10 does them: ack single/multiple/tag 0, nack and reject
with and without requeue, unknown and double acks (406), what comes back when a channel or
connection closes (and what basic.cancel keeps), basic.recover, no-ack consumers, and the
consumer errors (tag reuse 530, exclusive consumers 403, basic.cancel on queue delete)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pika
import pika.exceptions
import pytest
from pamqp import body as pamqp_body
from pamqp import commands, frame, header
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.integration.conftest import Broker
from tests.support import amqp_fixtures
from tests.support.amqp_fixtures import (
    Created,
    Deliveries,
    closes_channel,
    confirming_channel,
    get_one,
    pump,
    raw_channel,
    wait_for_count,
)
from tests.support.raw_amqp import RawClient

# --- helpers (shared ones: tests/support/amqp_fixtures.py; fixtures: conftest.py) -----

NAME_PREFIX = "flow"  # of the names made here (the `created` fixture reads it)


def unique(kind: str) -> str:
    return amqp_fixtures.unique(kind, NAME_PREFIX)


def drain_flags(
    channel: BlockingChannel,
    queue: str,
    expected: int,
    timeout: float = 5.0,
    settle: float = 0.3,
) -> list[tuple[bytes, bool]]:
    """Like `drain`, with each message's `redelivered` flag."""
    got: list[tuple[bytes, bool]] = []
    deadline = time.monotonic() + timeout
    while len(got) < expected and time.monotonic() < deadline:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.02)
        else:
            got.append((body, method.redelivered))
    quiet_until = time.monotonic() + settle
    while time.monotonic() < quiet_until:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.02)
        else:
            got.append((body, method.redelivered))
    return got


def publish(connection: BlockingConnection, queue: str, count: int) -> list[bytes]:
    """Declares `queue` (plain, not exclusive) and publishes m0..m<count-1> with confirms."""
    channel = confirming_channel(connection)
    channel.queue_declare(queue)
    bodies = [f"m{i}".encode() for i in range(count)]
    for body in bodies:
        channel.basic_publish("", queue, body)
    channel.close()
    return bodies


def consume(
    connection: BlockingConnection,
    queue: str,
    expected: int,
    *,
    prefetch: int = 0,
    auto_ack: bool = False,
) -> tuple[BlockingChannel, Deliveries, str]:
    """A new channel consuming `queue`, pumped until `expected` deliveries (and 0.3 s more)."""
    channel = connection.channel()
    if prefetch:
        channel.basic_qos(prefetch_count=prefetch)
    deliveries = Deliveries()
    tag = channel.basic_consume(queue, deliveries, auto_ack=auto_ack)
    pump([connection], lambda: len(deliveries) >= expected)
    return channel, deliveries, tag


# --- ack ----------------------------------------------------------------------------


def test_ack_single_acks_only_that_message(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    publish(connect(), queue, 3)
    consumer = connect()
    channel, deliveries, _ = consume(consumer, queue, 3)
    assert deliveries.flags == [(b"m0", False), (b"m1", False), (b"m2", False)]
    channel.basic_ack(deliveries.tags[1])
    channel.close()
    assert sorted(drain_flags(connect().channel(), queue, 2)) == [(b"m0", True), (b"m2", True)]


def test_ack_multiple_acks_up_to_and_including_the_tag(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    publish(connect(), queue, 4)
    consumer = connect()
    channel, deliveries, _ = consume(consumer, queue, 4)
    assert deliveries.bodies == [b"m0", b"m1", b"m2", b"m3"]
    channel.basic_ack(deliveries.tags[2], multiple=True)
    channel.close()
    assert drain_flags(connect().channel(), queue, 1) == [(b"m3", True)]


def test_ack_tag_zero_with_multiple_acks_everything_outstanding(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    publish(connect(), queue, 4)
    consumer = connect()
    channel, deliveries, _ = consume(consumer, queue, 4)
    assert len(deliveries) == 4
    channel.basic_ack(0, multiple=True)
    channel.basic_qos(prefetch_count=0)  # a round trip: the ack did not close the channel
    assert channel.is_open
    channel.close()
    assert drain_flags(connect().channel(), queue, 0) == []


def test_ack_tag_zero_with_multiple_and_nothing_outstanding_is_fine(
    connection: BlockingConnection,
) -> None:
    channel = connection.channel()
    channel.basic_ack(0, multiple=True)
    channel.basic_qos(prefetch_count=0)
    assert channel.is_open


# --- nack / reject ------------------------------------------------------------------


def test_nack_with_requeue_redelivers_and_the_count_stays(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    bodies = publish(connect(), queue, 3)
    holder = connect().channel()
    tags = []
    for expected in bodies:
        method, _, body = get_one(holder, queue)
        assert (body, method.redelivered) == (expected, False)
        tags.append(method.delivery_tag)
    observer = connect().channel()
    assert wait_for_count(observer, queue, 0) == 0
    holder.basic_nack(tags[-1], multiple=True, requeue=True)
    assert wait_for_count(observer, queue, 3) == 3
    assert sorted(drain_flags(observer, queue, 3)) == [(b, True) for b in bodies]


@pytest.mark.parametrize("how", ["nack", "reject"])
def test_nack_or_reject_without_requeue_drops_the_message(
    connect: Callable[[], BlockingConnection], created: Created, how: str
) -> None:
    queue = created.queue()
    publish(connect(), queue, 2)
    holder = connect().channel()
    method, _, body = get_one(holder, queue)
    assert body == b"m0"
    if how == "nack":
        holder.basic_nack(method.delivery_tag, requeue=False)
    else:
        holder.basic_reject(method.delivery_tag, requeue=False)
    observer = connect().channel()
    assert wait_for_count(observer, queue, 1) == 1
    holder.close()  # nothing is outstanding any more: nothing comes back
    assert drain_flags(observer, queue, 1) == [(b"m1", False)]


# --- invalid tags -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("how", "tag"),
    [("ack", 42), ("nack", 42), ("reject", 42), ("ack", 0)],
    ids=["ack", "nack", "reject", "ack-zero-single"],
)
def test_unknown_delivery_tag_closes_the_channel_with_406(
    connection: BlockingConnection, how: str, tag: int
) -> None:
    channel = connection.channel()

    def settle_unknown() -> None:
        if how == "ack":
            channel.basic_ack(tag)
        elif how == "nack":
            channel.basic_nack(tag)
        else:
            channel.basic_reject(tag)
        channel.basic_qos(prefetch_count=0)  # the close arrives instead of qos-ok

    error = closes_channel(connection, settle_unknown)
    assert error.reply_code == 406
    assert error.reply_text == f"PRECONDITION_FAILED - unknown delivery tag {tag}"


def test_double_ack_closes_the_channel_with_406(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    publish(connect(), queue, 1)
    connection = connect()
    channel = connection.channel()
    method, _, _ = get_one(channel, queue)
    channel.basic_ack(method.delivery_tag)

    def ack_again() -> None:
        channel.basic_ack(method.delivery_tag)
        channel.basic_qos(prefetch_count=0)

    error = closes_channel(connection, ack_again)
    assert error.reply_code == 406
    assert error.reply_text == f"PRECONDITION_FAILED - unknown delivery tag {method.delivery_tag}"
    assert drain_flags(connection.channel(), queue, 0) == []  # acked once, gone


# --- unacked messages and closes ----------------------------------------------------


def test_unacked_messages_come_back_when_the_channel_closes(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    bodies = publish(connect(), queue, 5)
    consumer = connect()
    channel, deliveries, _ = consume(consumer, queue, 5)
    assert deliveries.flags == [(b, False) for b in bodies]
    assert wait_for_count(connect().channel(), queue, 0) == 0
    channel.close()
    assert consumer.is_open
    assert sorted(drain_flags(connect().channel(), queue, 5)) == [(b, True) for b in bodies]


def test_unacked_messages_come_back_when_the_connection_closes(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    bodies = publish(connect(), queue, 5)
    consumer = connect()
    _, deliveries, _ = consume(consumer, queue, 5)
    assert len(deliveries) == 5
    consumer.close()
    assert sorted(drain_flags(connect().channel(), queue, 5)) == [(b, True) for b in bodies]


def test_cancel_does_not_requeue_delivered_unacked_messages(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    bodies = publish(connect(), queue, 3)
    consumer = connect()
    channel, deliveries, tag = consume(consumer, queue, 3, prefetch=3)
    assert deliveries.bodies == bodies
    channel.basic_cancel(tag)
    observer = connect().channel()
    assert drain_flags(observer, queue, 0, settle=0.5) == []  # still held by the channel
    assert observer.queue_declare(queue, passive=True).method.message_count == 0
    for delivery_tag in deliveries.tags:  # acks after the cancel are valid
        channel.basic_ack(delivery_tag)
    channel.basic_qos(prefetch_count=0)  # round trip: no 406
    assert channel.is_open
    channel.close()
    assert drain_flags(observer, queue, 0) == []
    assert len(deliveries) == 3  # nothing more arrived after the cancel


def test_cancel_then_channel_close_requeues_the_unacked_messages(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    bodies = publish(connect(), queue, 3)
    consumer = connect()
    channel, deliveries, tag = consume(consumer, queue, 3, prefetch=3)
    assert deliveries.bodies == bodies
    channel.basic_cancel(tag)
    observer = connect().channel()
    assert drain_flags(observer, queue, 0) == []
    channel.close()
    assert sorted(drain_flags(observer, queue, 3)) == [(b, True) for b in bodies]


def test_recover_with_requeue_redelivers_the_unacked_messages(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    bodies = publish(connect(), queue, 3)
    consumer = connect()
    channel, deliveries, _ = consume(consumer, queue, 3)
    assert deliveries.flags == [(b, False) for b in bodies]
    channel.basic_recover(requeue=True)
    pump([consumer], lambda: len(deliveries) >= 6)
    assert len(deliveries) == 6
    assert sorted(deliveries.flags[3:]) == [(b, True) for b in bodies]
    assert len(set(deliveries.tags)) == 6  # new delivery tags
    channel.basic_ack(max(deliveries.tags), multiple=True)
    channel.close()
    assert drain_flags(connect().channel(), queue, 0) == []


def next_delivery(client: RawClient) -> commands.Basic.Deliver:
    """The next basic.deliver (its content frames are skipped)."""
    while True:
        _, method = client.read_method()
        if isinstance(method, commands.Basic.Deliver):
            return method


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pamqp on basic.recover-async
def test_recover_async_redelivers_without_an_answer(broker: Broker, created: Created) -> None:
    # Deprecated in 0-9-1, still accepted by RabbitMQ: basic.recover without recover-ok.
    queue = created.queue()
    with raw_channel(broker) as client:
        client.send_method(1, commands.Queue.Declare(queue=queue))
        assert isinstance(client.read_method()[1], commands.Queue.DeclareOk)
        client.send_method(1, commands.Basic.Consume(queue=queue, consumer_tag="c"))
        assert isinstance(client.read_method()[1], commands.Basic.ConsumeOk)
        client.send_method(1, commands.Basic.Publish(exchange="", routing_key=queue))
        client.send(frame.marshal(header.ContentHeader(0, 2, commands.Basic.Properties()), 1))
        client.send(frame.marshal(pamqp_body.ContentBody(b"m1"), 1))
        first = next_delivery(client)
        assert (first.delivery_tag, first.redelivered) == (1, False)
        client.send_method(1, commands.Basic.RecoverAsync(requeue=True))
        again = next_delivery(client)
        assert (again.delivery_tag, again.redelivered) == (2, True)
        client.send_method(1, commands.Basic.Ack(delivery_tag=2))
        client.send_method(1, commands.Queue.Delete(queue=queue))
        deleted = client.read_method()[1]
        assert isinstance(deleted, commands.Queue.DeleteOk), deleted
        assert deleted.message_count == 0


def test_no_ack_consumer_gets_everything_without_acking(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    bodies = publish(connect(), queue, 10)
    consumer = connect()
    channel, deliveries, _ = consume(consumer, queue, 10, auto_ack=True)
    assert deliveries.flags == [(b, False) for b in bodies]
    observer = connect().channel()
    assert wait_for_count(observer, queue, 0) == 0
    channel.close()
    assert drain_flags(observer, queue, 0) == []


# --- consumer errors ----------------------------------------------------------------


def test_reusing_a_consumer_tag_on_a_channel_closes_the_connection_with_530(
    broker: Broker,
) -> None:
    with raw_channel(broker) as client:
        client.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
        _, declare_ok = client.read_method()
        assert isinstance(declare_ok, commands.Queue.DeclareOk), declare_ok
        client.send_method(1, commands.Basic.Consume(queue=declare_ok.queue, consumer_tag="ctag"))
        _, consume_ok = client.read_method()
        assert isinstance(consume_ok, commands.Basic.ConsumeOk), consume_ok
        assert consume_ok.consumer_tag == "ctag"
        client.send_method(1, commands.Basic.Consume(queue=declare_ok.queue, consumer_tag="ctag"))
        close = client.expect_connection_close()
    assert close.reply_code == 530
    assert close.reply_text == "NOT_ALLOWED - attempt to reuse consumer tag 'ctag'"
    assert (close.class_id, close.method_id) == (60, 20)


def test_second_consumer_on_an_exclusively_consumed_queue_is_403(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    first = connect()
    channel = first.channel()
    channel.queue_declare(queue)
    channel.basic_consume(queue, lambda *_: None, exclusive=True)
    other = connect()
    other_channel = other.channel()
    error = closes_channel(other, lambda: other_channel.basic_consume(queue, lambda *_: None))
    assert error.reply_code == 403
    assert error.reply_text == (f"ACCESS_REFUSED - queue '{queue}' in vhost '/' in exclusive use")
    assert channel.is_open


def test_exclusive_consume_when_a_consumer_exists_is_403(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    first = connect()
    channel = first.channel()
    channel.queue_declare(queue)
    channel.basic_consume(queue, lambda *_: None)
    other = connect()
    other_channel = other.channel()
    error = closes_channel(
        other, lambda: other_channel.basic_consume(queue, lambda *_: None, exclusive=True)
    )
    assert error.reply_code == 403
    assert error.reply_text == (f"ACCESS_REFUSED - queue '{queue}' in vhost '/' in exclusive use")
    assert channel.is_open


def test_deleting_a_consumed_queue_sends_basic_cancel_to_the_consumer(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    queue = created.queue()
    consumer = connect()
    assert consumer.consumer_cancel_notify_supported
    channel = consumer.channel()
    channel.queue_declare(queue)
    cancels: list[pika.spec.Basic.Cancel] = []
    channel.add_on_cancel_callback(lambda frame_: cancels.append(frame_.method))
    tag = channel.basic_consume(queue, lambda *_: None)
    connect().channel().queue_delete(queue)
    pump([consumer], lambda: len(cancels) >= 1)
    # RabbitMQ sends the cancel with nowait set: the client is not to answer cancel-ok.
    assert [(c.consumer_tag, c.nowait) for c in cancels] == [(tag, True)]
    assert consumer.is_open and channel.is_open
