"""queue.bind / queue.unbind and exchange.bind / exchange.unbind answer exactly as RabbitMQ 3.10
does, shown without publishing: reply codes, which side closes, the reply text."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest
from pamqp import commands
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.integration.conftest import Broker
from tests.support import amqp_fixtures
from tests.support.amqp_fixtures import Created, closes_channel, next_reply, raw_channel

# --- helpers (shared ones: tests/support/amqp_fixtures.py; fixtures: conftest.py) -----

NAME_PREFIX = "topo"  # of the names made here (the `created` fixture reads it)


def unique(kind: str) -> str:
    return amqp_fixtures.unique(kind, NAME_PREFIX)


def declare_pair(
    channel: BlockingChannel, created: Created, exchange_type: str = "direct"
) -> tuple[str, str]:
    exchange, queue = created.exchange(exchange_type), created.queue()
    channel.exchange_declare(exchange, exchange_type)
    channel.queue_declare(queue, exclusive=True)
    return exchange, queue


# --- queue.bind ---------------------------------------------------------------------


def test_bind_to_a_missing_queue_is_404_no_queue(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    exchange, _ = declare_pair(channel, created)
    missing = unique("missing")
    error = closes_channel(connection, lambda: channel.queue_bind(missing, exchange, "k"))
    assert error.reply_code == 404
    assert error.reply_text == f"NOT_FOUND - no queue '{missing}' in vhost '/'"


def test_bind_to_a_missing_exchange_is_404_no_exchange(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    _, queue = declare_pair(channel, created)
    missing = unique("missing")
    error = closes_channel(connection, lambda: channel.queue_bind(queue, missing, "k"))
    assert error.reply_code == 404
    assert error.reply_text == f"NOT_FOUND - no exchange '{missing}' in vhost '/'"


def test_bind_with_both_missing_reports_the_exchange(connection: BlockingConnection) -> None:
    channel = connection.channel()
    queue, exchange = unique("missing-q"), unique("missing-x")
    error = closes_channel(connection, lambda: channel.queue_bind(queue, exchange, "k"))
    assert error.reply_code == 404
    assert error.reply_text == f"NOT_FOUND - no exchange '{exchange}' in vhost '/'"


@pytest.mark.parametrize("queue_exists", [True, False], ids=["queue-exists", "queue-missing"])
@pytest.mark.parametrize("method", ["bind", "unbind"])
def test_binding_to_the_default_exchange_is_403(
    connection: BlockingConnection, created: Created, method: str, queue_exists: bool
) -> None:
    channel = connection.channel()
    queue = created.queue()
    if queue_exists:
        channel.queue_declare(queue, exclusive=True)
    action = channel.queue_bind if method == "bind" else channel.queue_unbind
    error = closes_channel(connection, lambda: action(queue, "", queue))
    assert error.reply_code == 403
    assert error.reply_text == "ACCESS_REFUSED - operation not permitted on the default exchange"


def test_binding_twice_is_one_binding(connection: BlockingConnection, created: Created) -> None:
    # Proof without publishing: an auto-delete exchange goes with its last binding, so one
    # unbind after two identical binds must remove it.
    channel = connection.channel()
    exchange, queue = created.exchange("ad"), created.queue()
    channel.exchange_declare(exchange, "direct", auto_delete=True)
    channel.queue_declare(queue, exclusive=True)
    assert isinstance(channel.queue_bind(queue, exchange, "k").method, pika.spec.Queue.BindOk)
    assert isinstance(channel.queue_bind(queue, exchange, "k").method, pika.spec.Queue.BindOk)
    assert isinstance(channel.queue_unbind(queue, exchange, "k").method, pika.spec.Queue.UnbindOk)
    error = closes_channel(connection, lambda: channel.exchange_declare(exchange, passive=True))
    assert error.reply_code == 404


def test_bindings_differing_only_in_key_are_separate(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    exchange, queue = created.exchange("ad"), created.queue()
    channel.exchange_declare(exchange, "direct", auto_delete=True)
    channel.queue_declare(queue, exclusive=True)
    channel.queue_bind(queue, exchange, "k1")
    channel.queue_bind(queue, exchange, "k2")
    channel.queue_unbind(queue, exchange, "k1")
    channel.exchange_declare(exchange, passive=True)  # "k2" still binds it
    error = closes_channel(connection, lambda: channel.exchange_delete(exchange, if_unused=True))
    assert error.reply_code == 406


def test_bindings_differing_only_in_arguments_are_separate(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    exchange, queue = created.exchange("ad"), created.queue()
    channel.exchange_declare(exchange, "headers", auto_delete=True)
    channel.queue_declare(queue, exclusive=True)
    channel.queue_bind(queue, exchange, "", arguments={"x-match": "all", "a": 1})
    channel.queue_bind(queue, exchange, "", arguments={"x-match": "all", "a": 2})
    channel.queue_unbind(queue, exchange, "", arguments={"x-match": "all", "a": 1})
    channel.exchange_declare(exchange, passive=True)  # the a=2 binding still binds it
    channel.queue_unbind(queue, exchange, "", arguments={"x-match": "all", "a": 2})
    error = closes_channel(connection, lambda: channel.exchange_declare(exchange, passive=True))
    assert error.reply_code == 404


def test_bind_to_a_predeclared_exchange(connection: BlockingConnection, created: Created) -> None:
    channel = connection.channel()
    queue = created.queue()
    channel.queue_declare(queue, exclusive=True)
    for exchange in ("amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"):
        assert isinstance(channel.queue_bind(queue, exchange, "k").method, pika.spec.Queue.BindOk)
        assert isinstance(
            channel.queue_unbind(queue, exchange, "k").method, pika.spec.Queue.UnbindOk
        )


def test_bind_to_an_internal_exchange_is_allowed(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    exchange, queue = created.exchange("internal"), created.queue()
    channel.exchange_declare(exchange, "fanout", internal=True)
    channel.queue_declare(queue, exclusive=True)
    assert isinstance(channel.queue_bind(queue, exchange).method, pika.spec.Queue.BindOk)


# --- queue.unbind -------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["binding", "queue", "exchange", "both"])
def test_unbind_of_something_missing_is_unbind_ok(
    connection: BlockingConnection, created: Created, missing: str
) -> None:
    channel = connection.channel()
    exchange, queue = declare_pair(channel, created)
    if missing in ("queue", "both"):
        queue = unique("missing-q")
    if missing in ("exchange", "both"):
        exchange = unique("missing-x")
    ok = channel.queue_unbind(queue, exchange, "never-bound").method
    assert isinstance(ok, pika.spec.Queue.UnbindOk)
    assert channel.is_open


def test_unbind_on_another_connections_exclusive_queue(
    broker: Broker, connection: BlockingConnection, created: Created
) -> None:
    # RabbitMQ checks exclusivity only when the binding exists: a missing binding is
    # unbind-ok, an existing one is 405.
    channel = connection.channel()
    exchange, queue = declare_pair(channel, created, "fanout")
    channel.queue_bind(queue, exchange, "bound")
    other = pika.BlockingConnection(pika.URLParameters(broker.url()))
    try:
        other_channel = other.channel()
        ok = other_channel.queue_unbind(queue, exchange, "not-bound").method
        assert isinstance(ok, pika.spec.Queue.UnbindOk)
        error = closes_channel(other, lambda: other_channel.queue_unbind(queue, exchange, "bound"))
        assert error.reply_code == 405
        assert error.reply_text.startswith(
            f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{queue}'"
        )
    finally:
        other.close()
    # Still bound.
    error = closes_channel(connection, lambda: channel.exchange_delete(exchange, if_unused=True))
    assert error.reply_code == 406


# --- arguments and patterns ---------------------------------------------------------


@pytest.mark.parametrize(
    ("x_match", "text"),
    [
        (
            "bogus",
            'Invalid x-match field value <<"bogus">>; expected all, any, all-with-x, or any-with-x',
        ),
        (1, "Invalid x-match field type signedint (value 1); expected longstr"),
    ],
    ids=["bogus-string", "integer"],
)
def test_headers_bind_with_invalid_x_match_is_406(
    connection: BlockingConnection, created: Created, x_match: object, text: str
) -> None:
    channel = connection.channel()
    exchange, queue = declare_pair(channel, created, "headers")
    error = closes_channel(
        connection,
        lambda: channel.queue_bind(queue, exchange, "", arguments={"x-match": x_match, "a": "1"}),
    )
    assert error.reply_code == 406
    assert error.reply_text == "PRECONDITION_FAILED - " + text


@pytest.mark.parametrize("x_match", ["all", "any", "all-with-x", "any-with-x"])
def test_headers_bind_accepts_every_x_match(
    connection: BlockingConnection, created: Created, x_match: str
) -> None:
    channel = connection.channel()
    exchange, queue = declare_pair(channel, created, "headers")
    ok = channel.queue_bind(queue, exchange, "", arguments={"x-match": x_match, "a": "1"})
    assert isinstance(ok.method, pika.spec.Queue.BindOk)


def test_x_match_is_not_checked_on_other_exchange_types(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    exchange, queue = declare_pair(channel, created, "direct")
    ok = channel.queue_bind(queue, exchange, "k", arguments={"x-match": "bogus"})
    assert isinstance(ok.method, pika.spec.Queue.BindOk)


@pytest.mark.parametrize("pattern", ["#.#", "a..b", "*", "", "#", "*.*", "a.*.#", ".", "a.#.b"])
def test_topic_bind_accepts_odd_patterns(
    connection: BlockingConnection, created: Created, pattern: str
) -> None:
    channel = connection.channel()
    exchange, queue = declare_pair(channel, created, "topic")
    assert isinstance(channel.queue_bind(queue, exchange, pattern).method, pika.spec.Queue.BindOk)
    assert isinstance(
        channel.queue_unbind(queue, exchange, pattern).method, pika.spec.Queue.UnbindOk
    )


# --- nowait -------------------------------------------------------------------------


def test_nowait_bind_then_unbind(broker: Broker, created: Created) -> None:
    exchange, queue = created.exchange("nowait"), created.queue("nowait")
    with raw_channel(broker) as client:
        client.send_method(1, commands.Exchange.Declare(exchange=exchange, exchange_type="direct"))
        assert isinstance(next_reply(client), commands.Exchange.DeclareOk)
        client.send_method(1, commands.Queue.Declare(queue=queue, exclusive=True))
        assert isinstance(next_reply(client), commands.Queue.DeclareOk)
        client.send_method(
            1, commands.Queue.Bind(queue=queue, exchange=exchange, routing_key="k", nowait=True)
        )
        # The binding exists by the time the next method is handled: if_unused refuses.
        client.send_method(1, commands.Exchange.Delete(exchange=exchange, if_unused=True))
        close = next_reply(client)
        assert isinstance(close, commands.Channel.Close)
        assert (close.reply_code, close.class_id, close.method_id) == (406, 40, 20)
        assert close.reply_text == (
            f"PRECONDITION_FAILED - exchange '{exchange}' in vhost '/' in use"
        )
        client.send_method(1, commands.Channel.CloseOk())
        assert isinstance(client.open_channel(1), commands.Channel.OpenOk)
        client.send_method(
            1, commands.Queue.Unbind(queue=queue, exchange=exchange, routing_key="k")
        )
        assert isinstance(next_reply(client), commands.Queue.UnbindOk)
        client.send_method(1, commands.Exchange.Delete(exchange=exchange, if_unused=True))
        assert isinstance(next_reply(client), commands.Exchange.DeleteOk)


def test_nowait_bind_to_a_missing_queue_still_closes_the_channel(broker: Broker) -> None:
    queue = unique("missing")
    with raw_channel(broker) as client:
        client.send_method(
            1, commands.Queue.Bind(queue=queue, exchange="amq.direct", routing_key="k", nowait=True)
        )
        close = next_reply(client)
        assert isinstance(close, commands.Channel.Close)
        assert (close.reply_code, close.class_id, close.method_id) == (404, 50, 20)
        assert close.reply_text == f"NOT_FOUND - no queue '{queue}' in vhost '/'"


# Exchange-to-exchange bindings (exchange.bind / exchange.unbind); routing through them:
# test_topology_exchange_bindings.py.


def test_exchange_to_exchange_bind_and_unbind(
    broker: Broker, connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    source, destination = created.exchange("e2e-src"), created.exchange("e2e-dst")
    channel.exchange_declare(source, "fanout")
    channel.exchange_declare(destination, "fanout")
    assert isinstance(
        channel.exchange_bind(destination, source, "k").method, pika.spec.Exchange.BindOk
    )
    assert isinstance(
        channel.exchange_bind(destination, source, "k").method, pika.spec.Exchange.BindOk
    )
    # The source is in use while it has the binding.
    error = closes_channel(connection, lambda: channel.exchange_delete(source, if_unused=True))
    assert error.reply_code == 406
    channel = connection.channel()
    assert isinstance(
        channel.exchange_unbind(destination, source, "k").method, pika.spec.Exchange.UnbindOk
    )
    assert isinstance(
        channel.exchange_unbind(destination, source, "k").method, pika.spec.Exchange.UnbindOk
    )
    assert isinstance(
        channel.exchange_delete(source, if_unused=True).method, pika.spec.Exchange.DeleteOk
    )


@pytest.mark.parametrize("missing", ["source", "destination"])
def test_exchange_to_exchange_bind_with_a_missing_exchange_is_404(
    broker: Broker, connection: BlockingConnection, created: Created, missing: str
) -> None:
    channel = connection.channel()
    present = created.exchange("e2e")
    channel.exchange_declare(present, "fanout")
    absent = unique("missing")
    source, destination = (absent, present) if missing == "source" else (present, absent)
    error = closes_channel(connection, lambda: channel.exchange_bind(destination, source, "k"))
    assert error.reply_code == 404
    assert error.reply_text == f"NOT_FOUND - no exchange '{absent}' in vhost '/'"
