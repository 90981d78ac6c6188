"""Helpers shared by the AMQP behaviour tests (tests/integration/test_topology_*.py and
test_flow_*.py): generated names and their cleanup, polling basic.get, confirms, raw
channels. The pytest fixtures built on them live in tests/integration/conftest.py."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import pika
import pika.exceptions
import pytest
from pamqp import body as pamqp_body
from pamqp import commands, frame
from pamqp import header as pamqp_header
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.support.raw_amqp import RawClient

if TYPE_CHECKING:
    from tests.integration.conftest import Broker


def unique(kind: str, prefix: str = "test") -> str:
    return f"{prefix}-{kind}-{uuid.uuid4().hex[:12]}"


class Created:
    """Names one test creates; whatever is left is deleted (best effort) when it ends."""

    def __init__(self, prefix: str = "test") -> None:
        self.prefix = prefix
        self.exchanges: list[str] = []
        self.queues: list[str] = []

    def exchange(self, kind: str = "x") -> str:
        name = unique(kind, self.prefix)
        self.exchanges.append(name)
        return name

    def queue(self, kind: str = "q") -> str:
        name = unique(kind, self.prefix)
        self.queues.append(name)
        return name


def delete_created(url: str, names: Created) -> None:
    """Delete (best effort) the queues, then the exchanges, that `names` recorded."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        targets = [("queue", q) for q in names.queues]
        targets += [("exchange", x) for x in names.exchanges]
        for kind, name in targets:
            try:
                if kind == "queue":
                    channel.queue_delete(name)
                else:
                    channel.exchange_delete(name)
            except pika.exceptions.ChannelClosedByBroker:
                channel = connection.channel()
    finally:
        connection.close()


def closes_channel(
    connection: BlockingConnection, action: Callable[[], object]
) -> pika.exceptions.ChannelClosedByBroker:
    """Run `action`, which must make the broker close the channel (not the connection)."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        action()
    assert connection.is_open
    assert connection.channel().is_open
    return info.value


def confirming_channel(connection: BlockingConnection) -> BlockingChannel:
    channel = connection.channel()
    channel.confirm_delivery()
    return channel


def drain(
    channel: BlockingChannel,
    queue: str,
    expected: int,
    timeout: float = 5.0,
    settle: float = 0.3,
) -> list[bytes]:
    """Bodies fetched with basic.get (auto-ack): polls until `expected` messages arrived or
    `timeout`, then `settle` seconds more so that any message beyond them shows up too."""
    bodies: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(bodies) < expected and time.monotonic() < deadline:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.02)
        else:
            bodies.append(body)
    quiet_until = time.monotonic() + settle
    while time.monotonic() < quiet_until:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.02)
        else:
            bodies.append(body)
    return bodies


def wait_for_count(
    channel: BlockingChannel, queue: str, expected: int, timeout: float = 5.0
) -> int:
    """Passive-declare until message_count == expected or `timeout`; returns the last count
    (RabbitMQ answers exactly at once; the proxy's counts follow Pulsar's stats)."""
    deadline = time.monotonic() + timeout
    while True:
        count = channel.queue_declare(queue, passive=True).method.message_count
        if count == expected or time.monotonic() >= deadline:
            return int(count)
        time.sleep(0.05)


class Deliveries:
    """A consumer's basic.deliver frames, in arrival order (a pika on_message_callback)."""

    def __init__(self) -> None:
        self.items: list[tuple[pika.spec.Basic.Deliver, bytes]] = []

    def __call__(
        self,
        _channel: BlockingChannel,
        method: pika.spec.Basic.Deliver,
        _properties: pika.BasicProperties,
        body: bytes,
    ) -> None:
        self.items.append((method, body))

    def __len__(self) -> int:
        return len(self.items)

    @property
    def bodies(self) -> list[bytes]:
        return [body for _, body in self.items]

    @property
    def tags(self) -> list[int]:
        return [method.delivery_tag for method, _ in self.items]

    @property
    def flags(self) -> list[tuple[bytes, bool]]:
        return [(body, method.redelivered) for method, body in self.items]


class AckingDeliveries(Deliveries):
    """Deliveries that acks each message as it arrives."""

    def __call__(
        self,
        channel: BlockingChannel,
        method: pika.spec.Basic.Deliver,
        properties: pika.BasicProperties,
        body: bytes,
    ) -> None:
        super().__call__(channel, method, properties, body)
        channel.basic_ack(method.delivery_tag)


def get_one(
    channel: BlockingChannel, queue: str, timeout: float = 5.0, *, auto_ack: bool = False
) -> tuple[pika.spec.Basic.GetOk, pika.BasicProperties, bytes]:
    """basic.get (manual ack unless `auto_ack`) polled until a message comes, or fail."""
    deadline = time.monotonic() + timeout
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=auto_ack)
        if method is not None:
            return method, properties, body
        assert time.monotonic() < deadline, f"no message in {queue} after {timeout}s"
        time.sleep(0.02)


def pump(
    connections: list[BlockingConnection],
    done: Callable[[], bool],
    timeout: float = 10.0,
    settle: float = 0.3,
    between: Callable[[], None] | None = None,
) -> None:
    """Process I/O on every connection until `done()` or `timeout`, then `settle` s more."""
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        for conn in connections:
            conn.process_data_events(time_limit=0.02)
            if between is not None:
                between()
    quiet_until = time.monotonic() + settle
    while time.monotonic() < quiet_until:
        for conn in connections:
            conn.process_data_events(time_limit=0.02)
            if between is not None:
                between()


@contextlib.contextmanager
def raw_channel(broker: Broker) -> Iterator[RawClient]:
    """A raw client past the handshake, with channel 1 open."""
    client = broker.raw()
    try:
        client.handshake()
        assert isinstance(client.open_channel(1), commands.Channel.OpenOk)
        yield client
    finally:
        client.close()


def next_reply(client: RawClient) -> object:
    channel, method = client.read_method()
    assert channel == 1, (channel, method)
    return method


def back_to_back_publishes(
    queue: str,
    count: int,
    channel: int = 1,
    exchange: str = "",
    routing_keys: Sequence[str] = (),
    properties: commands.Basic.Properties | None = None,
) -> bytes:
    """`count` basic.publish to `queue` (bodies m0, m1, ...) encoded as one byte string: sent
    with one write, the broker reads them together. With `routing_keys`, message i goes to
    `exchange` with routing key `routing_keys[i % len(routing_keys)]` instead."""
    data = b""
    for i in range(count):
        payload = f"m{i}".encode()
        key = routing_keys[i % len(routing_keys)] if routing_keys else queue
        data += frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=key), channel)
        data += frame.marshal(
            pamqp_header.ContentHeader(0, len(payload), properties or commands.Basic.Properties()),
            channel,
        )
        data += frame.marshal(pamqp_body.ContentBody(payload), channel)
    return data


def confirmed_tags(client: RawClient, count: int, timeout: float = 10) -> set[int]:
    """Read confirms (basic.ack) until `count` publishes are acked or nothing comes for
    `timeout` s; returns the acked delivery tags."""
    acked: set[int] = set()
    while len(acked) < count:
        try:
            _, method = client.read_method(timeout=timeout)
        except TimeoutError:
            break
        assert isinstance(method, commands.Basic.Ack), method
        last = method.delivery_tag
        acked |= set(range(1, last + 1)) if method.multiple else {last}
    return acked
