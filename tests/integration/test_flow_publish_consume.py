"""Message flow end to end with pika (and a raw client where frame order matters): work
queues, pub/sub, topic and headers routing, RPC, publisher confirms, mandatory returns,
basic.get counts, purge and the redelivered flag, as RabbitMQ 3.10 does them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pika
import pika.exceptions
import pytest
from pamqp import body as pamqp_body
from pamqp import commands, frame
from pamqp import header as pamqp_header
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.integration.conftest import Broker
from tests.support import amqp_fixtures
from tests.support.amqp_fixtures import (
    Created,
    Deliveries,
    back_to_back_publishes,
    confirming_channel,
    drain,
    get_one,
    pump,
    raw_channel,
)
from tests.support.raw_amqp import RawClient

# --- helpers (shared ones: tests/support/amqp_fixtures.py; fixtures: conftest.py) -----

NAME_PREFIX = "flow"  # of the names made here (the `created` fixture reads it)


def unique(kind: str) -> str:
    return amqp_fixtures.unique(kind, NAME_PREFIX)


def raw_publish(
    client: RawClient,
    exchange: str,
    routing_key: str,
    payload: bytes,
    *,
    mandatory: bool = False,
    channel: int = 1,
) -> None:
    data = frame.marshal(
        commands.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory),
        channel,
    )
    data += frame.marshal(
        pamqp_header.ContentHeader(0, len(payload), commands.Basic.Properties()), channel
    )
    if payload:
        data += frame.marshal(pamqp_body.ContentBody(payload), channel)
    client.send(data)


def raw_frames_until_quiet(client: RawClient, quiet: float = 0.3) -> list[object]:
    """Every frame the server sends until it has been silent for `quiet` seconds."""
    frames: list[object] = []
    while True:
        try:
            _, value = client.read_frame(timeout=quiet)
        except TimeoutError:
            return frames
        frames.append(value)


# --- work queue ---------------------------------------------------------------------


def test_work_queue_with_prefetch_one_shares_messages_between_two_consumers(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    total = 20
    queue = created.queue("work")
    publisher = confirming_channel(connect())
    publisher.queue_declare(queue)
    workers = [connect(), connect()]
    channels: list[BlockingChannel] = []
    received: list[list[bytes]] = [[], []]
    unacked: list[list[int]] = [[], []]
    most_unacked = [0, 0]
    for index, worker in enumerate(workers):
        channel = worker.channel()
        channel.basic_qos(prefetch_count=1)

        def on_message(
            _ch: BlockingChannel,
            method: pika.spec.Basic.Deliver,
            _props: pika.BasicProperties,
            body: bytes,
            index: int = index,
        ) -> None:
            received[index].append(body)
            unacked[index].append(method.delivery_tag)
            most_unacked[index] = max(most_unacked[index], len(unacked[index]))

        channel.basic_consume(queue, on_message)
        channels.append(channel)
    for i in range(total):
        publisher.basic_publish("", queue, f"job-{i}".encode())

    def ack_what_was_processed() -> None:
        # Acks come only after a pump round: a broker ignoring prefetch would have pushed
        # several messages to a consumer by then.
        for index, channel in enumerate(channels):
            for tag in unacked[index]:
                channel.basic_ack(tag)
            unacked[index].clear()

    pump(
        workers,
        lambda: len(received[0]) + len(received[1]) >= total,
        between=ack_what_was_processed,
    )
    everything = sorted(received[0] + received[1])
    assert everything == sorted(f"job-{i}".encode() for i in range(total))
    assert len(received[0]) > 0 and len(received[1]) > 0, received
    assert most_unacked == [1, 1]
    assert publisher.queue_declare(queue, passive=True).method.message_count == 0


def test_two_idle_consumers_of_prefetch_10_take_a_burst_of_10_in_turns(
    broker: Broker, connect: Callable[[], BlockingConnection], created: Created
) -> None:
    """A queue's messages go to its consumers in turn: a burst of ten published in one write
    to two idle consumers of prefetch 10 goes five to each, so both work at once. (Pulsar
    gives a consumer up to `dispatcherMaxRoundRobinBatchSize` entries a turn, 20 by
    default: the burst went ten and none about one time in three.)"""
    queue = created.queue("turns")
    workers = [connect(), connect()]
    channels = [worker.channel() for worker in workers]
    channels[0].queue_declare(queue)
    received = [Deliveries(), Deliveries()]
    for channel, deliveries in zip(channels, received, strict=True):
        channel.basic_qos(prefetch_count=10)
        channel.basic_consume(queue, deliveries)
    # A first message, taken and acknowledged, so that the burst is not the queue's first
    # publish (which makes its default-exchange subscription on the proxy, docs/design.md).
    channels[0].basic_publish("", queue, b"first")
    pump(workers, lambda: sum(map(len, received)) == 1)
    for channel, deliveries in zip(channels, received, strict=True):
        for tag in deliveries.tags:
            channel.basic_ack(tag)
        deliveries.items.clear()
    pump(workers, lambda: False, timeout=0.0)
    with raw_channel(broker) as client:
        client.send(back_to_back_publishes(queue, 10))
    pump(workers, lambda: sum(map(len, received)) == 10, settle=0.5)
    assert sorted(len(deliveries) for deliveries in received) == [5, 5]
    bodies = sorted(body for deliveries in received for body in deliveries.bodies)
    assert bodies == sorted(f"m{i}".encode() for i in range(10))


def test_four_workers_of_prefetch_10_each_take_a_fair_share_of_a_stream_of_jobs(
    broker: Broker, connect: Callable[[], BlockingConnection], created: Created
) -> None:
    """Celery's shape: four workers of prefetch 10 on one queue, each acknowledging every
    job as it takes it, and jobs published in bursts of 40: every worker gets at least
    half of the mean, and every job comes once."""
    total, burst = 400, 40
    queue = created.queue("jobs")
    workers = [connect() for _ in range(4)]
    channels = [worker.channel() for worker in workers]
    channels[0].queue_declare(queue)
    received = [Deliveries() for _ in workers]
    for channel, deliveries in zip(channels, received, strict=True):
        channel.basic_qos(prefetch_count=10)
        channel.basic_consume(queue, deliveries)
    acked = [0] * len(workers)

    def ack_what_came() -> None:
        for index, (channel, deliveries) in enumerate(zip(channels, received, strict=True)):
            for tag in deliveries.tags[acked[index] :]:
                channel.basic_ack(tag)
            acked[index] = len(deliveries)

    jobs = back_to_back_publishes(queue, total)  # bodies m0 ... m399
    step = len(jobs) * burst // total  # about 40 jobs a write
    with raw_channel(broker) as client:
        for start in range(0, len(jobs), step):
            client.send(jobs[start : start + step])
            pump(workers, lambda: False, timeout=0.0, settle=0.05, between=ack_what_came)
        pump(workers, lambda: sum(map(len, received)) >= total, between=ack_what_came)
    shares = [len(deliveries) for deliveries in received]
    bodies = sorted(body for deliveries in received for body in deliveries.bodies)
    assert bodies == sorted(f"m{i}".encode() for i in range(total)), shares
    assert min(shares) >= total / len(workers) / 2, shares


# --- pub/sub and routing ------------------------------------------------------------


def test_fanout_delivers_every_message_to_each_of_three_queues(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    exchange = created.exchange("fanout")
    channel.exchange_declare(exchange, "fanout")
    queues = [created.queue() for _ in range(3)]
    for queue in queues:
        channel.queue_declare(queue, exclusive=True)
        channel.queue_bind(queue, exchange)
    bodies = [f"news-{i}".encode() for i in range(10)]
    for body in bodies:
        channel.basic_publish(exchange, "ignored", body)
    for queue in queues:
        assert drain(channel, queue, len(bodies)) == bodies


def test_fanout_pub_sub_with_consumers(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    publisher = confirming_channel(connect())
    exchange = created.exchange("fanout")
    publisher.exchange_declare(exchange, "fanout")
    subscribers = [connect() for _ in range(3)]
    received: list[list[bytes]] = [[], [], []]
    for index, subscriber in enumerate(subscribers):
        channel = subscriber.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(queue, exchange)
        channel.basic_consume(
            queue,
            lambda _c, _m, _p, body, index=index: received[index].append(body),
            auto_ack=True,
        )
    bodies = [f"event-{i}".encode() for i in range(10)]
    for body in bodies:
        publisher.basic_publish(exchange, "", body)
    pump(subscribers, lambda: all(len(r) >= len(bodies) for r in received))
    assert received == [bodies, bodies, bodies]


TOPIC_KEYS = [
    "stock.usd.nyse",
    "stock.eur.nyse",
    "stock.usd",
    "stock",
    "bond.usd.lse",
    "stock.usd.nyse.extra",
]
TOPIC_ROUTES = {
    "stock.*.nyse": ["stock.usd.nyse", "stock.eur.nyse"],
    "stock.#": ["stock.usd.nyse", "stock.eur.nyse", "stock.usd", "stock", "stock.usd.nyse.extra"],
    "*.usd.*": ["stock.usd.nyse", "bond.usd.lse"],
    "*.*": ["stock.usd"],
    "#.nyse": ["stock.usd.nyse", "stock.eur.nyse"],
    "#": TOPIC_KEYS,
    "*": ["stock"],
    "bond.#.lse": ["bond.usd.lse"],
}


def test_topic_routing_with_star_and_hash(connection: BlockingConnection, created: Created) -> None:
    channel = confirming_channel(connection)
    exchange = created.exchange("topic")
    channel.exchange_declare(exchange, "topic")
    queues: dict[str, str] = {}
    for pattern in TOPIC_ROUTES:
        queues[pattern] = created.queue()
        channel.queue_declare(queues[pattern], exclusive=True)
        channel.queue_bind(queues[pattern], exchange, pattern)
    for key in TOPIC_KEYS:
        channel.basic_publish(exchange, key, key.encode())
    routed = {
        pattern: sorted(drain(channel, queue, len(TOPIC_ROUTES[pattern]), settle=0.1))
        for pattern, queue in queues.items()
    }
    assert routed == {
        pattern: sorted(key.encode() for key in keys) for pattern, keys in TOPIC_ROUTES.items()
    }


def test_headers_routing_all_and_any(connection: BlockingConnection, created: Created) -> None:
    channel = confirming_channel(connection)
    exchange = created.exchange("headers")
    channel.exchange_declare(exchange, "headers")
    match_all, match_any = created.queue("all"), created.queue("any")
    channel.queue_declare(match_all, exclusive=True)
    channel.queue_declare(match_any, exclusive=True)
    channel.queue_bind(
        match_all, exchange, arguments={"x-match": "all", "format": "pdf", "type": "report"}
    )
    channel.queue_bind(
        match_any, exchange, arguments={"x-match": "any", "format": "pdf", "type": "log"}
    )
    messages: list[tuple[bytes, dict[str, object] | None]] = [
        (b"pdf-report", {"format": "pdf", "type": "report"}),
        (b"pdf-log", {"format": "pdf", "type": "log"}),
        (b"zip-log", {"format": "zip", "type": "log"}),
        (b"zip-report", {"format": "zip", "type": "report"}),
        (b"pdf-report-extra", {"format": "pdf", "type": "report", "extra": 1}),
        (b"empty", {}),
        (b"no-headers", None),
    ]
    for payload, values in messages:
        channel.basic_publish(exchange, "ignored", payload, pika.BasicProperties(headers=values))
    assert sorted(drain(channel, match_all, 2)) == sorted([b"pdf-report", b"pdf-report-extra"])
    assert sorted(drain(channel, match_any, 4)) == sorted(
        [b"pdf-report", b"pdf-log", b"zip-log", b"pdf-report-extra"]
    )


# --- RPC ----------------------------------------------------------------------------


def test_rpc_replies_reach_the_caller_matched_by_correlation_id(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    server_connection, client_connection = connect(), connect()
    request_queue = created.queue("rpc")
    server = server_connection.channel()
    server.queue_declare(request_queue, exclusive=True)
    server.basic_qos(prefetch_count=1)
    served: list[str] = []

    def on_request(
        ch: BlockingChannel,
        method: pika.spec.Basic.Deliver,
        props: pika.BasicProperties,
        body: bytes,
    ) -> None:
        served.append(props.correlation_id)
        ch.basic_publish(
            "",
            props.reply_to,
            b"answer:" + body,
            pika.BasicProperties(correlation_id=props.correlation_id),
        )
        ch.basic_ack(method.delivery_tag)

    server.basic_consume(request_queue, on_request)

    client = client_connection.channel()
    client.confirm_delivery()
    reply_queue = client.queue_declare("", exclusive=True).method.queue
    answers: list[tuple[str, bytes]] = []
    client.basic_consume(
        reply_queue,
        lambda _c, _m, props, body: answers.append((props.correlation_id, body)),
        auto_ack=True,
    )
    expected: list[tuple[str, bytes]] = []
    for i in range(10):
        correlation_id = uuid.uuid4().hex
        request = f"question-{i}".encode()
        expected.append((correlation_id, b"answer:" + request))
        client.basic_publish(
            "",
            request_queue,
            request,
            pika.BasicProperties(reply_to=reply_queue, correlation_id=correlation_id),
        )
    pump([server_connection, client_connection], lambda: len(answers) >= len(expected))
    assert sorted(answers) == sorted(expected)
    assert sorted(served) == sorted(c for c, _ in expected)


# --- publisher confirms -------------------------------------------------------------


def test_confirmed_publishes_are_all_acked_and_all_stored(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue, exclusive=True)
    total = 50
    for i in range(total):
        # BlockingChannel waits for each confirm and raises on a nack.
        channel.basic_publish("", queue, f"m{i}".encode())
    assert drain(channel, queue, total) == [f"m{i}".encode() for i in range(total)]


def test_pipelined_publishes_are_each_got_exactly_once(
    connection: BlockingConnection, created: Created
) -> None:
    # Without confirms pika writes the publishes back to back, as fast clients do.
    channel = connection.channel()
    queue = created.queue()
    channel.queue_declare(queue, exclusive=True)
    bodies = [f"p{i}".encode() for i in range(20)]
    for body in bodies:
        channel.basic_publish("", queue, body)
    assert drain(channel, queue, len(bodies)) == bodies


def test_pipelined_publishes_are_each_consumed_exactly_once(
    connection: BlockingConnection, created: Created
) -> None:
    channel = connection.channel()
    queue = created.queue()
    channel.queue_declare(queue, exclusive=True)
    bodies = [f"p{i}".encode() for i in range(20)]
    for body in bodies:
        channel.basic_publish("", queue, body)
    received: list[bytes] = []
    channel.basic_consume(queue, lambda _c, _m, _p, body: received.append(body), auto_ack=True)
    pump([connection], lambda: len(received) >= len(bodies))
    assert received == bodies


def test_mandatory_unroutable_publish_with_confirms_is_returned_by_pika(
    connection: BlockingConnection,
) -> None:
    channel = confirming_channel(connection)
    with pytest.raises(pika.exceptions.UnroutableError) as info:
        channel.basic_publish("", unique("nowhere"), b"lost", mandatory=True)
    (returned,) = info.value.messages
    assert (returned.method.reply_code, returned.method.reply_text) == (312, "NO_ROUTE")
    assert returned.body == b"lost"
    # Not mandatory: silently dropped, still acked.
    channel.basic_publish("", unique("nowhere"), b"dropped")
    assert channel.is_open


@pytest.mark.parametrize("exchange_kind", ["default", "direct"])
def test_basic_return_arrives_before_the_ack_of_that_publish(
    broker: Broker, connection: BlockingConnection, created: Created, exchange_kind: str
) -> None:
    exchange = ""
    if exchange_kind == "direct":
        exchange = created.exchange()
        connection.channel().exchange_declare(exchange, "direct")
    key = unique("unroutable")
    with raw_channel(broker) as client:
        client.send_method(1, commands.Confirm.Select())
        assert isinstance(client.read_method()[1], commands.Confirm.SelectOk)
        raw_publish(client, exchange, key, b"returned-body", mandatory=True)
        frames = raw_frames_until_quiet(client)
    kinds = [type(f).__name__ for f in frames]
    assert kinds == ["Return", "ContentHeader", "ContentBody", "Ack"], frames
    returned, content_header, content_body, ack = frames
    assert isinstance(returned, commands.Basic.Return)
    assert (returned.reply_code, returned.reply_text) == (312, "NO_ROUTE")
    assert (returned.exchange, returned.routing_key) == (exchange, key)
    assert isinstance(content_header, pamqp_header.ContentHeader)
    assert content_header.body_size == len(b"returned-body")
    assert isinstance(content_body, pamqp_body.ContentBody)
    assert content_body.value == b"returned-body"
    assert isinstance(ack, commands.Basic.Ack)
    assert (ack.delivery_tag, ack.multiple) == (1, False)


def test_returns_and_acks_interleave_in_publish_order(
    broker: Broker, connection: BlockingConnection, created: Created
) -> None:
    queue = created.queue()
    connection.channel().queue_declare(queue)
    with raw_channel(broker) as client:
        client.send_method(1, commands.Confirm.Select())
        assert isinstance(client.read_method()[1], commands.Confirm.SelectOk)
        raw_publish(client, "", queue, b"routed-1", mandatory=True)
        raw_publish(client, "", unique("nowhere"), b"returned-2", mandatory=True)
        raw_publish(client, "", queue, b"routed-3", mandatory=True)
        frames = raw_frames_until_quiet(client)
    methods = [f for f in frames if isinstance(f, (commands.Basic.Return, commands.Basic.Ack))]
    # Whatever the ack grouping, tag 2 is acked after its return (acks of 1 may come first).
    acked: set[int] = set()
    returns = 0
    for method in methods:
        if isinstance(method, commands.Basic.Return):
            returns += 1
            assert 2 not in acked, frames
            continue
        newly = (
            {t for t in range(1, method.delivery_tag + 1) if t not in acked}
            if method.multiple
            else {method.delivery_tag}
        )
        assert newly and not newly & acked, frames
        acked |= newly
    assert returns == 1, frames
    assert acked == {1, 2, 3}
    assert drain(connection.channel(), queue, 2) == [b"routed-1", b"routed-3"]


def test_confirm_tags_are_numbered_one_to_n_and_each_acked_once(
    broker: Broker, connection: BlockingConnection, created: Created
) -> None:
    queue = created.queue()
    connection.channel().queue_declare(queue)
    with raw_channel(broker) as client:
        client.send_method(1, commands.Confirm.Select())
        assert isinstance(client.read_method()[1], commands.Confirm.SelectOk)
        for i in range(1, 6):
            raw_publish(client, "", queue, f"m{i}".encode())
        frames = raw_frames_until_quiet(client, quiet=0.5)
    acked: list[int] = []
    for method in frames:
        assert isinstance(method, commands.Basic.Ack), frames  # no nack, nothing else
        if method.multiple:
            newly = [t for t in range(1, method.delivery_tag + 1) if t not in acked]
            assert method.delivery_tag not in acked, frames
        else:
            newly = [method.delivery_tag]
        assert newly, frames
        acked.extend(newly)
    assert sorted(acked) == [1, 2, 3, 4, 5]
    assert len(acked) == len(set(acked)), frames
    assert drain(connection.channel(), queue, 5) == [f"m{i}".encode() for i in range(1, 6)]


# --- basic.get, purge -----------------------------------------------------------------


def test_basic_get_message_count_is_what_remains_after_it(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue, exclusive=True)
    for i in range(5):
        channel.basic_publish("", queue, f"m{i}".encode())
    seen: list[tuple[bytes, int]] = []
    deadline = time.monotonic() + 5
    while len(seen) < 5 and time.monotonic() < deadline:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.02)
            continue
        seen.append((body, method.message_count))
    assert seen == [(b"m0", 4), (b"m1", 3), (b"m2", 2), (b"m3", 1), (b"m4", 0)]
    assert channel.basic_get(queue, auto_ack=True) == (None, None, None)


@pytest.mark.parametrize("confirming", [False, True], ids=["plain", "confirming"])
def test_basic_get_right_after_basic_publish_on_the_same_channel_sees_it(
    connection: BlockingConnection, created: Created, confirming: bool
) -> None:
    # RabbitMQ handles a channel's commands in order: no get-empty, no sleep needed.
    channel = connection.channel()
    if confirming:
        channel.confirm_delivery()
    queue = created.queue()
    channel.queue_declare(queue, exclusive=True)
    empty = 0
    for i in range(30):
        channel.basic_publish("", queue, f"m{i}".encode())
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            empty += 1
        else:
            assert body == f"m{i}".encode()
    assert empty == 0


def test_basic_get_right_after_publishes_in_one_write_sees_them(
    broker: Broker, created: Created
) -> None:
    queue = created.queue()
    with raw_channel(broker) as client:
        client.send_method(1, commands.Queue.Declare(queue=queue, exclusive=True))
        assert isinstance(client.read_method()[1], commands.Queue.DeclareOk)
        client.send(
            back_to_back_publishes(queue, 3)
            + frame.marshal(commands.Basic.Get(queue=queue, no_ack=True), 1)
        )
        _, reply = client.read_method()
        assert isinstance(reply, commands.Basic.GetOk), reply
        assert reply.message_count == 2


def test_basic_get_on_an_empty_queue_answers_get_empty(
    broker: Broker, connection: BlockingConnection, created: Created
) -> None:
    queue = created.queue()
    connection.channel().queue_declare(queue)
    with raw_channel(broker) as client:
        for no_ack in (True, False):
            client.send_method(1, commands.Basic.Get(queue=queue, no_ack=no_ack))
            channel, reply = client.read_method()
            assert channel == 1
            assert isinstance(reply, commands.Basic.GetEmpty), reply
    assert connection.channel().basic_get(queue) == (None, None, None)


def test_purge_returns_the_count_and_empties_the_queue(
    connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue)
    for i in range(4):
        channel.basic_publish("", queue, f"m{i}".encode())
    assert channel.queue_purge(queue).method.message_count == 4
    assert channel.basic_get(queue, auto_ack=True) == (None, None, None)
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    assert channel.queue_purge(queue).method.message_count == 0
    channel.basic_publish("", queue, b"after")
    assert drain(channel, queue, 1) == [b"after"]


def test_purge_leaves_unacked_messages_which_come_back_on_requeue(
    broker: Broker, connection: BlockingConnection, created: Created
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue)
    for i in range(5):
        channel.basic_publish("", queue, f"m{i}".encode())
    holder = connection.channel()
    held = [get_one(holder, queue) for _ in range(2)]
    assert [body for _, _, body in held] == [b"m0", b"m1"]
    purged = channel.queue_purge(queue).method.message_count
    holder.close()  # requeues the two unacked
    if broker.is_rabbitmq:
        assert purged == 3  # ready messages only
        assert sorted(drain(channel, queue, 2)) == [b"m0", b"m1"]
        return
    # The proxy: while a get is unacked its Pulsar consumer holds one further message out of
    # purge's reach (docs/compatibility.md, "Counts"); it comes back with the other two.
    # Either way every message is purged or returned: none lost, none twice.
    assert purged in (2, 3)
    returned = drain(channel, queue, 5 - purged)
    assert {b"m0", b"m1"} <= set(returned)
    assert len(returned) == len(set(returned)) == 5 - purged


# --- redelivered flag ---------------------------------------------------------------


@pytest.mark.parametrize("how", ["reject", "nack", "channel-close"])
def test_redelivered_is_false_first_and_true_after_a_requeue(
    connection: BlockingConnection, created: Created, how: str
) -> None:
    channel = confirming_channel(connection)
    queue = created.queue()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"payload")
    first = connection.channel()
    method, _, body = get_one(first, queue)
    assert (body, method.redelivered) == (b"payload", False)
    if how == "reject":
        first.basic_reject(method.delivery_tag, requeue=True)
    elif how == "nack":
        first.basic_nack(method.delivery_tag, requeue=True)
    else:
        first.close()
    second = connection.channel()
    method, _, body = get_one(second, queue)
    assert (body, method.redelivered) == (b"payload", True)
    second.basic_ack(method.delivery_tag)
    assert drain(second, queue, 0) == []


def test_redelivered_flag_on_consumer_deliveries(
    connect: Callable[[], BlockingConnection], created: Created
) -> None:
    owner = connect()
    channel = confirming_channel(owner)
    queue = created.queue()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"a")
    channel.basic_publish("", queue, b"b")
    consumer = connect()
    consumer_channel = consumer.channel()
    deliveries: list[tuple[bytes, bool]] = []
    tags: list[int] = []

    def on_message(
        _c: BlockingChannel,
        method: pika.spec.Basic.Deliver,
        _p: pika.BasicProperties,
        body: bytes,
    ) -> None:
        deliveries.append((body, method.redelivered))
        tags.append(method.delivery_tag)

    consumer_channel.basic_consume(queue, on_message)
    pump([consumer], lambda: len(deliveries) >= 2)
    assert deliveries == [(b"a", False), (b"b", False)]
    consumer_channel.basic_reject(tags[0], requeue=True)  # "a" comes back redelivered
    pump([consumer], lambda: len(deliveries) >= 3)
    assert deliveries[2:] == [(b"a", True)]
    consumer_channel.basic_ack(0, multiple=True)
    consumer_channel.close()
    assert drain(channel, queue, 0) == []
