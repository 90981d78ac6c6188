"""Dead-lettering as RabbitMQ 3.10 does it: messages rejected or nacked without requeue, or
returned more often than a quorum queue's `x-delivery-limit`, are republished to the queue's
`x-dead-letter-exchange` (with `x-dead-letter-routing-key`, else their own key) carrying the
`x-death` and `x-first-death-*` headers; without a dead-letter exchange they are dropped.
Every test but the proxy kill runs against RabbitMQ too (STARLIGHT_TEST_AMQP_URL).

The at-least-once boundary (docs/reliability.md): the source message is acknowledged only
after Pulsar stored the dead letter, so a proxy killed in between duplicates, never loses.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import kombu
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from starlight_py.backend.pulsar_admin import PulsarAdmin
from starlight_py.local import ServiceEndpoints
from starlight_py.local.proxy import ProxyProcess
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from tests.integration.conftest import Broker
from tests.support import amqp_fixtures
from tests.support.amqp_fixtures import Created, confirming_channel, drain, get_one, pump

NAME_PREFIX = "dlx"  # of the names made here (the `created` fixture reads it)
# How long a message may take to arrive (a first publish to a new topic on a fresh Pulsar
# standalone can take seconds); not a bound on speed.
ARRIVAL = 20.0


def unique(kind: str) -> str:
    return amqp_fixtures.unique(kind, NAME_PREFIX)


def dead_letter_setup(
    channel: BlockingChannel, created: Created, **arguments: Any
) -> tuple[str, str, str]:
    """(source queue, dead-letter exchange, dead-letter queue): a fanout DLX bound to a
    plain DLQ, and a source queue dead-lettering to it with extra `arguments`."""
    dlx = created.exchange("dlx")
    dlq = created.queue("dlq")
    source = created.queue("src")
    channel.exchange_declare(dlx, "fanout")
    channel.queue_declare(dlq)
    channel.queue_bind(dlq, dlx)
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": dlx, **arguments})
    return source, dlx, dlq


def deaths(properties: pika.BasicProperties) -> list[dict[str, Any]]:
    headers = properties.headers or {}
    value = headers.get("x-death")
    assert isinstance(value, list), headers
    return value


def assert_recent(stamp: object) -> None:
    assert isinstance(stamp, datetime.datetime)
    age = datetime.datetime.now(datetime.UTC) - stamp
    assert datetime.timedelta(seconds=-5) < age < datetime.timedelta(minutes=5), stamp


def consume_all(
    connection: BlockingConnection, queue: str, expected: int, timeout: float = 30.0
) -> list[bytes]:
    """Bodies a no-ack consumer gets from `queue` until `expected` came (or `timeout`), and
    0.5 s more so that any beyond them show up too (faster than basic.get for many)."""
    channel = connection.channel()
    bodies: list[bytes] = []
    tag = channel.basic_consume(queue, lambda _c, _m, _p, body: bodies.append(body), auto_ack=True)
    pump([connection], lambda: len(bodies) >= expected, timeout=timeout, settle=0.5)
    channel.basic_cancel(tag)
    channel.close()
    return bodies


# --- reject / nack without requeue --------------------------------------------------------


def test_rejected_message_is_dead_lettered_with_x_death(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    source, dlx, dlq = dead_letter_setup(channel, created)
    channel.basic_publish(
        "",
        source,
        b"poison",
        pika.BasicProperties(
            content_type="application/json",
            message_id="m-1",
            correlation_id="c-1",
            delivery_mode=2,
            expiration="60000",
            headers={"app": "v1", "n": 7},
        ),
    )
    method, _, _ = get_one(channel, source, timeout=ARRIVAL)
    channel.basic_reject(method.delivery_tag, requeue=False)

    method, properties, body = get_one(channel, dlq, auto_ack=True, timeout=ARRIVAL)
    assert body == b"poison"
    assert method.exchange == dlx
    assert method.routing_key == source
    assert not method.redelivered
    assert properties.content_type == "application/json"
    assert properties.message_id == "m-1"
    assert properties.correlation_id == "c-1"
    assert properties.delivery_mode == 2
    assert properties.expiration is None  # moved to x-death's original-expiration
    headers = properties.headers
    assert headers["app"] == "v1"
    assert headers["n"] == 7
    (death,) = deaths(properties)
    assert_recent(death.pop("time"))
    assert death == {
        "count": 1,
        "reason": "rejected",
        "queue": source,
        "exchange": "",
        "routing-keys": [source],
        "original-expiration": "60000",
    }
    assert headers["x-first-death-reason"] == "rejected"
    assert headers["x-first-death-queue"] == source
    assert headers["x-first-death-exchange"] == ""
    assert channel.queue_declare(source, passive=True).method.message_count == 0


def test_nack_multiple_without_requeue_dead_letters_each(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    connection = connect()
    channel = confirming_channel(connection)
    source, _, dlq = dead_letter_setup(channel, created)
    for i in range(5):
        channel.basic_publish("", source, f"m{i}".encode())
    consumer = connect()
    consuming = consumer.channel()
    received: list[tuple[int, bytes]] = []
    consuming.basic_consume(
        source, lambda _c, method, _p, body: received.append((method.delivery_tag, body))
    )
    pump([consumer], lambda: len(received) >= 5)
    assert sorted(body for _, body in received) == [f"m{i}".encode() for i in range(5)]
    consuming.basic_nack(max(tag for tag, _ in received), multiple=True, requeue=False)
    bodies = drain(channel, dlq, 5, timeout=ARRIVAL)
    assert sorted(bodies) == [f"m{i}".encode() for i in range(5)]


def test_dead_letter_routing_key_replaces_the_key_and_drops_cc(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    dlx = created.exchange("dlx")
    dlq = created.queue("dlq")
    source = created.queue("src")
    channel.exchange_declare(dlx, "direct")
    channel.queue_declare(dlq)
    channel.queue_bind(dlq, dlx, "dead")
    channel.queue_declare(
        source,
        arguments={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "dead"},
    )
    channel.basic_publish("", source, b"x", pika.BasicProperties(headers={"CC": ["elsewhere"]}))
    method, _, _ = get_one(channel, source, timeout=ARRIVAL)
    channel.basic_nack(method.delivery_tag, requeue=False)
    method, properties, _ = get_one(channel, dlq, auto_ack=True, timeout=ARRIVAL)
    assert (method.exchange, method.routing_key) == (dlx, "dead")
    assert "CC" not in properties.headers
    # x-death keeps the keys the message was routed with.
    assert deaths(properties)[0]["routing-keys"] == [source, "elsewhere"]


def test_dead_letter_through_the_default_exchange(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    dlq = created.queue("dlq")
    source = created.queue("src")
    channel.queue_declare(dlq)
    channel.queue_declare(
        source, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
    )
    channel.basic_publish("", source, b"x")
    method, _, _ = get_one(channel, source, timeout=ARRIVAL)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, properties, body = get_one(channel, dlq, auto_ack=True, timeout=ARRIVAL)
    assert (method.exchange, method.routing_key, body) == ("", dlq, b"x")
    assert deaths(properties)[0]["queue"] == source


def test_dead_lettering_back_and_forth_counts_per_queue_and_reason(
    connection: BlockingConnection, created: Created
) -> None:
    """q1 and q2 dead-letter to each other: the death in q1 recorded first is counted up
    and moves to the front; x-first-death-* stay as the first death made them."""
    channel = confirming_channel(connection)
    q1, q2 = created.queue("one"), created.queue("two")
    for queue, other in ((q1, q2), (q2, q1)):
        channel.queue_declare(
            queue, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": other}
        )
    channel.basic_publish("", q1, b"ping-pong")
    for queue in (q1, q2, q1):
        method, _, _ = get_one(channel, queue, timeout=ARRIVAL)
        channel.basic_reject(method.delivery_tag, requeue=False)
    _, properties, body = get_one(channel, q2, auto_ack=True, timeout=ARRIVAL)
    assert body == b"ping-pong"
    entries = deaths(properties)
    assert [(d["queue"], d["reason"], d["count"]) for d in entries] == [
        (q1, "rejected", 2),
        (q2, "rejected", 1),
    ]
    assert entries[0]["routing-keys"] == [q1]  # as first recorded
    assert entries[1]["exchange"] == ""  # q2 got it through the default exchange
    assert entries[1]["routing-keys"] == [q2]
    headers = properties.headers
    assert (headers["x-first-death-queue"], headers["x-first-death-reason"]) == (q1, "rejected")


def test_reject_without_dead_letter_exchange_drops(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"x")
    method, _, _ = get_one(channel, queue, timeout=ARRIVAL)
    channel.basic_reject(method.delivery_tag, requeue=False)
    time.sleep(0.3)
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    assert drain(channel, queue, 0) == []


def test_dead_letter_exchange_that_does_not_exist_drops(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue, arguments={"x-dead-letter-exchange": unique("missing")})
    channel.basic_publish("", queue, b"x")
    method, _, _ = get_one(channel, queue, timeout=ARRIVAL)
    channel.basic_reject(method.delivery_tag, requeue=False)
    time.sleep(0.3)
    assert drain(channel, queue, 0) == []
    assert channel.is_open


def test_many_rejects_reach_the_dead_letter_queue_exactly_once(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    """300 messages: the consumer acks the even ones and rejects the odd ones; the DLQ gets
    every odd one once, the source queue ends empty."""
    publisher = connect()
    channel = confirming_channel(publisher)
    source, _, dlq = dead_letter_setup(channel, created)
    total = 300
    for i in range(total):
        channel.basic_publish("", source, str(i).encode())
    consumer = connect()
    consuming = consumer.channel()
    consuming.basic_qos(prefetch_count=50)
    seen: list[int] = []

    def on_message(
        ch: BlockingChannel, method: Any, _properties: pika.BasicProperties, body: bytes
    ) -> None:
        number = int(body)
        seen.append(number)
        if number % 2:
            ch.basic_reject(method.delivery_tag, requeue=False)
        else:
            ch.basic_ack(method.delivery_tag)

    consuming.basic_consume(source, on_message)
    pump([consumer], lambda: len(seen) >= total, timeout=60)
    assert sorted(seen) == list(range(total))
    dead = [int(body) for body in consume_all(publisher, dlq, total // 2)]
    assert sorted(dead) == list(range(1, total, 2))
    consumer.close()
    assert drain(channel, source, 0) == []


def test_kombu_reject_dead_letters(broker: Broker, created: Created) -> None:
    dlx = created.exchange("dlx")
    dlq_name = created.queue("dlq")
    source_name = created.queue("src")
    dead_letter_exchange = kombu.Exchange(dlx, "fanout", durable=True)
    dlq = kombu.Queue(dlq_name, dead_letter_exchange, durable=True)
    source = kombu.Queue(
        source_name,
        kombu.Exchange("", "direct"),
        routing_key=source_name,
        queue_arguments={"x-dead-letter-exchange": dlx},
    )
    with kombu.Connection(broker.url()) as conn:
        dlq.maybe_bind(conn)
        dlq.declare()
        with conn.SimpleQueue(source) as simple:
            simple.put({"task": "t1"}, serializer="json")
            message = simple.get(timeout=10)
            assert message.payload == {"task": "t1"}
            message.reject()  # kombu rejects without requeue
        with conn.SimpleQueue(dlq) as dead:
            message = dead.get(timeout=10)
            assert message.payload == {"task": "t1"}
            assert message.headers["x-death"][0]["reason"] == "rejected"
            assert message.headers["x-death"][0]["queue"] == source_name
            message.ack()


# --- delivery limit (a quorum queue argument on RabbitMQ) --------------------------------


def declare_limited(
    channel: BlockingChannel, created: Created, limit: int, dead_letter: bool
) -> tuple[str, str | None]:
    dlq: str | None = None
    arguments: dict[str, Any] = {"x-queue-type": "quorum", "x-delivery-limit": limit}
    if dead_letter:
        dlq = created.queue("dlq")
        channel.queue_declare(dlq)
        arguments |= {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
    queue = created.queue("limited")
    channel.queue_declare(queue, durable=True, arguments=arguments)
    return queue, dlq


def test_delivery_limit_dead_letters_after_that_many_returns(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue, dlq = declare_limited(channel, created, 2, dead_letter=True)
    assert dlq is not None
    channel.basic_publish("", queue, b"flaky")
    flags = []
    for _ in range(3):
        method, _, _ = get_one(channel, queue, timeout=ARRIVAL)
        flags.append(method.redelivered)
        channel.basic_nack(method.delivery_tag, requeue=True)
    assert flags == [False, True, True]
    _, properties, body = get_one(channel, dlq, auto_ack=True, timeout=ARRIVAL)
    assert body == b"flaky"
    (death,) = deaths(properties)
    assert (death["reason"], death["queue"], death["count"]) == ("delivery_limit", queue, 1)
    assert properties.headers["x-first-death-reason"] == "delivery_limit"
    assert drain(channel, queue, 0) == []


def test_delivery_limit_without_dead_letter_exchange_drops(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue, _ = declare_limited(channel, created, 1, dead_letter=False)
    channel.basic_publish("", queue, b"flaky")
    for _ in range(2):
        method, _, _ = get_one(channel, queue, timeout=ARRIVAL)
        channel.basic_reject(method.delivery_tag, requeue=True)
    assert drain(channel, queue, 0, settle=1.0) == []


def test_aio_pika_consumer_hits_the_delivery_limit(broker: Broker, created: Created) -> None:
    dlq = created.queue("dlq")
    queue = created.queue("limited")
    deliveries: list[bool] = []

    async def scenario() -> bytes:
        connection = await aio_pika.connect(broker.url())
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue(dlq)
            source = await channel.declare_queue(
                queue,
                durable=True,
                arguments={
                    "x-queue-type": "quorum",
                    "x-delivery-limit": 1,
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": dlq,
                },
            )
            await channel.default_exchange.publish(aio_pika.Message(b"again"), queue)
            async with source.iterator() as messages:
                async for message in messages:
                    deliveries.append(message.redelivered)
                    await message.nack(requeue=True)
                    if len(deliveries) == 2:
                        break
            dead = await channel.declare_queue(dlq, passive=True)
            for _ in range(200):
                got = await dead.get(no_ack=True, fail=False)
                if got is not None:
                    assert got.headers["x-death"][0]["reason"] == "delivery_limit"
                    return got.body
                await asyncio.sleep(0.05)
            return b""

    assert asyncio.run(scenario()) == b"again"
    assert deliveries == [False, True]


# --- at-least-once across a proxy kill (ours only) ---------------------------------------


@pytest.fixture
def proxy_process(
    proxy_only: None, services: ServiceEndpoints, tmp_path: Path
) -> Iterator[ProxyProcess]:
    process = ProxyProcess(
        "dlx-proxy",
        tmp_path / "dlx-proxy.log",
        {
            "configurationStoreServers": services.zookeeper,
            "brokerServiceURL": services.pulsar_service_url,
            "brokerWebServiceURL": services.pulsar_web_url,
            "amqpAutoCreateNamespaces": "true",
        },
    )
    process.start()
    yield process
    process.stop()


def test_proxy_killed_while_dead_lettering_loses_nothing(
    proxy_process: ProxyProcess,
    connect: Callable[[], BlockingConnection],
    created: Created,
) -> None:
    """A consumer on a proxy process rejects (requeue=false) every message as fast as it
    comes; the proxy is killed with SIGKILL in the middle. Every message must then be in the
    DLQ or back in the source queue: duplicates allowed (dead-lettered and also redelivered,
    when the kill fell between the republish and the source ack), losses not."""
    channel = confirming_channel(connect())
    source, _, dlq = dead_letter_setup(channel, created)
    total = 1000
    for i in range(total):
        channel.basic_publish("", source, str(i).encode())

    rejected: list[int] = []
    stop = threading.Event()

    def reject_all() -> None:
        try:
            conn = pika.BlockingConnection(pika.URLParameters(proxy_process.url))
            ch = conn.channel()
            ch.basic_qos(prefetch_count=200)

            def on_message(c: BlockingChannel, method: Any, _p: Any, body: bytes) -> None:
                rejected.append(int(body))
                c.basic_reject(method.delivery_tag, requeue=False)

            ch.basic_consume(source, on_message)
            while not stop.is_set():
                conn.process_data_events(time_limit=0.05)
        except Exception:  # the proxy went away under it
            return

    worker = threading.Thread(target=reject_all, daemon=True)
    worker.start()
    deadline = time.monotonic() + 60
    while len(rejected) < total // 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert rejected, "the consumer on the proxy process got nothing"
    proxy_process.send_signal(signal.SIGKILL)
    proxy_process.wait_exited()
    stop.set()
    worker.join(10)
    assert len(rejected) < total, "the kill came too late to cut the stream"

    reader = connect()
    dead = [int(b) for b in consume_all(reader, dlq, len(rejected))]
    back = [int(b) for b in consume_all(reader, source, total - len(set(dead)))]
    assert set(dead) | set(back) == set(range(total)), "messages lost"
    assert len(dead) == len(set(dead)), "a message dead-lettered twice"
    assert set(dead) <= set(rejected)
    duplicated = set(dead) & set(back)
    print(
        f"rejected before the kill: {len(rejected)}, dead-lettered: {len(dead)}, "
        f"back in the queue: {len(back)}, both (at-least-once duplicates): {len(duplicated)}"
    )


def test_rejects_while_the_source_topic_reloads_dead_letter_each_message_once(
    proxy_only: None,
    services: ServiceEndpoints,
    connect: Callable[[], BlockingConnection],
    created: Created,
) -> None:
    """A consumer rejects (requeue=false) 600 messages while the source queue's topic is
    unloaded again and again: an acknowledgement pulsar-client could not send during a
    reload is lost, so Pulsar sends the message again. Each message still reaches the DLQ
    exactly once (core/dead_letter_memory.py), and none is lost."""
    channel = confirming_channel(connect())
    source, _, dlq = dead_letter_setup(channel, created)
    total = 600
    for i in range(total):
        channel.basic_publish("", source, str(i).encode())
    topic = naming.exchange_topic(NamespaceName("public", "default"), "", "direct", source)
    admin = PulsarAdmin(services.pulsar_web_url)
    rejected: list[int] = []
    stop = threading.Event()

    def unload_again_and_again() -> None:
        # Spaced so that the consumer's Pulsar consumers reconnect in between; a topic
        # unloaded every 150 ms kept a new subscription from being made at all.
        for _ in range(8):
            if stop.wait(0.5):
                return
            with contextlib.suppress(Exception):  # a reload already under way
                admin.unload_topic(topic)

    consumer = connect()
    consuming = consumer.channel()
    consuming.basic_qos(prefetch_count=20)

    def on_message(c: BlockingChannel, method: Any, _p: Any, body: bytes) -> None:
        rejected.append(int(body))
        time.sleep(0.005)  # the rejects spread over several reloads
        c.basic_reject(method.delivery_tag, requeue=False)

    consuming.basic_consume(source, on_message)
    pump([consumer], lambda: len(rejected) > 0, timeout=ARRIVAL)  # subscribed, reading
    unloader = threading.Thread(target=unload_again_and_again, daemon=True)
    unloader.start()
    try:
        pump([consumer], lambda: len(set(rejected)) >= total, timeout=120)
    finally:
        stop.set()
        unloader.join(10)
    assert set(rejected) == set(range(total))
    dead = [int(body) for body in consume_all(connect(), dlq, total, timeout=60)]
    assert len(dead) == len(set(dead)), (
        f"{len(dead) - len(set(dead))} messages dead-lettered twice "
        f"({len(rejected) - total} deliveries again after a reload)"
    )
    assert sorted(dead) == list(range(total))
    consumer.close()
    assert drain(channel, source, 0) == []
