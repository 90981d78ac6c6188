"""x-delayed-message exchanges (RabbitMQ's community delayed-message plugin, which Debian's
RabbitMQ does not ship, so these run against the proxy only): a message waits `x-delay`
milliseconds in Pulsar's delayed delivery, then routes like its `x-delayed-type`."""

from __future__ import annotations

import time
from collections.abc import Callable

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.integration.conftest import ProxyFactory
from tests.support import amqp_fixtures
from tests.support.amqp_fixtures import Created, closes_channel, confirming_channel

NAME_PREFIX = "delayed"

pytestmark = pytest.mark.usefixtures("proxy_only")

# The proxy, the broker and this test read the same host clock; allow for rounding only.
CLOCK_TOLERANCE = 0.05


def unique(kind: str) -> str:
    return amqp_fixtures.unique(kind, NAME_PREFIX)


def declare_delayed(channel: BlockingChannel, name: str, routing_type: str = "direct") -> None:
    channel.exchange_declare(
        name, "x-delayed-message", durable=True, arguments={"x-delayed-type": routing_type}
    )


def publish(channel: BlockingChannel, exchange: str, key: str, body: bytes, **headers: object):
    channel.basic_publish(
        exchange, key, body, pika.BasicProperties(headers=headers or None, delivery_mode=2)
    )


def collect(
    connection: BlockingConnection, queue: str, expected: int, timeout: float
) -> dict[bytes, tuple[float, dict[str, object]]]:
    """Consume (auto-ack) until `expected` messages came or `timeout`: body -> (arrival
    time, headers)."""
    arrived: dict[bytes, tuple[float, dict[str, object]]] = {}
    channel = connection.channel()

    def on_message(_ch: object, _method: object, properties: pika.BasicProperties, body: bytes):
        arrived[body] = (time.monotonic(), dict(properties.headers or {}))

    channel.basic_consume(queue, on_message, auto_ack=True)
    deadline = time.monotonic() + timeout
    while len(arrived) < expected and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    return arrived


def test_each_message_waits_at_least_its_x_delay(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    exchange, queue = created.exchange("dx"), created.queue("dq")
    publisher = confirming_channel(connect())
    declare_delayed(publisher, exchange)
    publisher.queue_declare(queue, durable=True)
    publisher.queue_bind(queue, exchange, "k")
    consumer = connect()
    delays = {b"d3000": 3000, b"d1500": 1500, b"d500": 500, b"d0": 0, b"neg": -1000}
    published: dict[bytes, float] = {}
    for body, delay in delays.items():
        published[body] = time.monotonic()
        publish(publisher, exchange, "k", body, **{"x-delay": delay})
    published[b"none"] = time.monotonic()
    publish(publisher, exchange, "k", b"none")
    expected = {**delays, b"none": 0}

    arrived = collect(consumer, queue, len(expected), timeout=30)

    assert set(arrived) == set(expected), "every delayed message arrives once"
    for body, delay in expected.items():
        waited = arrived[body][0] - published[body]
        assert waited >= max(0, delay) / 1000 - CLOCK_TOLERANCE, (body, waited)
    # The header stays on the message, as with RabbitMQ's plugin.
    assert arrived[b"d1500"][1]["x-delay"] == 1500
    # Delays order arrivals (3 s against 0.5 s is far beyond any scheduling noise).
    assert arrived[b"d500"][0] < arrived[b"d1500"][0] < arrived[b"d3000"][0]


@pytest.mark.parametrize(
    ("routing_type", "binding", "routed", "unrouted"),
    [("topic", "a.*", "a.b", "c.d"), ("fanout", "", "any", None)],
)
def test_delayed_exchange_routes_like_its_x_delayed_type(
    connect: Callable[[], BlockingConnection],
    created: Created,
    routing_type: str,
    binding: str,
    routed: str,
    unrouted: str | None,
) -> None:
    exchange, queue = created.exchange("dx"), created.queue("dq")
    channel = confirming_channel(connect())
    declare_delayed(channel, exchange, routing_type)
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, exchange, binding)
    started = time.monotonic()
    publish(channel, exchange, routed, b"routed", **{"x-delay": 700})
    if unrouted is not None:
        publish(channel, exchange, unrouted, b"unrouted", **{"x-delay": 700})

    arrived = collect(connect(), queue, 2, timeout=5)

    assert set(arrived) == {b"routed"}
    assert arrived[b"routed"][0] - started >= 0.7 - CLOCK_TOLERANCE


def test_delayed_unroutable_mandatory_message_is_returned_at_once(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    # Ours routes when the message is published (the plugin, which routes when the delay
    # ends, does not support mandatory at all): no binding now means basic.return now.
    exchange = created.exchange("dx")
    channel = connect().channel()
    declare_delayed(channel, exchange)
    returned: list[bytes] = []
    channel.add_on_return_callback(lambda _ch, _m, _p, body: returned.append(body))
    channel.basic_publish(
        exchange,
        "nobody",
        b"lost",
        pika.BasicProperties(headers={"x-delay": 60_000}),
        mandatory=True,
    )
    deadline = time.monotonic() + 5
    while not returned and time.monotonic() < deadline:
        channel.connection.process_data_events(time_limit=0.05)
    assert returned == [b"lost"]


def test_delayed_message_survives_a_proxy_restart(
    start_proxy: ProxyFactory, created: Created
) -> None:
    exchange, queue = created.exchange("dx"), created.queue("dq")
    first = start_proxy()
    connection = pika.BlockingConnection(pika.URLParameters(first.amqp_url()))
    channel = confirming_channel(connection)
    declare_delayed(channel, exchange)
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, exchange, "k")
    published = time.monotonic()
    publish(channel, exchange, "k", b"later", **{"x-delay": 4000})
    connection.close()
    first.stop()

    second = start_proxy()
    connection = pika.BlockingConnection(pika.URLParameters(second.amqp_url()))
    try:
        arrived = collect(connection, queue, 1, timeout=30)
        assert list(arrived) == [b"later"]
        assert arrived[b"later"][0] - published >= 4.0 - CLOCK_TOLERANCE
        channel = connection.channel()
        channel.queue_delete(queue)
        channel.exchange_delete(exchange)
    finally:
        connection.close()


def test_pending_delayed_messages_are_not_ready_while_the_queue_has_a_consumer(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    # Pulsar counts a delayed message as backlog; message_count leaves out those the broker
    # tracks as delayed (msgDelayed), which it does once a consumer reads the subscription.
    exchange, queue = created.exchange("dx"), created.queue("dq")
    channel = confirming_channel(connect())
    declare_delayed(channel, exchange)
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, exchange, "k")
    consumer = connect()
    consumer_channel = consumer.channel()
    arrived: list[bytes] = []
    consumer_channel.basic_consume(queue, lambda _c, _m, _p, body: arrived.append(body))
    consumer.process_data_events(time_limit=0.3)
    publish(channel, exchange, "k", b"pending", **{"x-delay": 20_000})
    deadline = time.monotonic() + 10
    count = -1
    while time.monotonic() < deadline:
        consumer.process_data_events(time_limit=0.2)
        count = channel.queue_declare(queue, passive=True).method.message_count
        if count == 0:
            break
    assert count == 0
    assert arrived == []


def test_x_delayed_message_needs_a_known_x_delayed_type(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    connection = connect()
    missing = created.exchange("dx")
    error = closes_channel(
        connection,
        lambda: connection.channel().exchange_declare(missing, "x-delayed-message"),
    )
    assert error.reply_code == 406
    assert "x-delayed-type" in error.reply_text
    recursive = created.exchange("dx")
    error = closes_channel(
        connection,
        lambda: connection.channel().exchange_declare(
            recursive, "x-delayed-message", arguments={"x-delayed-type": "x-delayed-message"}
        ),
    )
    assert error.reply_code == 406

    name = created.exchange("dx")
    declare_delayed(connection.channel(), name, "topic")
    error = closes_channel(
        connection, lambda: declare_delayed(connection.channel(), name, "fanout")
    )
    assert error.reply_code == 406
    assert "x-delayed-type" in error.reply_text

    unknown = created.exchange("dx")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        connection.channel().exchange_declare(
            unknown, "x-delayed-message", arguments={"x-delayed-type": "nonsense"}
        )
    assert info.value.reply_code == 503


def test_an_x_delay_that_is_not_an_integer_means_no_delay(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    exchange, queue = created.exchange("dx"), created.queue("dq")
    channel = confirming_channel(connect())
    declare_delayed(channel, exchange)
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, exchange, "k")
    publish(channel, exchange, "k", b"string", **{"x-delay": "60000"})  # as the plugin: no delay
    publish(channel, exchange, "k", b"delayed", **{"x-delay": 1500})

    arrived = collect(connect(), queue, 2, timeout=30)

    assert set(arrived) == {b"string", b"delayed"}
    assert arrived[b"string"][0] < arrived[b"delayed"][0]


@pytest.mark.parametrize("delayed_one", ["published to", "alternate"])
def test_a_message_routed_by_an_alternate_exchange_keeps_its_delay(
    connect: Callable[[], BlockingConnection], created: Created, delayed_one: str
) -> None:
    main, alternate, queue = created.exchange("main"), created.exchange("alt"), created.queue()
    channel = confirming_channel(connect())
    if delayed_one == "alternate":
        declare_delayed(channel, alternate, "fanout")
        channel.exchange_declare(main, "direct", arguments={"alternate-exchange": alternate})
    else:
        channel.exchange_declare(alternate, "fanout")
        channel.exchange_declare(
            main,
            "x-delayed-message",
            arguments={"x-delayed-type": "direct", "alternate-exchange": alternate},
        )
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, alternate, "")
    started = time.monotonic()
    publish(channel, main, "unbound", b"via alternate", **{"x-delay": 1200})

    arrived = collect(connect(), queue, 1, timeout=30)

    assert list(arrived) == [b"via alternate"]
    assert arrived[b"via alternate"][0] - started >= 1.2 - CLOCK_TOLERANCE


def test_basic_get_polling_returns_each_delayed_message_once_it_is_due(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    # A queue polled with basic.get, nobody consuming: a delayed message must become
    # gettable once due (the broker tracks it as delayed once a getter has read the
    # subscription, and hands it out only to a consumer that is there when it is due).
    exchange, queue = created.exchange("dx"), created.queue("dq")
    publisher = confirming_channel(connect())
    declare_delayed(publisher, exchange)
    publisher.queue_declare(queue, durable=True)
    publisher.queue_bind(queue, exchange, "k")
    delays = {b"d3000": 3000, b"d500": 500}
    published: dict[bytes, float] = {}
    for body, delay in delays.items():
        published[body] = time.monotonic()
        publish(publisher, exchange, "k", body, **{"x-delay": delay})
    poller = connect().channel()
    got: dict[bytes, float] = {}
    deadline = time.monotonic() + 30
    while len(got) < len(delays) and time.monotonic() < deadline:
        method, _, body = poller.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.05)
            continue
        assert body not in got, "a delayed message is got once"
        got[body] = time.monotonic()
    assert set(got) == set(delays)
    for body, delay in delays.items():
        waited = got[body] - published[body]
        assert waited >= delay / 1000 - CLOCK_TOLERANCE, (body, waited)
        print(f"{body!r}: got {1000 * waited - delay:.0f} ms after it was due")
    assert poller.basic_get(queue, auto_ack=True)[0] is None
