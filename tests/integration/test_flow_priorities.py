"""Priority queues (`x-max-priority`) as RabbitMQ 3.10 does them: the ready message of the
highest priority goes first (absent = 0, above the maximum = the maximum), publish order
within a priority. Runs against RabbitMQ too (STARLIGHT_TEST_AMQP_URL), except the test of
the proxy's band granularity (docs/mapping.md#priority-queues).
"""

from __future__ import annotations

import asyncio
import random
import time

import aio_pika
import kombu
import pika
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from starlight_py.model.priorities import band_of
from tests.integration.conftest import Broker
from tests.support.amqp_fixtures import (
    AckingDeliveries,
    Created,
    Deliveries,
    confirming_channel,
    drain,
    pump,
    wait_for_count,
)

NAME_PREFIX = "prio"
ARRIVAL = 1.0  # seconds for a message published to reach a waiting consumer's proxy


def declare(channel: BlockingChannel, created: Created, max_priority: int = 10) -> str:
    queue = created.queue("q")
    channel.queue_declare(queue, durable=True, arguments={"x-max-priority": max_priority})
    return queue


def publish(
    channel: BlockingChannel, exchange: str, key: str, messages: list[tuple[bytes, int | None]]
) -> None:
    for body, priority in messages:
        channel.basic_publish(
            exchange, key, body, pika.BasicProperties(delivery_mode=2, priority=priority)
        )


def by_priority(messages: list[tuple[bytes, int | None]], max_priority: int) -> list[bytes]:
    """The order RabbitMQ delivers them in: highest first, publish order within one."""
    ranked = sorted(enumerate(messages), key=lambda m: (-min(m[1][1] or 0, max_priority), m[0]))
    return [body for _, (body, _) in ranked]


MIXED: list[tuple[bytes, int | None]] = [
    (b"none-1", None),
    (b"p1", 1),
    (b"p5-1", 5),
    (b"p10-1", 10),
    (b"p5-2", 5),
    (b"p0", 0),
    (b"p3", 3),
    (b"p200", 200),  # above the maximum: counts as 10
    (b"none-2", None),
    (b"p10-2", 10),
]


def filled(connection: BlockingConnection, created: Created) -> tuple[BlockingChannel, str]:
    """A confirming channel and a priority queue (max 10) holding MIXED."""
    channel = confirming_channel(connection)
    queue = declare(channel, created)
    publish(channel, "", queue, MIXED)
    assert wait_for_count(channel, queue, len(MIXED)) == len(MIXED)
    return channel, queue


def test_get_takes_the_highest_priority_first(
    connection: BlockingConnection, created: Created
) -> None:
    channel, queue = filled(connection, created)
    assert drain(channel, queue, len(MIXED)) == by_priority(MIXED, 10)


def test_a_consumer_gets_the_backlog_in_priority_order(
    connection: BlockingConnection, created: Created
) -> None:
    _, queue = filled(connection, created)
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=1)
    deliveries = AckingDeliveries()
    consumer.basic_consume(queue, deliveries)
    pump([connection], lambda: len(deliveries) >= len(MIXED))
    bodies = deliveries.bodies
    assert sorted(bodies) == sorted(body for body, _ in MIXED)
    priorities = dict(MIXED)
    bands = [band_of(priorities[body], 10) for body in bodies]
    assert bands == sorted(bands, reverse=True), bodies
    assert bodies == by_priority(MIXED, 10)


def test_a_higher_priority_message_overtakes_the_waiting_ones(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = declare(channel, created, max_priority=5)
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=1)
    deliveries = Deliveries()
    consumer.basic_consume(queue, deliveries)
    publish(channel, "", queue, [(f"low{i}".encode(), 1) for i in range(4)])
    pump([connection], lambda: len(deliveries) >= 1)
    assert deliveries.bodies == [b"low0"]  # held unacked: prefetch 1
    publish(channel, "", queue, [(b"urgent", 5)])
    pump([connection], lambda: False, timeout=ARRIVAL, settle=0)
    for count in range(2, 6):
        consumer.basic_ack(deliveries.tags[-1])
        pump([connection], lambda n=count: len(deliveries) >= n)  # type: ignore[misc]
    assert deliveries.bodies == [b"low0", b"urgent", b"low1", b"low2", b"low3"]


def test_counts_and_purge_cover_every_priority(
    connection: BlockingConnection, created: Created
) -> None:
    channel, queue = filled(connection, created)
    assert channel.queue_purge(queue).method.message_count == len(MIXED)
    assert wait_for_count(channel, queue, 0) == 0
    assert drain(channel, queue, 0) == []
    # Deleting reports what it held, every priority included.
    publish(channel, "", queue, MIXED[:4])
    assert wait_for_count(channel, queue, 4) == 4
    assert channel.queue_delete(queue).method.message_count == 4


def test_a_fanout_gives_each_queue_every_message_once(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    exchange = created.exchange("fan")
    channel.exchange_declare(exchange, "fanout")
    prioritised = declare(channel, created)
    plain = created.queue("plain")
    channel.queue_declare(plain, durable=True)
    for queue in (prioritised, plain):
        channel.queue_bind(queue, exchange)
    publish(channel, exchange, "", MIXED)
    assert drain(channel, plain, len(MIXED)) == [body for body, _ in MIXED]
    assert drain(channel, prioritised, len(MIXED)) == by_priority(MIXED, 10)


def test_dead_letters_keep_their_priority(connection: BlockingConnection, created: Created) -> None:
    channel = confirming_channel(connection)
    target = declare(channel, created)
    source = created.queue("src")
    channel.queue_declare(
        source,
        durable=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": target},
    )
    publish(channel, "", source, MIXED)
    rejected = 0
    while rejected < len(MIXED):
        method, _, _ = channel.basic_get(source)
        if method is None:
            time.sleep(0.02)
            continue
        channel.basic_reject(method.delivery_tag, requeue=False)
        rejected += 1
    assert wait_for_count(channel, target, len(MIXED)) == len(MIXED)
    assert drain(channel, target, len(MIXED)) == by_priority(MIXED, 10)


def test_nothing_is_lost_when_a_channel_closes_with_unacked_messages(
    connection: BlockingConnection, created: Created
) -> None:
    total = 600
    rng = random.Random(7)
    messages: list[tuple[bytes, int | None]] = [
        (f"m{i}".encode(), rng.choice([None, 0, 1, 2, 3])) for i in range(total)
    ]
    channel = confirming_channel(connection)
    queue = declare(channel, created, max_priority=3)
    publish(channel, "", queue, messages)
    # A consumer takes 50 without acking, and its channel closes: they go back.
    first = connection.channel()
    first.basic_qos(prefetch_count=50)
    held = Deliveries()
    first.basic_consume(queue, held)
    pump([connection], lambda: len(held) >= 50)
    assert len(held) == 50
    first.close()
    second = connection.channel()
    second.basic_qos(prefetch_count=100)
    seen = AckingDeliveries()
    second.basic_consume(queue, seen)
    pump([connection], lambda: len(seen) >= total, timeout=60, settle=0.5)
    assert sorted(seen.bodies) == sorted(body for body, _ in messages)
    assert wait_for_count(channel, queue, 0) == 0


def test_aio_pika_priorities(broker: Broker, created: Created) -> None:
    queue_name = created.queue("aio")

    async def scenario() -> list[bytes]:
        connection = await aio_pika.connect(broker.url())
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue(
                queue_name, durable=True, arguments={"x-max-priority": 9}
            )
            for body, priority in MIXED:
                await channel.default_exchange.publish(
                    aio_pika.Message(body, priority=priority), queue_name
                )
            received: list[bytes] = []
            deadline = time.monotonic() + 10
            while len(received) < len(MIXED) and time.monotonic() < deadline:
                message = await queue.get(no_ack=True, fail=False)
                if message is None:
                    await asyncio.sleep(0.02)
                else:
                    received.append(message.body)
            return received

    assert asyncio.run(scenario()) == by_priority(MIXED, 9)


def test_kombu_priorities(broker: Broker, created: Created) -> None:
    name = created.queue("kombu")
    queue = kombu.Queue(name, kombu.Exchange("", "direct"), routing_key=name, max_priority=10)
    received: list[bytes] = []
    with kombu.Connection(broker.url(), transport_options={"confirm_publish": True}) as conn:
        producer = conn.Producer()
        for body, priority in MIXED:
            producer.publish(
                body,
                routing_key=name,
                declare=[queue],
                priority=priority,
                serializer=None,
                content_type="application/octet-stream",
                content_encoding="binary",
            )
        bound = queue(conn.default_channel)
        deadline = time.monotonic() + 10
        while len(received) < len(MIXED) and time.monotonic() < deadline:
            message = bound.get(no_ack=False)
            if message is None:
                time.sleep(0.02)
                continue
            received.append(message.body)
            message.ack()
    assert received == by_priority(MIXED, 10)


def test_priorities_above_ten_share_bands(
    proxy_only: None, connection: BlockingConnection, created: Created
) -> None:
    """The proxy's granularity: x-max-priority 255 has 10 bands above 0, so 30 and 40
    (both band 2) keep their publish order, while 200 (band 8) goes first."""
    channel = confirming_channel(connection)
    queue = declare(channel, created, max_priority=255)
    publish(channel, "", queue, [(b"p30", 30), (b"p40", 40), (b"p200", 200), (b"p0", None)])
    assert drain(channel, queue, 4) == [b"p200", b"p30", b"p40", b"p0"]


def test_a_new_consumer_has_every_band_before_the_cancel_ok_of_its_first_delivery(
    broker: Broker, created: Created
) -> None:
    """RabbitMQ hands a new consumer of a priority queue every ready message at once, so a
    client that cancels at its first delivery has had them all by cancel-ok, requeued ones
    included (kombu's test_publish_requeue_consume does this). The proxy's bands are
    subscriptions that Pulsar serves each at its own moment: a new consumer's first
    deliveries wait for every band's known messages."""
    name = created.queue("one-go")
    with kombu.Connection(broker.url(), transport_options={"confirm_publish": True}) as conn:
        channel = conn.default_channel
        channel.queue_declare(
            name, durable=True, auto_delete=False, arguments={"x-max-priority": 10}
        )

        def publish_one(body: bytes, priority: int) -> None:
            message = channel.prepare_message(body, priority, properties={"delivery_mode": 2})
            channel.basic_publish(message, exchange="", routing_key=name)

        def consume_then_cancel() -> list[tuple[bytes, int]]:
            received: list[tuple[bytes, int]] = []
            tag = channel.basic_consume(
                name,
                callback=lambda m: received.append((m.body, m.delivery_info["delivery_tag"])),
            )
            deadline = time.monotonic() + 10
            while not received and time.monotonic() < deadline:
                conn.drain_events(timeout=deadline - time.monotonic())
            # Deliveries that come before the cancel-ok still reach the callback.
            channel.basic_cancel(tag)
            return received

        for body, priority in [(b"first", 3), (b"second", 6), (b"third", 3)]:
            publish_one(body, priority)
        with pika.BlockingConnection(pika.URLParameters(broker.url())) as counting:
            assert wait_for_count(counting.channel(), name, 3) == 3
        first = consume_then_cancel()
        assert [body for body, _ in first] == [b"second", b"first", b"third"]
        for _, tag in first:
            channel.basic_reject(tag, requeue=True)
        publish_one(b"fourth", 9)
        with pika.BlockingConnection(pika.URLParameters(broker.url())) as counting:
            assert wait_for_count(counting.channel(), name, 4, timeout=10) == 4
        second = consume_then_cancel()
        assert [body for body, _ in second] == [b"fourth", b"second", b"first", b"third"]
