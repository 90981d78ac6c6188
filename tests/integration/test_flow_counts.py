"""Counts the broker reports: declare-ok message_count/consumer_count, delete-ok and
purge-ok message_count, exactly as RabbitMQ 3.10 reports them (ready messages only)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pika
import pika.exceptions
import pytest
from pamqp import commands
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.integration.conftest import Broker, ProxyFactory
from tests.support import amqp_fixtures
from tests.support.amqp_fixtures import Created, confirming_channel, get_one, raw_channel

# --- helpers (shared ones: tests/support/amqp_fixtures.py; fixtures: conftest.py) -----

NAME_PREFIX = "flow"  # of the names made here (the `created` fixture reads it)


def unique(kind: str) -> str:
    return amqp_fixtures.unique(kind, NAME_PREFIX)


def counts(channel: BlockingChannel, queue: str) -> tuple[int, int]:
    ok = channel.queue_declare(queue, passive=True).method
    return ok.message_count, ok.consumer_count


def wait_for_counts(
    channel: BlockingChannel, queue: str, expected: tuple[int, int], timeout: float = 10.0
) -> tuple[int, int]:
    """Passive-declare until (message_count, consumer_count) == expected or timeout; returns
    the last answer. RabbitMQ answers exactly at once; a proxy may lag by a moment."""
    deadline = time.monotonic() + timeout
    while True:
        answer = counts(channel, queue)
        if answer == expected or time.monotonic() >= deadline:
            return answer
        time.sleep(0.05)


def publish(channel: BlockingChannel, queue: str, count: int) -> None:
    for i in range(count):
        channel.basic_publish("", queue, f"m{i}".encode())


# --- message_count ------------------------------------------------------------------


def test_declare_ok_message_count_after_confirmed_publishes(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    ok = channel.queue_declare(queue).method
    assert (ok.message_count, ok.consumer_count) == (0, 0)
    publish(channel, queue, 25)
    assert wait_for_counts(channel, queue, (25, 0)) == (25, 0)
    ok = channel.queue_declare(queue).method  # a non-passive redeclare answers the same
    assert (ok.queue, ok.message_count, ok.consumer_count) == (queue, 25, 0)


def test_declare_ok_message_count_after_pipelined_confirmed_publishes(
    broker: Broker, connection: BlockingConnection, created: Created
) -> None:
    """Publishes written back to back (one write), all confirmed, then counted."""
    channel = connection.channel()
    queue = created.queue()
    channel.queue_declare(queue)
    total = 20
    with raw_channel(broker) as client:
        client.send_method(1, commands.Confirm.Select())
        assert isinstance(client.read_method()[1], commands.Confirm.SelectOk)
        client.send(amqp_fixtures.back_to_back_publishes(queue, total))
        acked = amqp_fixtures.confirmed_tags(client, total)
        assert acked == set(range(1, total + 1))
    assert wait_for_counts(channel, queue, (total, 0)) == (total, 0)


def test_message_count_counts_ready_messages_not_unacked_ones(
    broker: Broker, connect: Callable[[], BlockingConnection], created: Created
) -> None:
    channel = confirming_channel(connect())
    queue = created.queue()
    channel.queue_declare(queue)
    publish(channel, queue, 5)
    assert wait_for_counts(channel, queue, (5, 0)) == (5, 0)
    holder = connect().channel()
    for expected in (b"m0", b"m1"):
        assert get_one(holder, queue)[2] == expected
    # Exact on the proxy too: a message read ahead by a getter is still ready.
    assert wait_for_counts(channel, queue, (3, 0)) == (3, 0)
    holder.close()  # the two unacked are requeued
    assert wait_for_counts(channel, queue, (5, 0)) == (5, 0)


def test_message_count_with_a_prefetch_limited_consumer(
    broker: Broker, connect: Callable[[], BlockingConnection], created: Created
) -> None:
    channel = confirming_channel(connect())
    queue = created.queue()
    channel.queue_declare(queue)
    publish(channel, queue, 10)
    consumer = connect()
    consumer_channel = consumer.channel()
    consumer_channel.basic_qos(prefetch_count=4)
    received: list[bytes] = []
    consumer_channel.basic_consume(queue, lambda _c, _m, _p, body: received.append(body))
    deadline = time.monotonic() + 10
    while len(received) < 4 and time.monotonic() < deadline:
        consumer.process_data_events(time_limit=0.02)
    consumer.process_data_events(time_limit=0.3)
    assert received == [b"m0", b"m1", b"m2", b"m3"]
    # Exact on the proxy too: what Pulsar pushed to the proxy past the prefetch is ready.
    assert wait_for_counts(channel, queue, (6, 1)) == (6, 1)


# --- consumer_count -----------------------------------------------------------------


def test_consumer_count_follows_consumers(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    observer = connect().channel()
    queue = created.queue()
    observer.queue_declare(queue)
    first, second = connect(), connect()
    first_channel, other_channel = first.channel(), first.channel()
    tags = [
        first_channel.basic_consume(queue, lambda *_: None),
        first_channel.basic_consume(queue, lambda *_: None),
        other_channel.basic_consume(queue, lambda *_: None),
    ]
    second.channel().basic_consume(queue, lambda *_: None)
    assert wait_for_counts(observer, queue, (0, 4)) == (0, 4)
    first_channel.basic_cancel(tags[0])
    assert wait_for_counts(observer, queue, (0, 3)) == (0, 3)
    second.close()
    assert wait_for_counts(observer, queue, (0, 2)) == (0, 2)
    first_channel.close()
    assert wait_for_counts(observer, queue, (0, 1)) == (0, 1)
    first.close()
    assert wait_for_counts(observer, queue, (0, 0)) == (0, 0)


def test_cancelled_consumer_holding_unacked_messages_is_not_counted(
    connection: BlockingConnection, created: Created
) -> None:
    """RabbitMQ counts consumers, not channels holding deliveries: right after cancel-ok the
    count drops and delete(if_unused) succeeds, while the messages stay unacked."""
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue)
    publish(channel, queue, 3)
    received: list[int] = []
    tag = channel.basic_consume(queue, lambda ch, m, p, b: received.append(m.delivery_tag))
    deadline = time.monotonic() + 10
    while len(received) < 3 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    assert len(received) == 3
    channel.basic_cancel(tag)
    assert counts(connection.channel(), queue) == (0, 0)
    ok = connection.channel().queue_delete(queue, if_unused=True).method
    assert isinstance(ok, pika.spec.Queue.DeleteOk)


# --- delete-ok / purge-ok -----------------------------------------------------------


def test_delete_ok_message_count_is_the_number_of_messages(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue)
    publish(channel, queue, 7)
    ok = channel.queue_delete(queue).method
    assert (type(ok), ok.message_count) == (pika.spec.Queue.DeleteOk, 7)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.queue_declare(queue, passive=True)
    assert info.value.reply_code == 404


def test_delete_ok_counts_ready_messages_only(
    broker: Broker, connect: Callable[[], BlockingConnection], created: Created
) -> None:
    channel = confirming_channel(connect())
    queue = created.queue()
    channel.queue_declare(queue)
    publish(channel, queue, 5)
    holder = connect().channel()
    for expected in (b"m0", b"m1"):
        assert get_one(holder, queue)[2] == expected
    deleted = channel.queue_delete(queue).method.message_count
    if broker.is_rabbitmq:
        assert deleted == 3
    else:
        # One further message may sit in the outstanding get's receiver queue, counted as
        # unacked (docs/compatibility.md, "Counts").
        assert deleted in (2, 3)


def test_purge_ok_then_declare_ok_counts(connection: BlockingConnection, created: Created) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue)
    publish(channel, queue, 6)
    assert channel.queue_purge(queue).method.message_count == 6
    assert counts(channel, queue) == (0, 0)
    publish(channel, queue, 2)
    assert wait_for_counts(channel, queue, (2, 0)) == (2, 0)


@pytest.mark.usefixtures("proxy_only")
def test_message_count_on_one_proxy_leaves_out_what_a_consumer_on_another_holds(
    start_proxy: ProxyFactory, created: Created
) -> None:
    """A prefetch-10 consumer on one proxy holds 10 of 30 messages: any proxy counts 20."""
    counting, consuming = start_proxy(), start_proxy()
    channel = confirming_channel(pika.BlockingConnection(pika.URLParameters(counting.amqp_url())))
    queue = created.queue()
    channel.queue_declare(queue)
    publish(channel, queue, 30)
    consumer = pika.BlockingConnection(pika.URLParameters(consuming.amqp_url()))
    consumer_channel = consumer.channel()
    consumer_channel.basic_qos(prefetch_count=10)
    received: list[bytes] = []
    consumer_channel.basic_consume(queue, lambda _c, _m, _p, body: received.append(body))
    deadline = time.monotonic() + 10
    while len(received) < 10 and time.monotonic() < deadline:
        consumer.process_data_events(time_limit=0.02)
    consumer.process_data_events(time_limit=0.3)
    assert len(received) == 10
    assert wait_for_counts(channel, queue, (20, 1)) == (20, 1)
    consumer.close()  # its ten go back
    assert wait_for_counts(channel, queue, (30, 0)) == (30, 0)
    channel.queue_delete(queue)


@pytest.mark.parametrize("kind", ["topic", "headers"])
def test_queues_of_a_shared_exchange_count_only_what_was_routed_to_them(
    connect: Callable[[], BlockingConnection], created: Created, kind: str
) -> None:
    """One topic carries every message of a topic or headers exchange; each queue counts
    (and purges) only its own, as in RabbitMQ, and still gets all of them."""
    channel = confirming_channel(connect())
    exchange = created.exchange(kind)
    channel.exchange_declare(exchange, kind)
    queue_a, queue_b = created.queue("a"), created.queue("b")
    for queue, key in ((queue_a, "a"), (queue_b, "b")):
        channel.queue_declare(queue)
        if kind == "topic":
            channel.queue_bind(queue, exchange, f"{key}.*")
        else:
            channel.queue_bind(queue, exchange, "", {"x-match": "all", "to": key})

    def send(key: str, body: bytes) -> None:
        if kind == "topic":
            channel.basic_publish(exchange, f"{key}.x", body)
        else:
            channel.basic_publish(exchange, "", body, pika.BasicProperties(headers={"to": key}))

    for i in range(5):
        send("a", f"a{i}".encode())
    send("b", b"b0")
    assert wait_for_counts(channel, queue_a, (5, 0)) == (5, 0)
    assert wait_for_counts(channel, queue_b, (1, 0)) == (1, 0)
    # Nothing of queue a was taken by the pre-acks of queue b.
    assert sorted(amqp_fixtures.drain(channel, queue_a, 5)) == [f"a{i}".encode() for i in range(5)]
    assert channel.queue_purge(queue_b).method.message_count == 1


def test_every_get_on_a_new_channel_finds_a_message_while_others_publish(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    """RabbitMQ answers basic.get with a message whenever its count says there is one. Each
    get here is on a new channel (a new reader of the queue, which Pulsar must first dispatch
    to) while another connection keeps publishing to another queue: 40 gets, 40 messages in
    order, and the count after each is one less."""
    channel = confirming_channel(connect())
    queue, busy = created.queue("get"), created.queue("busy")
    channel.queue_declare(queue)
    channel.queue_declare(busy)
    total = 40
    publish(channel, queue, total)
    assert wait_for_counts(channel, queue, (total, 0)) == (total, 0)
    stop = threading.Event()
    publisher = connect()

    def keep_publishing() -> None:
        load = publisher.channel()
        while not stop.is_set():
            for _ in range(50):
                load.basic_publish("", busy, b"x" * 1024)
            publisher.process_data_events(time_limit=0)

    loader = threading.Thread(target=keep_publishing, daemon=True)
    loader.start()
    got: list[bytes] = []
    left: list[int] = []
    try:
        with connect() as getting:
            for _ in range(total):
                get_channel = getting.channel()
                method, _properties, body = get_channel.basic_get(queue, auto_ack=True)
                if method is None:
                    break
                got.append(body)
                left.append(method.message_count)
                get_channel.close()
    finally:
        stop.set()
        loader.join(timeout=10)
    assert got == [f"m{i}".encode() for i in range(total)]
    assert left == list(range(total - 1, -1, -1))
    channel.queue_purge(busy)
