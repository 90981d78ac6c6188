"""Faults through HAProxy in front of 3 proxy processes, with their own ZooKeeper and Pulsar
(`local_cluster`): proxies killed with SIGKILL, ZooKeeper stopped, Pulsar restarted. Every
test counts messages: what was confirmed must be consumed; duplicates are allowed (AMQP is
at-least-once) and reported. Each test prints a `FAULT` line with its figures, which
docs/reliability.md records."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from starlight_py.backend.pulsar_admin import PulsarAdmin
from starlight_py.cluster.election import LeaderElection
from starlight_py.cluster.registry import live_proxies
from starlight_py.local.cluster import LocalCluster
from starlight_py.metadata.records import Paths
from starlight_py.metadata.zookeeper import ZooKeeperClient
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from tests.support.amqp_fixtures import unique

SESSION_TIMEOUT = 4.0  # the cluster's zooKeeperSessionTimeoutMillis
CLEANER_INTERVAL = 1.0
CLEANER_GRACE = 2.0
PATHS = Paths("/starlight")
NAMESPACE = NamespaceName("public", "default")
AMQP_ERRORS = (pika.exceptions.AMQPError, OSError)


def connect(url: str, heartbeat: int = 10) -> BlockingConnection:
    """`heartbeat=0` for connections a test leaves unattended while it waits on another."""
    parameters = pika.URLParameters(url)
    parameters.connection_attempts = 1
    parameters.socket_timeout = 5
    parameters.blocked_connection_timeout = 60
    parameters.heartbeat = heartbeat
    return pika.BlockingConnection(parameters)


def connect_retrying(url: str, timeout: float = 120.0) -> BlockingConnection:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return connect(url)
        except AMQP_ERRORS:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def report(name: str, **figures: object) -> None:
    print(f"FAULT {name}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))


def eventually(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(*AMQP_ERRORS):
            if predicate():
                return True
        time.sleep(0.2)
    return predicate()


@pytest.fixture
def cluster(healthy_cluster: LocalCluster) -> Iterator[LocalCluster]:
    yield healthy_cluster
    healthy_cluster.start()  # repair whatever the test broke, for the next one


@pytest.fixture
def zookeeper(cluster: LocalCluster) -> Iterator[ZooKeeperClient]:
    client = ZooKeeperClient(cluster.zookeeper.connect_string, session_timeout=10)
    client.start()
    yield client
    client.stop()


def drain_all(url: str, queue: str, idle: float = 5.0) -> Counter[bytes]:
    """Consume (with acks) until the queue stays silent for `idle` seconds."""
    received: Counter[bytes] = Counter()
    connection = connect_retrying(url)
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=200)
        for method, _, body in channel.consume(queue, inactivity_timeout=idle):
            if method is None:
                break
            received[body] += 1
            channel.basic_ack(method.delivery_tag)
        channel.cancel()
    finally:
        with contextlib.suppress(*AMQP_ERRORS):
            connection.close()
    return received


def publish_confirmed(channel: BlockingChannel, queue: str, bodies: list[bytes]) -> None:
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish("", queue, body, mandatory=True)


def serving_proxy(cluster: LocalCluster) -> int:
    """The proxy HAProxy has the (single) client connection on."""
    busy = {server.name for server in cluster.haproxy.servers() if server.current_sessions}
    for index in range(len(cluster.proxies)):
        if cluster.haproxy_server_name(index) in busy:
            return index
    raise AssertionError("no client connection through HAProxy")


def proxy_index_of(cluster: LocalCluster, zk: ZooKeeperClient, proxy_id: str) -> int:
    for record in live_proxies(zk, PATHS):
        if record.id == proxy_id:
            port = int(record.listeners[0].rsplit(":", 1)[1])
            return [p.port for p in cluster.proxies].index(port)
    raise AssertionError(f"proxy {proxy_id} is not registered")


# ---- a proxy dies ------------------------------------------------------------------------


def test_unacked_messages_of_a_killed_proxy_are_redelivered_elsewhere(
    cluster: LocalCluster,
) -> None:
    queue = unique("q", "fault")
    total, held = 300, 50
    with connect(cluster.proxy_url(1)) as setup:
        channel = setup.channel()
        channel.queue_declare(queue)
        publish_confirmed(channel, queue, [f"m{i}".encode() for i in range(total)])

    doomed = connect(cluster.proxy_url(0))
    channel = doomed.channel()
    channel.basic_qos(prefetch_count=held)
    delivered_to_doomed = []
    for method, _, body in channel.consume(queue, inactivity_timeout=5):
        if method is None:
            break
        delivered_to_doomed.append(body)
        if len(delivered_to_doomed) == held:
            break
    assert len(delivered_to_doomed) == held  # held, never acked
    cluster.kill_proxy(0)

    received: Counter[bytes] = Counter()
    lock = threading.Lock()

    def consume_on(index: int) -> None:
        with connect(cluster.proxy_url(index)) as conn:
            ch = conn.channel()
            ch.basic_qos(prefetch_count=20)
            for method, _, body in ch.consume(queue, inactivity_timeout=8):
                if method is None:
                    break
                with lock:
                    received[body] += 1
                ch.basic_ack(method.delivery_tag)
            ch.cancel()

    workers = [threading.Thread(target=consume_on, args=(i,)) for i in (1, 2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    expected = {f"m{i}".encode() for i in range(total)}
    lost = expected - set(received)
    duplicated = sum(received.values()) - len(received)
    report(
        "kill-consumer-proxy",
        messages=total,
        held_unacked=held,
        lost=len(lost),
        duplicated=duplicated,
    )
    assert not lost, sorted(lost)[:10]
    assert set(delivered_to_doomed) <= set(received)
    with connect(cluster.proxy_url(1)) as conn:
        conn.channel().queue_delete(queue)


def test_confirmed_publishes_survive_proxies_killed_one_after_another(
    cluster: LocalCluster,
) -> None:
    queue = unique("q", "fault")
    with connect(cluster.amqp_url) as setup:
        setup.channel().queue_declare(queue)

    confirmed: list[bytes] = []
    attempted = 0
    reconnects = 0
    stop = threading.Event()

    def publisher() -> None:
        nonlocal attempted, reconnects
        sequence = 0
        while not stop.is_set():
            try:
                connection = connect_retrying(cluster.amqp_url, 60)
            except AMQP_ERRORS:
                continue
            try:
                channel = connection.channel()
                channel.confirm_delivery()
                while not stop.is_set():
                    body = f"p{sequence}".encode()
                    sequence += 1
                    attempted += 1
                    channel.basic_publish("", queue, body)
                    confirmed.append(body)  # basic_publish returned: the broker confirmed
            except AMQP_ERRORS:
                reconnects += 1  # that publish is unconfirmed: it may or may not arrive
            finally:
                with contextlib.suppress(*AMQP_ERRORS):
                    connection.close()

    thread = threading.Thread(target=publisher)
    thread.start()
    try:
        for _ in range(3):
            time.sleep(3)
            index = serving_proxy(cluster)  # the publisher's: each kill cuts it off
            cluster.kill_proxy(index)
            time.sleep(1)
            cluster.start_proxy(index)
        time.sleep(3)
    finally:
        stop.set()
        thread.join(90)
    assert not thread.is_alive()

    received = drain_all(cluster.amqp_url, queue)
    lost = set(confirmed) - set(received)
    duplicated = sum(received.values()) - len(received)
    report(
        "kill-proxies-under-publisher",
        kills=3,
        attempted=attempted,
        confirmed=len(confirmed),
        received=len(received),
        lost=len(lost),
        duplicated=duplicated,
        reconnects=reconnects,
    )
    assert reconnects >= 3  # the publisher really was cut off, every time
    assert len(confirmed) > 100
    assert not lost, sorted(lost)[:10]
    with connect(cluster.amqp_url) as conn:
        conn.channel().queue_delete(queue)


def test_an_exclusive_queue_of_a_killed_proxy_goes_after_the_session_timeout(
    cluster: LocalCluster, zookeeper: ZooKeeperClient
) -> None:
    queue = unique("excl", "fault")
    owner = connect(cluster.proxy_url(2))
    owner.channel().queue_declare(queue, exclusive=True)
    cluster.kill_proxy(2)
    killed = time.monotonic()

    def code() -> int:
        with connect(cluster.proxy_url(0)) as conn:
            try:
                conn.channel().queue_declare(queue, passive=True)
            except pika.exceptions.ChannelClosedByBroker as e:
                return e.reply_code
            return 200

    assert code() == 405  # still owned until the session expires
    assert eventually(lambda: code() == 404, SESSION_TIMEOUT + CLEANER_GRACE + 20)
    gone_after = time.monotonic() - killed
    report("exclusive-queue-of-killed-proxy", gone_after_s=f"{gone_after:.1f}")
    assert gone_after >= SESSION_TIMEOUT * 0.5


def test_an_auto_delete_queue_whose_last_consumer_died_with_its_proxy_goes(
    cluster: LocalCluster,
) -> None:
    queue = unique("auto", "fault")
    with connect(cluster.proxy_url(0)) as conn:
        conn.channel().queue_declare(queue, auto_delete=True)
    consumer = connect(cluster.proxy_url(1))
    consumer.channel().basic_consume(queue, lambda *args: None)
    cluster.kill_proxy(1)

    def exists() -> bool:
        with connect(cluster.proxy_url(0)) as conn:
            try:
                conn.channel().queue_declare(queue, passive=True)
            except pika.exceptions.ChannelClosedByBroker:
                return False
            return True

    assert eventually(lambda: not exists(), SESSION_TIMEOUT + CLEANER_GRACE + 20)


# ---- the SubscriptionCleaner's leader dies -------------------------------------------------


def test_another_proxy_leads_the_cleaner_when_the_leader_is_killed(
    cluster: LocalCluster, zookeeper: ZooKeeperClient
) -> None:
    observer = LeaderElection(zookeeper, PATHS.cleaner_election, "observer")
    assert eventually(lambda: observer.leader_identity() is not None, 20)
    leader = observer.leader_identity()
    assert leader is not None
    index = proxy_index_of(cluster, zookeeper, leader)
    cluster.kill_proxy(index)
    killed = time.monotonic()
    assert eventually(
        lambda: observer.leader_identity() not in (None, leader), SESSION_TIMEOUT + 10
    )
    took = time.monotonic() - killed
    report(
        "cleaner-leader-killed", new_leader_after_s=f"{took:.1f}", session_timeout_s=SESSION_TIMEOUT
    )
    assert took <= SESSION_TIMEOUT + CLEANER_INTERVAL + 5

    # The new leader works: a binding removed while its consumer lags keeps its
    # subscription until the lag is acked, then it is removed.
    survivor = (index + 1) % 3
    exchange, queue = unique("ex", "fault"), unique("q", "fault")
    admin = PulsarAdmin(cluster.pulsar.web_url)
    topic = naming.exchange_topic(NAMESPACE, exchange, "direct", "k")
    with connect(cluster.proxy_url(survivor)) as conn:
        channel = conn.channel()
        channel.exchange_declare(exchange, "direct")
        channel.queue_declare(queue)
        channel.queue_bind(queue, exchange, "k")
        channel.confirm_delivery()
        for i in range(20):
            channel.basic_publish(exchange, "k", f"lag{i}".encode())
        channel.queue_unbind(queue, exchange, "k")
        reader = conn.channel()
        reader.basic_qos(prefetch_count=50)
        tags = []
        for method, _, _body in reader.consume(queue, inactivity_timeout=5):
            if method is None:
                break
            tags.append(method.delivery_tag)
        assert len(tags) == 20
        time.sleep(CLEANER_INTERVAL * 4)
        assert len(admin.subscription_stats(topic)) == 1  # lag unacked: kept
        for tag in tags:
            reader.basic_ack(tag)
        assert eventually(lambda: not admin.subscription_stats(topic), 30)
        channel.queue_delete(queue)
        channel.exchange_delete(exchange)


# ---- ZooKeeper and Pulsar go away --------------------------------------------------------


def test_zookeeper_down_for_30_s_stops_topology_changes_not_messages(
    cluster: LocalCluster,
) -> None:
    queue, exclusive = unique("q", "fault"), unique("excl", "fault")
    publisher = connect(cluster.proxy_url(0), heartbeat=0)
    pub = publisher.channel()
    pub.queue_declare(queue)
    pub.queue_declare(exclusive, exclusive=True)
    pub.confirm_delivery()
    changer = connect(cluster.proxy_url(2), heartbeat=0)

    received: Counter[bytes] = Counter()
    consuming = threading.Event()
    stop = threading.Event()

    def consume() -> None:
        with connect(cluster.proxy_url(1)) as consumer:
            channel = consumer.channel()
            channel.basic_qos(prefetch_count=100)

            def on_message(ch: BlockingChannel, method: Any, _props: object, body: bytes) -> None:
                received[body] += 1
                ch.basic_ack(method.delivery_tag)

            channel.basic_consume(queue, on_message)
            consuming.set()
            while not stop.is_set():
                consumer.process_data_events(0.1)

    thread = threading.Thread(target=consume)
    thread.start()
    assert consuming.wait(30)
    # The queue's default-exchange subscription is made by its first publish through the
    # default exchange, which needs ZooKeeper (docs/reliability.md): one before the outage.
    pub.basic_publish("", queue, b"z-before")
    sent = [b"z-before"]
    try:
        cluster.stop_zookeeper()
        stopped = time.monotonic()
        while time.monotonic() - stopped < 30:
            body = f"z{len(sent)}".encode()
            pub.basic_publish("", queue, body)  # confirmed: publishing goes on
            sent.append(body)
        # A new connection still opens (the vhost is in the proxies' caches)...
        with connect(cluster.amqp_url) as late:
            late_channel = late.channel()
            late_channel.confirm_delivery()
            late_channel.basic_publish("", queue, b"z-late")
            sent.append(b"z-late")
        # ... but a topology change fails with an AMQP error instead of hanging.
        began = time.monotonic()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as refused:
            changer.channel().queue_declare(unique("new", "fault"))
        answered_after = time.monotonic() - began
        assert refused.value.reply_code == 541
        assert "ZooKeeper" in refused.value.reply_text

        cluster.start_zookeeper()
        restarted = time.monotonic()

        def declare_works() -> bool:
            with connect(cluster.proxy_url(2)) as conn:
                ch = conn.channel()
                name = unique("after", "fault")
                ch.queue_declare(name)
                ch.queue_delete(name)
            return True

        # kazoo's reconnect back-off grows while ZooKeeper is down (up to a minute).
        assert eventually(declare_works, 90)
        changes_back_after = time.monotonic() - restarted
        deadline = time.monotonic() + 30
        while len(received) < len(sent) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(30)
    lost = set(sent) - set(received)
    # The exclusive queue survived the outage (its owner znode is still there, or made
    # again after a new session).
    time.sleep(CLEANER_GRACE + CLEANER_INTERVAL * 2)
    pub.queue_declare(exclusive, passive=True)
    report(
        "zookeeper-down-30s",
        published=len(sent),
        consumed=len(received),
        lost=len(lost),
        duplicated=sum(received.values()) - len(received),
        declare_refused_after_s=f"{answered_after:.1f}",
        topology_back_after_s=f"{changes_back_after:.1f}",
    )
    assert not lost, sorted(lost)[:10]
    publisher.close()
    with connect(cluster.amqp_url) as conn:
        conn.channel().queue_delete(queue)


def test_a_pulsar_restart_pauses_clients_and_loses_no_confirmed_message(
    cluster: LocalCluster,
) -> None:
    queue = unique("q", "fault")
    with connect(cluster.amqp_url) as setup:
        setup.channel().queue_declare(queue)
    confirmed: list[bytes] = []
    failures = 0
    stop = threading.Event()

    def publisher() -> None:
        nonlocal failures
        sequence = 0
        while not stop.is_set():
            try:
                connection = connect(cluster.amqp_url)
            except AMQP_ERRORS:
                time.sleep(0.5)
                continue
            try:
                channel = connection.channel()
                channel.confirm_delivery()
                while not stop.is_set():
                    body = f"r{sequence}".encode()
                    sequence += 1
                    channel.basic_publish("", queue, body)
                    confirmed.append(body)
                    time.sleep(0.01)
            except AMQP_ERRORS:
                failures += 1
                time.sleep(0.5)
            finally:
                with contextlib.suppress(*AMQP_ERRORS):
                    connection.close()

    thread = threading.Thread(target=publisher)
    thread.start()
    try:
        time.sleep(3)
        before = len(confirmed)
        cluster.restart_pulsar()
        restarted = len(confirmed)
        assert eventually(lambda: len(confirmed) > restarted + 50, 120)
    finally:
        stop.set()
        thread.join(120)
    received = drain_all(cluster.amqp_url, queue, idle=8)
    lost = set(confirmed) - set(received)
    report(
        "pulsar-restart",
        confirmed_before=before,
        confirmed=len(confirmed),
        received=len(received),
        lost=len(lost),
        duplicated=sum(received.values()) - len(received),
        publisher_errors=failures,
    )
    assert not lost, sorted(lost)[:10]
    with connect(cluster.amqp_url) as conn:
        conn.channel().queue_delete(queue)
