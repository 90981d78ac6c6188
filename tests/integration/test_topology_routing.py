"""Topology seen through messages: a binding routes once bind-ok has been sent, unbind and
deletes stop routing, exchange types route like RabbitMQ, and declare-ok / purge-ok /
delete-ok count messages. Each test publishes a few messages and reads them with
basic.get: they depend on publish/get working too (message flow)."""

from __future__ import annotations

import asyncio

import aio_pika
import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingConnection

from tests.integration.conftest import Broker
from tests.support import amqp_fixtures
from tests.support.amqp_fixtures import Created, closes_channel, confirming_channel, drain

# --- helpers (shared ones: tests/support/amqp_fixtures.py; fixtures: conftest.py) -----

NAME_PREFIX = "topo"  # of the names made here (the `created` fixture reads it)


def unique(kind: str) -> str:
    return amqp_fixtures.unique(kind, NAME_PREFIX)


def headers(**values: object) -> pika.BasicProperties:
    return pika.BasicProperties(headers=values)


# --- bind / unbind ------------------------------------------------------------------


def test_message_published_after_bind_ok_is_routed(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    exchange, queue = created.exchange(), created.queue()
    channel.exchange_declare(exchange, "direct")
    channel.queue_declare(queue, exclusive=True)
    channel.queue_bind(queue, exchange, "k")
    channel.basic_publish(exchange, "k", b"routed")
    channel.basic_publish(exchange, "other", b"not-routed")
    assert drain(channel, queue, 1) == [b"routed"]


def test_unbind_stops_routing_but_keeps_what_was_routed(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    exchange, queue = created.exchange(), created.queue()
    channel.exchange_declare(exchange, "direct")
    channel.queue_declare(queue, exclusive=True)
    channel.queue_bind(queue, exchange, "k")
    channel.basic_publish(exchange, "k", b"before-unbind")
    channel.queue_unbind(queue, exchange, "k")
    channel.basic_publish(exchange, "k", b"after-unbind")
    assert drain(channel, queue, 1) == [b"before-unbind"]


def test_rebind_after_unbind_routes_again(connection: BlockingConnection, created: Created) -> None:
    channel = confirming_channel(connection)
    exchange, queue = created.exchange(), created.queue()
    channel.exchange_declare(exchange, "fanout")
    channel.queue_declare(queue, exclusive=True)
    channel.queue_bind(queue, exchange)
    channel.queue_unbind(queue, exchange)
    channel.basic_publish(exchange, "", b"while-unbound")
    channel.queue_bind(queue, exchange)
    channel.basic_publish(exchange, "", b"after-rebind")
    assert drain(channel, queue, 1) == [b"after-rebind"]


# --- exchange types -----------------------------------------------------------------


def test_direct_with_two_keys_bound_for_one_queue_routes_each_message_once(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    exchange, queue = created.exchange(), created.queue()
    channel.exchange_declare(exchange, "direct")
    channel.queue_declare(queue, exclusive=True)
    channel.queue_bind(queue, exchange, "k1")
    channel.queue_bind(queue, exchange, "k2")
    channel.basic_publish(exchange, "k1", b"one")
    channel.basic_publish(exchange, "k2", b"two")
    channel.basic_publish(exchange, "k3", b"three")
    assert sorted(drain(channel, queue, 2)) == [b"one", b"two"]


def test_message_matching_several_bindings_of_one_queue_arrives_once(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    topic, fanout, queue = created.exchange("t"), created.exchange("f"), created.queue()
    channel.exchange_declare(topic, "topic")
    channel.exchange_declare(fanout, "fanout")
    channel.queue_declare(queue, exclusive=True)
    for pattern in ("a.*", "a.#", "#", "*.b"):
        channel.queue_bind(queue, topic, pattern)
    for key in ("x", "y"):  # fanout ignores keys: two bindings that match everything
        channel.queue_bind(queue, fanout, key)
    channel.basic_publish(topic, "a.b", b"topic")
    channel.basic_publish(fanout, "z", b"fanout")
    assert sorted(drain(channel, queue, 2)) == [b"fanout", b"topic"]


def test_fanout_routes_to_every_bound_queue(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    exchange, first, second = created.exchange(), created.queue(), created.queue()
    channel.exchange_declare(exchange, "fanout")
    for queue in (first, second):
        channel.queue_declare(queue, exclusive=True)
        channel.queue_bind(queue, exchange, "ignored")
    channel.basic_publish(exchange, "any-key", b"m1")
    channel.basic_publish(exchange, "", b"m2")
    assert drain(channel, first, 2) == [b"m1", b"m2"]
    assert drain(channel, second, 2) == [b"m1", b"m2"]


# Pattern -> the keys (of KEYS, published in that order) that RabbitMQ 3.10.8 routes to it.
TOPIC_KEYS = ["a", "a.b", "a.b.c", "b", "", "a..b", "x.b"]
TOPIC_MATCHES = {
    "a.*": ["a.b"],
    "a.#": ["a", "a.b", "a.b.c", "a..b"],
    "#": TOPIC_KEYS,
    "#.#": TOPIC_KEYS,
    "*": ["a", "b"],  # not the empty key
    "*.*": ["a.b", "x.b"],
    "a..b": ["a..b"],
    "a.*.#": ["a.b", "a.b.c", "a..b"],  # an empty word is a word
    "#.b": ["a.b", "b", "a..b", "x.b"],
    "": [""],
}


def test_topic_patterns_route_like_rabbitmq(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    exchange = created.exchange("topic")
    channel.exchange_declare(exchange, "topic")
    queues = {}
    for pattern in TOPIC_MATCHES:
        queues[pattern] = created.queue()
        channel.queue_declare(queues[pattern], exclusive=True)
        channel.queue_bind(queues[pattern], exchange, pattern)
    for key in TOPIC_KEYS:
        channel.basic_publish(exchange, key, f"<{key}>".encode())
    routed = {
        pattern: drain(channel, queue, len(TOPIC_MATCHES[pattern]), settle=0.1)
        for pattern, queue in queues.items()
    }
    assert routed == {
        pattern: [f"<{key}>".encode() for key in keys] for pattern, keys in TOPIC_MATCHES.items()
    }


def test_headers_exchange_all_and_any(connection: BlockingConnection, created: Created) -> None:
    channel = confirming_channel(connection)
    exchange = created.exchange("headers")
    channel.exchange_declare(exchange, "headers")
    match_all, match_any, match_default = created.queue(), created.queue(), created.queue()
    for queue, x_match in ((match_all, "all"), (match_any, "any"), (match_default, None)):
        channel.queue_declare(queue, exclusive=True)
        arguments: dict[str, object] = {"a": 1, "b": "two"}
        if x_match is not None:
            arguments["x-match"] = x_match
        channel.queue_bind(queue, exchange, "", arguments=arguments)
    channel.basic_publish(exchange, "", b"both", headers(a=1, b="two", c=3))
    channel.basic_publish(exchange, "", b"only-a", headers(a=1))
    channel.basic_publish(exchange, "", b"a-wrong-value", headers(a=2, b="two"))
    channel.basic_publish(exchange, "", b"none", headers(c=3))
    channel.basic_publish(exchange, "", b"no-headers")
    assert drain(channel, match_all, 1) == [b"both"]
    assert drain(channel, match_default, 1) == [b"both"]  # x-match defaults to all
    assert drain(channel, match_any, 3) == [b"both", b"only-a", b"a-wrong-value"]


# --- counts in declare-ok / purge-ok / delete-ok ------------------------------------


def test_declare_ok_message_count_reflects_published_messages(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"m1")
    channel.basic_publish("", queue, b"m2")
    ok = channel.queue_declare(queue, passive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (queue, 2, 0)
    ok = channel.queue_declare(queue).method  # a non-passive redeclare counts the same
    assert (ok.queue, ok.message_count, ok.consumer_count) == (queue, 2, 0)


def test_purge_ok_returns_the_purged_count(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue)
    for body in (b"m1", b"m2", b"m3"):
        channel.basic_publish("", queue, body)
    assert channel.queue_purge(queue).method.message_count == 3
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    channel.basic_publish("", queue, b"after-purge")
    assert drain(channel, queue, 1) == [b"after-purge"]


def test_delete_ok_returns_the_ready_message_count(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue)
    for body in (b"m1", b"m2", b"m3"):
        channel.basic_publish("", queue, body)
    ok = channel.queue_delete(queue).method
    assert (type(ok), ok.message_count) == (pika.spec.Queue.DeleteOk, 3)


def test_delete_if_empty_with_a_message_is_406(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"m")
    error = closes_channel(connection, lambda: channel.queue_delete(queue, if_empty=True))
    assert error.reply_code == 406
    assert error.reply_text == f"PRECONDITION_FAILED - queue '{queue}' in vhost '/' not empty"
    ok = connection.channel().queue_declare(queue, passive=True).method
    assert ok.message_count == 1  # still there, message and all


# --- deletes remove bindings --------------------------------------------------------


def test_deleting_a_queue_removes_its_bindings(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    exchange, queue = created.exchange(), created.queue()
    channel.exchange_declare(exchange, "fanout")
    channel.queue_declare(queue)
    channel.queue_bind(queue, exchange)
    channel.queue_delete(queue)
    channel.queue_declare(queue)  # same name, new queue: no bindings
    channel.basic_publish(exchange, "", b"m")
    assert drain(channel, queue, 0) == []
    # The exchange is not in use any more either.
    assert isinstance(
        channel.exchange_delete(exchange, if_unused=True).method, pika.spec.Exchange.DeleteOk
    )


def test_deleting_an_exchange_removes_its_bindings(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    exchange, queue = created.exchange(), created.queue()
    channel.exchange_declare(exchange, "fanout")
    channel.queue_declare(queue, exclusive=True)
    channel.queue_bind(queue, exchange)
    channel.exchange_delete(exchange)
    channel.exchange_declare(exchange, "fanout")  # same name, new exchange: no bindings
    channel.basic_publish(exchange, "", b"m")
    assert drain(channel, queue, 0) == []


# --- aio-pika -----------------------------------------------------------------------


def test_aio_pika_declare_bind_publish_get(broker: Broker, created: Created) -> None:
    exchange_name, queue_name = created.exchange("aio"), created.queue("aio")

    async def scenario() -> tuple[bytes, str, int]:
        connection = await aio_pika.connect(broker.url())
        try:
            channel = await connection.channel()  # publisher confirms on
            exchange = await channel.declare_exchange(exchange_name, aio_pika.ExchangeType.TOPIC)
            queue = await channel.declare_queue(queue_name, exclusive=True)
            await queue.bind(exchange, routing_key="orders.*")
            await exchange.publish(aio_pika.Message(b"hello"), routing_key="orders.created")
            await exchange.publish(aio_pika.Message(b"skip"), routing_key="payments.created")
            deadline = asyncio.get_running_loop().time() + 5
            message = None
            while message is None and asyncio.get_running_loop().time() < deadline:
                message = await queue.get(no_ack=True, fail=False)
                if message is None:
                    await asyncio.sleep(0.02)
            assert message is not None
            await asyncio.sleep(0.3)
            left = await queue.declare()
            await queue.unbind(exchange, routing_key="orders.*")
            await exchange.delete()
            return message.body, message.routing_key or "", left.message_count or 0
        finally:
            await connection.close()

    assert asyncio.run(scenario()) == (b"hello", "orders.created", 0)
