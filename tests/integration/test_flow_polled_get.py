"""Clients that poll with basic.get, as scripts and job runners do: a message in the queue is
returned by the next get, as RabbitMQ 3.10 returns it, whatever else the polling channel got
from, rejected or dead-lettered before, and while getters and consumers on another proxy
work the same queue. Runs against RabbitMQ too (STARLIGHT_TEST_AMQP_URL): there both ends
are the one broker. How a get reads Pulsar is in docs/mapping.md ("basic.get").

The bounds below are correctness bounds (a message must come at all), not timings: the
latency of polled gets is measured by ``python -m starlight_py.bench.polled_get``.
"""

from __future__ import annotations

import threading
import time

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.integration.conftest import Broker
from tests.support.amqp_fixtures import Created, confirming_channel, get_one, wait_for_count

NAME_PREFIX = "polled"
POLL = 0.05  # s between the gets of item 1's poller
FAST_POLL = 0.01  # s a poller sleeps after an empty get
ARRIVAL = 5.0  # s: a message in the queue is got by polling within this (not a speed bound)
MESSAGES = 60
PUBLISH_GAP = 0.05  # s between publishes


@pytest.fixture
def other_url(request: pytest.FixtureRequest, broker: Broker) -> str:
    """An AMQP URL of a second proxy of the same cluster (RabbitMQ: the same broker)."""
    if broker.is_rabbitmq:
        return broker.url()
    start_proxy = request.getfixturevalue("start_proxy")
    return str(start_proxy().amqp_url())


def open_channel(url: str) -> tuple[BlockingConnection, BlockingChannel]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    return connection, connection.channel()


def declare_ttl_pair(channel: BlockingChannel, created: Created) -> tuple[str, str]:
    """(src, dlq): src with a 1 s TTL dead-lettering to dlq through the default exchange."""
    dlq = created.queue("dlq")
    channel.queue_declare(dlq)
    src = created.queue("src")
    channel.queue_declare(
        src,
        arguments={
            "x-message-ttl": 1000,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dlq,
        },
    )
    return src, dlq


def poll_bodies(
    channel: BlockingChannel, queue: str, wanted: set[bytes], every: float
) -> dict[bytes, str]:
    """Poll `queue` with auto-ack gets every `every` s until every body in `wanted` came or
    ARRIVAL passed since the last one came; returns body -> x-death reason of the first
    death (or "")."""
    got: dict[bytes, str] = {}
    deadline = time.monotonic() + ARRIVAL
    while not wanted <= got.keys() and time.monotonic() < deadline:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            channel.connection.sleep(every)
            continue
        got[body] = str((properties.headers or {}).get("x-first-death-reason", ""))
        deadline = time.monotonic() + ARRIVAL
    return got


def reject_one_then_publish_two(channel: BlockingChannel, src: str) -> None:
    """The user's steps on one channel: get one message of src and reject it without
    requeue (dead-lettered), then publish `expired` (the queue's TTL) and `short` (an
    expiration of its own, shorter, but behind `expired`)."""
    channel.basic_publish("", src, b"first")
    method, _, _ = get_one(channel, src)
    channel.basic_reject(method.delivery_tag, requeue=False)
    channel.basic_publish("", src, b"expired")
    channel.basic_publish("", src, b"short", pika.BasicProperties(expiration="200"))


def test_a_poller_gets_dead_letters_after_rejecting_on_the_same_channel(
    connection: BlockingConnection, created: Created
) -> None:
    """Issue: the getter of src, kept open by the channel's polling of dlq, had taken
    `expired` out of src's reach, and the dead letter never came."""
    channel = confirming_channel(connection)
    src, dlq = declare_ttl_pair(channel, created)
    reject_one_then_publish_two(channel, src)
    got = poll_bodies(channel, dlq, {b"first", b"expired", b"short"}, POLL)
    assert got == {b"first": "rejected", b"expired": "expired", b"short": "expired"}
    # The proxy that reaps src may be another one, whose counts reach this one ~250 ms later.
    assert wait_for_count(channel, src, 0) == 0


def test_pollers_on_two_proxies_get_the_dead_letters(
    connection: BlockingConnection, other_url: str, created: Created
) -> None:
    """The rejecting channel and a channel on another proxy both poll dlq: each dead
    letter is got once, by one of them."""
    channel = confirming_channel(connection)
    src, dlq = declare_ttl_pair(channel, created)
    poller_connection, poller = open_channel(other_url)
    try:
        assert poller.basic_get(dlq, auto_ack=True)[0] is None
        reject_one_then_publish_two(channel, src)
        got: list[bytes] = []
        deadline = time.monotonic() + ARRIVAL
        while len(got) < 3 and time.monotonic() < deadline:
            for polling in (channel, poller):
                method, _, body = polling.basic_get(dlq, auto_ack=True)
                if method is not None:
                    got.append(body)
                    deadline = time.monotonic() + ARRIVAL
            poller_connection.sleep(POLL)
        assert sorted(got) == [b"expired", b"first", b"short"]
    finally:
        poller_connection.close()


def publish_spaced(url: str, queue: str, count: int, done: threading.Event) -> None:
    connection, channel = open_channel(url)
    try:
        for i in range(count):
            channel.basic_publish("", queue, str(i).encode())
            connection.sleep(PUBLISH_GAP)
    finally:
        connection.close()
        done.set()


def poll_until(
    channel: BlockingChannel,
    queue: str,
    finished: threading.Event,
    got: list[int],
    stop: threading.Event | None = None,
    manual_ack: bool = False,
) -> None:
    """Poll with gets (FAST_POLL after an empty one) until `finished` is set and the queue
    stays empty for ARRIVAL, or `stop` is set."""
    quiet_since: float | None = None
    while stop is None or not stop.is_set():
        method, _, body = channel.basic_get(queue, auto_ack=not manual_ack)
        if method is not None:
            got.append(int(body))
            if manual_ack:
                channel.basic_ack(method.delivery_tag)
            quiet_since = None
            continue
        if finished.is_set():
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since > ARRIVAL:
                return
        channel.connection.sleep(FAST_POLL)


@pytest.mark.parametrize("manual_ack", [False, True], ids=["auto-ack", "manual-ack"])
def test_a_poller_gets_every_message_in_order(
    broker: Broker, other_url: str, created: Created, manual_ack: bool
) -> None:
    queue = created.queue()
    connection, channel = open_channel(broker.url())
    channel.queue_declare(queue)
    finished = threading.Event()
    publisher = threading.Thread(
        target=publish_spaced, args=(other_url, queue, MESSAGES, finished), daemon=True
    )
    publisher.start()
    got: list[int] = []
    try:
        poll_until(channel, queue, finished, got, manual_ack=manual_ack)
    finally:
        publisher.join()
        connection.close()
    assert got == list(range(MESSAGES))


def test_pollers_on_two_proxies_share_the_queue(
    broker: Broker, other_url: str, created: Created
) -> None:
    """Each message goes to one of them, each poller's in order, none held back."""
    queue = created.queue()
    connection, channel = open_channel(broker.url())
    channel.queue_declare(queue)
    other_connection, other = open_channel(other_url)
    finished = threading.Event()
    stop = threading.Event()
    theirs: list[int] = []

    def other_poller() -> None:
        poll_until(other, queue, finished, theirs, stop)

    publisher = threading.Thread(
        target=publish_spaced, args=(broker.url(), queue, MESSAGES, finished), daemon=True
    )
    polling = threading.Thread(target=other_poller, daemon=True)
    publisher.start()
    polling.start()
    ours: list[int] = []
    try:
        poll_until(channel, queue, finished, ours)
    finally:
        stop.set()
        publisher.join()
        polling.join()
        other_connection.close()
        connection.close()
    assert sorted(ours + theirs) == list(range(MESSAGES))
    assert ours == sorted(ours)
    assert theirs == sorted(theirs)


def test_a_poller_and_a_consumer_on_another_proxy_share_the_queue(
    broker: Broker, other_url: str, created: Created
) -> None:
    """A consumer (prefetch 1, manual ack) on the other proxy and a poller here: every
    message reaches one of them once; once the consumer is cancelled, the poller gets all
    the rest. (Not in order: pika requeues what reached the consumer after its cancel, and
    the proxy's requeue, a Pulsar negative ack, comes back behind later messages.)"""
    queue = created.queue()
    connection, channel = open_channel(broker.url())
    channel.queue_declare(queue)
    consumer_connection, consumer = open_channel(other_url)
    consumer.basic_qos(prefetch_count=1)
    consumed: list[int] = []

    def on_message(ch: BlockingChannel, method: object, _p: object, body: bytes) -> None:
        consumed.append(int(body))
        ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]

    tag = consumer.basic_consume(queue, on_message)
    finished = threading.Event()
    publisher = threading.Thread(
        target=publish_spaced, args=(broker.url(), queue, MESSAGES, finished), daemon=True
    )
    publisher.start()
    ours: list[int] = []
    try:
        # Half the publishes with the consumer there, the rest with the poller alone.
        deadline = time.monotonic() + MESSAGES * PUBLISH_GAP / 2
        while time.monotonic() < deadline:
            consumer_connection.process_data_events(time_limit=0.01)
            method, _, body = channel.basic_get(queue, auto_ack=True)
            if method is not None:
                ours.append(int(body))
        consumer.basic_cancel(tag)
        consumer_connection.process_data_events(time_limit=0.1)
        poll_until(channel, queue, finished, ours)
    finally:
        publisher.join()
        consumer_connection.close()
        connection.close()
    assert sorted(ours + consumed) == list(range(MESSAGES))
    assert max(ours) == MESSAGES - 1  # the poller got the tail once the consumer left


@pytest.mark.parametrize("where", ["same-connection", "other-proxy"])
def test_a_poller_hears_that_its_queue_was_deleted(
    broker: Broker, other_url: str, created: Created, where: str
) -> None:
    """A poller's repeated gets of one queue skip ZooKeeper's reads while the topology
    cache shows the queue unchanged; a delete still ends the polling with 404 NOT_FOUND:
    at once after a delete through this proxy, once the cache hears of it (milliseconds)
    after a delete through another."""
    queue = created.queue()
    connection, channel = open_channel(broker.url())
    try:
        channel.queue_declare(queue)
        for _ in range(5):
            assert channel.basic_get(queue, auto_ack=True)[0] is None
        if where == "same-connection":
            connection.channel().queue_delete(queue)
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
                channel.basic_get(queue, auto_ack=True)
            assert closed.value.reply_code == 404
            return
        deleting_connection, deleting = open_channel(other_url)
        deleting.queue_delete(queue)
        deleting_connection.close()
        deadline = time.monotonic() + ARRIVAL
        while True:
            try:
                channel.basic_get(queue, auto_ack=True)
            except pika.exceptions.ChannelClosedByBroker as e:
                assert e.reply_code == 404
                return
            assert time.monotonic() < deadline, "gets of a deleted queue went on"
            channel.connection.sleep(FAST_POLL)
    finally:
        if connection.is_open:
            connection.close()
