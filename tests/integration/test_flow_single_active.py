"""`x-single-active-consumer` queues: of all the consumers of the queue, on any connection
(and any proxy), one gets every message; when it goes, the next in line takes over. Runs
against RabbitMQ too (STARLIGHT_TEST_AMQP_URL)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.integration.conftest import ProxyFactory
from tests.support.amqp_fixtures import Created, confirming_channel, pump

NAME_PREFIX = "sac"
ARRIVAL = 20.0  # how long messages may take to arrive (not a bound on speed)
SINGLE_ACTIVE = {"x-single-active-consumer": True}


class Consumer:
    """A manual-ack consumer on its own connection that records what it got."""

    def __init__(self, connection: BlockingConnection, queue: str) -> None:
        self.connection = connection
        self.channel: BlockingChannel = connection.channel()
        self.channel.basic_qos(prefetch_count=50)
        self.bodies: list[bytes] = []
        self.tag = self.channel.basic_consume(queue, self._on_message)

    def _on_message(
        self, channel: BlockingChannel, method: object, _p: object, body: bytes
    ) -> None:
        self.bodies.append(body)
        channel.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]


def publish(channel: BlockingChannel, queue: str, prefix: str, count: int) -> list[bytes]:
    bodies = [f"{prefix}{i}".encode() for i in range(count)]
    for body in bodies:
        channel.basic_publish("", queue, body)
    return bodies


def test_one_consumer_gets_everything_until_it_goes_then_the_next_takes_over(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    publisher = confirming_channel(connect())
    queue = created.queue()
    publisher.queue_declare(queue, arguments=SINGLE_ACTIVE)
    first = Consumer(connect(), queue)
    pump([first.connection], lambda: False, timeout=0.3)  # first in line
    second = Consumer(connect(), queue)
    both = [first.connection, second.connection]
    assert publisher.queue_declare(queue, passive=True).method.consumer_count == 2

    sent = publish(publisher, queue, "a", 20)
    pump(both, lambda: len(first.bodies) >= 20, timeout=ARRIVAL, settle=0.5)
    assert first.bodies == sent  # all of them, in order
    assert second.bodies == []

    first.channel.basic_cancel(first.tag)
    sent = publish(publisher, queue, "b", 10)
    pump(both, lambda: len(second.bodies) >= 10, timeout=ARRIVAL, settle=0.5)
    assert second.bodies == sent
    assert first.bodies[20:] == []


def test_unacked_messages_of_the_active_consumer_go_to_the_next_when_it_closes(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    publisher = confirming_channel(connect())
    queue = created.queue()
    publisher.queue_declare(queue, arguments=SINGLE_ACTIVE)
    holder = connect()
    holding = holder.channel()
    holding.basic_qos(prefetch_count=3)
    held: list[bytes] = []
    holding.basic_consume(queue, lambda _c, _m, _p, body: held.append(body))  # never acks
    pump([holder], lambda: False, timeout=0.3)
    waiting = Consumer(connect(), queue)
    sent = publish(publisher, queue, "m", 5)
    pump([holder, waiting.connection], lambda: len(held) >= 3, timeout=ARRIVAL, settle=0.5)
    assert held == sent[:3]
    assert waiting.bodies == []
    holder.close()  # its three go back; the waiting consumer is first now
    pump([waiting.connection], lambda: len(waiting.bodies) >= 5, timeout=ARRIVAL)
    assert sorted(waiting.bodies) == sorted(sent)


@pytest.mark.usefixtures("proxy_only")
def test_the_line_spans_proxies(start_proxy: ProxyFactory, created: Created) -> None:
    one, other = start_proxy(), start_proxy()

    def connect_to(proxy: object) -> BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))  # type: ignore[attr-defined]

    publisher = confirming_channel(connect_to(one))
    queue = created.queue()
    publisher.queue_declare(queue, arguments=SINGLE_ACTIVE)
    first = Consumer(connect_to(other), queue)
    pump([first.connection], lambda: False, timeout=0.3)
    second = Consumer(connect_to(one), queue)
    both = [first.connection, second.connection]
    sent = publish(publisher, queue, "a", 10)
    pump(both, lambda: len(first.bodies) >= 10, timeout=ARRIVAL, settle=0.5)
    assert (first.bodies, second.bodies) == (sent, [])
    first.connection.close()
    started = time.monotonic()
    sent = publish(publisher, queue, "b", 10)
    pump([second.connection], lambda: len(second.bodies) >= 10, timeout=ARRIVAL)
    assert second.bodies == sent
    print(f"the next consumer took over within {time.monotonic() - started:.2f} s")
    publisher.queue_delete(queue)
