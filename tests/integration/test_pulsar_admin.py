"""The admin REST client against a real Pulsar: subscriptions, positions, stats, and the
names of naming.py end to end."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import TypeVar

import pulsar
import pytest

from starlight_py.backend.pulsar_admin import (
    BackendUnavailable,
    PulsarAdmin,
    PulsarAdminError,
    SubscriptionStats,
)
from starlight_py.backend.pulsar_client import PulsarBackend
from starlight_py.local import ServiceEndpoints
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import (
    TopicName,
    exchange_topic,
    new_binding_set_id,
    parse_exchange_topic,
    parse_subscription_name,
    subscription_name,
)
from starlight_py.model.positions import MessageIdRecord

NS = NamespaceName("public", "default")
T = TypeVar("T")


@pytest.fixture(scope="module")
def admin(services: ServiceEndpoints) -> PulsarAdmin:
    return PulsarAdmin(services.pulsar_web_url)


@pytest.fixture(scope="module")
def client(services: ServiceEndpoints) -> Iterator[pulsar.Client]:
    c = pulsar.Client(
        services.pulsar_service_url,
        operation_timeout_seconds=10,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
    )
    yield c
    c.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def fanout_topic(prefix: str = "fan") -> TopicName:
    return exchange_topic(NS, unique(prefix), "fanout", "")


def record(message_id: pulsar.MessageId) -> MessageIdRecord:
    return MessageIdRecord(
        message_id.ledger_id(),
        message_id.entry_id(),
        message_id.batch_index(),
        message_id.partition(),
    )


def send(client: pulsar.Client, topic: TopicName, *payloads: bytes) -> list[MessageIdRecord]:
    producer = client.create_producer(str(topic), batching_enabled=False)
    try:
        return [record(producer.send(payload)) for payload in payloads]
    finally:
        producer.close()


def eventually(read: Callable[[], T], check: Callable[[T], bool], timeout: float = 10.0) -> T:
    """Stats and cursors follow acknowledgements asynchronously: poll until `check` holds."""
    deadline = time.monotonic() + timeout
    value = read()
    while not check(value):
        assert time.monotonic() < deadline, f"still {value!r} after {timeout} s"
        time.sleep(0.05)
        value = read()
    return value


# ---- create_subscription --------------------------------------------------------------------


def test_subscription_is_created_at_the_latest_position(
    admin: PulsarAdmin, client: pulsar.Client
) -> None:
    topic = fanout_topic()
    send(client, topic, b"before")
    assert admin.create_subscription(topic, "sub")
    assert admin.subscription_stats(topic)["sub"].backlog == 0
    send(client, topic, b"after")
    assert admin.subscription_stats(topic)["sub"].backlog == 1

    consumer = client.subscribe(str(topic), "sub", consumer_type=pulsar.ConsumerType.Shared)
    try:
        assert consumer.receive(10_000).data() == b"after"
    finally:
        consumer.close()


def test_create_subscription_creates_the_topic_and_is_idempotent(admin: PulsarAdmin) -> None:
    topic = fanout_topic()
    assert admin.create_subscription(topic, "sub")
    assert admin.create_subscription(topic, "sub") is False
    assert set(admin.subscription_stats(topic)) == {"sub"}


def test_an_existing_subscription_keeps_its_cursor(
    admin: PulsarAdmin, client: pulsar.Client
) -> None:
    topic = fanout_topic()
    admin.create_subscription(topic, "sub")
    send(client, topic, b"kept")
    assert admin.create_subscription(topic, "sub") is False
    assert admin.subscription_stats(topic)["sub"].backlog == 1


def test_create_subscription_where_topics_are_not_auto_created(
    admin: PulsarAdmin, services: ServiceEndpoints
) -> None:
    namespace = NamespaceName("public", unique("noauto"))
    admin.create_namespace(namespace.tenant, namespace.namespace)
    request = urllib.request.Request(
        f"{services.pulsar_web_url}/admin/v2/namespaces/{namespace}/autoTopicCreation",
        data=json.dumps({"allowAutoTopicCreation": False}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).close()
    topic = exchange_topic(namespace, "x", "direct", "k")
    assert admin.create_subscription(topic, "sub")
    assert admin.create_subscription(topic, "sub") is False
    assert admin.last_message_id(topic) is None


def test_create_subscription_in_a_missing_namespace_is_an_error(admin: PulsarAdmin) -> None:
    topic = exchange_topic(NamespaceName("public", unique("missing")), "x", "fanout", "")
    with pytest.raises(PulsarAdminError) as raised:
        admin.create_subscription(topic, "sub")
    assert raised.value.status == 404


# ---- delete ---------------------------------------------------------------------------------


def test_delete_subscription_true_then_false(admin: PulsarAdmin) -> None:
    topic = fanout_topic()
    admin.create_subscription(topic, "sub")
    assert admin.delete_subscription(topic, "sub")
    assert admin.delete_subscription(topic, "sub") is False
    assert admin.subscription_stats(topic) == {}


def test_delete_subscription_of_a_missing_topic_or_namespace(admin: PulsarAdmin) -> None:
    assert admin.delete_subscription(fanout_topic(), "sub") is False
    missing = exchange_topic(NamespaceName("public", unique("missing")), "x", "fanout", "")
    assert admin.delete_subscription(missing, "sub") is False


def test_forced_delete_subscription_disconnects_its_consumers(
    admin: PulsarAdmin, client: pulsar.Client
) -> None:
    topic = fanout_topic()
    admin.create_subscription(topic, "sub")
    consumer = client.subscribe(str(topic), "sub", consumer_type=pulsar.ConsumerType.Shared)
    try:
        with pytest.raises(PulsarAdminError) as raised:
            admin.delete_subscription(topic, "sub", force=False)
        assert raised.value.status == 412
        assert admin.delete_subscription(topic, "sub")
    finally:
        consumer.close()


def test_delete_topic_true_then_false(admin: PulsarAdmin, client: pulsar.Client) -> None:
    topic = fanout_topic()
    admin.create_subscription(topic, "sub")
    send(client, topic, b"x")
    assert admin.delete_topic(topic)
    assert admin.delete_topic(topic) is False
    assert admin.last_message_id(topic) is None
    assert admin.subscription_stats(topic) == {}


def test_dropping_an_owned_topic_without_clients_takes_it_and_its_backlog(
    admin: PulsarAdmin, client: pulsar.Client
) -> None:
    topic = fanout_topic()
    admin.create_subscription(topic, "sub")
    send(client, topic, b"x", b"y")
    admin.drop_subscription(topic, "sub", owns_topic=True)
    assert admin.subscription_stats(topic) == {}
    assert admin.create_topic(topic)  # it was gone: made anew
    assert admin.subscription_stats(topic) == {}
    admin.drop_subscription(topic, "sub", owns_topic=True)  # missing subscription: no error


def test_dropping_an_owned_topic_a_producer_holds_takes_the_subscription_and_refuses(
    admin: PulsarAdmin, client: pulsar.Client
) -> None:
    topic = fanout_topic()
    admin.create_subscription(topic, "sub")
    admin.create_subscription(topic, "other")
    producer = client.create_producer(str(topic), batching_enabled=False)
    try:
        producer.send(b"x")
        with pytest.raises(PulsarAdminError) as raised:
            admin.drop_subscription(topic, "sub", owns_topic=True)
        assert raised.value.status == 412
        assert set(admin.subscription_stats(topic)) == {"other"}  # the topic stays
    finally:
        producer.close()
    admin.drop_subscription(topic, "sub", owns_topic=True)  # tried again: the topic goes
    assert admin.subscription_stats(topic) == {}
    assert admin.delete_topic(topic) is False


def test_dropping_a_shared_topics_subscription_leaves_the_topic(
    admin: PulsarAdmin, client: pulsar.Client
) -> None:
    topic = fanout_topic()
    admin.create_subscription(topic, "sub")
    admin.create_subscription(topic, "other")
    send(client, topic, b"x")
    admin.drop_subscription(topic, "sub", owns_topic=False)
    assert set(admin.subscription_stats(topic)) == {"other"}
    assert admin.subscription_stats(topic)["other"].backlog == 1


def test_a_forced_drop_disconnects_consumers_then_takes_the_owned_topic(
    admin: PulsarAdmin, client: pulsar.Client
) -> None:
    topic = fanout_topic()
    admin.create_subscription(topic, "sub")
    consumer = client.subscribe(str(topic), "sub", consumer_type=pulsar.ConsumerType.Shared)
    try:
        with pytest.raises(PulsarAdminError) as raised:
            admin.drop_subscription(topic, "sub", owns_topic=True)
        assert raised.value.status == 412
        admin.drop_subscription(topic, "sub", owns_topic=True, force=True)
        assert admin.subscription_stats(topic) == {}
        assert admin.delete_topic(topic) is False
    finally:
        consumer.close()


def test_create_topic_true_then_false(admin: PulsarAdmin) -> None:
    topic = fanout_topic()
    assert admin.create_topic(topic)
    assert admin.create_topic(topic) is False


# ---- stats and positions --------------------------------------------------------------------


def test_subscription_stats_count_backlog_unacked_and_consumers(
    admin: PulsarAdmin, client: pulsar.Client
) -> None:
    topic = fanout_topic()
    admin.create_subscription(topic, "sub")
    admin.create_subscription(topic, "idle")
    consumer = client.subscribe(
        str(topic), "sub", consumer_type=pulsar.ConsumerType.Shared, consumer_name="c1"
    )
    try:
        send(client, topic, b"one")
        message = consumer.receive(10_000)
        stats = eventually(lambda: admin.subscription_stats(topic), lambda s: s["sub"].unacked == 1)
        assert stats == {
            "sub": SubscriptionStats(backlog=1, unacked=1, consumer_names=("c1",)),
            "idle": SubscriptionStats(backlog=1, unacked=0, consumer_names=()),
        }
        consumer.acknowledge(message)
        stats = eventually(lambda: admin.subscription_stats(topic), lambda s: s["sub"].backlog == 0)
        assert stats["sub"] == SubscriptionStats(backlog=0, unacked=0, consumer_names=("c1",))
    finally:
        consumer.close()
    assert admin.subscription_stats(topic)["sub"].consumer_names == ()


def test_expiring_messages_of_a_caught_up_subscription_is_no_error(
    admin: PulsarAdmin, client: pulsar.Client
) -> None:
    # Pulsar answers 409 "subscription almost catch up" when there is nothing to expire; the
    # cleaner asks every pass for every queue with a TTL, and must not log it each time.
    topic = fanout_topic()
    admin.create_subscription(topic, "sub")
    admin.expire_messages(topic, "sub", 0)  # empty
    send(client, topic, b"one")
    consumer = client.subscribe(str(topic), "sub", consumer_type=pulsar.ConsumerType.Shared)
    try:
        consumer.acknowledge(consumer.receive(10_000))
        eventually(lambda: admin.subscription_stats(topic), lambda s: s["sub"].backlog == 0)
        admin.expire_messages(topic, "sub", 0)  # caught up
    finally:
        consumer.close()
    admin.expire_messages(topic, "missing", 0)


def test_subscription_stats_of_a_missing_topic_are_empty(admin: PulsarAdmin) -> None:
    assert admin.subscription_stats(fanout_topic()) == {}


def test_topic_stats_give_the_stored_size_producers_and_subscriptions(
    admin: PulsarAdmin, client: pulsar.Client
) -> None:
    topic = fanout_topic()
    assert admin.topic_stats(topic) is None
    admin.create_subscription(topic, "sub")
    producer = client.create_producer(str(topic))
    try:
        producer.send(b"x" * 1000)
        stats = eventually(
            lambda: admin.topic_stats(topic, with_bytes=True),
            lambda s: s is not None and s.storage_size > 0,
        )
        assert stats is not None
        assert stats.storage_size >= 1000
        assert stats.producers == 1
        assert stats.subscriptions["sub"].backlog == 1
        assert stats.subscriptions["sub"].backlog_bytes >= 1000
    finally:
        producer.close()


def test_last_message_id_is_none_until_a_message_is_sent(
    admin: PulsarAdmin, client: pulsar.Client
) -> None:
    topic = fanout_topic()
    assert admin.last_message_id(topic) is None  # no topic
    admin.create_topic(topic)
    assert admin.last_message_id(topic) is None  # a topic, no message
    first, second = send(client, topic, b"1", b"2")
    assert admin.last_message_id(topic) == second
    assert first < second


def test_last_message_id_survives_a_topic_unload(
    admin: PulsarAdmin, client: pulsar.Client, services: ServiceEndpoints
) -> None:
    # The unload opens a new, empty ledger; the answer must still be the last message.
    topic = fanout_topic()
    (sent,) = send(client, topic, b"1")
    request = urllib.request.Request(
        f"{services.pulsar_web_url}/admin/v2/{topic.rest_path}/unload", method="PUT"
    )
    urllib.request.urlopen(request, timeout=10).close()
    assert admin.last_message_id(topic) == sent


def test_cursor_position_follows_acknowledgements(
    admin: PulsarAdmin, client: pulsar.Client
) -> None:
    topic = fanout_topic()
    assert admin.cursor_position(topic, "sub") is None  # no topic
    admin.create_subscription(topic, "sub")
    assert admin.cursor_position(topic, "other") is None  # no such subscription
    start = admin.cursor_position(topic, "sub")
    assert start is not None
    ids = send(client, topic, b"0", b"1", b"2")
    assert start < ids[0]

    consumer = client.subscribe(
        str(topic), "sub", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10
    )
    try:
        messages = [consumer.receive(10_000) for _ in ids]
        consumer.acknowledge(messages[0])
        assert eventually(lambda: admin.cursor_position(topic, "sub"), lambda p: p == ids[0])
        # Acknowledged out of order: the mark-delete position waits for messages[1].
        consumer.acknowledge(messages[2])
        time.sleep(0.5)
        assert admin.cursor_position(topic, "sub") == ids[0]
        consumer.acknowledge(messages[1])
        position = eventually(
            lambda: admin.cursor_position(topic, "sub"), lambda p: p is not None and p >= ids[2]
        )
        assert position == ids[2]
    finally:
        consumer.close()


def test_message_id_records_order_like_pulsar(client: pulsar.Client) -> None:
    assert MessageIdRecord(1, 5) < MessageIdRecord(2, 0)
    assert MessageIdRecord(2, -1) < MessageIdRecord(2, 0)
    assert MessageIdRecord(2, 0, 0) < MessageIdRecord(2, 0, 1)
    assert MessageIdRecord(2, 0) < MessageIdRecord(2, 0, 0)  # not batched sorts first
    assert MessageIdRecord(3, 4, partition=0) <= MessageIdRecord(3, 4, partition=1)
    assert MessageIdRecord(3, 4, partition=0) != MessageIdRecord(3, 4, partition=1)
    assert max(MessageIdRecord(1, 9), MessageIdRecord(2, 0), MessageIdRecord(1, 10)) == (
        MessageIdRecord(2, 0)
    )
    assert MessageIdRecord.parse_position("7:-1") == MessageIdRecord(7, -1)
    with pytest.raises(ValueError):
        MessageIdRecord.parse_position("7")
    # The same order as the Pulsar client's own MessageId.
    ids = [
        pulsar.MessageId(partition, ledger, entry, batch)
        for partition in (-1,)
        for ledger in (1, 2)
        for entry in (-1, 0, 1)
        for batch in (-1, 0, 1)
    ]
    assert sorted(ids, key=record) == sorted(ids)


# ---- names ----------------------------------------------------------------------------------


def test_escaped_names_work_end_to_end(admin: PulsarAdmin, client: pulsar.Client) -> None:
    exchange = unique("ex with space/and~tilde é")
    topic = exchange_topic(NS, exchange, "direct", "a-partition-1")
    subscription = subscription_name("queue ~~ 1/é", new_binding_set_id())
    assert admin.create_subscription(topic, subscription)
    (sent,) = send(client, topic, b"hello")
    assert admin.last_message_id(topic) == sent
    assert admin.subscription_stats(topic)[subscription].backlog == 1

    consumer = client.subscribe(str(topic), subscription, consumer_type=pulsar.ConsumerType.Shared)
    try:
        message = consumer.receive(10_000)
        assert message.data() == b"hello"
        # Not a partition: Pulsar reports the topic itself, not "...-partition-1".
        assert message.topic_name() == str(topic)
        assert message.message_id().partition() == -1
        local = message.topic_name().rsplit("/", 1)[1]
        assert parse_exchange_topic(local) == (exchange, "a-partition-1")
        consumer.acknowledge(message)
        assert eventually(lambda: admin.cursor_position(topic, subscription), lambda p: p == sent)
    finally:
        consumer.close()
    assert parse_subscription_name(subscription)[0] == "queue ~~ 1/é"
    assert admin.delete_subscription(topic, subscription)
    assert admin.delete_topic(topic)


def test_the_longest_amqp_names_give_valid_pulsar_names(
    admin: PulsarAdmin, client: pulsar.Client
) -> None:
    # 255 bytes (AMQP's limit), each escaped to three characters.
    namespace = NamespaceName("public", unique("long"))
    admin.create_namespace(namespace.tenant, namespace.namespace)
    topic = exchange_topic(namespace, "/" * 255, "direct", "~" * 255)
    subscription = subscription_name("/" * 255, new_binding_set_id())
    assert len(topic.local) == 1532
    assert len(subscription) == 779
    assert admin.create_subscription(topic, subscription)
    (sent,) = send(client, topic, b"long")
    assert admin.last_message_id(topic) == sent
    assert admin.subscription_stats(topic)[subscription].backlog == 1
    assert admin.delete_subscription(topic, subscription)
    assert admin.delete_topic(topic)


@pytest.mark.parametrize("exchange", [".", ".."])
def test_dot_segment_exchange_names(
    admin: PulsarAdmin, client: pulsar.Client, exchange: str
) -> None:
    # A fanout exchange named "." or ".." is a topic named so; the REST path must not be
    # normalised away by the client.
    topic = exchange_topic(NamespaceName("public", unique("dots")), exchange, "fanout", "")
    admin.create_namespace(topic.namespace.tenant, topic.namespace.namespace)
    assert admin.create_subscription(topic, "sub")
    (sent,) = send(client, topic, b"x")
    assert admin.last_message_id(topic) == sent
    assert admin.subscription_stats(topic)["sub"].backlog == 1


def test_unreachable_broker_is_backend_unavailable() -> None:
    admin = PulsarAdmin("http://127.0.0.1:9", timeout=2)
    with pytest.raises(BackendUnavailable):
        admin.create_subscription(fanout_topic(), "sub")


def test_a_redirect_to_the_owning_broker_is_followed_with_method_and_body(
    services: ServiceEndpoints, client: pulsar.Client
) -> None:
    # In a cluster, a broker answers 307 to a request for a topic another broker owns.
    target = services.pulsar_web_url.rstrip("/")
    methods: list[str] = []

    class Redirect(BaseHTTPRequestHandler):
        def redirect(self) -> None:
            methods.append(self.command)
            self.send_response(307)
            self.send_header("Location", target + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_PUT = do_DELETE = redirect

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Redirect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        admin = PulsarAdmin(f"http://127.0.0.1:{server.server_port}")
        topic = fanout_topic("redirected")
        send(client, topic, b"before")
        assert admin.create_subscription(topic, "sub")
        assert admin.subscription_stats(topic)["sub"].backlog == 0
        assert admin.delete_subscription(topic, "sub")
        assert admin.delete_subscription(topic, "sub") is False
        assert methods == ["PUT", "GET", "DELETE", "DELETE"]
    finally:
        server.shutdown()
        server.server_close()


def test_a_consumer_handle_closes_once_however_often_it_is_closed(
    admin: PulsarAdmin, services: ServiceEndpoints
) -> None:
    """A client's basic.cancel and a server-side cancel (queue deleted) can close the same
    Pulsar consumers on two worker threads; pulsar-client raises ValueError on the second
    close, which once closed the client's connection with 541."""
    topic = fanout_topic("close")
    subscription = subscription_name("close-q", new_binding_set_id())
    admin.create_subscription(topic, subscription)
    backend = PulsarBackend(services.pulsar_service_url)
    try:
        handle = backend.subscribe(topic, subscription, "closer", 10, None)
        threads = [threading.Thread(target=handle.close) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        handle.close()
        assert (
            eventually(
                lambda: admin.subscription_stats(topic)[subscription].consumer_names,
                lambda names: names == (),
            )
            == ()
        )
    finally:
        backend.close()
