"""exchange.declare / exchange.delete answer exactly as RabbitMQ 3.10 does: reply codes,
which side closes (channel or connection) and the stable part of the reply text."""

from __future__ import annotations

import time
from collections.abc import Callable

import pika
import pika.exceptions
import pytest
from pamqp import commands
from pika.adapters.blocking_connection import BlockingConnection

from tests.integration.conftest import Broker
from tests.support import amqp_fixtures
from tests.support.amqp_fixtures import Created, closes_channel, next_reply, raw_channel

# --- helpers (shared ones: tests/support/amqp_fixtures.py; fixtures: conftest.py) -----

NAME_PREFIX = "topo"  # of the names made here (the `created` fixture reads it)


def unique(kind: str) -> str:
    return amqp_fixtures.unique(kind, NAME_PREFIX)


# --- declare ------------------------------------------------------------------------


@pytest.mark.parametrize("exchange_type", ["direct", "fanout", "topic", "headers"])
def test_declare_each_type_redeclare_equivalent_and_passive(
    connection: BlockingConnection, created: Created, exchange_type: str
) -> None:
    channel = connection.channel()
    name = created.exchange(exchange_type)
    ok = channel.exchange_declare(name, exchange_type)
    assert isinstance(ok.method, pika.spec.Exchange.DeclareOk)
    assert isinstance(
        channel.exchange_declare(name, exchange_type).method, pika.spec.Exchange.DeclareOk
    )
    assert isinstance(
        channel.exchange_declare(name, passive=True).method, pika.spec.Exchange.DeclareOk
    )
    assert isinstance(channel.exchange_delete(name).method, pika.spec.Exchange.DeleteOk)
    assert channel.is_open


def test_passive_declare_of_missing_exchange_closes_the_channel_with_404(
    connection: BlockingConnection,
) -> None:
    channel = connection.channel()
    name = unique("missing")
    error = closes_channel(connection, lambda: channel.exchange_declare(name, passive=True))
    assert error.reply_code == 404
    assert error.reply_text == f"NOT_FOUND - no exchange '{name}' in vhost '/'"


def test_passive_declare_ignores_type_and_flags(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    name = created.exchange()
    channel.exchange_declare(name, "direct")
    ok = channel.exchange_declare(name, "fanout", passive=True, durable=True, auto_delete=True)
    assert isinstance(ok.method, pika.spec.Exchange.DeclareOk)


@pytest.mark.parametrize(
    ("first", "second", "arg", "received", "current"),
    [
        ({"exchange_type": "direct"}, {"exchange_type": "fanout"}, "type", "fanout", "direct"),
        ({"exchange_type": "topic"}, {"exchange_type": "headers"}, "type", "headers", "topic"),
        ({"durable": False}, {"durable": True}, "durable", "true", "false"),
        ({"durable": True}, {"durable": False}, "durable", "false", "true"),
        ({"auto_delete": False}, {"auto_delete": True}, "auto_delete", "true", "false"),
        ({"internal": False}, {"internal": True}, "internal", "true", "false"),
        # Several differences: RabbitMQ names the first of type, durable, auto_delete,
        # internal, arguments.
        (
            {"exchange_type": "direct", "durable": False},
            {"exchange_type": "fanout", "durable": True},
            "type",
            "fanout",
            "direct",
        ),
        (
            {"durable": False, "auto_delete": False, "internal": False},
            {"durable": True, "auto_delete": True, "internal": True},
            "durable",
            "true",
            "false",
        ),
        (
            {"auto_delete": False, "internal": False},
            {"auto_delete": True, "internal": True},
            "auto_delete",
            "true",
            "false",
        ),
        (
            {"arguments": {"alternate-exchange": "ae-1"}},
            {"arguments": {"alternate-exchange": "ae-2"}},
            "alternate-exchange",
            "ae-2",
            "ae-1",
        ),
    ],
    ids=[
        "type",
        "type-topic-headers",
        "durable-on",
        "durable-off",
        "auto_delete",
        "internal",
        "type-before-durable",
        "durable-before-auto_delete",
        "auto_delete-before-internal",
        "alternate-exchange",
    ],
)
def test_inequivalent_redeclare_closes_the_channel_with_406_naming_the_arg(
    connection: BlockingConnection,
    created: Created,
    first: dict[str, object],
    second: dict[str, object],
    arg: str,
    received: str,
    current: str,
) -> None:
    channel = connection.channel()
    name = created.exchange()
    channel.exchange_declare(name, **first)
    error = closes_channel(connection, lambda: channel.exchange_declare(name, **second))
    assert error.reply_code == 406
    assert error.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg '{arg}' for exchange '{name}' in vhost '/': "
        f"received '{received}' but current is '{current}'"
    )
    # The exchange is unchanged.
    check = connection.channel()
    check.exchange_declare(name, **first)


@pytest.mark.parametrize(
    ("first", "second", "detail"),
    [
        (
            {},
            {"alternate-exchange": "ae"},
            "received the value 'ae' of type 'longstr' but current is none",
        ),
        (
            {"alternate-exchange": "ae"},
            {},
            "received none but current is the value 'ae' of type 'longstr'",
        ),
    ],
    ids=["added", "removed"],
)
def test_alternate_exchange_added_or_removed_is_406(
    connection: BlockingConnection,
    created: Created,
    first: dict[str, object],
    second: dict[str, object],
    detail: str,
) -> None:
    channel = connection.channel()
    name = created.exchange()
    channel.exchange_declare(name, "direct", arguments=first)
    error = closes_channel(
        connection,
        lambda: channel.exchange_declare(name, "direct", arguments=second),
    )
    assert error.reply_code == 406
    assert error.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange '{name}' "
        f"in vhost '/': {detail}"
    )


def test_arguments_rabbitmq_does_not_compare_may_differ(
    connection: BlockingConnection, created: Created
) -> None:
    # RabbitMQ compares only the exchange arguments it knows (alternate-exchange);
    # any other x-argument may differ on redeclare.
    channel = connection.channel()
    name = created.exchange()
    channel.exchange_declare(name, "direct", arguments={"x-foo": "a"})
    ok = channel.exchange_declare(name, "direct", arguments={"x-foo": "b", "x-bar": 1})
    assert isinstance(ok.method, pika.spec.Exchange.DeclareOk)
    ok = channel.exchange_declare(name, "direct")
    assert isinstance(ok.method, pika.spec.Exchange.DeclareOk)


def test_declaring_an_amq_prefixed_exchange_is_403(connection: BlockingConnection) -> None:
    channel = connection.channel()
    name = f"amq.{unique('x')}"
    error = closes_channel(connection, lambda: channel.exchange_declare(name, "direct"))
    assert error.reply_code == 403
    assert error.reply_text == (
        f"ACCESS_REFUSED - exchange name '{name}' contains reserved prefix 'amq.*'"
    )


def test_passive_declare_of_missing_amq_prefixed_exchange_is_404_not_403(
    connection: BlockingConnection,
) -> None:
    channel = connection.channel()
    name = f"amq.{unique('x')}"
    error = closes_channel(connection, lambda: channel.exchange_declare(name, passive=True))
    assert error.reply_code == 404
    assert error.reply_text == f"NOT_FOUND - no exchange '{name}' in vhost '/'"


def test_redeclaring_amq_direct_with_its_own_parameters_is_allowed(
    connection: BlockingConnection,
) -> None:
    channel = connection.channel()
    ok = channel.exchange_declare("amq.direct", "direct", durable=True)
    assert isinstance(ok.method, pika.spec.Exchange.DeclareOk)


@pytest.mark.parametrize(
    ("params", "arg", "received", "current"),
    [
        ({"exchange_type": "direct", "durable": False}, "durable", "false", "true"),
        ({"exchange_type": "fanout", "durable": True}, "type", "fanout", "direct"),
    ],
    ids=["non-durable", "fanout"],
)
def test_redeclaring_amq_direct_differently_is_406_not_403(
    connection: BlockingConnection,
    params: dict[str, object],
    arg: str,
    received: str,
    current: str,
) -> None:
    channel = connection.channel()
    error = closes_channel(
        connection,
        lambda: channel.exchange_declare("amq.direct", **params),
    )
    assert error.reply_code == 406
    assert error.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg '{arg}' for exchange 'amq.direct' "
        f"in vhost '/': received '{received}' but current is '{current}'"
    )


def test_unknown_exchange_type_closes_the_connection_with_503(broker: Broker) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    channel = connection.channel()
    name = unique("bad-type")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        channel.exchange_declare(name, "x-nope")
    assert info.value.reply_code == 503
    assert info.value.reply_text == "COMMAND_INVALID - unknown exchange type 'x-nope'"
    assert connection.is_closed


def test_unknown_exchange_type_close_names_exchange_declare(broker: Broker) -> None:
    with raw_channel(broker) as client:
        client.send_method(
            1, commands.Exchange.Declare(exchange=unique("bad-type"), exchange_type="x-nope")
        )
        close = client.expect_connection_close()
        assert (close.reply_code, close.class_id, close.method_id) == (503, 40, 10)


@pytest.mark.parametrize(
    "operation",
    [
        lambda ch: ch.exchange_declare("", "direct", durable=True),
        lambda ch: ch.exchange_declare("", passive=True),
        lambda ch: ch.exchange_delete(""),
    ],
    ids=["declare", "passive-declare", "delete"],
)
def test_default_exchange_cannot_be_declared_or_deleted(
    connection: BlockingConnection, operation: Callable[[object], object]
) -> None:
    channel = connection.channel()
    error = closes_channel(connection, lambda: operation(channel))
    assert error.reply_code == 403
    assert error.reply_text == "ACCESS_REFUSED - operation not permitted on the default exchange"


@pytest.mark.parametrize(
    ("name", "exchange_type"),
    [
        ("amq.direct", "direct"),
        ("amq.fanout", "fanout"),
        ("amq.topic", "topic"),
        ("amq.headers", "headers"),
        ("amq.match", "headers"),
    ],
)
def test_predeclared_exchanges_exist_durable_with_their_type(
    connection: BlockingConnection, name: str, exchange_type: str
) -> None:
    channel = connection.channel()
    assert isinstance(
        channel.exchange_declare(name, passive=True).method, pika.spec.Exchange.DeclareOk
    )
    # An equivalent redeclare proves type and durability (anything else is a 406).
    ok = channel.exchange_declare(name, exchange_type, durable=True)
    assert isinstance(ok.method, pika.spec.Exchange.DeclareOk)


def test_nowait_declare_then_passive_declare(broker: Broker, created: Created) -> None:
    name = created.exchange("nowait")
    with raw_channel(broker) as client:
        client.send_method(
            1, commands.Exchange.Declare(exchange=name, exchange_type="fanout", nowait=True)
        )
        client.send_method(1, commands.Exchange.Declare(exchange=name, passive=True))
        # No declare-ok for the nowait declare: the first reply answers the passive one.
        assert isinstance(next_reply(client), commands.Exchange.DeclareOk)
        client.send_method(1, commands.Exchange.Delete(exchange=name, nowait=True))
        client.send_method(1, commands.Exchange.Declare(exchange=name, passive=True))
        close = next_reply(client)
        assert isinstance(close, commands.Channel.Close)
        assert (close.reply_code, close.class_id, close.method_id) == (404, 40, 10)


def test_nowait_inequivalent_declare_still_closes_the_channel_with_406(
    broker: Broker, created: Created
) -> None:
    name = created.exchange("nowait")
    with raw_channel(broker) as client:
        client.send_method(1, commands.Exchange.Declare(exchange=name, exchange_type="fanout"))
        assert isinstance(next_reply(client), commands.Exchange.DeclareOk)
        client.send_method(
            1, commands.Exchange.Declare(exchange=name, exchange_type="direct", nowait=True)
        )
        close = next_reply(client)
        assert isinstance(close, commands.Channel.Close)
        assert (close.reply_code, close.class_id, close.method_id) == (406, 40, 10)
        assert f"inequivalent arg 'type' for exchange '{name}'" in close.reply_text
        client.send_method(1, commands.Channel.CloseOk())
        # The connection is fine: the channel number can be reused.
        assert isinstance(client.open_channel(1), commands.Channel.OpenOk)


# --- delete -------------------------------------------------------------------------


@pytest.mark.parametrize("if_unused", [False, True])
def test_deleting_a_missing_exchange_is_delete_ok(
    connection: BlockingConnection, if_unused: bool
) -> None:
    channel = connection.channel()
    ok = channel.exchange_delete(unique("missing"), if_unused=if_unused)
    assert isinstance(ok.method, pika.spec.Exchange.DeleteOk)
    assert channel.is_open


def test_delete_removes_the_exchange(connection: BlockingConnection, created: Created) -> None:
    channel = connection.channel()
    name = created.exchange()
    channel.exchange_declare(name, "topic")
    assert isinstance(channel.exchange_delete(name).method, pika.spec.Exchange.DeleteOk)
    error = closes_channel(connection, lambda: channel.exchange_declare(name, passive=True))
    assert error.reply_code == 404


def test_delete_if_unused_while_bound_is_406_then_ok_after_unbind(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    exchange, queue = created.exchange(), created.queue()
    channel.exchange_declare(exchange, "fanout")
    channel.queue_declare(queue, exclusive=True)
    channel.queue_bind(queue, exchange)
    error = closes_channel(connection, lambda: channel.exchange_delete(exchange, if_unused=True))
    assert error.reply_code == 406
    assert error.reply_text == f"PRECONDITION_FAILED - exchange '{exchange}' in vhost '/' in use"
    channel = connection.channel()
    channel.exchange_declare(exchange, passive=True)  # still there
    channel.queue_unbind(queue, exchange)
    ok = channel.exchange_delete(exchange, if_unused=True)
    assert isinstance(ok.method, pika.spec.Exchange.DeleteOk)
    error = closes_channel(connection, lambda: channel.exchange_declare(exchange, passive=True))
    assert error.reply_code == 404


@pytest.mark.parametrize("name", ["amq.direct", "amq.fanout", "amq.topic", "amq.headers"])
def test_deleting_a_system_exchange_is_403(connection: BlockingConnection, name: str) -> None:
    channel = connection.channel()
    error = closes_channel(connection, lambda: channel.exchange_delete(name))
    assert error.reply_code == 403
    assert error.reply_text == (
        f"ACCESS_REFUSED - deletion of system exchange '{name}' in vhost '/' not allowed"
    )
    connection.channel().exchange_declare(name, passive=True)


def test_deleting_a_missing_amq_prefixed_exchange_is_403_too(
    connection: BlockingConnection,
) -> None:
    # The prefix is checked before existence (unlike passive declare, which says 404).
    channel = connection.channel()
    name = f"amq.{unique('x')}"
    error = closes_channel(connection, lambda: channel.exchange_delete(name))
    assert error.reply_code == 403
    assert error.reply_text == (
        f"ACCESS_REFUSED - deletion of system exchange '{name}' in vhost '/' not allowed"
    )


# --- publish checks (no routing involved) -------------------------------------------


def test_publishing_to_an_internal_exchange_closes_the_channel_with_403(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    name = created.exchange("internal")
    channel.exchange_declare(name, "fanout", internal=True)
    channel.confirm_delivery()
    error = closes_channel(connection, lambda: channel.basic_publish(name, "", b"m"))
    assert error.reply_code == 403
    assert error.reply_text == (
        f"ACCESS_REFUSED - cannot publish to internal exchange '{name}' in vhost '/'"
    )


def test_publishing_to_a_missing_exchange_closes_the_channel_with_404(
    connection: BlockingConnection,
) -> None:
    channel = connection.channel()
    name = unique("missing")
    channel.confirm_delivery()
    error = closes_channel(connection, lambda: channel.basic_publish(name, "k", b"m"))
    assert error.reply_code == 404
    assert error.reply_text == f"NOT_FOUND - no exchange '{name}' in vhost '/'"


# --- auto-delete --------------------------------------------------------------------


def test_auto_delete_exchange_goes_when_its_last_binding_is_removed(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    exchange, queue = created.exchange("ad"), created.queue()
    channel.exchange_declare(exchange, "direct", auto_delete=True)
    channel.queue_declare(queue, exclusive=True)
    channel.queue_bind(queue, exchange, "k1")
    channel.queue_bind(queue, exchange, "k2")
    channel.queue_unbind(queue, exchange, "k1")
    channel.exchange_declare(exchange, passive=True)  # one binding left: still there
    channel.queue_unbind(queue, exchange, "k2")
    error = closes_channel(connection, lambda: channel.exchange_declare(exchange, passive=True))
    assert error.reply_code == 404
    assert error.reply_text == f"NOT_FOUND - no exchange '{exchange}' in vhost '/'"


def test_auto_delete_exchange_goes_when_its_last_bound_queue_is_deleted(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    exchange, queue = created.exchange("ad"), created.queue()
    channel.exchange_declare(exchange, "fanout", auto_delete=True)
    channel.queue_declare(queue)
    channel.queue_bind(queue, exchange)
    channel.queue_delete(queue)
    error = closes_channel(connection, lambda: channel.exchange_declare(exchange, passive=True))
    assert error.reply_code == 404


def test_auto_delete_exchange_never_bound_stays(
    broker: Broker, connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    exchange = created.exchange("ad")
    channel.exchange_declare(exchange, "direct", auto_delete=True)
    time.sleep(1.0)
    assert isinstance(
        channel.exchange_declare(exchange, passive=True).method, pika.spec.Exchange.DeclareOk
    )
    # Closing the declaring connection does not remove it either.
    connection.close()
    other = pika.BlockingConnection(pika.URLParameters(broker.url()))
    try:
        ok = other.channel().exchange_declare(exchange, passive=True)
        assert isinstance(ok.method, pika.spec.Exchange.DeclareOk)
    finally:
        other.close()
