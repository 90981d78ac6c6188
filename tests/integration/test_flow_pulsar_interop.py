"""AMQP clients and Pulsar-native clients on the same topics (docs/mapping.md)."""

from __future__ import annotations

import re
import time
import uuid

import pika
import pulsar

from tests.support.proxy_runner import ProxyThread


def get_one(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> tuple:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            return method, properties, body
        time.sleep(0.05)
    raise AssertionError(f"nothing arrived in {queue}")


def test_pulsar_native_producer_reaches_amqp_consumer(
    proxy: ProxyThread, pulsar_client: pulsar.Client
) -> None:
    exchange, queue = f"native-{uuid.uuid4().hex[:8]}", f"q-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))
    channel = connection.channel()
    channel.exchange_declare(exchange, "fanout")
    channel.queue_declare(queue, exclusive=True)
    channel.queue_bind(queue, exchange)
    # A fanout exchange is one topic named like the exchange (docs/mapping.md).
    producer = pulsar_client.create_producer(f"persistent://public/default/{exchange}")
    producer.send(b'{"order": 7}', properties={"content-type": "application/json", "region": "eu"})
    method, properties, body = get_one(channel, queue)
    assert body == b'{"order": 7}'
    assert method.exchange == exchange
    assert properties.content_type == "application/json"
    assert properties.headers == {"content-type": "application/json", "region": "eu"}
    connection.close()


def test_amqp_publish_is_readable_by_a_pulsar_native_consumer(
    proxy: ProxyThread, pulsar_client: pulsar.Client
) -> None:
    exchange, queue = f"amqp-out-{uuid.uuid4().hex[:8]}", f"q-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.exchange_declare(exchange, "topic")
    channel.queue_declare(queue, exclusive=True)
    channel.queue_bind(queue, exchange, "orders.#")
    # A topic exchange writes each message to the own topic of every queue binding that
    # routes it, `<exchange>~~<queue>~~<id>` (docs/mapping.md): read them all by pattern.
    # Such a topic is made by the first message routed there: a pattern subscribed before
    # finds it only at its next discovery (a minute by default), so this one subscribes
    # once the message is confirmed, and reads each topic from its start.
    channel.basic_publish(
        exchange,
        "orders.created",
        b"payload",
        pika.BasicProperties(
            content_type="text/plain",
            message_id="m-1",
            correlation_id="c-1",
            headers={"tenant": "acme", "attempt": 2},
        ),
    )
    native = pulsar_client.subscribe(
        re.compile(f"persistent://public/default/{re.escape(exchange)}~~.*"),
        "analytics",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    message = native.receive(timeout_millis=10000)
    native.acknowledge(message)
    assert message.data() == b"payload"
    props = message.properties()
    assert props["amqp.exchange"] == exchange
    assert props["amqp.routing_key"] == "orders.created"
    assert props["amqp.content_type"] == "text/plain"
    assert props["amqp.message_id"] == "m-1"
    assert props["amqp.correlation_id"] == "c-1"
    assert props["amqp.header.tenant"] == "acme"
    assert props["amqp.header.attempt"] == "2"
    assert "amqp.properties" in props  # the lossless copy AMQP consumers use
    # ...and the AMQP queue got it too, with typed headers intact.
    _, properties, body = get_one(channel, queue)
    assert body == b"payload"
    assert properties.headers == {"tenant": "acme", "attempt": 2}
    native.close()
    connection.close()
