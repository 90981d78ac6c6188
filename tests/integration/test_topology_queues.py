"""queue.declare / queue.delete / queue.purge answer exactly as RabbitMQ 3.10 does: reply
codes, which side closes, the stable part of the reply text, exclusivity."""

from __future__ import annotations

import time
from collections.abc import Callable

import pika
import pika.exceptions
import pytest
from pamqp import commands, frame
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.integration.conftest import Broker
from tests.support import amqp_fixtures
from tests.support.amqp_fixtures import (
    Created,
    closes_channel,
    get_one,
    next_reply,
    raw_channel,
)

# --- helpers (shared ones: tests/support/amqp_fixtures.py; fixtures: conftest.py) -----

NAME_PREFIX = "topo"  # of the names made here (the `created` fixture reads it)


def unique(kind: str) -> str:
    return amqp_fixtures.unique(kind, NAME_PREFIX)


def wait_until_queue_is_gone(
    connection: BlockingConnection, queue: str, timeout: float = 5.0
) -> int:
    """Passive-declare `queue` until the broker says 404; returns the last reply code.

    While the owner's connection is being torn down the queue may still exist and answer
    405 (another connection's exclusive queue): keep asking until it is gone."""
    deadline = time.monotonic() + timeout
    channel = connection.channel()
    code = 200
    while time.monotonic() < deadline:
        try:
            channel.queue_declare(queue, passive=True)
            code = 200
        except pika.exceptions.ChannelClosedByBroker as e:
            assert connection.is_open
            code = int(e.reply_code)
            if code != 405:
                return code
            channel = connection.channel()
        time.sleep(0.05)
    return code


LOCKED = "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{}' in vhost '/'"


# --- declare ------------------------------------------------------------------------


def test_declare_named_queue_returns_its_name_and_zero_counts(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    name = created.queue()
    ok = channel.queue_declare(name).method
    assert isinstance(ok, pika.spec.Queue.DeclareOk)
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 0)
    # An equivalent redeclare answers the same.
    ok = channel.queue_declare(name).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 0)


@pytest.mark.parametrize("kind", ["café", "orders{1}", "a b#*"])
def test_every_utf8_name_rabbitmq_accepts_works(
    connection: BlockingConnection, created: Created, kind: str
) -> None:
    channel = connection.channel()
    channel.confirm_delivery()
    queue, exchange = created.queue(kind), created.exchange(kind)
    ok = channel.queue_declare(queue).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (queue, 0, 0)
    channel.exchange_declare(exchange, "direct")
    channel.queue_bind(queue, exchange, routing_key=kind)
    channel.basic_publish(exchange, kind, b"named")
    method, _, body = get_one(channel, queue, auto_ack=True)
    assert (method.exchange, method.routing_key, body) == (exchange, kind, b"named")
    # basic.return names the exchange too.
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish(exchange, "nowhere", b"lost", mandatory=True)
    assert channel.queue_delete(queue).method.message_count == 0


def test_server_named_queue_gets_a_fresh_amq_gen_name(connection: BlockingConnection) -> None:
    channel = connection.channel()
    first = channel.queue_declare("", exclusive=True).method
    second = channel.queue_declare("", exclusive=True).method
    assert first.queue.startswith("amq.gen-") and second.queue.startswith("amq.gen-")
    assert first.queue != second.queue
    assert (first.message_count, first.consumer_count) == (0, 0)
    ok = channel.queue_declare(first.queue, passive=True).method
    assert ok.queue == first.queue


def test_redeclaring_a_server_named_queue_by_name_is_403(connection: BlockingConnection) -> None:
    # Surprising but true: the reserved-prefix check applies to every non-passive declare,
    # even of a queue that exists (only passive declares can name amq.gen-* queues).
    channel = connection.channel()
    name = channel.queue_declare("", exclusive=True).method.queue
    error = closes_channel(connection, lambda: channel.queue_declare(name, exclusive=True))
    assert error.reply_code == 403
    assert error.reply_text == (
        f"ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.*'"
    )


def test_passive_declare_of_existing_queue_returns_its_counts(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    name = created.queue()
    channel.queue_declare(name)
    ok = channel.queue_declare(name, passive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 0)
    consumer_channel = connection.channel()
    consumer_channel.basic_consume(name, lambda *_: None)
    ok = channel.queue_declare(name, passive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 1)


def test_passive_declare_of_missing_queue_closes_the_channel_with_404(
    connection: BlockingConnection,
) -> None:
    channel = connection.channel()
    name = unique("missing")
    error = closes_channel(connection, lambda: channel.queue_declare(name, passive=True))
    assert error.reply_code == 404
    assert error.reply_text == f"NOT_FOUND - no queue '{name}' in vhost '/'"


def test_passive_declare_ignores_flags_and_arguments(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    name = created.queue()
    channel.queue_declare(name)
    ok = channel.queue_declare(
        name, passive=True, durable=True, auto_delete=True, arguments={"x-message-ttl": 5}
    ).method
    assert ok.queue == name


@pytest.mark.parametrize(
    ("first", "second", "arg", "received", "current"),
    [
        ({"durable": False}, {"durable": True}, "durable", "true", "false"),
        ({"durable": True}, {"durable": False}, "durable", "false", "true"),
        ({"auto_delete": False}, {"auto_delete": True}, "auto_delete", "true", "false"),
        ({"auto_delete": True}, {"auto_delete": False}, "auto_delete", "false", "true"),
        (
            {"durable": False, "auto_delete": False},
            {"durable": True, "auto_delete": True},
            "durable",
            "true",
            "false",
        ),
        (
            {"arguments": {"x-message-ttl": 1000}},
            {"arguments": {"x-message-ttl": 2000}},
            "x-message-ttl",
            "2000",
            "1000",
        ),
        (
            {"arguments": {"x-expires": 100000}},
            {"arguments": {"x-expires": 200000}},
            "x-expires",
            "200000",
            "100000",
        ),
        (
            {"arguments": {"x-max-length": 10}},
            {"arguments": {"x-max-length": 20}},
            "x-max-length",
            "20",
            "10",
        ),
        (
            {"arguments": {"x-max-priority": 5}},
            {"arguments": {"x-max-priority": 6}},
            "x-max-priority",
            "6",
            "5",
        ),
        (
            {"arguments": {"x-dead-letter-exchange": "dlx-a"}},
            {"arguments": {"x-dead-letter-exchange": "dlx-b"}},
            "x-dead-letter-exchange",
            "dlx-b",
            "dlx-a",
        ),
        # Flags are compared before arguments.
        (
            {"auto_delete": False, "arguments": {"x-message-ttl": 1000}},
            {"auto_delete": True, "arguments": {"x-message-ttl": 2000}},
            "auto_delete",
            "true",
            "false",
        ),
    ],
    ids=[
        "durable-on",
        "durable-off",
        "auto_delete-on",
        "auto_delete-off",
        "durable-before-auto_delete",
        "x-message-ttl",
        "x-expires",
        "x-max-length",
        "x-max-priority",
        "x-dead-letter-exchange",
        "flags-before-arguments",
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
    name = created.queue()
    channel.queue_declare(name, **first)
    error = closes_channel(connection, lambda: channel.queue_declare(name, **second))
    assert error.reply_code == 406
    assert error.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg '{arg}' for queue '{name}' in vhost '/': "
        f"received '{received}' but current is '{current}'"
    )
    connection.channel().queue_declare(name, **first)  # unchanged


@pytest.mark.parametrize(
    ("first", "second", "detail"),
    [
        (
            {},
            {"x-message-ttl": 2000},
            "received the value '2000' of type 'signedint' but current is none",
        ),
        (
            {"x-message-ttl": 2000},
            {},
            "received none but current is the value '2000' of type 'signedint'",
        ),
    ],
    ids=["added", "removed"],
)
def test_queue_argument_added_or_removed_is_406(
    connection: BlockingConnection,
    created: Created,
    first: dict[str, object],
    second: dict[str, object],
    detail: str,
) -> None:
    channel = connection.channel()
    name = created.queue()
    channel.queue_declare(name, arguments=first)
    error = closes_channel(
        connection,
        lambda: channel.queue_declare(name, arguments=second),
    )
    assert error.reply_code == 406
    assert error.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '{name}' "
        f"in vhost '/': {detail}"
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"exclusive": False}, {"exclusive": True}),
        ({"exclusive": True}, {"exclusive": False}),
        # exclusive is checked before durable.
        ({"exclusive": False, "durable": False}, {"exclusive": True, "durable": True}),
    ],
    ids=["exclusive-on", "exclusive-off", "exclusive-before-durable"],
)
def test_redeclare_with_other_exclusive_flag_is_405_not_406(
    connection: BlockingConnection,
    created: Created,
    first: dict[str, bool],
    second: dict[str, bool],
) -> None:
    # RabbitMQ answers a differing `exclusive` with RESOURCE_LOCKED, even on the very
    # connection that declared the queue.
    channel = connection.channel()
    name = created.queue()
    channel.queue_declare(name, **first)
    error = closes_channel(connection, lambda: channel.queue_declare(name, **second))
    assert error.reply_code == 405
    assert error.reply_text.startswith(LOCKED.format(name))


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"x-foo": "a"}, {"x-foo": "b"}),
        ({"x-foo": "a"}, {}),
        ({}, {"x-queue-type": "classic"}),
    ],
    ids=["x-foo-differs", "x-foo-dropped", "x-queue-type-classic-is-the-default"],
)
def test_arguments_rabbitmq_does_not_compare_may_differ(
    connection: BlockingConnection,
    created: Created,
    first: dict[str, object],
    second: dict[str, object],
) -> None:
    channel = connection.channel()
    name = created.queue()
    channel.queue_declare(name, arguments=first)
    ok = channel.queue_declare(name, arguments=second).method
    assert (ok.queue, ok.message_count) == (name, 0)


@pytest.mark.parametrize(
    ("arguments", "detail"),
    [
        (
            {"x-message-ttl": "abc"},
            "invalid arg 'x-message-ttl' for queue '{}' in vhost '/': "
            '"expected integer, got longstr"',
        ),
        (
            {"x-message-ttl": -1},
            "invalid arg 'x-message-ttl' for queue '{}' in vhost '/': {{value_negative,-1}}",
        ),
        ({"x-expires": 0}, "invalid arg 'x-expires' for queue '{}' in vhost '/': {{value_zero,0}}"),
        (
            {"x-expires": -1},
            "invalid arg 'x-expires' for queue '{}' in vhost '/': {{value_negative,-1}}",
        ),
        (
            {"x-max-length": -1},
            "invalid arg 'x-max-length' for queue '{}' in vhost '/': {{value_negative,-1}}",
        ),
        (
            {"x-max-length-bytes": -1},
            "invalid arg 'x-max-length-bytes' for queue '{}' in vhost '/': {{value_negative,-1}}",
        ),
        (
            {"x-max-priority": 300},
            "invalid arg 'x-max-priority' for queue '{}' in vhost '/': {{max_value_exceeded,300}}",
        ),
        (
            {"x-max-priority": 256},
            "invalid arg 'x-max-priority' for queue '{}' in vhost '/': {{max_value_exceeded,256}}",
        ),
        (
            {"x-max-priority": -1},
            "invalid arg 'x-max-priority' for queue '{}' in vhost '/': {{value_negative,-1}}",
        ),
        (
            {"x-dead-letter-routing-key": "k"},
            "invalid arg 'x-dead-letter-routing-key' for queue '{}' in vhost '/': "
            "routing_key_but_no_dlx_defined",
        ),
        (
            {"x-dead-letter-exchange": 5},
            "invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue '{}' in vhost '/'",
        ),
        (
            {"x-overflow": "bogus"},
            "invalid arg 'x-overflow' for queue '{}' in vhost '/': invalid_overflow",
        ),
    ],
    ids=[
        "ttl-string",
        "ttl-negative",
        "expires-zero",
        "expires-negative",
        "max-length-negative",
        "max-length-bytes-negative",
        "max-priority-300",
        "max-priority-256",
        "max-priority-negative",
        "dlrk-without-dlx",
        "dlx-not-a-string",
        "overflow-bogus",
    ],
)
def test_invalid_queue_argument_closes_the_channel_with_406(
    connection: BlockingConnection,
    created: Created,
    arguments: dict[str, object],
    detail: str,
) -> None:
    channel = connection.channel()
    name = created.queue()
    error = closes_channel(
        connection,
        lambda: channel.queue_declare(name, arguments=arguments),
    )
    assert error.reply_code == 406
    assert error.reply_text == "PRECONDITION_FAILED - " + detail.format(name)
    # Nothing was created.
    error = closes_channel(
        connection, lambda: connection.channel().queue_declare(name, passive=True)
    )
    assert error.reply_code == 404


def test_max_priority_255_is_the_largest_accepted(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    name = created.queue()
    ok = channel.queue_declare(name, arguments={"x-max-priority": 255}).method
    assert ok.queue == name


def test_declaring_an_amq_prefixed_queue_is_403(connection: BlockingConnection) -> None:
    channel = connection.channel()
    name = f"amq.{unique('q')}"
    error = closes_channel(connection, lambda: channel.queue_declare(name))
    assert error.reply_code == 403
    assert error.reply_text == (
        f"ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.*'"
    )


def test_passive_declare_of_missing_amq_prefixed_queue_is_404(
    connection: BlockingConnection,
) -> None:
    channel = connection.channel()
    name = f"amq.{unique('q')}"
    error = closes_channel(connection, lambda: channel.queue_declare(name, passive=True))
    assert error.reply_code == 404
    assert error.reply_text == f"NOT_FOUND - no queue '{name}' in vhost '/'"


def test_nowait_declare_then_passive_declare(broker: Broker, created: Created) -> None:
    name = created.queue("nowait")
    with raw_channel(broker) as client:
        client.send_method(1, commands.Queue.Declare(queue=name, nowait=True))
        client.send_method(1, commands.Queue.Declare(queue=name, passive=True))
        ok = next_reply(client)
        assert isinstance(ok, commands.Queue.DeclareOk)
        assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 0)
        client.send_method(1, commands.Queue.Delete(queue=name, nowait=True))
        client.send_method(1, commands.Queue.Declare(queue=name, passive=True))
        close = next_reply(client)
        assert isinstance(close, commands.Channel.Close)
        assert (close.reply_code, close.class_id, close.method_id) == (404, 50, 10)
        assert close.reply_text == f"NOT_FOUND - no queue '{name}' in vhost '/'"


def test_nowait_invalid_declare_still_closes_the_channel(broker: Broker) -> None:
    with raw_channel(broker) as client:
        name = f"amq.{unique('q')}"
        client.send_method(1, commands.Queue.Declare(queue=name, nowait=True))
        close = next_reply(client)
        assert isinstance(close, commands.Channel.Close)
        assert (close.reply_code, close.class_id, close.method_id) == (403, 50, 10)


# --- exclusive queues ---------------------------------------------------------------

OTHER_CONNECTION_OPERATIONS: dict[str, Callable[[BlockingChannel, str], object]] = {
    "passive-declare": lambda ch, q: ch.queue_declare(q, passive=True),
    "declare-exclusive": lambda ch, q: ch.queue_declare(q, exclusive=True),
    "declare-shared": lambda ch, q: ch.queue_declare(q),
    "basic-get": lambda ch, q: ch.basic_get(q),
    "basic-consume": lambda ch, q: ch.basic_consume(q, lambda *_: None),
    "delete": lambda ch, q: ch.queue_delete(q),
    "purge": lambda ch, q: ch.queue_purge(q),
    "bind": lambda ch, q: ch.queue_bind(q, "amq.fanout"),
}


@pytest.mark.parametrize("operation", list(OTHER_CONNECTION_OPERATIONS))
def test_exclusive_queue_is_locked_for_other_connections(
    broker: Broker, connection: BlockingConnection, created: Created, operation: str
) -> None:
    name = created.queue("excl")
    connection.channel().queue_declare(name, exclusive=True)
    other = pika.BlockingConnection(pika.URLParameters(broker.url()))
    try:
        channel = other.channel()
        error = closes_channel(other, lambda: OTHER_CONNECTION_OPERATIONS[operation](channel, name))
        assert error.reply_code == 405
        assert error.reply_text.startswith(LOCKED.format(name))
    finally:
        other.close()
    # The owner is unaffected.
    ok = connection.channel().queue_declare(name, passive=True).method
    assert ok.queue == name


def test_exclusive_queue_is_usable_from_another_channel_of_its_connection(
    connection: BlockingConnection, created: Created
) -> None:
    name = created.queue("excl")
    connection.channel().queue_declare(name, exclusive=True)
    channel = connection.channel()
    assert channel.queue_declare(name, passive=True).method.queue == name
    assert channel.queue_declare(name, exclusive=True).method.queue == name
    assert channel.basic_get(name) == (None, None, None)
    assert channel.queue_purge(name).method.message_count == 0


def test_exclusive_queue_goes_when_its_connection_closes(
    broker: Broker, connection: BlockingConnection, created: Created
) -> None:
    name = created.queue("excl")
    owner = pika.BlockingConnection(pika.URLParameters(broker.url()))
    owner.channel().queue_declare(name, exclusive=True)
    owner.close()
    assert wait_until_queue_is_gone(connection, name) == 404
    # The name is free again, for anyone.
    assert connection.channel().queue_declare(name, exclusive=True).method.queue == name


def test_exclusive_queue_is_gone_before_the_broker_closes_its_connection(
    broker: Broker, connection: BlockingConnection, created: Created
) -> None:
    """A connection the broker closes (here: basic.qos with a prefetch size, 540): its
    exclusive queues are deleted before connection.close is sent, so declaring one again
    right after the close works (no 405)."""
    name = created.queue("excl")
    owner = pika.BlockingConnection(pika.URLParameters(broker.url()))
    channel = owner.channel()
    channel.queue_declare(name, exclusive=True)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        channel.basic_qos(prefetch_size=1)
    assert closed.value.reply_code == 540
    again = connection.channel().queue_declare(name, exclusive=True)
    assert again.method.queue == name


def test_exclusive_queue_goes_when_its_socket_drops(
    broker: Broker, connection: BlockingConnection, created: Created
) -> None:
    name = created.queue("excl")
    with raw_channel(broker) as client:
        client.send_method(1, commands.Queue.Declare(queue=name, exclusive=True))
        assert isinstance(next_reply(client), commands.Queue.DeclareOk)
    # No connection.close: the socket just went away.
    assert wait_until_queue_is_gone(connection, name) == 404


# --- delete / purge -----------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [{}, {"if_unused": True, "if_empty": True}],
    ids=["plain", "if_unused-if_empty"],
)
def test_deleting_a_missing_queue_is_delete_ok_with_zero(
    connection: BlockingConnection, flags: dict[str, bool]
) -> None:
    channel = connection.channel()
    ok = channel.queue_delete(unique("missing"), **flags).method
    assert isinstance(ok, pika.spec.Queue.DeleteOk)
    assert ok.message_count == 0
    assert channel.is_open


def test_delete_removes_the_queue(connection: BlockingConnection, created: Created) -> None:
    channel = connection.channel()
    name = created.queue()
    channel.queue_declare(name, durable=True)
    ok = channel.queue_delete(name).method
    assert (type(ok), ok.message_count) == (pika.spec.Queue.DeleteOk, 0)
    error = closes_channel(connection, lambda: channel.queue_declare(name, passive=True))
    assert error.reply_code == 404


def test_purging_a_missing_queue_is_404(connection: BlockingConnection) -> None:
    channel = connection.channel()
    name = unique("missing")
    error = closes_channel(connection, lambda: channel.queue_purge(name))
    assert error.reply_code == 404
    assert error.reply_text == f"NOT_FOUND - no queue '{name}' in vhost '/'"


def test_purging_an_empty_queue_is_purge_ok_zero(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    name = created.queue()
    channel.queue_declare(name)
    ok = channel.queue_purge(name).method
    assert (type(ok), ok.message_count) == (pika.spec.Queue.PurgeOk, 0)


def test_delete_if_unused_with_a_consumer_is_406(
    connection: BlockingConnection, created: Created
) -> None:
    name = created.queue()
    consumer_channel = connection.channel()
    consumer_channel.queue_declare(name)
    tag = consumer_channel.basic_consume(name, lambda *_: None)
    channel = connection.channel()
    error = closes_channel(connection, lambda: channel.queue_delete(name, if_unused=True))
    assert error.reply_code == 406
    assert error.reply_text == f"PRECONDITION_FAILED - queue '{name}' in vhost '/' in use"
    consumer_channel.basic_cancel(tag)
    ok = connection.channel().queue_delete(name, if_unused=True).method
    assert isinstance(ok, pika.spec.Queue.DeleteOk)


def test_delete_if_empty_on_an_empty_queue_is_ok(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    name = created.queue()
    channel.queue_declare(name)
    ok = channel.queue_delete(name, if_empty=True).method
    assert (type(ok), ok.message_count) == (pika.spec.Queue.DeleteOk, 0)
    error = closes_channel(connection, lambda: channel.queue_declare(name, passive=True))
    assert error.reply_code == 404


def test_consumers_hear_their_queues_deleted_before_the_next_reply(
    broker: Broker, created: Created
) -> None:
    """RabbitMQ sends a consumer's basic.cancel at once when its queue is deleted: on one
    connection it comes before (or a moment after) the deleting channel's delete-ok, and
    before the answer to the client's next request. Robust clients (aio-pika) re-declare on
    the cancel; a publish right after the delete-ok must not find the consumer still there.
    The proxy cancels its own consumers of the queue before it answers the delete; it used
    to wait for its topology cache, which on a busy connection came several round trips
    late (aio-pika's test_cancel_during_recovery_wakes_next_pass, 2 of 10 runs)."""
    queues = [created.queue("a"), created.queue("b")]
    client = broker.raw()
    try:
        client.handshake(capabilities={"consumer_cancel_notify": True})
        for number in (1, 2):
            assert isinstance(client.open_channel(number), commands.Channel.OpenOk)
        for tag, queue in enumerate(queues):
            client.send_method(1, commands.Queue.Declare(queue=queue))
            assert isinstance(client.read_method()[1], commands.Queue.DeclareOk)
            client.send_method(1, commands.Basic.Consume(queue=queue, consumer_tag=f"c{tag}"))
            assert isinstance(client.read_method()[1], commands.Basic.ConsumeOk)
        # Both deletes and a qos in one write: the qos answer comes after both delete-oks.
        client.send(
            b"".join(
                frame.marshal(method, 2)
                for method in (
                    commands.Queue.Delete(queue=queues[1]),
                    commands.Queue.Delete(queue=queues[0]),
                    commands.Basic.Qos(prefetch_count=1),
                )
            )
        )
        seen: list[tuple[int, str]] = []
        while (2, "Basic.QosOk") not in seen:
            channel, method = client.read_method()
            seen.append((channel, method.name))
        assert sorted(seen) == [
            (1, "Basic.Cancel"),
            (1, "Basic.Cancel"),
            (2, "Basic.QosOk"),
            (2, "Queue.DeleteOk"),
            (2, "Queue.DeleteOk"),
        ]
        assert seen[-1] == (2, "Basic.QosOk")
    finally:
        client.close()


def test_a_consumer_of_the_deleting_channel_hears_the_cancel_after_the_delete_ok(
    broker: Broker, created: Created
) -> None:
    """RabbitMQ answers queue.delete on the deleting channel first and only then sends
    basic.cancel to that channel's own consumers of the queue (its channel process sees the
    queue go after it has replied). A client that waits for the delete-ok on a channel with
    a consumer (py-amqp, kombu's test_ack_from_another_thread) raises ConsumerCancelled if
    the cancel comes first. Consumers of other channels hear it before the delete-ok (the
    test above)."""
    queue = created.queue("own")
    client = broker.raw()
    try:
        client.handshake(capabilities={"consumer_cancel_notify": True})
        assert isinstance(client.open_channel(1), commands.Channel.OpenOk)
        client.send_method(1, commands.Queue.Declare(queue=queue))
        assert isinstance(client.read_method()[1], commands.Queue.DeclareOk)
        client.send_method(1, commands.Basic.Consume(queue=queue, consumer_tag="own"))
        assert isinstance(client.read_method()[1], commands.Basic.ConsumeOk)
        client.send_method(1, commands.Queue.Delete(queue=queue))
        seen = [client.read_method()[1].name for _ in range(2)]
        assert seen == ["Queue.DeleteOk", "Basic.Cancel"]
    finally:
        client.close()
