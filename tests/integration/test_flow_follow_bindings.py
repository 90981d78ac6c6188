"""A consumer follows bindings added after it started, even when they are made on another
proxy (docs/compatibility.md: `basic.consume` follows bindings added later)."""

from __future__ import annotations

import time
import uuid

import pika

from tests.integration.conftest import ProxyFactory


def test_consumer_gets_messages_of_a_binding_made_later_on_another_proxy(
    start_proxy: ProxyFactory,
) -> None:
    consumer_proxy, other_proxy = start_proxy(), start_proxy()
    queue, exchange = f"follow-q-{uuid.uuid4().hex[:8]}", f"follow-x-{uuid.uuid4().hex[:8]}"
    consumer_connection = pika.BlockingConnection(pika.URLParameters(consumer_proxy.amqp_url()))
    channel = consumer_connection.channel()
    channel.queue_declare(queue)  # not exclusive: the other connection binds it
    received: list[bytes] = []
    channel.basic_consume(queue, lambda ch, m, p, body: received.append(body), auto_ack=True)

    other = pika.BlockingConnection(pika.URLParameters(other_proxy.amqp_url()))
    other_channel = other.channel()
    other_channel.confirm_delivery()
    other_channel.exchange_declare(exchange, "fanout", auto_delete=True)
    other_channel.queue_bind(queue, exchange)
    other_channel.basic_publish(exchange, "", b"via-later-binding")

    deadline = time.monotonic() + 15
    while not received and time.monotonic() < deadline:
        consumer_connection.process_data_events(time_limit=0.1)
    assert received == [b"via-later-binding"]
    other_channel.queue_delete(queue)
    other.close()
    consumer_connection.close()
