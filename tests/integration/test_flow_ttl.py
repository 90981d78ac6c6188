"""Message TTL as RabbitMQ 3.10 does it: a queue's `x-message-ttl` and a message's own
`expiration` (milliseconds, as a string); expired messages are never delivered, are
dead-lettered with reason `expired` when the queue has a dead-letter exchange (their
expiration moved to x-death's `original-expiration`), and no longer count once a read
reached them. Invalid expirations are refused at publish (406). Runs against RabbitMQ too
(STARLIGHT_TEST_AMQP_URL); how exact expiry is on the proxy is in docs/mapping.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.integration.conftest import ProxyFactory
from tests.support.amqp_fixtures import (
    Created,
    closes_channel,
    confirming_channel,
    drain,
    get_one,
    pump,
    wait_for_count,
)

NAME_PREFIX = "ttl"  # of the names made here (the `created` fixture reads it)
TTL_MS = 300
PAST_TTL = 1.0  # seconds: well past TTL_MS
ARRIVAL = 20.0  # how long a message may take to arrive (not a bound on speed)


def declare(
    channel: BlockingChannel, created: Created, dead_letter: bool, **arguments: Any
) -> tuple[str, str | None]:
    """(queue, its dead-letter queue or None), the DLQ reached through the default
    exchange."""
    dlq: str | None = None
    if dead_letter:
        dlq = created.queue("dlq")
        channel.queue_declare(dlq)
        arguments |= {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
    queue = created.queue("q")
    channel.queue_declare(queue, arguments=arguments)
    return queue, dlq


def test_queue_ttl_expires_and_dead_letters(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue, dlq = declare(channel, created, True, **{"x-message-ttl": TTL_MS})
    assert dlq is not None
    for i in range(5):
        channel.basic_publish("", queue, f"m{i}".encode())
    time.sleep(PAST_TTL)
    method, _, _ = channel.basic_get(queue, auto_ack=False)
    assert method is None  # expired: not delivered
    dead: list[tuple[bytes, pika.BasicProperties]] = []
    deadline = time.monotonic() + ARRIVAL
    while len(dead) < 5 and time.monotonic() < deadline:
        got, properties, body = channel.basic_get(dlq, auto_ack=True)
        if got is None:
            time.sleep(0.05)
            continue
        assert (got.exchange, got.routing_key) == ("", dlq)
        dead.append((body, properties))
    assert sorted(body for body, _ in dead) == [f"m{i}".encode() for i in range(5)]
    for _, properties in dead:
        (death,) = properties.headers["x-death"]
        assert (death["reason"], death["queue"], death["count"]) == ("expired", queue, 1)
        assert (death["exchange"], death["routing-keys"]) == ("", [queue])
        assert "original-expiration" not in death  # the queue's TTL, not the message's
        assert properties.headers["x-first-death-reason"] == "expired"
    assert wait_for_count(channel, queue, 0) == 0


def test_expired_messages_stop_counting_in_a_queue_nobody_reads(
    connection: BlockingConnection, created: Created
) -> None:
    """No consumer, no basic.get: RabbitMQ drops them itself; the proxy's SubscriptionCleaner
    leader expires them in Pulsar on its next pass (queues without a dead-letter exchange)."""
    channel = confirming_channel(connection)
    queue, _ = declare(channel, created, False, **{"x-message-ttl": TTL_MS})
    for i in range(5):
        channel.basic_publish("", queue, f"m{i}".encode())
    assert wait_for_count(channel, queue, 0, timeout=60) == 0


def test_expired_messages_never_reach_a_consumer(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    channel = confirming_channel(connect())
    queue, _ = declare(channel, created, False, **{"x-message-ttl": TTL_MS})
    for i in range(3):
        channel.basic_publish("", queue, f"old{i}".encode())
    time.sleep(PAST_TTL)
    channel.basic_publish("", queue, b"fresh")
    consumer = connect()
    consuming = consumer.channel()
    bodies: list[bytes] = []
    consuming.basic_consume(queue, lambda _c, _m, _p, body: bodies.append(body), auto_ack=True)
    pump([consumer], lambda: len(bodies) >= 1, settle=1.0)
    assert bodies == [b"fresh"]
    assert wait_for_count(channel, queue, 0) == 0


def test_messages_within_the_ttl_are_delivered(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    channel = confirming_channel(connect())
    queue, dlq = declare(channel, created, True, **{"x-message-ttl": 60_000})
    assert dlq is not None
    consumer = connect()
    consuming = consumer.channel()
    bodies: list[bytes] = []
    consuming.basic_consume(queue, lambda _c, _m, _p, body: bodies.append(body), auto_ack=True)
    for i in range(20):
        channel.basic_publish("", queue, f"m{i}".encode())
    pump([consumer], lambda: len(bodies) >= 20)
    assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(20))
    assert drain(channel, dlq, 0) == []


def test_expired_unacked_message_is_not_expired_while_held(
    connection: BlockingConnection, created: Created
) -> None:
    """TTL applies while a message waits in the queue: one delivered and still unacked
    when its TTL passes is acked normally, not dead-lettered behind the consumer's back."""
    channel = confirming_channel(connection)
    queue, dlq = declare(channel, created, True, **{"x-message-ttl": TTL_MS})
    assert dlq is not None
    channel.basic_publish("", queue, b"held")
    method, _, _ = get_one(channel, queue, timeout=ARRIVAL)
    time.sleep(PAST_TTL)
    channel.basic_ack(method.delivery_tag)
    assert drain(channel, dlq, 0) == []
    assert wait_for_count(channel, queue, 0) == 0


# --- expiration (per message) ---------------------------------------------------------------


def test_per_message_expiration_dead_letters_with_original_expiration(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue, dlq = declare(channel, created, True)
    assert dlq is not None
    channel.basic_publish("", queue, b"short", pika.BasicProperties(expiration="200"))
    channel.basic_publish("", queue, b"long", pika.BasicProperties(expiration="600000"))
    channel.basic_publish("", queue, b"forever")
    time.sleep(PAST_TTL)
    assert sorted(drain(channel, queue, 2, timeout=ARRIVAL)) == [b"forever", b"long"]
    _, properties, body = get_one(channel, dlq, auto_ack=True, timeout=ARRIVAL)
    assert body == b"short"
    assert properties.expiration is None
    (death,) = properties.headers["x-death"]
    assert death["reason"] == "expired"
    assert death["original-expiration"] == "200"
    assert drain(channel, dlq, 0) == []


def test_message_expiration_shorter_than_the_queue_ttl_wins(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue, _ = declare(channel, created, False, **{"x-message-ttl": 600_000})
    channel.basic_publish("", queue, b"brief", pika.BasicProperties(expiration="100"))
    time.sleep(PAST_TTL)
    assert drain(channel, queue, 0) == []
    assert wait_for_count(channel, queue, 0) == 0


def test_queue_ttl_shorter_than_the_message_expiration_wins(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue, _ = declare(channel, created, False, **{"x-message-ttl": TTL_MS})
    channel.basic_publish("", queue, b"brief", pika.BasicProperties(expiration="600000"))
    time.sleep(PAST_TTL)
    assert drain(channel, queue, 0) == []


def test_message_counts_add_up_across_queue_and_dead_letter_queue(
    connection: BlockingConnection, created: Created
) -> None:
    """100 messages, every third with a short expiration: nothing lost, nothing twice."""
    channel = confirming_channel(connection)
    queue, dlq = declare(channel, created, True)
    assert dlq is not None
    for i in range(100):
        expiration = "100" if i % 3 == 0 else None
        channel.basic_publish(
            "", queue, str(i).encode(), pika.BasicProperties(expiration=expiration)
        )
    time.sleep(PAST_TTL)
    delivered = [int(b) for b in drain(channel, queue, 66, timeout=30)]
    dead = [int(b) for b in drain(channel, dlq, 34, timeout=30)]
    assert sorted(delivered) == [i for i in range(100) if i % 3]
    assert sorted(dead) == [i for i in range(100) if i % 3 == 0]


@pytest.mark.parametrize(
    ("expiration", "reason"),
    [
        ("abc", "no_integer"),
        ("", "no_integer"),
        ("-1", "{value_negative,-1}"),
        ("1.5", '{leftover_string,".5"}'),
    ],
)
def test_invalid_expiration_is_refused_at_publish(
    connection: BlockingConnection, created: Created, expiration: str, reason: str
) -> None:
    channel = connection.channel()
    queue = created.queue()
    channel.queue_declare(queue)

    def publish() -> None:
        channel.basic_publish("", queue, b"x", pika.BasicProperties(expiration=expiration))
        channel.queue_declare(queue, passive=True)  # a round trip: the error comes first

    error = closes_channel(connection, publish)
    assert error.reply_code == 406
    assert error.reply_text == f"PRECONDITION_FAILED - invalid expiration '{expiration}': {reason}"
    assert drain(connection.channel(), queue, 0) == []


def test_wrong_ttl_argument_is_refused(connection: BlockingConnection, created: Created) -> None:
    queue = created.queue()
    error = closes_channel(
        connection,
        lambda: connection.channel().queue_declare(queue, arguments={"x-message-ttl": "1000"}),
    )
    assert error.reply_code == 406
    assert error.reply_text == (
        f"PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue '{queue}' in vhost '/': "
        '"expected integer, got longstr"'
    )


def consume_all(
    connection: BlockingConnection, queue: str, expected: int, timeout: float = ARRIVAL
) -> list[tuple[float, bytes, pika.BasicProperties]]:
    """Consume (auto-ack) until `expected` messages came or `timeout`, then 0.3 s more:
    (arrival time, body, properties) in arrival order."""
    arrived: list[tuple[float, bytes, pika.BasicProperties]] = []
    channel = connection.channel()

    def on_message(
        _ch: object, _method: object, properties: pika.BasicProperties, body: bytes
    ) -> None:
        arrived.append((time.monotonic(), body, properties))

    channel.basic_consume(queue, on_message, auto_ack=True)
    pump([connection], lambda: len(arrived) >= expected, timeout=timeout)
    return arrived


def test_wait_queue_nobody_reads_dead_letters_each_message_once_its_ttl_passed(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    """The retry pattern: a wait queue with a TTL and a dead-letter exchange that nobody
    reads; its messages move to the work queue as their TTL passes."""
    channel = confirming_channel(connect())
    wait_queue, work_queue = declare(channel, created, True, **{"x-message-ttl": 500})
    assert work_queue is not None
    worker = connect()
    published = time.monotonic()
    for i in range(5):
        channel.basic_publish("", wait_queue, f"retry{i}".encode())
    arrived = consume_all(worker, work_queue, 5)
    assert sorted(body for _, body, _ in arrived) == [f"retry{i}".encode() for i in range(5)]
    for at, _, properties in arrived:
        assert at - published >= 0.5 - 0.05, "not before its TTL"
        (death,) = properties.headers["x-death"]
        assert (death["reason"], death["queue"]) == ("expired", wait_queue)
    print(f"last one moved {1000 * (arrived[-1][0] - published) - 500:.0f} ms after its TTL")
    assert wait_for_count(channel, wait_queue, 0) == 0


def test_per_message_expiration_in_a_wait_queue_expires_at_the_head(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    """Per-message TTLs in a queue nobody reads: a message dies once it is at the head and
    expired, so a short one waits behind a longer one (RabbitMQ's order)."""
    channel = confirming_channel(connect())
    wait_queue, work_queue = declare(channel, created, True)
    assert work_queue is not None
    worker = connect()
    published = time.monotonic()
    channel.basic_publish("", wait_queue, b"slow", pika.BasicProperties(expiration="1500"))
    channel.basic_publish("", wait_queue, b"quick", pika.BasicProperties(expiration="200"))
    arrived = consume_all(worker, work_queue, 2)
    assert [body for _, body, _ in arrived] == [b"slow", b"quick"]
    assert arrived[1][0] - published >= 1.5 - 0.05, "the quick one waited for the head"
    for _, _, properties in arrived:
        assert properties.headers["x-death"][0]["reason"] == "expired"
    print(f"moved {1000 * (arrived[-1][0] - published) - 1500:.0f} ms after the head expired")


@pytest.mark.usefixtures("proxy_only")
def test_wait_queue_messages_expire_through_a_proxy_restart(
    start_proxy: ProxyFactory, created: Created
) -> None:
    """Messages published through one proxy, which stops before they expire, are
    dead-lettered by the next one."""
    first = start_proxy()
    connection = pika.BlockingConnection(pika.URLParameters(first.amqp_url()))
    channel = confirming_channel(connection)
    wait_queue, work_queue = declare(channel, created, True, **{"x-message-ttl": 3000})
    assert work_queue is not None
    for i in range(3):
        channel.basic_publish("", wait_queue, f"m{i}".encode())
    connection.close()
    first.stop()

    second = start_proxy()
    connection = pika.BlockingConnection(pika.URLParameters(second.amqp_url()))
    try:
        arrived = consume_all(connection, work_queue, 3, timeout=30)
        assert sorted(body for _, body, _ in arrived) == [b"m0", b"m1", b"m2"]
        channel = connection.channel()
        channel.queue_delete(wait_queue)
        channel.queue_delete(work_queue)
    finally:
        connection.close()


def test_source_queue_is_empty_as_soon_as_its_dead_letter_arrives(
    connection: BlockingConnection, created: Created
) -> None:
    """The moment a consumer of the dead-letter queue has the expired message, the source
    queue counts 0 and `queue.delete(if_empty)` deletes it (aio-pika's test_expiration
    does exactly this). On the proxy the source's acknowledgement reaches Pulsar up to
    100 ms after the dead letter is stored, so the count must leave it out meanwhile."""
    channel = confirming_channel(connection)
    got: list[bytes] = []
    for attempt in range(3):
        queue, dlq = declare(channel, created, True, **{"x-message-ttl": 10_000})
        assert dlq is not None
        got.clear()
        tag = channel.basic_consume(
            dlq, lambda _ch, _method, _props, body: got.append(body), auto_ack=True
        )
        channel.basic_publish(
            "", queue, f"m{attempt}".encode(), pika.BasicProperties(expiration=str(TTL_MS))
        )
        pump([connection], lambda: bool(got), timeout=ARRIVAL, settle=0)
        assert got == [f"m{attempt}".encode()]
        assert channel.queue_declare(queue, passive=True).method.message_count == 0
        channel.queue_delete(queue, if_empty=True)
        channel.basic_cancel(tag)
