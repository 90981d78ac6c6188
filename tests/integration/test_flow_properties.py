"""Message content survives the proxy exactly: every basic property, header values of every
field-table type (values and Python types, and the wire type tags), empty and multi-frame
bodies, and the same through aio-pika and kombu."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import random
import struct
import time

import aio_pika
import aio_pika.abc
import kombu
import pika
import pika.exceptions
import pytest
from pamqp import body as pamqp_body
from pamqp import commands, frame
from pika.adapters.blocking_connection import BlockingConnection

from tests.integration.conftest import Broker
from tests.support import amqp_fixtures
from tests.support.amqp_fixtures import Created, confirming_channel, get_one, raw_channel
from tests.support.raw_amqp import RawClient

# --- helpers (shared ones: tests/support/amqp_fixtures.py; fixtures: conftest.py) -----

NAME_PREFIX = "flow"  # of the names made here (the `created` fixture reads it)


def unique(kind: str) -> str:
    return amqp_fixtures.unique(kind, NAME_PREFIX)


def consume_one(
    connection: BlockingConnection, queue: str, timeout: float = 5.0
) -> tuple[pika.spec.Basic.Deliver, pika.BasicProperties, bytes]:
    channel = connection.channel()
    received: list[tuple[pika.spec.Basic.Deliver, pika.BasicProperties, bytes]] = []
    channel.basic_consume(queue, lambda _c, m, p, b: received.append((m, p, b)), auto_ack=True)
    deadline = time.monotonic() + timeout
    while not received and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.02)
    assert received, f"nothing consumed from {queue} in {timeout}s"
    channel.close()
    return received[0]


def receive(
    connection: BlockingConnection, queue: str, path: str
) -> tuple[pika.BasicProperties, bytes]:
    if path == "get":
        _, properties, body = get_one(connection.channel(), queue, auto_ack=True)
    else:
        _, properties, body = consume_one(connection, queue)
    return properties, body


PROPERTY_NAMES = [
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
]


def as_dict(properties: pika.BasicProperties) -> dict[str, object]:
    return {name: getattr(properties, name) for name in PROPERTY_NAMES}


def typed(value: object) -> object:
    """`value` with the Python type of every leaf, so that 1 != True != 1.0 != "1"."""
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [typed(item) for item in value]
    return (type(value).__name__, value)


def typed_as_pika_decodes(value: object) -> object:
    """`typed(value)` after a pika round trip: pika sends ints outside 32 bits as 'l' and
    decodes 'l' into its own `long` subclass of int (and 'I' into a plain int)."""
    if isinstance(value, dict):
        return {key: typed_as_pika_decodes(item) for key, item in value.items()}
    if isinstance(value, list):
        return [typed_as_pika_decodes(item) for item in value]
    if type(value) is int and not -(2**31) <= value < 2**31:
        return ("long", value)
    return (type(value).__name__, value)


# --- basic properties ---------------------------------------------------------------


@pytest.mark.parametrize(
    "stamp",
    [1_700_000_000_123, 1_700_000_000_123_456, 2**64 - 1],
    ids=["milliseconds", "microseconds", "largest"],
)
def test_64_bit_timestamps_pass_through_untouched(
    connection: BlockingConnection, created: Created, stamp: int
) -> None:
    # AMQP timestamps are 64 bits; clients send milliseconds or microseconds as well.
    channel = confirming_channel(connection)
    queue, dead_letters = created.queue(), created.queue("dlq")
    channel.queue_declare(dead_letters, exclusive=True)
    channel.queue_declare(
        queue,
        exclusive=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead_letters},
    )
    channel.basic_publish("", queue, b"one", pika.BasicProperties(timestamp=stamp))
    channel.basic_publish("", queue, b"two", pika.BasicProperties(timestamp=stamp))
    properties, body = receive(connection, queue, "get")
    assert (body, properties.timestamp) == (b"one", stamp)
    getter = connection.channel()
    method, properties, body = get_one(getter, queue)
    assert (body, properties.timestamp) == (b"two", stamp)
    # Dead-lettering writes the properties again, with x-death: the timestamp stays.
    getter.basic_reject(method.delivery_tag, requeue=False)
    properties, body = receive(connection, dead_letters, "consume")
    assert (body, properties.timestamp) == (b"two", stamp)
    assert properties.headers["x-death"][0]["reason"] == "rejected"


@pytest.mark.parametrize("path", ["get", "consume"])
@pytest.mark.parametrize("delivery_mode", [1, 2])
def test_every_basic_property_survives_publish_and_delivery(
    connection: BlockingConnection, created: Created, delivery_mode: int, path: str
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue, exclusive=True)
    sent = pika.BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers={"tenant": "acme", "attempt": 3},
        delivery_mode=delivery_mode,
        priority=7,
        correlation_id="corr-8d1f",
        reply_to="amq.gen-reply-here",
        expiration="600000",
        message_id="msg-42",
        timestamp=1700000000,
        type="order.created",
        user_id="guest",
        app_id="flow-tests",
    )
    channel.basic_publish("", queue, b'{"id": 1}', sent)
    properties, body = receive(connection, queue, path)
    assert body == b'{"id": 1}'
    assert as_dict(properties) == as_dict(sent)


def test_absent_properties_stay_absent(connection: BlockingConnection, created: Created) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue, exclusive=True)
    channel.basic_publish("", queue, b"bare")
    properties, body = receive(connection, queue, "get")
    assert body == b"bare"
    assert as_dict(properties) == {name: None for name in PROPERTY_NAMES}


def test_user_id_other_than_the_login_user_is_406(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    connection.channel().queue_declare(queue)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.basic_publish("", queue, b"spoofed", pika.BasicProperties(user_id="mallory"))
    assert info.value.reply_code == 406
    assert info.value.reply_text == (
        "PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated user was 'guest'"
    )
    assert connection.is_open
    assert connection.channel().queue_declare(queue, passive=True).method.message_count == 0


# --- headers: field-table types -----------------------------------------------------

UTC = datetime.UTC

# Every type pika can encode. pika has no float encoder (UnsupportedAMQPFieldException; it
# would also decode 'd' as an int): floats are covered by the aio-pika and wire tests.
PIKA_HEADERS: dict[str, object] = {
    "int-small": 7,
    "int-zero": 0,
    "int-negative": -42,
    "int-max32": 2**31 - 1,
    "int-min32": -(2**31),
    "int-over32": 2**31,
    "int-big": 2**40 + 5,
    "int-big-negative": -(2**40),
    "bool-true": True,
    "bool-false": False,
    "str": "hello",
    "str-unicode": "h\u00e9llo \u2713",
    "str-empty": "",
    "str-digits": "123",
    "bytes": b"\x00\x01binary\xff",
    "decimal": decimal.Decimal("3.14"),
    "decimal-negative": decimal.Decimal("-0.005"),
    "decimal-integral": decimal.Decimal("12"),
    "datetime": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
    "void": None,
    "nested": {"a": 1, "b": {"c": "d", "e": [True, None]}},
    "list": [1, "two", True, None, 2**33, decimal.Decimal("1.5"), {"k": "v"}, [3, []], b"\x01"],
    "empty-dict": {},
    "empty-list": [],
}


def test_header_values_of_every_pika_type_come_back_with_value_and_type(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue, exclusive=True)
    channel.basic_publish("", queue, b"typed", pika.BasicProperties(headers=PIKA_HEADERS))
    properties, _ = receive(connection, queue, "get")
    assert typed(properties.headers) == typed_as_pika_decodes(PIKA_HEADERS)


# Every field type RabbitMQ knows (its errata to 0-9-1), encoded by hand: tag and bytes
# must come back unchanged, which a Java or .NET client relies on (Short vs Integer...).
WIRE_FIELDS: list[tuple[str, bytes, bytes]] = [
    ("bool", b"t", b"\x01"),
    ("int8", b"b", struct.pack(">b", -5)),
    ("uint8", b"B", struct.pack(">B", 250)),
    ("int16", b"s", struct.pack(">h", -300)),
    ("uint16", b"u", struct.pack(">H", 65000)),
    ("int32", b"I", struct.pack(">i", -70000)),
    ("uint32", b"i", struct.pack(">I", 4000000000)),
    ("int64", b"l", struct.pack(">q", -(2**40))),
    ("float", b"f", struct.pack(">f", 1.5)),
    ("double", b"d", struct.pack(">d", 2.25)),
    ("decimal", b"D", struct.pack(">Bi", 2, 314)),
    ("longstr", b"S", struct.pack(">I", 5) + b"hello"),
    ("bytes", b"x", struct.pack(">I", 3) + b"\x00\xff\x01"),
    ("array", b"A", struct.pack(">I", 7) + b"b\x01S\x00\x00\x00\x00"),
    ("timestamp", b"T", struct.pack(">Q", 1700000000)),
    ("table", b"F", struct.pack(">I", 4) + b"\x01kt\x00"),
    ("void", b"V", b""),
]


def encode_wire_table(fields: list[tuple[str, bytes, bytes]]) -> bytes:
    entries = b"".join(
        struct.pack(">B", len(key)) + key.encode() + tag + value for key, tag, value in fields
    )
    return struct.pack(">I", len(entries)) + entries


def read_raw_frame(client: RawClient, timeout: float = 5.0) -> tuple[int, int, bytes]:
    """(frame type, channel, payload) without decoding the payload."""
    deadline = time.monotonic() + timeout
    while True:
        if len(client.buffer) >= 7:
            kind, channel, size = struct.unpack(">BHI", client.buffer[:7])
            if len(client.buffer) >= size + 8:
                payload = client.buffer[7 : 7 + size]
                assert client.buffer[7 + size] == 0xCE
                client.buffer = client.buffer[size + 8 :]
                if kind == 8:  # heartbeat
                    continue
                return kind, channel, payload
        assert time.monotonic() < deadline, "no frame"
        client.sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = client.sock.recv(65536)
        if not chunk:
            raise EOFError("server closed the connection")
        client.buffer += chunk


def test_header_field_type_tags_survive_on_the_wire(broker: Broker) -> None:
    table = encode_wire_table(WIRE_FIELDS)
    payload = b"wire"
    header_frame_payload = struct.pack(">HHQH", 60, 0, len(payload), 1 << 13) + table
    with raw_channel(broker) as client:
        client.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
        _, declare_ok = client.read_method()
        assert isinstance(declare_ok, commands.Queue.DeclareOk), declare_ok
        client.send_method(1, commands.Confirm.Select())
        assert isinstance(client.read_method()[1], commands.Confirm.SelectOk)
        client.send(
            frame.marshal(commands.Basic.Publish(exchange="", routing_key=declare_ok.queue), 1)
            + struct.pack(">BHI", 2, 1, len(header_frame_payload))
            + header_frame_payload
            + b"\xce"
            + frame.marshal(pamqp_body.ContentBody(payload), 1)
        )
        _, ack = client.read_method()
        assert isinstance(ack, commands.Basic.Ack), ack
        deadline = time.monotonic() + 5
        while True:
            client.send_method(1, commands.Basic.Get(queue=declare_ok.queue, no_ack=True))
            _, reply = client.read_method()
            if isinstance(reply, commands.Basic.GetOk):
                break
            assert isinstance(reply, commands.Basic.GetEmpty), reply
            assert time.monotonic() < deadline, "message never arrived"
            time.sleep(0.02)
        kind, channel, content_header = read_raw_frame(client)
        assert (kind, channel) == (2, 1)
        kind, channel, content_body = read_raw_frame(client)
        assert (kind, channel, content_body) == (3, 1, payload)
    class_id, weight, body_size, flags = struct.unpack(">HHQH", content_header[:14])
    assert (class_id, weight, body_size, flags) == (60, 0, len(payload), 1 << 13)
    assert content_header[14:] == table


# --- bodies -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "size",
    [0, 1, 131072 - 8, 131072 - 7, 300 * 1024],
    ids=["empty", "one-byte", "one-full-frame", "one-frame-plus-one", "300KiB"],
)
def test_body_comes_back_identical(
    connection: BlockingConnection, created: Created, size: int
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue, exclusive=True)
    payload = bytes(random.Random(size).getrandbits(8) for _ in range(size))
    channel.basic_publish("", queue, payload)
    method, _, body = get_one(connection.channel(), queue, auto_ack=True)
    assert (len(body), body == payload) == (size, True)
    assert method.message_count == 0


def test_empty_and_large_bodies_through_a_consumer(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue, exclusive=True)
    large = bytes(random.Random(7).getrandbits(8) for _ in range(300 * 1024))
    channel.basic_publish("", queue, b"")
    channel.basic_publish("", queue, large)
    received: list[bytes] = []
    consumer = connection.channel()
    consumer.basic_consume(queue, lambda _c, _m, _p, body: received.append(body), auto_ack=True)
    deadline = time.monotonic() + 5
    while len(received) < 2 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.02)
    connection.process_data_events(time_limit=0.3)
    assert [len(b) for b in received] == [0, len(large)]
    assert received == [b"", large]


# --- other clients ------------------------------------------------------------------


def test_aio_pika_publish_consume_with_headers_and_properties(
    broker: Broker, created: Created
) -> None:
    queue_name = created.queue("aio")
    sent_headers = {
        "int": 5,
        "big": 2**40,
        "negative": -3,
        "float": 1.5,
        "bool": True,
        "str": "text",
        "nested": {"k": [1, "v"]},
        "void": None,
        "decimal": decimal.Decimal("2.50"),
    }
    timestamp = datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)

    async def scenario() -> aio_pika.abc.AbstractIncomingMessage:
        connection = await aio_pika.connect(broker.url())
        try:
            channel = await connection.channel()  # publisher confirms on
            queue = await channel.declare_queue(queue_name, exclusive=True)
            await channel.default_exchange.publish(
                aio_pika.Message(
                    b"aio-body",
                    headers=sent_headers,
                    content_type="text/plain",
                    content_encoding="utf-8",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    priority=3,
                    correlation_id="aio-corr",
                    reply_to="aio-replies",
                    expiration=600,
                    message_id="aio-1",
                    timestamp=timestamp,
                    type="aio.type",
                    user_id="guest",
                    app_id="aio-app",
                ),
                routing_key=queue_name,
            )
            async with queue.iterator(timeout=5) as messages:
                async for message in messages:
                    await message.ack()
                    return message
            raise AssertionError("no message")
        finally:
            await connection.close()

    message = asyncio.run(scenario())
    assert message.body == b"aio-body"
    assert typed(dict(message.headers)) == typed(sent_headers)
    assert (message.content_type, message.content_encoding) == ("text/plain", "utf-8")
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert (message.priority, message.correlation_id, message.reply_to) == (
        3,
        "aio-corr",
        "aio-replies",
    )
    assert message.expiration == 600
    assert (message.message_id, message.timestamp, message.type) == (
        "aio-1",
        timestamp,
        "aio.type",
    )
    assert (message.user_id, message.app_id) == ("guest", "aio-app")
    assert message.redelivered is False


def test_kombu_simple_queue_round_trip_with_json_payload_and_headers(
    broker: Broker, created: Created
) -> None:
    name = created.queue("kombu")
    created.exchanges.append(name)  # SimpleQueue declares a direct exchange of that name
    payload = {"order": 17, "items": ["a", "b"], "total": 12.5, "paid": False, "note": None}
    with kombu.Connection(broker.url(), connect_timeout=10) as connection:
        queue = connection.SimpleQueue(name)
        try:
            queue.put(payload, serializer="json", headers={"tenant": "acme", "attempt": 2})
            message = queue.get(block=True, timeout=5)
            message.ack()
            assert message.payload == payload
            assert message.content_type == "application/json"
            assert message.content_encoding == "utf-8"
            assert message.headers == {"tenant": "acme", "attempt": 2}
            assert message.delivery_info["routing_key"] == name
            with pytest.raises(queue.Empty):
                queue.get(block=True, timeout=0.3)
        finally:
            queue.close()


@pytest.mark.parametrize("path", ["get", "consume"])
def test_a_routing_key_with_nul_bytes_is_delivered_whole(
    connection: BlockingConnection, created: Created, path: str
) -> None:
    """A routing key is any short string, NULs included: the proxy reads received messages'
    properties through pulsar-client's C API, whose strings end at a NUL (the key travels
    in base64 beside its plain copy, backend/message_codec.py)."""
    channel = confirming_channel(connection)
    exchange, queue = created.exchange(), created.queue()
    channel.exchange_declare(exchange, "topic", auto_delete=True)
    channel.queue_declare(queue, exclusive=True)
    channel.queue_bind(queue, exchange, "odd.#")
    key = "odd.\x00nul\x00.end"
    channel.basic_publish(exchange, key, b"with-nul")
    if path == "get":
        method, _, body = get_one(connection.channel(), queue, auto_ack=True)
    else:
        method, _, body = consume_one(connection, queue)
    assert (body, method.routing_key) == (b"with-nul", key)
