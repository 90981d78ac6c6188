"""The proxy against a real Pulsar cluster (issue 21): 2 brokers and 3 bookies (ensemble 3,
write and ack quorum 2) keeping their metadata in the cluster's ZooKeeper, 2 proxies behind
HAProxy. Topics move between brokers while clients publish and consume through HAProxy:
unloads, bundle splits, a broker killed with SIGKILL, a bookie killed with SIGKILL, each 5
times. Every test counts messages: every confirmed message is consumed, nothing unexpected
arrives, and the clients' connections to the proxy survive (the proxy hides broker-side
events; publishes wait while a topic moves). Each test prints a `CLUSTER-FAULT` line with
its figures, which docs/reliability.md records."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from starlight_py.backend.pulsar_admin import PulsarAdmin, PulsarAdminError
from starlight_py.local.cluster import LocalCluster
from starlight_py.local.pulsar_cluster import PulsarCluster
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from tests.support.amqp_fixtures import unique

NAMESPACE = NamespaceName("public", "default")
REPETITIONS = 5
BROKER_KILLS = 3
BOOKIE_KILLS = 3
AMQP_ERRORS = (pika.exceptions.AMQPError, OSError)
# A killed broker's topics move once its metadata session expires: 10 s here (Pulsar's
# default is 30 s), so that the kills fit in CI.
BROKER_SESSION_TIMEOUT_MS = 10_000


@pytest.fixture(scope="module")
def pulsar_cluster(
    tmp_path_factory: pytest.TempPathFactory, pulsar_distribution: Path
) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        tmp_path_factory.mktemp("pulsar_cluster"),
        proxies=2,
        brokers=2,
        bookies=3,
        broker_settings={"metadataStoreSessionTimeoutMillis": str(BROKER_SESSION_TIMEOUT_MS)},
        distribution=pulsar_distribution,
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster(pulsar_cluster: LocalCluster) -> Iterator[LocalCluster]:
    pulsar_cluster.start()
    yield pulsar_cluster
    pulsar_cluster.start()  # whatever a test left stopped comes back for the next one


def pulsar_of(cluster: LocalCluster) -> PulsarCluster:
    assert isinstance(cluster.pulsar, PulsarCluster)
    return cluster.pulsar


def admin_of(cluster: LocalCluster) -> PulsarAdmin:
    return PulsarAdmin(cluster.pulsar.web_url)


def connect(url: str) -> BlockingConnection:
    parameters = pika.URLParameters(url)
    parameters.connection_attempts = 1
    parameters.socket_timeout = 5
    parameters.blocked_connection_timeout = 300
    parameters.heartbeat = 30
    return pika.BlockingConnection(parameters)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.2)


class Workload:
    """A confirming publisher and a manual-ack consumer on one queue, each on its own
    connection through HAProxy, in threads. A client error (a connection or channel
    closed, a nack) is counted, and the client connects again."""

    def __init__(self, url: str, queue: str) -> None:
        self.url = url
        self.queue = queue
        self.published: set[bytes] = set()
        self.confirmed: list[bytes] = []
        self.received: Counter[bytes] = Counter()
        self.publisher_errors: list[str] = []
        self.consumer_errors: list[str] = []
        self._stop_publishing = threading.Event()
        self._stop_consuming = threading.Event()
        self._last_receipt = time.monotonic()
        self._threads = [
            threading.Thread(target=self._publish, name="publisher"),
            threading.Thread(target=self._consume, name="consumer"),
        ]

    def __enter__(self) -> Workload:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_publishing.set()
        self._stop_consuming.set()
        for thread in self._threads:
            thread.join(60)

    def progress(self, more: int, timeout: float, what: str) -> None:
        """Wait until `more` further messages are confirmed and consumed."""
        confirmed, received = len(self.confirmed), len(self.received)
        wait_for(
            lambda: (
                len(self.confirmed) >= confirmed + more and len(self.received) >= received + more
            ),
            timeout,
            f"{more} more messages confirmed and consumed {what}",
        )

    def finish(self, idle: float = 8.0) -> None:
        """Stop publishing, then consume until nothing arrives for `idle` seconds."""
        self._stop_publishing.set()
        self._threads[0].join(180)
        wait_for(lambda: time.monotonic() - self._last_receipt > idle, 300, "the queue drained")
        self._stop_consuming.set()
        self._threads[1].join(60)

    def _publish(self) -> None:
        sequence = 0
        while not self._stop_publishing.is_set():
            try:
                connection = connect(self.url)
            except AMQP_ERRORS as e:
                self.publisher_errors.append(f"connect: {e!r}")
                time.sleep(0.5)
                continue
            try:
                channel = connection.channel()
                channel.confirm_delivery()
                while not self._stop_publishing.is_set():
                    body = f"m{sequence}".encode()
                    sequence += 1
                    self.published.add(body)
                    properties = pika.BasicProperties(delivery_mode=2)
                    channel.basic_publish("", self.queue, body, properties)
                    self.confirmed.append(body)
                    time.sleep(0.005)
            except AMQP_ERRORS as e:
                self.publisher_errors.append(repr(e))
                time.sleep(0.5)
            finally:
                with contextlib.suppress(*AMQP_ERRORS):
                    connection.close()

    def _consume(self) -> None:
        while not self._stop_consuming.is_set():
            try:
                connection = connect(self.url)
            except AMQP_ERRORS as e:
                self.consumer_errors.append(f"connect: {e!r}")
                time.sleep(0.5)
                continue
            try:
                channel = connection.channel()
                channel.basic_qos(prefetch_count=50)
                for method, _, body in channel.consume(self.queue, inactivity_timeout=0.5):
                    if self._stop_consuming.is_set():
                        break
                    if method is None:
                        continue
                    self.received[body] += 1
                    self._last_receipt = time.monotonic()
                    channel.basic_ack(method.delivery_tag)
            except AMQP_ERRORS as e:
                self.consumer_errors.append(repr(e))
                time.sleep(0.5)
            finally:
                with contextlib.suppress(*AMQP_ERRORS):
                    connection.close()

    def check(self, event: str, repetitions: int) -> None:
        lost = set(self.confirmed) - set(self.received)
        unexpected = set(self.received) - self.published
        duplicated = sum(self.received.values()) - len(self.received)
        print(
            f"CLUSTER-FAULT {event}: repetitions={repetitions}, confirmed={len(self.confirmed)}, "
            f"consumed={len(self.received)}, lost={len(lost)}, unexpected={len(unexpected)}, "
            f"duplicated={duplicated}, publisher_errors={len(self.publisher_errors)}, "
            f"consumer_errors={len(self.consumer_errors)}"
        )
        assert not lost, sorted(lost)[:10]
        assert not unexpected, sorted(unexpected)[:10]
        assert not self.publisher_errors, self.publisher_errors[:5]
        assert not self.consumer_errors, self.consumer_errors[:5]


def declare(cluster: LocalCluster, prefix: str) -> tuple[str, naming.TopicName]:
    queue = unique("q", prefix)
    with connect(cluster.amqp_url) as connection:
        connection.channel().queue_declare(queue, durable=True)
    return queue, naming.exchange_topic(NAMESPACE, "", "direct", queue)


def delete(cluster: LocalCluster, queue: str) -> None:
    with connect(cluster.amqp_url) as connection:
        connection.channel().queue_delete(queue)


def test_the_proxy_works_on_a_cluster_of_brokers_and_bookies(cluster: LocalCluster) -> None:
    admin = admin_of(cluster)
    assert len(admin.brokers()) == 2
    queues = [declare(cluster, "spread") for _ in range(8)]
    with connect(cluster.amqp_url) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for queue, _ in queues:
            for i in range(3):
                channel.basic_publish("", queue, f"{queue}-{i}".encode())
        # Counts come from the stats of topics owned by either broker (the admin API
        # redirects to the owner).
        for queue, _ in queues:
            assert channel.queue_declare(queue, passive=True).method.message_count == 3
        # The brokers' backlog plugin (batch-aware counts) answers on either broker too:
        # the one that does not own a topic redirects to the one that does.
        for broker in pulsar_of(cluster).brokers:
            backlogs = PulsarAdmin(broker.web_url)
            assert backlogs.has_message_backlogs()
            for _, topic in queues:
                assert list(backlogs.message_backlog_counts(topic).values()) == [3]
        for queue, _ in queues:
            bodies = []
            for _ in range(3):
                method, _, body = channel.basic_get(queue, auto_ack=True)
                assert method is not None
                bodies.append(body)
            assert sorted(bodies) == [f"{queue}-{i}".encode() for i in range(3)]
    # Each broker's admin API answers for topics the other owns (HTTP 307 to the owner,
    # followed for every method).
    pulsar = pulsar_of(cluster)
    queue, topic = queues[0]
    owner = admin.topic_owner(topic)
    other = next(b for b in pulsar.brokers if not owner.endswith(b.service_address))
    stats = PulsarAdmin(other.web_url).subscription_stats(topic)
    assert len(stats) == 1 and next(iter(stats.values())).backlog == 0
    for queue, _ in queues:
        delete(cluster, queue)
    # The subscriptions go right after delete-ok (topology/background_work.py).
    deadline = time.monotonic() + 30
    while PulsarAdmin(other.web_url).subscription_stats(topic) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert PulsarAdmin(other.web_url).subscription_stats(topic) == {}


def test_topics_unloaded_under_load_lose_nothing(cluster: LocalCluster) -> None:
    queue, topic = declare(cluster, "unload")
    admin = admin_of(cluster)
    with Workload(cluster.amqp_url, queue) as load:
        load.progress(100, 60, "before the first unload")
        for _ in range(REPETITIONS):
            admin.unload_topic(topic)
            load.progress(100, 120, "after an unload")
        load.finish()
    load.check("topic-unload", REPETITIONS)
    delete(cluster, queue)


def test_bundle_splits_under_load_lose_nothing(cluster: LocalCluster) -> None:
    queue, topic = declare(cluster, "split")
    admin = admin_of(cluster)
    with Workload(cluster.amqp_url, queue) as load:
        load.progress(100, 60, "before the first split")
        for _ in range(REPETITIONS):
            before = admin.bundle_count(str(NAMESPACE))
            admin.split_bundle(str(NAMESPACE), admin.topic_bundle(topic), unload=True)
            # The broker that answers may not have read the new bundle list yet.
            wait_for(
                lambda: admin.bundle_count(str(NAMESPACE)) == before + 1,  # noqa: B023
                30,
                f"{before + 1} bundles after the split",
            )
            load.progress(100, 120, "after a split")
        load.finish()
    load.check("bundle-split", REPETITIONS)
    delete(cluster, queue)


@pytest.mark.timeout(480)
def test_a_broker_killed_under_load_loses_nothing(cluster: LocalCluster) -> None:
    """Each kill takes about 50 s here (the metadata session expires, the topic moves, the
    broker's JVM starts again): BROKER_KILLS of them, not REPETITIONS."""
    queue, topic = declare(cluster, "broker")
    admin = admin_of(cluster)
    pulsar = pulsar_of(cluster)
    with Workload(cluster.amqp_url, queue) as load:
        load.progress(100, 60, "before the first kill")
        for _ in range(BROKER_KILLS):
            owner = admin.topic_owner(topic)
            broker = next(b for b in pulsar.brokers if owner.endswith(b.service_address))
            broker.kill()
            load.progress(100, 120, f"after broker {broker.index} was killed")
            # Admin calls (a count needs the topic's stats) go to the broker still up,
            # whichever of the two the proxy's admin URL list names first.
            with connect(cluster.amqp_url) as connection:
                connection.channel().queue_declare(queue, passive=True)
            pulsar.start_broker(broker.index)
            load.progress(50, 120, f"after broker {broker.index} came back")
        load.finish()
    load.check("broker-kill", BROKER_KILLS)
    delete(cluster, queue)


def test_a_bookie_killed_under_load_loses_nothing(cluster: LocalCluster) -> None:
    queue, _ = declare(cluster, "bookie")
    pulsar = pulsar_of(cluster)
    with Workload(cluster.amqp_url, queue) as load:
        load.progress(100, 60, "before the first kill")
        for repetition in range(BOOKIE_KILLS):  # each of the three bookies once
            bookie = pulsar.bookies[repetition % len(pulsar.bookies)]
            bookie.kill()
            time.sleep(2)
            pulsar.start_bookie(bookie.index)
            load.progress(100, 180, f"after bookie {bookie.index} was killed and restarted")
        load.finish()
    load.check("bookie-kill", BOOKIE_KILLS)
    delete(cluster, queue)


def move_every_topic(admin: PulsarAdmin, topics: list[naming.TopicName]) -> None:
    """Split the bundle of each topic (its topics are unloaded and looked up again), each
    bundle once; a bundle still moving after another split is tried again."""
    bundles = {admin.topic_bundle(topic) for topic in topics}
    for bundle in sorted(bundles):
        deadline = time.monotonic() + 30
        while True:
            try:
                admin.split_bundle(str(NAMESPACE), bundle, unload=True)
                break
            except PulsarAdminError as e:
                # A bundle still moving answers 500 (or 409/412) for a moment.
                if e.status not in (409, 412, 500) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def get_all(channel: BlockingChannel, queue: str, timeout: float = 30) -> list[bytes]:
    bodies: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            if bodies:
                return bodies
            time.sleep(0.2)
            continue
        bodies.append(body)
    return bodies


def test_queue_features_keep_working_while_their_topics_move(cluster: LocalCluster) -> None:
    """TTL dead-lettering with no consumer, priorities, delayed messages, exclusive and
    auto-delete queues, across bundle splits that move their topics."""
    admin = admin_of(cluster)
    wait, dead, prio, delayed_target = (unique("q", k) for k in ("wait", "dead", "prio", "dl"))
    delayed = unique("x", "delayed")
    with connect(cluster.amqp_url) as owner, connect(cluster.amqp_url) as other:
        channel = owner.channel()
        channel.confirm_delivery()
        channel.queue_declare(dead, durable=True)
        channel.queue_declare(
            wait,
            durable=True,
            arguments={
                "x-message-ttl": 1000,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": dead,
            },
        )
        channel.queue_declare(prio, durable=True, arguments={"x-max-priority": 5})
        channel.exchange_declare(
            delayed, "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"}
        )
        channel.queue_declare(delayed_target, durable=True)
        channel.queue_bind(delayed_target, delayed, "k")
        exclusive = channel.queue_declare("", exclusive=True).method.queue
        auto_delete = unique("q", "auto")
        channel.queue_declare(auto_delete, auto_delete=True)
        consumer_tag = channel.basic_consume(auto_delete, lambda *_: None)

        def topics() -> list[naming.TopicName]:
            return [
                naming.exchange_topic(NAMESPACE, "", "direct", q)
                for q in (wait, dead, prio, exclusive, auto_delete)
            ] + [naming.exchange_topic(NAMESPACE, delayed, "direct", "k")]

        for topic in topics():
            admin.topic_owner(topic)  # loaded, so that a split moves it
        move_every_topic(admin, topics())
        for i in range(5):
            channel.basic_publish("", wait, f"w{i}".encode())
        for priority in (1, 5, 3):
            channel.basic_publish(
                "", prio, f"p{priority}".encode(), pika.BasicProperties(priority=priority)
            )
        channel.basic_publish(
            delayed, "k", b"later", pika.BasicProperties(headers={"x-delay": 3000})
        )
        channel.basic_publish("", exclusive, b"mine")
        move_every_topic(admin, topics())

        # Expired messages leave the wait queue with nobody reading it.
        assert sorted(get_all(channel, dead)) == [f"w{i}".encode() for i in range(5)]
        assert channel.queue_declare(wait, passive=True).method.message_count == 0
        assert get_all(channel, prio) == [b"p5", b"p3", b"p1"]
        assert get_all(channel, delayed_target) == [b"later"]
        assert get_all(channel, exclusive) == [b"mine"]
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            other.channel().queue_declare(exclusive, passive=True)
        assert refused.value.reply_code == 405
        channel.basic_cancel(consumer_tag)
        wait_for(lambda: _queue_gone(cluster, auto_delete), 30, "the auto-delete queue deleted")
        for q in (wait, dead, prio, delayed_target):
            channel.queue_delete(q)
        channel.exchange_delete(delayed)


def _queue_gone(cluster: LocalCluster, queue: str) -> bool:
    with connect(cluster.amqp_url) as connection:
        try:
            connection.channel().queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as e:
            return e.reply_code == 404
    return False
