"""Message bodies up to RabbitMQ's limit (128 MiB): larger than Pulsar's maxMessageSize, so
stored in chunks (Pulsar message chunking); delivered, fetched and requeued whole; one
byte more is refused with RabbitMQ's 406. Counted and compared by digest."""

from __future__ import annotations

import hashlib
import os
import time

import pika
from pika.adapters.blocking_connection import BlockingConnection

from tests.support import amqp_fixtures
from tests.support.amqp_fixtures import Created, closes_channel, confirming_channel

NAME_PREFIX = "large"
RABBITMQ_MAX_MESSAGE_SIZE = 128 * 1024 * 1024
LARGE = 20 * 1000 * 1000  # four times Pulsar's default maxMessageSize


def digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def test_large_messages_reach_two_consumers_whole_and_once(
    connection: BlockingConnection, created: Created
) -> None:
    queue = created.queue()
    publisher = confirming_channel(connection)
    publisher.queue_declare(queue, durable=True)
    bodies = [os.urandom(LARGE) for _ in range(4)]
    for body in bodies:
        publisher.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    got: list[str] = []
    channels = []
    for _ in range(2):
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1)

        def on_message(ch: object, method: object, props: object, body: bytes) -> None:
            got.append(digest(body))
            ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]

        channel.basic_consume(queue, on_message)
        channels.append(channel)
    deadline = time.monotonic() + 60
    while len(got) < len(bodies) and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    connection.process_data_events(time_limit=0.5)  # nothing more may come
    assert sorted(got) == sorted(digest(b) for b in bodies)


def test_a_message_of_exactly_128_mib_is_fetched_and_requeued_whole(
    connection: BlockingConnection, created: Created
) -> None:
    queue = created.queue()
    channel = confirming_channel(connection)
    channel.queue_declare(queue)
    body = os.urandom(RABBITMQ_MAX_MESSAGE_SIZE)
    channel.basic_publish("", queue, body)
    expected = digest(body)
    del body
    method, _, got = amqp_fixtures.get_one(channel, queue, auto_ack=False, timeout=60)
    assert method is not None and not method.redelivered
    assert digest(got) == expected
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, _, got = amqp_fixtures.get_one(channel, queue, auto_ack=True, timeout=60)
    assert method is not None and method.redelivered
    assert digest(got) == expected
    assert channel.queue_declare(queue, passive=True).method.message_count == 0


def test_one_byte_over_128_mib_closes_the_channel_with_406(
    connection: BlockingConnection, created: Created
) -> None:
    queue = created.queue()
    channel = connection.channel()
    channel.queue_declare(queue)
    size = RABBITMQ_MAX_MESSAGE_SIZE + 1

    def publish() -> None:
        channel.basic_publish("", queue, bytes(size))
        channel.queue_declare(queue, passive=True)  # waits for the close

    error = closes_channel(connection, publish)
    assert error.reply_code == 406
    assert error.reply_text == (
        f"PRECONDITION_FAILED - message size {size} is larger than configured max size "
        f"{RABBITMQ_MAX_MESSAGE_SIZE}"
    )
