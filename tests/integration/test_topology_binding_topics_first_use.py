"""A binding's own topic and subscription are made by the first message it routes
(topology/binding_topics.py), counted message by message: consumers on two proxies that
started before it, first messages from two proxies at once, a dead letter, an
exchange-to-exchange publish and an alternate exchange's as first messages, and an unbind
racing the making. The tests with a `broker` run against RabbitMQ too
(STARLIGHT_TEST_AMQP_URL), so the expected figures are RabbitMQ's."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from starlight_py.backend.pulsar_admin import PulsarAdmin
from starlight_py.backend.subscription_maker import SubscriptionMaker
from starlight_py.local import ServiceEndpoints
from starlight_py.metadata.records import BindingSet, Paths, decode
from starlight_py.metadata.zookeeper import ZooKeeperClient
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import TopicName
from starlight_py.topology.binding_topics import make_binding_topic
from tests.integration.conftest import Broker, ProxyFactory
from tests.support.amqp_fixtures import Created

NAME_PREFIX = "bf"
NAMESPACE = NamespaceName("public", "default")
WAIT = 20.0  # s: generous bound for messages to arrive


@pytest.fixture
def name_prefix() -> str:
    return NAME_PREFIX


def confirming(connection: pika.BlockingConnection) -> BlockingChannel:
    channel = connection.channel()
    channel.confirm_delivery()
    return channel


def message_count(channel: BlockingChannel, queue: str, want: int) -> int:
    """The queue's message_count once it is `want` (or after WAIT s)."""
    deadline = time.monotonic() + WAIT
    count = channel.queue_declare(queue, passive=True).method.message_count
    while count != want and time.monotonic() < deadline:
        time.sleep(0.1)
        count = channel.queue_declare(queue, passive=True).method.message_count
    return int(count)


def binding_topics(admin: PulsarAdmin, exchange: str) -> list[str]:
    prefix = f"persistent://{NAMESPACE}/{naming.escape(exchange)}{naming.SEPARATOR}"
    listed = admin._request("GET", f"/admin/v2/persistent/{NAMESPACE}")
    return sorted(t for t in listed if t.startswith(prefix))


def test_consumers_on_two_proxies_started_before_the_first_message_get_each_message_once(
    start_proxy: ProxyFactory, created: Created
) -> None:
    a, b = start_proxy(), start_proxy()
    exchange, queue = created.exchange("two"), created.queue("two")
    total = 300
    got: Counter[bytes] = Counter()
    lock = threading.Lock()
    stop = threading.Event()
    ready = threading.Barrier(3)

    def consume(url: str) -> None:
        with pika.BlockingConnection(pika.URLParameters(url)) as connection:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=10)

            def on_message(ch: BlockingChannel, method: object, _: object, body: bytes) -> None:
                with lock:
                    got[body] += 1
                ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]

            channel.basic_consume(queue, on_message)
            ready.wait(WAIT)
            while not stop.is_set():
                connection.process_data_events(0.1)

    with pika.BlockingConnection(pika.URLParameters(b.amqp_url())) as connection:
        channel = connection.channel()
        channel.exchange_declare(exchange, "topic")
        channel.queue_declare(queue)
        channel.queue_bind(queue, exchange, "two.#")
    consumers = [threading.Thread(target=consume, args=(p.amqp_url(),)) for p in (a, b)]
    for thread in consumers:
        thread.start()
    try:
        ready.wait(WAIT)  # both consuming, the binding's topic not made yet
        with pika.BlockingConnection(pika.URLParameters(a.amqp_url())) as connection:
            channel = confirming(connection)
            for n in range(total):
                channel.basic_publish(exchange, f"two.{n % 3}", str(n).encode())
        deadline = time.monotonic() + WAIT
        while sum(got.values()) < total and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # nothing more may come
    finally:
        stop.set()
        for thread in consumers:
            thread.join(WAIT)
    assert sorted(int(x) for x in got) == list(range(total))
    assert set(got.values()) == {1}


def test_first_messages_from_two_proxies_at_once_make_one_subscription_each(
    start_proxy: ProxyFactory, created: Created, services: ServiceEndpoints
) -> None:
    a, b = start_proxy(), start_proxy()
    exchange = created.exchange("race")
    queues = [created.queue(f"race{i}") for i in range(20)]
    with pika.BlockingConnection(pika.URLParameters(a.amqp_url())) as connection:
        channel = connection.channel()
        channel.exchange_declare(exchange, "topic")
        for i, queue in enumerate(queues):
            channel.queue_declare(queue)
            channel.queue_bind(queue, exchange, f"race.{i}")
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def publish(url: str, tag: str) -> None:
        try:
            with pika.BlockingConnection(pika.URLParameters(url)) as connection:
                channel = confirming(connection)
                start.wait(WAIT)
                for i in range(len(queues)):
                    channel.basic_publish(exchange, f"race.{i}", tag.encode())
        except BaseException as e:
            errors.append(e)

    threads = [
        threading.Thread(target=publish, args=(p.amqp_url(), t)) for p, t in ((a, "a"), (b, "b"))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 3)
    assert not errors, errors
    admin = PulsarAdmin(services.pulsar_web_url)
    with pika.BlockingConnection(pika.URLParameters(b.amqp_url())) as connection:
        channel = connection.channel()
        assert [message_count(channel, q, 2) for q in queues] == [2] * len(queues)
        for queue in queues:
            bodies = sorted(channel.basic_get(queue, auto_ack=True)[2] for _ in range(2))
            assert bodies == [b"a", b"b"]
    topics = binding_topics(admin, exchange)
    assert len(topics) == len(queues)  # one topic per binding, none made twice
    for topic in topics:
        local = topic.rsplit("/", 1)[1]
        assert len(admin.subscription_stats(TopicName(NAMESPACE, local))) == 1


def test_a_dead_letter_can_be_the_first_message_of_its_binding(
    broker: Broker, created: Created
) -> None:
    exchange, source, dead = created.exchange("dlx"), created.queue("src"), created.queue("dlq")
    with pika.BlockingConnection(pika.URLParameters(broker.url())) as connection:
        channel = confirming(connection)
        channel.exchange_declare(exchange, "topic")
        channel.queue_declare(dead)
        channel.queue_bind(dead, exchange, "dead.#")
        channel.queue_declare(
            source,
            arguments={"x-dead-letter-exchange": exchange, "x-dead-letter-routing-key": "dead.1"},
        )
        for n in range(3):
            channel.basic_publish("", source, f"d{n}".encode())
        for _ in range(3):
            method, _, _ = channel.basic_get(source)
            assert method is not None
            channel.basic_reject(method.delivery_tag, requeue=False)
        assert message_count(channel, dead, 3) == 3
        bodies = sorted(channel.basic_get(dead, auto_ack=True)[2] for _ in range(3))
        assert bodies == [b"d0", b"d1", b"d2"]


def test_exchange_to_exchange_and_alternate_exchange_publishes_can_be_first_messages(
    broker: Broker, created: Created
) -> None:
    source, alternate, target = (created.exchange(k) for k in ("src", "alt", "topic"))
    routed, fallback = created.queue("routed"), created.queue("fallback")
    with pika.BlockingConnection(pika.URLParameters(broker.url())) as connection:
        channel = confirming(connection)
        channel.exchange_declare(alternate, "topic")
        channel.exchange_declare(source, "direct", arguments={"alternate-exchange": alternate})
        channel.exchange_declare(target, "topic")
        channel.exchange_bind(target, source, "e2e.1")
        channel.queue_declare(routed)
        channel.queue_bind(routed, target, "e2e.*")
        channel.queue_declare(fallback)
        channel.queue_bind(fallback, alternate, "#")
        channel.basic_publish(source, "e2e.1", b"through the binding")
        channel.basic_publish(source, "other", b"to the alternate")
        assert message_count(channel, routed, 1) == 1
        assert message_count(channel, fallback, 1) == 1
        assert channel.basic_get(routed, auto_ack=True)[2] == b"through the binding"
        assert channel.basic_get(fallback, auto_ack=True)[2] == b"to the alternate"


class UnbindingMaker(SubscriptionMaker):
    """Makes subscriptions, but first unbinds the queue (through AMQP): an unbind that
    lands while a first publish makes the binding's topic."""

    def __init__(self, admin: PulsarAdmin, unbind: object) -> None:
        super().__init__(admin)
        self.unbind = unbind
        self.made: list[tuple[TopicName, str]] = []

    def create(self, topic: TopicName, subscription: str) -> None:
        if not self.made:
            self.unbind()  # type: ignore[operator]
        super().create(topic, subscription)
        self.made.append((topic, subscription))


def test_an_unbind_while_the_first_message_makes_the_topic_leaves_no_topic_behind(
    start_proxy: ProxyFactory, services: ServiceEndpoints
) -> None:
    root = f"/bf-{uuid.uuid4().hex[:8]}"
    proxy = start_proxy(starlightMetadataRoot=root)
    exchange, queue = (f"bf-{kind}-{uuid.uuid4().hex[:8]}" for kind in ("x", "q"))
    admin = PulsarAdmin(services.pulsar_web_url)
    zk = ZooKeeperClient(services.zookeeper)
    zk.start()
    with pika.BlockingConnection(pika.URLParameters(proxy.amqp_url())) as connection:
        channel = connection.channel()
        channel.exchange_declare(exchange, "topic")
        channel.queue_declare(queue)
        channel.queue_bind(queue, exchange, "u.*")
        paths = Paths(root)
        set_topic = naming.exchange_topic(NAMESPACE, exchange, "topic", "").local
        found = zk.get(paths.binding_set("/", queue, set_topic))
        assert found is not None
        unmade = decode(found[0])
        assert isinstance(unmade, BindingSet) and not unmade.made
        try:
            maker = UnbindingMaker(admin, lambda: channel.queue_unbind(queue, exchange, "u.*"))
            made = make_binding_topic(zk, paths, maker, admin, "/", NAMESPACE, queue, set_topic)
            assert made is None  # the set is gone: the publish writes nothing there
            assert [s for _, s in maker.made] == [unmade.subscription]  # it was made, then
            assert binding_topics(admin, exchange) == []  # deleted again
            assert zk.children(paths.retired("/")) == []
            # Bound again: a new set, made by its first message as usual.
            channel.queue_bind(queue, exchange, "u.*")
            again = make_binding_topic(
                zk, paths, SubscriptionMaker(admin), admin, "/", NAMESPACE, queue, set_topic
            )
            assert again is not None and again.made
            assert again.subscription != unmade.subscription
            (topic,) = binding_topics(admin, exchange)
            stats = admin.subscription_stats(TopicName(NAMESPACE, topic.rsplit("/", 1)[1]))
            assert list(stats) == [again.subscription]
        finally:
            channel.queue_delete(queue)
            channel.exchange_delete(exchange)
            zk.stop()


def test_a_queue_deleted_while_the_first_message_makes_its_topic_leaves_nothing_behind(
    start_proxy: ProxyFactory, services: ServiceEndpoints
) -> None:
    root = f"/bf-{uuid.uuid4().hex[:8]}"
    proxy = start_proxy(starlightMetadataRoot=root)
    exchange, queue = (f"bf-{kind}-{uuid.uuid4().hex[:8]}" for kind in ("x", "q"))
    admin = PulsarAdmin(services.pulsar_web_url)
    zk = ZooKeeperClient(services.zookeeper)
    zk.start()
    paths = Paths(root)
    set_topic = naming.exchange_topic(NAMESPACE, exchange, "topic", "").local
    try:
        with pika.BlockingConnection(pika.URLParameters(proxy.amqp_url())) as connection:
            channel = connection.channel()
            channel.exchange_declare(exchange, "topic")
            channel.queue_declare(queue)
            channel.queue_bind(queue, exchange, "d.*")
            # A never-used binding owns nothing in Pulsar: deleting its queue retires no
            # subscription (no record for the cleaner), and the first message making the
            # topic meanwhile deletes what it made.
            maker = UnbindingMaker(admin, lambda: channel.queue_delete(queue))
            made = make_binding_topic(zk, paths, maker, admin, "/", NAMESPACE, queue, set_topic)
            assert made is None
            assert len(maker.made) == 1
            assert binding_topics(admin, exchange) == []
            assert zk.children(paths.retired("/")) == []
            assert zk.get(paths.queue("/", queue)) is None
            channel.exchange_delete(exchange)
    finally:
        zk.stop()


def test_a_deleted_queue_takes_its_used_binding_topic_along_without_the_cleaner(
    start_proxy: ProxyFactory, services: ServiceEndpoints
) -> None:
    """The publishing proxy holds a producer of the binding topic: the deleting proxy
    closes it, then one request deletes the topic with its subscription; nothing is left
    for the cleaner (disabled here)."""
    root = f"/bf-{uuid.uuid4().hex[:8]}"
    proxy = start_proxy(starlightMetadataRoot=root, subscriptionCleanerEnabled="false")
    exchange, queue = (f"bf-{kind}-{uuid.uuid4().hex[:8]}" for kind in ("x", "q"))
    admin = PulsarAdmin(services.pulsar_web_url)
    zk = ZooKeeperClient(services.zookeeper)
    zk.start()
    paths = Paths(root)
    try:
        with pika.BlockingConnection(pika.URLParameters(proxy.amqp_url())) as connection:
            channel = confirming(connection)
            channel.exchange_declare(exchange, "topic")
            channel.queue_declare(queue)
            channel.queue_bind(queue, exchange, "d.*")
            for n in range(3):
                channel.basic_publish(exchange, "d.x", f"m{n}".encode())
            assert message_count(channel, queue, 3) == 3
            assert len(binding_topics(admin, exchange)) == 1
            assert channel.queue_delete(queue).method.message_count == 3
            deadline = time.monotonic() + WAIT
            while binding_topics(admin, exchange) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert binding_topics(admin, exchange) == []
            while zk.children(paths.retired("/")) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert zk.children(paths.retired("/")) == []
            channel.exchange_delete(exchange)
    finally:
        zk.stop()
