"""Queue length limits as RabbitMQ 3.10 does them: `x-max-length` and `x-max-length-bytes`,
with `x-overflow` `reject-publish` (the publisher's confirm is a nack; queues with room
still get the message) and `drop-head`, the default (the oldest ready messages are dropped,
or dead-lettered with reason `maxlen`). Runs against RabbitMQ too (STARLIGHT_TEST_AMQP_URL).

The proxy knows a queue's depth from Pulsar's stats (docs/mapping.md says how exact), so
where RabbitMQ is exact at once these tests wait for the outcome instead of sampling it.
"""

from __future__ import annotations

import time
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.support.amqp_fixtures import (
    Created,
    confirming_channel,
    drain,
    get_one,
    wait_for_count,
)

NAME_PREFIX = "maxlen"
STATS_SETTLE = 0.6  # seconds: longer than the proxy's stats refresh (0.25 s)
TRIMMED = 10.0  # seconds a drop-head trim may take to show (not a bound on speed)


def publish_all(
    channel: BlockingChannel, exchange: str, key: str, bodies: list[bytes]
) -> list[bool]:
    """Publish each body on a confirming channel; True where the broker acked it."""
    results = []
    for body in bodies:
        try:
            channel.basic_publish(exchange, key, body, pika.BasicProperties(delivery_mode=2))
            results.append(True)
        except pika.exceptions.NackError:
            results.append(False)
    return results


def declare(channel: BlockingChannel, created: Created, **arguments: Any) -> str:
    queue = created.queue("q")
    channel.queue_declare(queue, durable=True, arguments=arguments)
    return queue


# --- reject-publish ------------------------------------------------------------------------


def test_reject_publish_nacks_what_the_full_queue_refuses(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = declare(channel, created, **{"x-max-length": 3, "x-overflow": "reject-publish"})
    bodies = [f"m{i}".encode() for i in range(5)]
    assert publish_all(channel, "", queue, bodies) == [True, True, True, False, False]
    assert wait_for_count(channel, queue, 3, timeout=TRIMMED) == 3
    assert drain(channel, queue, 3) == bodies[:3]


def test_reject_publish_takes_messages_again_once_there_is_room(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = declare(channel, created, **{"x-max-length": 2, "x-overflow": "reject-publish"})
    assert publish_all(channel, "", queue, [b"a", b"b", b"c"]) == [True, True, False]
    method, _, body = get_one(channel, queue)
    assert body == b"a"
    channel.basic_ack(method.delivery_tag)
    time.sleep(STATS_SETTLE)
    assert publish_all(channel, "", queue, [b"d", b"e"]) == [True, False]
    assert drain(channel, queue, 2) == [b"b", b"d"]


def test_a_refusing_queue_does_not_keep_the_message_from_the_others(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    exchange = created.exchange("fan")
    channel.exchange_declare(exchange, "fanout")
    limited = declare(channel, created, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    unlimited = declare(channel, created)
    for queue in (limited, unlimited):
        channel.queue_bind(queue, exchange)
    bodies = [b"one", b"two", b"three"]
    # The publisher hears of the refusal (nack) even though one queue took the message.
    assert publish_all(channel, exchange, "", bodies) == [True, False, False]
    assert drain(channel, unlimited, 3) == bodies
    assert drain(channel, limited, 1) == [b"one"]


def test_reject_publish_counts_body_bytes(connection: BlockingConnection, created: Created) -> None:
    channel = confirming_channel(connection)
    queue = declare(
        channel, created, **{"x-max-length-bytes": 35_000, "x-overflow": "reject-publish"}
    )
    bodies = [bytes([65 + i]) * 10_000 for i in range(5)]
    assert publish_all(channel, "", queue, bodies) == [True, True, True, False, False]
    assert drain(channel, queue, 3) == bodies[:3]


# --- drop-head -----------------------------------------------------------------------------


def test_drop_head_keeps_the_newest_messages(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = declare(channel, created, **{"x-max-length": 2})
    bodies = [f"m{i}".encode() for i in range(6)]
    assert publish_all(channel, "", queue, bodies) == [True] * 6
    assert wait_for_count(channel, queue, 2, timeout=TRIMMED) == 2
    assert drain(channel, queue, 2) == bodies[-2:]


def test_drop_head_dead_letters_the_oldest_with_reason_maxlen(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    dlq = created.queue("dlq")
    channel.queue_declare(dlq, durable=True)
    queue = declare(
        channel,
        created,
        **{"x-max-length": 2, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq},
    )
    bodies = [f"m{i}".encode() for i in range(5)]
    assert publish_all(channel, "", queue, bodies) == [True] * 5
    assert wait_for_count(channel, dlq, 3, timeout=TRIMMED) == 3
    dead = []
    for _ in range(3):
        method, properties, body = get_one(channel, dlq)
        channel.basic_ack(method.delivery_tag)
        death = properties.headers["x-death"][0]
        assert death["reason"] == "maxlen"
        assert death["queue"] == queue
        assert properties.headers["x-first-death-reason"] == "maxlen"
        dead.append(body)
    assert dead == bodies[:3]
    assert drain(channel, queue, 2) == bodies[-2:]


def test_reject_publish_dlx_dead_letters_what_it_refuses(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    dlq = created.queue("dlq")
    channel.queue_declare(dlq, durable=True)
    queue = declare(
        channel,
        created,
        **{
            "x-max-length": 1,
            "x-overflow": "reject-publish-dlx",
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dlq,
        },
    )
    assert publish_all(channel, "", queue, [b"kept", b"refused"]) == [True, False]
    method, properties, body = get_one(channel, dlq)
    channel.basic_ack(method.delivery_tag)
    assert body == b"refused"
    death = properties.headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("maxlen", queue, 1)
    assert death["exchange"] == ""
    assert death["routing-keys"] == [queue]
    assert drain(channel, queue, 1) == [b"kept"]
    assert drain(channel, dlq, 0) == []
