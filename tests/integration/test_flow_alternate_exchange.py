"""Alternate exchanges (the `alternate-exchange` exchange argument), as RabbitMQ 3.x has
them: a message that its exchange routes nowhere goes through the alternate exchange (and
its alternate, and so on, each tried once); only if none routes it is it returned
(mandatory) or dropped. Publisher confirms ack it either way."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.support.amqp_fixtures import (
    Created,
    closes_channel,
    confirming_channel,
    drain,
    get_one,
)

NAME_PREFIX = "ae"


def declare(
    channel: BlockingChannel,
    name: str,
    kind: str = "direct",
    alternate: str | None = None,
    internal: bool = False,
) -> None:
    arguments = {"alternate-exchange": alternate} if alternate is not None else None
    channel.exchange_declare(name, kind, durable=True, internal=internal, arguments=arguments)


def bound_queue(channel: BlockingChannel, created: Created, exchange: str, key: str = "") -> str:
    queue = created.queue("q")
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, exchange, key)
    return queue


def publish_mandatory(channel: BlockingChannel, exchange: str, key: str, body: bytes) -> list:
    """Publish with mandatory=true on a confirming channel; the bodies returned to us."""
    returned: list[bytes] = []
    channel.add_on_return_callback(lambda _ch, _m, _p, b: returned.append(b))
    # pika raises this for a return before the ack, after it has called the callback.
    with contextlib.suppress(pika.exceptions.UnroutableError):
        channel.basic_publish(exchange, key, body, mandatory=True)
    channel.connection.process_data_events(time_limit=0.2)
    return returned


def test_unroutable_message_goes_to_the_alternate_exchange_keeping_its_exchange_and_key(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    main, alternate = created.exchange("main"), created.exchange("alt")
    declare(channel, alternate, "fanout")
    declare(channel, main, "direct", alternate=alternate)
    routed_queue = bound_queue(channel, created, main, "known")
    alternate_queue = bound_queue(channel, created, alternate)

    channel.basic_publish(main, "known", b"routed")
    channel.basic_publish(main, "unknown", b"unroutable")

    assert drain(channel, routed_queue, 1) == [b"routed"]
    method, _, body = get_one(channel, alternate_queue, auto_ack=True)
    assert body == b"unroutable"
    # RabbitMQ delivers it as published: the exchange is the one the client used.
    assert (method.exchange, method.routing_key) == (main, "unknown")
    assert drain(channel, alternate_queue, 0) == []


def test_alternate_exchange_routes_with_its_own_type_and_bindings(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    main, alternate = created.exchange("main"), created.exchange("alt")
    declare(channel, alternate, "topic")
    declare(channel, main, "fanout", alternate=alternate)
    orders = bound_queue(channel, created, alternate, "orders.*")

    # The fanout exchange has no queue at all: everything goes to the topic exchange,
    # which routes by the original routing key.
    channel.basic_publish(main, "orders.new", b"order")
    channel.basic_publish(main, "invoices.new", b"invoice")

    assert drain(channel, orders, 1) == [b"order"]


def test_alternate_exchanges_chain_until_one_routes(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    first, second, third = (created.exchange(n) for n in ("first", "second", "third"))
    declare(channel, third, "fanout")
    declare(channel, second, "direct", alternate=third)
    declare(channel, first, "direct", alternate=second)
    at_second = bound_queue(channel, created, second, "k2")
    at_third = bound_queue(channel, created, third)

    channel.basic_publish(first, "k2", b"second routes it")
    channel.basic_publish(first, "k3", b"third routes it")

    assert drain(channel, at_second, 1) == [b"second routes it"]
    assert drain(channel, at_third, 1) == [b"third routes it"]


def test_a_cycle_of_alternate_exchanges_ends_in_a_return(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    a, b = created.exchange("a"), created.exchange("b")
    declare(channel, a, "direct", alternate=b)
    declare(channel, b, "direct", alternate=a)

    assert publish_mandatory(channel, a, "nowhere", b"looping") == [b"looping"]
    # The channel is fine and confirms go on.
    queue = bound_queue(channel, created, b, "k")
    channel.basic_publish(a, "k", b"through b")
    assert drain(channel, queue, 1) == [b"through b"]


def test_mandatory_message_routed_by_the_alternate_exchange_is_not_returned(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    main, alternate = created.exchange("main"), created.exchange("alt")
    declare(channel, alternate, "fanout")
    declare(channel, main, "direct", alternate=alternate)
    queue = bound_queue(channel, created, alternate)

    assert publish_mandatory(channel, main, "unbound", b"kept") == []
    assert drain(channel, queue, 1) == [b"kept"]


def test_missing_alternate_exchange_means_unroutable(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    main = created.exchange("main")
    declare(channel, main, "direct", alternate=created.exchange("never-declared"))

    assert publish_mandatory(channel, main, "k", b"back") == [b"back"]


def test_internal_exchange_works_as_an_alternate_exchange(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    main, alternate = created.exchange("main"), created.exchange("alt")
    declare(channel, alternate, "fanout", internal=True)
    declare(channel, main, "direct", alternate=alternate)
    queue = bound_queue(channel, created, alternate)

    channel.basic_publish(main, "k", b"via internal")

    assert drain(channel, queue, 1) == [b"via internal"]


def test_alternate_exchange_added_after_a_delete_and_redeclare_is_used(
    connection: BlockingConnection, created: Created
) -> None:
    # An exchange's alternate cannot change by redeclaring (406); deleting and declaring
    # again with a new one takes effect for the next publish.
    channel = confirming_channel(connection)
    main, old, new = created.exchange("main"), created.exchange("old"), created.exchange("new")
    declare(channel, old, "fanout")
    declare(channel, new, "fanout")
    declare(channel, main, "direct", alternate=old)
    old_queue = bound_queue(channel, created, old)
    new_queue = bound_queue(channel, created, new)
    error = closes_channel(connection, lambda: declare(connection.channel(), main, alternate=new))
    assert error.reply_code == 406
    assert "alternate-exchange" in error.reply_text

    channel.exchange_delete(main)
    declare(channel, main, "direct", alternate=new)
    channel.basic_publish(main, "k", b"to new")

    assert drain(channel, new_queue, 1) == [b"to new"]
    assert drain(channel, old_queue, 0, settle=0.5) == []


@pytest.mark.parametrize("value", [5, True])
def test_alternate_exchange_must_be_a_string(
    connection: BlockingConnection, created: Created, value: object
) -> None:
    name = created.exchange("main")
    error = closes_channel(
        connection,
        lambda: connection.channel().exchange_declare(
            name, "direct", arguments={"alternate-exchange": value}
        ),
    )
    assert error.reply_code == 406
    kind = "signedint" if value == 5 and not isinstance(value, bool) else "bool"
    assert error.reply_text == (
        f"PRECONDITION_FAILED - invalid type '{kind}' for arg 'alternate-exchange' in "
        f"exchange '{name}' in vhost '/'"
    )


def test_publisher_confirms_ack_unroutable_messages_after_the_alternate_exchange(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    connection = connect()
    channel = confirming_channel(connection)
    main, alternate = created.exchange("main"), created.exchange("alt")
    declare(channel, alternate, "fanout")
    declare(channel, main, "direct", alternate=alternate)
    queue = bound_queue(channel, created, alternate)

    # basic_publish on a confirming channel raises unless the broker acks.
    for n in range(20):
        channel.basic_publish(main, f"key-{n}", str(n).encode())

    assert sorted(drain(channel, queue, 20), key=int) == [str(n).encode() for n in range(20)]
