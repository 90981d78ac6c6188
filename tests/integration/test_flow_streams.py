"""Stream queues (`x-queue-type: stream`) over AMQP 0-9-1, as RabbitMQ 3.10 has them:
declare checks and their errors, consumers reading from `x-stream-offset` (first, last, next,
a stored offset, a timestamp, an interval) without taking anything away, the offset header,
and offsets that are the same through every proxy. Run against RabbitMQ 3.10 too
(STARLIGHT_TEST_AMQP_URL), except the tests marked proxy_only."""

from __future__ import annotations

import asyncio
import datetime
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import aio_pika
import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from starlight_py.backend.pulsar_admin import PulsarAdmin
from starlight_py.local import ServiceEndpoints
from starlight_py.local.ports import free_port
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import exchange_topic
from tests.integration.conftest import Broker, ProxyFactory
from tests.integration.test_ops_metrics import sample
from tests.support.admin_cli import AdminCLI
from tests.support.amqp_fixtures import (
    Created,
    closes_channel,
    confirming_channel,
    pump,
)

NAME_PREFIX = "stream"
STREAM = {"x-queue-type": "stream"}


def declare_stream(
    channel: BlockingChannel, name: str, **arguments: Any
) -> pika.spec.Queue.DeclareOk:
    ok: pika.spec.Queue.DeclareOk = channel.queue_declare(
        name, durable=True, arguments={**STREAM, **arguments}
    ).method
    return ok


def publish(channel: BlockingChannel, queue: str, bodies: list[bytes], exchange: str = "") -> None:
    for body in bodies:
        channel.basic_publish(exchange, queue, body)


class StreamReader:
    """A manual-ack stream consumer: bodies and x-stream-offset headers, in order."""

    def __init__(self, channel: BlockingChannel, queue: str, offset: Any, prefetch: int = 10):
        self.channel = channel
        self.items: list[tuple[bytes, int]] = []
        channel.basic_qos(prefetch_count=prefetch)
        arguments = {} if offset is None else {"x-stream-offset": offset}
        self.tag = channel.basic_consume(queue, self._on_message, arguments=arguments)

    def _on_message(
        self,
        channel: BlockingChannel,
        method: pika.spec.Basic.Deliver,
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        self.items.append((body, (properties.headers or {})["x-stream-offset"]))
        channel.basic_ack(method.delivery_tag)

    @property
    def bodies(self) -> list[bytes]:
        return [body for body, _ in self.items]

    @property
    def offsets(self) -> list[int]:
        return [offset for _, offset in self.items]


def read(
    connection: BlockingConnection,
    queue: str,
    offset: Any,
    expected: int,
    settle: float = 0.5,
    before: Callable[[], None] | None = None,
) -> StreamReader:
    reader = StreamReader(connection.channel(), queue, offset)
    if before is not None:
        pump([connection], lambda: False, timeout=0, settle=0.5)
        before()
    pump([connection], lambda: len(reader.items) >= expected, timeout=10, settle=settle)
    return reader


BODIES = [f"m{i}".encode() for i in range(10)]


def own_cleaner() -> dict[str, str]:
    """Settings for a proxy that leads the SubscriptionCleaner at once: a metadata root of
    its own, so that no other proxy on the same ZooKeeper takes part in its election."""
    return {"starlightMetadataRoot": f"/starlight-streams-{uuid.uuid4().hex[:8]}"}


# ---- declare -------------------------------------------------------------------------------


def test_declare_stream_and_redeclare(connection: BlockingConnection, created: Created) -> None:
    channel = connection.channel()
    name = created.queue()
    ok = declare_stream(
        channel,
        name,
        **{
            "x-max-age": "7D",
            "x-max-length-bytes": 10_000_000,
            "x-stream-max-segment-size-bytes": 500_000,
        },
    )
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 0)
    assert channel.queue_declare(name, passive=True).method.queue == name
    plain = created.queue()
    declare_stream(channel, plain)
    error = closes_channel(connection, lambda: channel.queue_declare(plain, durable=True))
    assert error.reply_code == 406
    assert error.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{plain}' in vhost "
        "'/': received none but current is the value 'stream' of type 'longstr'"
    )


@pytest.mark.parametrize(
    ("options", "refused"),
    [
        ({"durable": True, "exclusive": True}, "exclusive-owner"),
        ({"durable": True, "auto_delete": True}, "auto-delete"),
        ({"durable": False}, "non-durable"),
        ({"durable": False, "auto_delete": True}, "auto-delete"),
    ],
)
def test_stream_properties_rabbitmq_refuses(
    connection: BlockingConnection, created: Created, options: dict[str, bool], refused: str
) -> None:
    name = created.queue()
    channel = connection.channel()
    error = closes_channel(
        connection, lambda: channel.queue_declare(name, arguments=STREAM, **options)
    )
    assert error.reply_code == 406
    assert error.reply_text == (
        f"PRECONDITION_FAILED - invalid property '{refused}' for queue '{name}' in vhost '/'"
    )


def test_server_named_stream_is_refused(connection: BlockingConnection) -> None:
    channel = connection.channel()
    error = closes_channel(
        connection, lambda: channel.queue_declare("", durable=True, arguments=STREAM)
    )
    assert (error.reply_code, error.reply_text) == (
        406,
        "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_stream_queue",
    )


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ({"x-max-age": "7X"}, ": invalid_max_age"),
        ({"x-max-age": "0s"}, ": invalid_max_age"),
        ({"x-max-age": 5}, ": {unacceptable_type,signedint}"),
        ({"x-stream-max-segment-size-bytes": "x"}, ': "expected integer, got longstr"'),
        ({"x-max-length-bytes": -1}, ": {value_negative,-1}"),
        ({"x-max-length": 10}, " of queue type rabbit_stream_queue"),
        ({"x-message-ttl": 10}, " of queue type rabbit_stream_queue"),
        ({"x-dead-letter-exchange": "dlx"}, " of queue type rabbit_stream_queue"),
        ({"x-max-priority": 5}, " of queue type rabbit_stream_queue"),
        ({"x-single-active-consumer": True}, " of queue type rabbit_stream_queue"),
        ({"x-expires": 1000}, " of queue type rabbit_stream_queue"),
        # Arguments are checked before the properties.
        ({"x-max-age": "1x", "x-message-ttl": 3}, ": invalid_max_age"),
    ],
)
def test_stream_arguments_rabbitmq_refuses(
    connection: BlockingConnection, created: Created, arguments: dict[str, Any], reason: str
) -> None:
    name = created.queue()
    channel = connection.channel()
    error = closes_channel(connection, lambda: declare_stream(channel, name, **arguments))
    key = next(iter(arguments))
    assert error.reply_code == 406
    assert error.reply_text == (
        f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{name}' in vhost '/'{reason}"
    )


def test_get_and_purge_close_the_connection_with_540(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    name = created.queue()
    declare_stream(connect().channel(), name)
    for action in (
        lambda ch: ch.basic_get(name),
        lambda ch: ch.basic_get(name, auto_ack=True),
        lambda ch: ch.queue_purge(name),
    ):
        connection = connect()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            action(connection.channel())
        method = (
            "queue.purge"
            if info.value.reply_text.startswith("NOT_IMPLEMENTED - queue")
            else ("basic.get")
        )
        assert (info.value.reply_code, info.value.reply_text) == (
            540,
            f"NOT_IMPLEMENTED - {method} not supported by stream queues queue '{name}' in "
            "vhost '/'",
        )


@pytest.mark.parametrize("global_qos", [None, False, True])
def test_consume_without_prefetch_is_refused(
    connection: BlockingConnection, created: Created, global_qos: bool | None
) -> None:
    name = created.queue()
    channel = connection.channel()
    declare_stream(channel, name)
    if global_qos is not None:
        # A global prefetch is not a consumer prefetch; 0 is none.
        channel.basic_qos(prefetch_count=10 if global_qos else 0, global_qos=global_qos)

    def consume() -> None:
        channel.basic_consume(name, lambda *_: None)
        connection.process_data_events(0.3)

    error = closes_channel(connection, consume)
    assert (error.reply_code, error.reply_text) == (
        406,
        f"PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '{name}' in "
        "vhost '/''",
    )


def test_consume_with_auto_ack_closes_the_connection(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    name = created.queue()
    connection = connect()
    channel = connection.channel()
    declare_stream(channel, name)
    channel.basic_qos(prefetch_count=10)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        channel.basic_consume(name, lambda *_: None, auto_ack=True)
        connection.process_data_events(0.3)
    assert (info.value.reply_code, info.value.reply_text) == (
        540,
        f"NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues queue "
        f"'{name}' in vhost '/'",
    )


# RabbitMQ 3.10 answers other texts that are no duration ("1x") with 541 INTERNAL_ERROR (a
# crash); the proxy answers them as these.
@pytest.mark.parametrize(("offset", "shown"), [("0s", "0s"), ("5", "5")])
def test_invalid_offset_is_refused(
    connection: BlockingConnection, created: Created, offset: str, shown: str
) -> None:
    name = created.queue()
    channel = connection.channel()
    declare_stream(channel, name)
    channel.basic_qos(prefetch_count=10)

    def consume() -> None:
        channel.basic_consume(name, lambda *_: None, arguments={"x-stream-offset": offset})
        connection.process_data_events(0.3)

    error = closes_channel(connection, consume)
    assert (error.reply_code, error.reply_text) == (
        406,
        f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue '{name}' in vhost '/': "
        f'{{invalid_stream_offset_arg,{{longstr,<<"{shown}">>}}}}',
    )


def test_nack_of_a_stream_delivery_closes_the_connection(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    name = created.queue()
    connection = connect()
    channel = confirming_channel(connection)
    declare_stream(channel, name)
    publish(channel, name, [b"a"])
    channel.basic_qos(prefetch_count=10)
    tags: list[int] = []
    channel.basic_consume(
        name,
        lambda ch, method, props, body: tags.append(method.delivery_tag),
        arguments={"x-stream-offset": "first"},
    )
    pump([connection], lambda: bool(tags), timeout=10, settle=0)
    assert tags
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        channel.basic_nack(tags[0], requeue=True)
        connection.process_data_events(1)
    assert (info.value.reply_code, info.value.reply_text) == (
        540,
        "NOT_IMPLEMENTED - basic.nack and basic.reject not supported by stream queues queue "
        f"'{name}' in vhost '/'",
    )


# ---- reading -------------------------------------------------------------------------------


def test_read_from_first_and_again_by_a_second_consumer(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    name = created.queue()
    connection = connect()
    channel = confirming_channel(connection)
    declare_stream(channel, name)
    publish(channel, name, BODIES)
    first = read(connection, name, "first", len(BODIES))
    assert first.bodies == BODIES
    # RabbitMQ's numbers: a stream's messages are 0, 1, 2, ...
    assert first.offsets == list(range(len(BODIES)))
    # Acknowledged messages stay: another consumer (another connection) reads them all.
    second = read(connect(), name, "first", len(BODIES))
    assert second.items == first.items
    # Nothing was taken from the stream.
    assert channel.queue_declare(name, passive=True).method.message_count == 0


def test_resume_from_a_stored_offset(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    name = created.queue()
    connection = connect()
    channel = confirming_channel(connection)
    declare_stream(channel, name)
    publish(channel, name, BODIES)
    everything = read(connection, name, "first", len(BODIES))
    stored = everything.offsets[5]
    resumed = read(connect(), name, stored, 5)
    assert resumed.items == everything.items[5:]
    # The usual pattern: resume after the last offset processed.
    after = read(connect(), name, stored + 1, 4)
    assert after.items == everything.items[6:]


def test_offset_5_of_ten_messages_reads_messages_5_to_9(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    # Offsets a client computes rather than stores: the sixth message is offset 5.
    name = created.queue()
    connection = connect()
    channel = confirming_channel(connection)
    declare_stream(channel, name)
    publish(channel, name, BODIES)
    reader = read(connect(), name, 5, 5)
    assert reader.bodies == BODIES[5:]
    assert reader.offsets == [5, 6, 7, 8, 9]
    assert read(connect(), name, 9, 1).items == [(BODIES[9], 9)]
    assert read(connect(), name, 0, 10).offsets == list(range(10))


def test_an_offset_past_the_end_waits_for_the_next_message(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    name = created.queue()
    connection = connect()
    channel = confirming_channel(connection)
    declare_stream(channel, name)
    publish(channel, name, BODIES[:3])
    reader = read(connect(), name, 3, 2, before=lambda: publish(channel, name, [b"n3", b"n4"]))
    assert reader.items == [(b"n3", 3), (b"n4", 4)]


def test_a_stream_declared_again_after_a_delete_starts_at_0(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    name = created.queue()
    connection = connect()
    channel = confirming_channel(connection)
    declare_stream(channel, name)
    publish(channel, name, BODIES[:3])
    assert read(connection, name, "first", 3).offsets == [0, 1, 2]
    channel.queue_delete(name)
    declare_stream(channel, name)
    publish(channel, name, [b"again0", b"again1"])
    assert read(connect(), name, "first", 2).items == [(b"again0", 0), (b"again1", 1)]
    assert read(connect(), name, 1, 1).items == [(b"again1", 1)]


def test_next_sees_only_new_messages(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    name = created.queue()
    connection = connect()
    channel = confirming_channel(connection)
    declare_stream(channel, name)
    publish(channel, name, BODIES[:3])
    later = [b"new1", b"new2"]
    reader = read(connect(), name, "next", len(later), before=lambda: publish(channel, name, later))
    assert reader.bodies == later


def test_no_offset_is_next(connect: Callable[[], BlockingConnection], created: Created) -> None:
    name = created.queue()
    connection = connect()
    channel = confirming_channel(connection)
    declare_stream(channel, name)
    publish(channel, name, BODIES[:3])
    reader = read(connect(), name, None, 1, before=lambda: publish(channel, name, [b"new"]))
    assert reader.bodies == [b"new"]


def test_last_starts_at_the_last_message(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    name = created.queue()
    connection = connect()
    channel = confirming_channel(connection)
    declare_stream(channel, name)
    for body in BODIES[:4]:
        publish(channel, name, [body])  # one confirmed publish at a time: one chunk each
        time.sleep(0.05)
    reader = read(connect(), name, "last", 1)
    assert reader.bodies == [BODIES[3]]


def test_from_a_timestamp_and_an_interval(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    name = created.queue()
    connection = connect()
    channel = confirming_channel(connection)
    declare_stream(channel, name)
    publish(channel, name, [b"old1", b"old2"])
    # AMQP timestamps are whole seconds: the boundary is the next second.
    boundary = datetime.datetime.fromtimestamp(int(time.time()) + 1, tz=datetime.UTC)
    time.sleep(max(0.0, boundary.timestamp() - time.time()) + 0.3)
    publish(channel, name, [b"new1", b"new2"])
    since = read(connect(), name, boundary.replace(tzinfo=None), 2)
    assert since.bodies == [b"new1", b"new2"]
    recent = read(connect(), name, "30m", 4)
    assert recent.bodies == [b"old1", b"old2", b"new1", b"new2"]


def test_stream_bound_to_an_exchange(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    name = created.queue()
    exchange = created.exchange()
    connection = connect()
    channel = confirming_channel(connection)
    channel.exchange_declare(exchange, "fanout")
    declare_stream(channel, name)
    channel.queue_bind(name, exchange)
    publish(channel, "any-key", BODIES[:3], exchange=exchange)
    publish(channel, name, [b"direct"])
    reader = read(connect(), name, "first", 4)
    assert sorted(reader.bodies) == sorted([*BODIES[:3], b"direct"])
    assert reader.bodies[:3] == BODIES[:3] or reader.bodies[1:] == BODIES[:3]


def test_aio_pika_reads_and_resumes(broker: Broker, created: Created) -> None:
    name = created.queue("aio")

    async def scenario() -> tuple[list[tuple[bytes, int]], list[bytes]]:
        connection = await aio_pika.connect(broker.url())
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            await channel.set_qos(prefetch_count=5)
            queue = await channel.declare_queue(name, durable=True, arguments=STREAM)
            for body in BODIES:
                await channel.default_exchange.publish(aio_pika.Message(body), name)
            seen: list[tuple[bytes, int]] = []
            async with queue.iterator(arguments={"x-stream-offset": "first"}) as messages:
                async for message in messages:
                    seen.append((message.body, int(message.headers["x-stream-offset"])))  # type: ignore[call-overload]
                    await message.ack()
                    if len(seen) == len(BODIES):
                        break
            resumed: list[bytes] = []
            async with queue.iterator(arguments={"x-stream-offset": seen[7][1]}) as messages:
                async for message in messages:
                    resumed.append(message.body)
                    await message.ack()
                    if len(resumed) == 3:
                        break
            return seen, resumed

    seen, resumed = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert [body for body, _ in seen] == BODIES
    assert resumed == BODIES[7:]


# ---- across proxies ------------------------------------------------------------------------


def test_consumer_on_one_proxy_publisher_on_another_and_offsets_everywhere_alike(
    proxy_only: None, start_proxy: ProxyFactory, created: Created
) -> None:
    first_proxy, second_proxy = start_proxy(), start_proxy()

    def connect_to(port: int) -> BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}/"))

    name = created.queue()
    consumer_side = connect_to(first_proxy.port)
    publisher_side = connect_to(second_proxy.port)
    try:
        publisher = confirming_channel(publisher_side)
        declare_stream(publisher, name)
        reader = read(
            consumer_side, name, "next", 5, before=lambda: publish(publisher, name, BODIES[:5])
        )
        assert reader.bodies == BODIES[:5]
        assert reader.offsets == [0, 1, 2, 3, 4]
        # The same offsets through the other proxy, and through a proxy started now.
        again = read(publisher_side, name, 2, 3)
        assert again.items == reader.items[2:]
        third = connect_to(start_proxy().port)
        try:
            assert read(third, name, "first", 5).items == reader.items
        finally:
            third.close()
    finally:
        consumer_side.close()
        publisher_side.close()


def test_resume_through_a_new_proxy_after_a_restart(
    proxy_only: None, start_proxy: ProxyFactory, created: Created
) -> None:
    def connect_to(port: int) -> BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}/"))

    name = created.queue()
    before = start_proxy()
    connection = connect_to(before.port)
    channel = confirming_channel(connection)
    declare_stream(channel, name)
    publish(channel, name, BODIES[:5])
    stored = read(connection, name, "first", 5).offsets[-1]
    assert stored == 4
    connection.close()
    before.stop()
    after = connect_to(start_proxy().port)
    try:
        publish(confirming_channel(after), name, BODIES[5:])
        resumed = read(after, name, stored + 1, 5)
        assert resumed.bodies == BODIES[5:]
        assert resumed.offsets == [5, 6, 7, 8, 9]
    finally:
        after.close()


def test_offsets_go_on_across_a_topic_reload_and_ledgers(
    proxy_only: None,
    services: ServiceEndpoints,
    connect: Callable[[], BlockingConnection],
    created: Created,
) -> None:
    # An unload (a bundle move, a broker restart) closes the topic's ledger: the broker
    # goes on numbering from the last entry's index, and readers ask again in the new one.
    name = created.queue()
    connection = connect()
    channel = confirming_channel(connection)
    declare_stream(channel, name)
    publish(channel, name, BODIES[:4])
    topic = exchange_topic(NamespaceName("public", "default"), "", "direct", name)
    admin = PulsarAdmin(services.pulsar_web_url)
    admin.unload_topic(topic)
    publish(channel, name, BODIES[4:])
    assert len(admin.ledger_sizes(topic)) >= 2
    everything = read(connect(), name, "first", len(BODIES))
    assert everything.items == [(body, i) for i, body in enumerate(BODIES)]
    assert read(connect(), name, 3, 7).items == everything.items[3:]
    assert read(connect(), name, 6, 4).items == everything.items[6:]


def test_offsets_count_every_message_of_a_batch(
    proxy_only: None, start_proxy: ProxyFactory, created: Created
) -> None:
    # Published without confirms, the proxy writes them in Pulsar batch entries: each
    # message still has an offset of its own, and offsets inside a batch start exactly.
    proxy = start_proxy(pulsarProducerBatching="true")
    connection = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))
    try:
        name = created.queue()
        channel = connection.channel()
        declare_stream(channel, name)
        bodies = [f"b{i}".encode() for i in range(50)]
        publish(channel, name, bodies)
        everything = read(connection, name, "first", len(bodies))
        assert everything.bodies == bodies
        assert everything.offsets == list(range(len(bodies)))
        assert read(connection, name, 23, 27).items == everything.items[23:]
    finally:
        connection.close()


def test_messages_routed_by_an_exchange_have_offsets_of_their_own(
    proxy_only: None, connect: Callable[[], BlockingConnection], created: Created
) -> None:
    # The stream's own messages (published to its name) are 0, 1, 2...; those of an
    # exchange topic are numbered in that topic's lane (docs/mapping.md#stream-queues).
    name = created.queue()
    exchange = created.exchange()
    connection = connect()
    channel = confirming_channel(connection)
    channel.exchange_declare(exchange, "fanout")
    declare_stream(channel, name)
    channel.queue_bind(name, exchange)
    publish(channel, name, [b"d0", b"d1"])
    publish(channel, "any-key", [b"x0", b"x1", b"x2"], exchange=exchange)
    publish(channel, name, [b"d2"])
    offsets = dict(read(connection, name, "first", 6).items)
    assert [offsets[b] for b in (b"d0", b"d1", b"d2")] == [0, 1, 2]
    lane = offsets[b"x0"] >> 40
    assert lane >= 1
    assert [offsets[b] for b in (b"x0", b"x1", b"x2")] == [lane << 40 | i for i in range(3)]
    # From an exchange message's offset: its topic from it on, the stream's own topic from
    # the time it was published.
    resumed = read(connect(), name, offsets[b"x1"], 3)
    assert sorted(resumed.items) == [(b"d2", 2), (b"x1", offsets[b"x1"]), (b"x2", offsets[b"x2"])]


def test_retention_by_size_lets_go_of_the_oldest(
    proxy_only: None, start_proxy: ProxyFactory, created: Created
) -> None:
    # The SubscriptionCleaner's leader applies x-max-length-bytes and x-max-age at each
    # pass; `first` then starts at the oldest message kept.
    proxy = start_proxy(subscriptionCleanerIntervalMillis="300", **own_cleaner())
    connection = pika.BlockingConnection(
        pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{proxy.port}/")
    )
    try:
        name = created.queue()
        channel = confirming_channel(connection)
        declare_stream(channel, name, **{"x-max-length-bytes": 5_000})
        bodies = [bytes([65 + i]) * 1000 for i in range(20)]
        publish(channel, name, bodies)
        deadline = time.monotonic() + 15
        kept: list[bytes] = []
        while time.monotonic() < deadline:
            kept = read(connection, name, "first", 20, settle=0.3).bodies
            if len(kept) < 10:
                break
            time.sleep(0.5)
        assert 1 <= len(kept) < 10
        assert kept == bodies[-len(kept) :]
        connection.channel().queue_delete(name)  # in this proxy's own metadata root
    finally:
        connection.close()


def test_admin_queue_list_shows_a_stream_with_its_size(
    proxy_only: None, services: ServiceEndpoints, start_proxy: ProxyFactory, created: Created
) -> None:
    admin = AdminCLI(services)
    proxy = start_proxy(**admin.proxy_settings)
    connection = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))
    try:
        name = created.queue()
        channel = confirming_channel(connection)
        declare_stream(channel, name)
        publish(channel, name, [b"x" * 100] * 7)
        reader = StreamReader(connection.channel(), name, "first")
        pump([connection], lambda: len(reader.items) == 7, timeout=10, settle=0)
        row = {row["name"]: row for row in admin.json("queue", "list")}[name]
        assert (row["type"], row["ready"], row["consumers"]) == ("stream", 7, 1)
        assert row["stream_bytes"] >= 700
        connection.channel().queue_delete(name)
    finally:
        connection.close()


def test_metrics_show_a_streams_size(
    proxy_only: None, start_proxy: ProxyFactory, created: Created
) -> None:
    port = free_port()
    proxy = start_proxy(
        metricsListener=f"http://127.0.0.1:{port}",
        subscriptionCleanerIntervalMillis="300",
        **own_cleaner(),
    )
    connection = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))
    try:
        name = created.queue()
        channel = confirming_channel(connection)
        declare_stream(channel, name)
        publish(channel, name, [b"x" * 100] * 6)
        labels = f'queue="{name}",vhost="/"'
        deadline = time.monotonic() + 15
        text = ""
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                text = answer.read().decode()
            if sample(text, "starlight_stream_messages", labels) == 6:
                break
            time.sleep(0.3)
        assert sample(text, "starlight_stream_messages", labels) == 6
        assert sample(text, "starlight_stream_bytes", labels) >= 600
        channel.queue_delete(name)  # in this proxy's own metadata root
    finally:
        connection.close()
