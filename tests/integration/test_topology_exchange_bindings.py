"""Routing through exchange-to-exchange bindings (exchange.bind / exchange.unbind), as
RabbitMQ does it: chains, cycles, each queue gets a message once, unbind and exchange delete
stop routing, mandatory returns, 404 and 403 answers. The same expected values hold on
RabbitMQ 3.x."""

from __future__ import annotations

import contextlib
import time

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.support import amqp_fixtures
from tests.support.amqp_fixtures import (
    Created,
    closes_channel,
    confirming_channel,
    drain,
    wait_for_count,
)

NAME_PREFIX = "e2e"  # of the names made here (the `created` fixture reads it)


def exchange(channel: BlockingChannel, created: Created, kind: str, label: str = "x") -> str:
    name = created.exchange(label)
    channel.exchange_declare(name, kind)
    return name


def bound_queue(
    channel: BlockingChannel,
    created: Created,
    to: str,
    key: str = "",
    arguments: dict[str, object] | None = None,
) -> str:
    queue = created.queue()
    channel.queue_declare(queue, exclusive=True)
    channel.queue_bind(queue, to, key, arguments=arguments)
    return queue


def publish_mandatory(channel: BlockingChannel, to: str, key: str, body: bytes) -> list[bytes]:
    """The bodies returned for a mandatory publish (confirming channel)."""
    returned: list[bytes] = []
    channel.add_on_return_callback(lambda _ch, _m, _p, b: returned.append(b))
    # pika raises this for a return before the ack, after it has called the callback.
    with contextlib.suppress(pika.exceptions.UnroutableError):
        channel.basic_publish(to, key, body, mandatory=True)
    channel.connection.process_data_events(time_limit=0.2)
    return returned


def test_direct_chain_routes_to_the_destinations_queue(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    source = exchange(channel, created, "direct", "src")
    middle = exchange(channel, created, "direct", "mid")
    last = exchange(channel, created, "direct", "dst")
    channel.exchange_bind(middle, source, "k")
    channel.exchange_bind(last, middle, "k")
    queue = bound_queue(channel, created, last, "k")
    other = bound_queue(channel, created, last, "other")
    channel.basic_publish(source, "k", b"chained")
    channel.basic_publish(source, "other", b"not bound at the source")
    assert drain(channel, queue, 1) == [b"chained"]
    assert drain(channel, other, 0, timeout=0.5) == []


def test_the_delivery_keeps_the_exchange_it_was_published_to(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    source = exchange(channel, created, "fanout", "src")
    destination = exchange(channel, created, "direct", "dst")
    channel.exchange_bind(destination, source, "")
    queue = bound_queue(channel, created, destination, "rk")
    channel.basic_publish(source, "rk", b"m")
    method = None
    for _ in range(250):
        method, _, _ = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            break
        connection.sleep(0.02)
    assert method is not None
    assert (method.exchange, method.routing_key) == (source, "rk")


def test_fanout_to_topic_chain_matches_by_each_exchanges_type(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    source = exchange(channel, created, "fanout", "fan")
    destination = exchange(channel, created, "topic", "top")
    channel.exchange_bind(destination, source, "ignored-by-fanout")
    colours = bound_queue(channel, created, destination, "colour.*")
    everything = bound_queue(channel, created, destination, "#")
    channel.basic_publish(source, "colour.red", b"red")
    channel.basic_publish(source, "size.big", b"big")
    assert drain(channel, colours, 1) == [b"red"]
    assert sorted(drain(channel, everything, 2)) == [b"big", b"red"]


def test_topic_source_binding_filters_what_passes(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    source = exchange(channel, created, "topic", "top")
    destination = exchange(channel, created, "fanout", "fan")
    channel.exchange_bind(destination, source, "a.#")
    queue = bound_queue(channel, created, destination)
    for key in ("a", "a.b.c", "b.a"):
        channel.basic_publish(source, key, key.encode())
    assert sorted(drain(channel, queue, 2)) == [b"a", b"a.b.c"]


def test_headers_source_binding_matches_the_headers(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    source = exchange(channel, created, "headers", "hdr")
    destination = exchange(channel, created, "fanout", "fan")
    channel.exchange_bind(destination, source, "", arguments={"x-match": "all", "kind": "a"})
    queue = bound_queue(channel, created, destination)
    for kind in ("a", "b"):
        properties = pika.BasicProperties(headers={"kind": kind})
        channel.basic_publish(source, "", kind.encode(), properties)
    assert drain(channel, queue, 1) == [b"a"]


def test_a_queue_reachable_by_several_paths_gets_the_message_once(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    source = exchange(channel, created, "fanout", "src")
    left = exchange(channel, created, "fanout", "left")
    right = exchange(channel, created, "fanout", "right")
    channel.exchange_bind(left, source, "")
    channel.exchange_bind(right, source, "")
    shared = bound_queue(channel, created, source)
    channel.queue_bind(shared, left, "")
    channel.queue_bind(shared, right, "")
    only_right = bound_queue(channel, created, right)
    channel.basic_publish(source, "k", b"once")
    assert drain(channel, shared, 1, settle=0.5) == [b"once"]
    assert drain(channel, only_right, 1) == [b"once"]


def test_a_queue_reachable_by_several_paths_counts_the_message_once(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    source = exchange(channel, created, "fanout", "src")
    destination = exchange(channel, created, "fanout", "dst")
    channel.exchange_bind(destination, source, "")
    shared = bound_queue(channel, created, source)
    channel.queue_bind(shared, destination, "")
    only_destination = bound_queue(channel, created, destination)
    channel.basic_publish(source, "k", b"once")
    assert wait_for_count(channel, only_destination, 1) == 1
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:  # the count never shows a second copy
        assert wait_for_count(channel, shared, 1) == 1
        connection.sleep(0.2)


def test_a_priority_queue_reached_through_a_binding_orders_by_priority(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    source = exchange(channel, created, "fanout", "src")
    destination = exchange(channel, created, "direct", "dst")
    channel.exchange_bind(destination, source, "")
    queue = created.queue("prio")
    channel.queue_declare(queue, exclusive=True, arguments={"x-max-priority": 10})
    channel.queue_bind(queue, destination, "k")
    for body, priority in ((b"low", 1), (b"high", 9), (b"mid", 5)):
        channel.basic_publish(source, "k", body, pika.BasicProperties(priority=priority))
    assert wait_for_count(channel, queue, 3) == 3
    assert drain(channel, queue, 3) == [b"high", b"mid", b"low"]


def test_a_full_reject_publish_queue_behind_a_binding_refuses_and_nacks(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    source = exchange(channel, created, "fanout", "src")
    destination = exchange(channel, created, "fanout", "dst")
    channel.exchange_bind(destination, source, "")
    limited = created.queue("limited")
    channel.queue_declare(
        limited, exclusive=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
    )
    channel.queue_bind(limited, destination, "")
    unlimited = bound_queue(channel, created, source)
    results = []
    for body in (b"one", b"two", b"three"):
        try:
            channel.basic_publish(source, "", body)
            results.append(True)
        except pika.exceptions.NackError:
            results.append(False)
    # The publisher hears of the refusal (nack) even though one queue took the message.
    assert results == [True, False, False]
    assert drain(channel, unlimited, 3) == [b"one", b"two", b"three"]
    assert drain(channel, limited, 1) == [b"one"]


def test_dead_letters_follow_the_dead_letter_exchanges_bindings(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    dead_letter_exchange = exchange(channel, created, "fanout", "dlx")
    destination = exchange(channel, created, "direct", "dst")
    channel.exchange_bind(destination, dead_letter_exchange, "")
    work = created.queue("work")
    # Dead-lettered with its routing key (the work queue's name: published to "").
    dead = bound_queue(channel, created, destination, work)
    channel.queue_declare(
        work, exclusive=True, arguments={"x-dead-letter-exchange": dead_letter_exchange}
    )
    channel.basic_publish("", work, b"doomed")
    method = None
    deadline = time.monotonic() + 5
    while method is None and time.monotonic() < deadline:
        method, _, _ = channel.basic_get(work)
        if method is None:
            connection.sleep(0.02)
    assert method is not None
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert drain(channel, dead, 1) == [b"doomed"]


def test_a_cycle_delivers_once(connection: BlockingConnection, created: Created) -> None:
    channel = confirming_channel(connection)
    first = exchange(channel, created, "fanout", "one")
    second = exchange(channel, created, "fanout", "two")
    channel.exchange_bind(second, first, "")
    channel.exchange_bind(first, second, "")
    channel.exchange_bind(first, first, "")
    queue = bound_queue(channel, created, second)
    channel.basic_publish(first, "k", b"from-first")
    channel.basic_publish(second, "k", b"from-second")
    assert sorted(drain(channel, queue, 2, settle=0.5)) == [b"from-first", b"from-second"]
    # Deleting an exchange bound to itself and in a cycle takes its bindings along.
    assert isinstance(channel.exchange_delete(first).method, pika.spec.Exchange.DeleteOk)
    channel.basic_publish(second, "k", b"after delete")
    assert drain(channel, queue, 1) == [b"after delete"]
    # second -> first went with first: second's only binding left is the queue's.
    channel.queue_unbind(queue, second, "")
    assert isinstance(
        channel.exchange_delete(second, if_unused=True).method, pika.spec.Exchange.DeleteOk
    )


def test_binding_twice_is_idempotent_and_unbind_stops_routing(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    source = exchange(channel, created, "direct", "src")
    destination = exchange(channel, created, "fanout", "dst")
    channel.exchange_bind(destination, source, "k")
    channel.exchange_bind(destination, source, "k")
    queue = bound_queue(channel, created, destination)
    channel.basic_publish(source, "k", b"bound")
    assert drain(channel, queue, 1) == [b"bound"]
    assert isinstance(
        channel.exchange_unbind(destination, source, "k").method, pika.spec.Exchange.UnbindOk
    )
    assert isinstance(
        channel.exchange_unbind(destination, source, "k").method, pika.spec.Exchange.UnbindOk
    )
    channel.basic_publish(source, "k", b"unbound")
    assert drain(channel, queue, 0, timeout=0.5) == []


def test_deleting_the_destination_removes_the_binding(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    source = exchange(channel, created, "fanout", "src")
    destination = exchange(channel, created, "fanout", "dst")
    channel.exchange_bind(destination, source, "")
    queue = bound_queue(channel, created, destination)
    channel.exchange_delete(destination)
    # The source has no binding left: if-unused deletes it.
    channel.exchange_declare(destination, "fanout")
    channel.queue_bind(queue, destination, "")
    channel.basic_publish(source, "k", b"after delete")
    assert drain(channel, queue, 0, timeout=0.5) == []
    assert isinstance(
        channel.exchange_delete(source, if_unused=True).method, pika.spec.Exchange.DeleteOk
    )


def test_deleting_the_source_removes_the_binding(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    source = exchange(channel, created, "fanout", "src")
    destination = exchange(channel, created, "fanout", "dst")
    channel.exchange_bind(destination, source, "")
    queue = bound_queue(channel, created, destination)
    channel.exchange_delete(source)
    channel.exchange_declare(source, "fanout")
    channel.basic_publish(source, "k", b"after delete")
    assert drain(channel, queue, 0, timeout=0.5) == []
    channel.basic_publish(destination, "k", b"direct")
    assert drain(channel, queue, 1) == [b"direct"]


def test_an_auto_delete_source_goes_with_its_last_binding(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    source = created.exchange("auto")
    channel.exchange_declare(source, "fanout", auto_delete=True)
    destination = exchange(channel, created, "fanout", "dst")
    channel.exchange_bind(destination, source, "a")
    channel.exchange_bind(destination, source, "b")
    channel.exchange_unbind(destination, source, "a")
    channel.exchange_declare(source, "fanout", auto_delete=True, passive=True)  # still there
    channel.exchange_unbind(destination, source, "b")
    error = closes_channel(
        connection, lambda: channel.exchange_declare(source, "fanout", passive=True)
    )
    assert error.reply_code == 404
    channel = connection.channel()
    channel.exchange_declare(destination, "fanout", passive=True)  # the destination stays


def test_auto_delete_exchanges_go_up_the_chain_with_their_last_binding(
    connection: BlockingConnection, created: Created
) -> None:
    """outer -> inner -> an auto-delete queue, both exchanges auto-delete: when the queue's
    last consumer cancels, the queue goes, then inner (its last binding went), then outer
    (its only binding led to inner), as RabbitMQ cascades them (amqp091-go's
    TestConnectionRecoveryAutoDeleteExchangeCascade)."""
    channel = connection.channel()
    outer, inner = created.exchange("outer"), created.exchange("inner")
    for name in (outer, inner):
        channel.exchange_declare(name, "fanout", auto_delete=True)
    channel.exchange_bind(inner, outer, "")
    queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
    channel.queue_bind(queue, inner, "")
    tag = channel.basic_consume(queue, lambda *_: None)
    channel.basic_cancel(tag)
    for name in (inner, outer):
        probe = connection.channel()
        error = closes_channel(
            connection,
            lambda probe=probe, name=name: probe.exchange_declare(name, "fanout", passive=True),
        )
        assert error.reply_code == 404, name


def test_deleting_a_destination_takes_auto_delete_sources_bound_only_to_it(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    lonely, shared = created.exchange("lonely"), created.exchange("shared")
    for name in (lonely, shared):
        channel.exchange_declare(name, "fanout", auto_delete=True)
    destination = exchange(channel, created, "fanout", "dst")
    other = exchange(channel, created, "fanout", "other")
    channel.exchange_bind(destination, lonely, "")
    channel.exchange_bind(destination, shared, "")
    channel.exchange_bind(other, shared, "")
    channel.exchange_delete(destination)
    error = closes_channel(
        connection, lambda: channel.exchange_declare(lonely, "fanout", passive=True)
    )
    assert error.reply_code == 404
    channel = connection.channel()
    channel.exchange_declare(shared, "fanout", auto_delete=True, passive=True)  # still bound


def test_mandatory_publish_through_a_chain_without_queues_is_returned(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    source = exchange(channel, created, "fanout", "src")
    destination = exchange(channel, created, "direct", "dst")
    channel.exchange_bind(destination, source, "")
    bound_queue(channel, created, destination, "wanted")
    assert publish_mandatory(channel, source, "unwanted", b"lost") == [b"lost"]
    assert publish_mandatory(channel, source, "wanted", b"routed") == []


def test_alternate_exchanges_apply_where_the_walk_routes_nowhere(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    alternate = exchange(channel, created, "fanout", "alt")
    source = created.exchange("src")
    channel.exchange_declare(source, "direct", arguments={"alternate-exchange": alternate})
    destination = exchange(channel, created, "direct", "dst")
    channel.exchange_bind(destination, source, "k")
    caught = bound_queue(channel, created, alternate)
    # No binding of the source matches: its alternate exchange gets the message.
    assert publish_mandatory(channel, source, "other", b"to the alternate") == []
    assert drain(channel, caught, 1) == [b"to the alternate"]
    # The source passes it on to the destination, which routes it to no queue: returned
    # (the source's alternate is for messages it routes nowhere at all).
    assert publish_mandatory(channel, source, "k", b"lost") == [b"lost"]
    assert drain(channel, caught, 0, timeout=0.5) == []


@pytest.mark.parametrize("missing", ["source", "destination"])
def test_missing_exchange_is_404(
    connection: BlockingConnection, created: Created, missing: str
) -> None:
    channel = connection.channel()
    present = exchange(channel, created, "fanout", "here")
    absent = amqp_fixtures.unique("missing", NAME_PREFIX)
    source, destination = (absent, present) if missing == "source" else (present, absent)
    error = closes_channel(connection, lambda: channel.exchange_bind(destination, source, "k"))
    assert error.reply_code == 404
    assert error.reply_text == f"NOT_FOUND - no exchange '{absent}' in vhost '/'"


@pytest.mark.parametrize("side", ["source", "destination"])
def test_the_default_exchange_cannot_be_bound(
    connection: BlockingConnection, created: Created, side: str
) -> None:
    channel = connection.channel()
    present = exchange(channel, created, "direct", "here")
    source, destination = ("", present) if side == "source" else (present, "")
    error = closes_channel(connection, lambda: channel.exchange_bind(destination, source, "k"))
    assert error.reply_code == 403
    assert error.reply_text == "ACCESS_REFUSED - operation not permitted on the default exchange"
