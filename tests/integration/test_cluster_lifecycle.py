"""Queue lifecycle across proxies (exclusive, auto-delete, x-expires), the proxy registry and
the SubscriptionCleaner, with real ZooKeeper and Pulsar. Each test has its own metadata root,
so its proxies elect their own cleaner (with a short period)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pika
import pika.exceptions
import pytest
from kazoo.client import KazooClient
from pika.adapters.blocking_connection import BlockingChannel

from starlight_py.backend.pulsar_admin import PulsarAdmin
from starlight_py.cluster.election import LeaderElection
from starlight_py.cluster.registry import live_proxies
from starlight_py.local import ServiceEndpoints
from starlight_py.metadata.ephemeral import EphemeralNodes
from starlight_py.metadata.records import Paths, RetiredSubscription, decode
from starlight_py.metadata.zookeeper import ZooKeeperClient
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from tests.integration.conftest import ProxyFactory
from tests.support.proxy_runner import ProxyThread

NAMESPACE = NamespaceName("public", "default")
GRACE_MS = 600
WAIT = 20.0  # seconds: generous bound for what the cleaner does within a few passes


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def root() -> str:
    return "/" + unique("lifecycle")


@pytest.fixture
def paths(root: str) -> Paths:
    return Paths(root)


@pytest.fixture
def zookeeper(services: ServiceEndpoints) -> Iterator[ZooKeeperClient]:
    client = ZooKeeperClient(services.zookeeper, session_timeout=4)
    client.start()
    yield client
    client.stop()


@pytest.fixture
def admin(services: ServiceEndpoints) -> PulsarAdmin:
    return PulsarAdmin(services.pulsar_web_url)


@pytest.fixture
def start(start_proxy: ProxyFactory, root: str) -> Callable[[], ProxyThread]:
    def start_one() -> ProxyThread:
        return start_proxy(
            starlightMetadataRoot=root,
            subscriptionCleanerIntervalMillis="200",
            subscriptionCleanerGracePeriodMillis=str(GRACE_MS),
            zooKeeperSessionTimeoutMillis="4000",
        )

    return start_one


def connect(proxy: ProxyThread) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))


def eventually(predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def queue_exists(proxy: ProxyThread, name: str) -> bool:
    with connect(proxy) as conn:
        try:
            conn.channel().queue_declare(name, passive=True)
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code == 404
            return False
        return True


def reply_code(action: Callable[[BlockingChannel], object], proxy: ProxyThread) -> int:
    with connect(proxy) as conn:
        try:
            action(conn.channel())
        except pika.exceptions.ChannelClosedByBroker as e:
            return e.reply_code
        return 200


# ---- registry and election -----------------------------------------------------------------


def test_a_watch_on_the_election_hears_candidates_stand_and_go(
    zookeeper: ZooKeeperClient, paths: Paths
) -> None:
    """The expiry reaper learns of a new leader from this watch, not at its next poll."""
    heard: list[float] = []
    observer = LeaderElection(zookeeper, paths.cleaner_election, "observer")
    observer.watch(lambda: heard.append(time.monotonic()))
    assert eventually(lambda: len(heard) == 1)  # called once at once
    first = LeaderElection(zookeeper, paths.cleaner_election, "first")
    second = LeaderElection(zookeeper, paths.cleaner_election, "second")
    assert first.is_leader()
    assert eventually(lambda: len(heard) >= 2)
    assert not second.is_leader()
    assert eventually(lambda: len(heard) >= 3)
    first.resign()
    assert eventually(lambda: len(heard) >= 4)
    assert second.is_leader()
    assert observer.leader_identity() == "second"
    second.resign()
    assert eventually(lambda: len(heard) >= 5)
    assert observer.leader_identity() is None


def test_each_live_proxy_is_registered_and_a_stopped_one_leaves(
    start: Callable[[], ProxyThread], zookeeper: ZooKeeperClient, paths: Paths
) -> None:
    first, second = start(), start()
    assert eventually(lambda: len(live_proxies(zookeeper, paths)) == 2)
    records = live_proxies(zookeeper, paths)
    ports = {url.rsplit(":", 1)[1] for r in records for url in r.listeners}
    assert ports == {str(first.port), str(second.port)}
    assert all(r.version and r.pid and r.started_at <= time.time() for r in records)
    second.stop()
    assert eventually(lambda: len(live_proxies(zookeeper, paths)) == 1)
    assert (
        live_proxies(zookeeper, paths)[0].listeners
        == records[[str(first.port) in r.listeners[0] for r in records].index(True)].listeners
    )


def test_the_cleaner_lead_passes_on_when_the_leader_stops(
    start: Callable[[], ProxyThread], zookeeper: ZooKeeperClient, paths: Paths
) -> None:
    proxies = [start(), start()]
    observer = LeaderElection(zookeeper, paths.cleaner_election, "observer")
    assert eventually(lambda: len(zookeeper.children(paths.cleaner_election)) == 2)
    leader_id = observer.leader_identity()
    assert leader_id is not None
    registered = {r.id: r for r in live_proxies(zookeeper, paths)}
    leader_port = registered[leader_id].listeners[0].rsplit(":", 1)[1]
    leader = next(p for p in proxies if str(p.port) == leader_port)
    follower = next(p for p in proxies if p is not leader)
    leader.stop()
    # A stopping proxy resigns: the other one leads at once, not after a session timeout.
    assert eventually(lambda: observer.leader_identity() not in (None, leader_id), 5)
    new_leader = observer.leader_identity()
    assert new_leader is not None
    assert registered[new_leader].listeners[0].endswith(f":{follower.port}")
    # ... and does the work: a drained retired subscription gets deleted.
    exchange, queue = unique("ex"), unique("q")
    with connect(follower) as conn:
        channel = conn.channel()
        channel.exchange_declare(exchange, "direct")
        channel.queue_declare(queue)
        channel.queue_bind(queue, exchange, "k")
        channel.basic_publish(exchange, "k", b"one")
        channel.queue_unbind(queue, exchange, "k")
        assert channel.queue_declare(queue, passive=True).method.message_count == 1
        method, _, body = next(channel.consume(queue, inactivity_timeout=10))
        assert body == b"one"
        channel.basic_ack(method.delivery_tag)
        channel.cancel()
        assert eventually(lambda: not zookeeper.children(paths.retired("/")))
        channel.queue_delete(queue)
        channel.exchange_delete(exchange)


def test_ephemeral_znodes_are_made_again_after_a_session_expires(
    services: ServiceEndpoints, paths: Paths
) -> None:
    client = ZooKeeperClient(services.zookeeper, session_timeout=4)
    client.start()
    try:
        ephemerals = EphemeralNodes(client, "test")
        client.ensure_path(paths.proxies)
        path = paths.proxy("expiring")
        client.create(path, b"x", ephemeral=True)
        ephemerals.remember(path, b"x")
        # Expire the session from outside, the way ZooKeeper does for a partitioned client.
        session_id, password = client.kazoo.client_id
        intruder = KazooClient(hosts=services.zookeeper, client_id=(session_id, password))
        intruder.start()
        intruder.stop()
        intruder.close()
        observer = ZooKeeperClient(services.zookeeper)
        observer.start()
        try:
            # A new session replaces the expired one; the znode died with the old one and is
            # made again by EphemeralNodes.
            assert eventually(
                lambda: client.connected and client.kazoo.client_id[0] != session_id, 20
            )
            assert eventually(lambda: observer.get(path) is not None, 10)
            found = observer.get(path)
            assert found is not None and found[0] == b"x"
        finally:
            observer.stop()
    finally:
        client.stop()


# ---- exclusive queues ------------------------------------------------------------------------


def test_an_exclusive_queue_is_locked_on_every_proxy_and_goes_with_its_connection(
    start: Callable[[], ProxyThread],
) -> None:
    first, second = start(), start()
    queue = unique("excl")
    owner = connect(first)
    channel = owner.channel()
    channel.queue_declare(queue, exclusive=True)
    assert reply_code(lambda c: c.queue_declare(queue, passive=True), second) == 405
    assert reply_code(lambda c: c.basic_consume(queue, lambda *a: None), second) == 405
    assert reply_code(lambda c: c.basic_get(queue), second) == 405
    assert reply_code(lambda c: c.queue_delete(queue), second) == 405
    channel.confirm_delivery()  # counts come from Pulsar: wait until it has the message
    channel.basic_publish("", queue, b"mine")
    assert channel.queue_declare(queue, passive=True).method.message_count == 1
    owner.close()
    assert eventually(lambda: not queue_exists(second, queue), 10)


def test_an_exclusive_queue_whose_owner_vanished_is_deleted_by_the_cleaner(
    start: Callable[[], ProxyThread], zookeeper: ZooKeeperClient, paths: Paths
) -> None:
    """The owner znode disappears when the owning proxy's session ends; removing it by hand
    stands in for that here (the fault tests kill the proxy for real)."""
    proxy = start()
    queue = unique("excl")
    with connect(proxy) as conn:
        conn.channel().queue_declare(queue, exclusive=True)
        owner_path = paths.queue_owner("/", queue)
        assert zookeeper.get(owner_path) is not None
        zookeeper.delete(owner_path)
        started = time.monotonic()
        assert eventually(lambda: zookeeper.get(paths.queue("/", queue)) is None)
        # Not before the grace period: a proxy may be re-making its ephemeral znodes.
        assert time.monotonic() - started >= GRACE_MS / 1000 * 0.9


# ---- auto-delete -------------------------------------------------------------------------


def test_an_auto_delete_queue_goes_when_its_last_consumer_on_any_proxy_goes(
    start: Callable[[], ProxyThread], zookeeper: ZooKeeperClient, paths: Paths
) -> None:
    first, second = start(), start()
    queue = unique("auto")
    a, b = connect(first), connect(second)
    try:
        channel_a, channel_b = a.channel(), b.channel()
        channel_a.queue_declare(queue, auto_delete=True)
        tag_a = channel_a.basic_consume(queue, lambda *args: None)
        tag_b = channel_b.basic_consume(queue, lambda *args: None)
        assert len(zookeeper.children(paths.queue_consumers("/", queue))) == 2
        channel_a.basic_cancel(tag_a)
        time.sleep(GRACE_MS / 1000 * 3)  # several cleaner passes
        assert queue_exists(first, queue)  # one consumer left, on the other proxy
        channel_b.basic_cancel(tag_b)
        assert not queue_exists(first, queue)  # deleted before cancel-ok was answered
    finally:
        a.close()
        b.close()


def test_an_auto_delete_queue_without_any_consumer_ever_stays(
    start: Callable[[], ProxyThread],
) -> None:
    proxy = start()
    queue = unique("auto")
    with connect(proxy) as conn:
        channel = conn.channel()
        channel.queue_declare(queue, auto_delete=True)
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"x")
        assert channel.basic_get(queue, auto_ack=True)[2] == b"x"
        time.sleep(GRACE_MS / 1000 * 3)
        assert channel.queue_declare(queue, passive=True).method.consumer_count == 0
        channel.queue_delete(queue)


def test_an_auto_delete_queue_goes_when_its_consumer_closes_its_channel(
    start: Callable[[], ProxyThread],
) -> None:
    proxy = start()
    queue = unique("auto")
    with connect(proxy) as conn:
        channel = conn.channel()
        channel.queue_declare(queue, auto_delete=True)
        channel.basic_consume(queue, lambda *args: None)
        channel.close()
        assert eventually(lambda: not queue_exists(proxy, queue), 10)


def test_the_cleaner_deletes_an_auto_delete_queue_whose_consumer_record_vanished(
    start: Callable[[], ProxyThread], zookeeper: ZooKeeperClient, paths: Paths
) -> None:
    """A proxy dying with the last consumer: its ephemeral consumer znode goes with its
    session (removed by hand here; the fault tests kill a proxy)."""
    proxy = start()
    queue = unique("auto")
    with connect(proxy) as conn:
        channel = conn.channel()
        channel.queue_declare(queue, auto_delete=True)
        channel.basic_consume(queue, lambda *args: None)
        base = paths.queue_consumers("/", queue)
        for child in zookeeper.children(base):
            zookeeper.delete(f"{base}/{child}")
        assert eventually(lambda: zookeeper.get(paths.queue("/", queue)) is None)


# ---- x-expires ---------------------------------------------------------------------------


def test_an_unused_queue_expires_and_a_consumed_one_does_not(
    start: Callable[[], ProxyThread], zookeeper: ZooKeeperClient, paths: Paths
) -> None:
    """Existence is read from ZooKeeper: a passive declare would count as a use (as in
    RabbitMQ, where queue.declare resets the expiry timer)."""
    proxy = start()
    idle, busy = unique("exp"), unique("exp")

    def exists(name: str) -> bool:
        return zookeeper.get(paths.queue("/", name)) is not None

    with connect(proxy) as conn:
        channel = conn.channel()
        declared = time.monotonic()
        channel.queue_declare(idle, arguments={"x-expires": 1500})
        channel.queue_declare(busy, arguments={"x-expires": 1500})
        tag = channel.basic_consume(busy, lambda *args: None)
        assert eventually(lambda: not exists(idle), 15)
        assert time.monotonic() - declared >= 1.4
        time.sleep(1.0)
        assert exists(busy)  # a consumer keeps it in use
        channel.basic_cancel(tag)
        cancelled = time.monotonic()
        assert eventually(lambda: not exists(busy), 15)
        assert time.monotonic() - cancelled >= 1.4
        assert not queue_exists(proxy, busy)


# ---- retired subscriptions: drained first, then deleted ------------------------------------


def test_an_unbound_subscription_stays_until_its_lag_is_acked_then_goes(
    start: Callable[[], ProxyThread],
    zookeeper: ZooKeeperClient,
    paths: Paths,
    admin: PulsarAdmin,
) -> None:
    proxy = start()
    exchange, queue = unique("ex"), unique("q")
    topic = naming.exchange_topic(NAMESPACE, exchange, "direct", "k")
    with connect(proxy) as conn:
        channel = conn.channel()
        channel.exchange_declare(exchange, "direct")
        channel.queue_declare(queue)
        channel.queue_bind(queue, exchange, "k")
        channel.confirm_delivery()
        for i in range(5):
            channel.basic_publish(exchange, "k", f"m{i}".encode())
        subscriptions = set(admin.subscription_stats(topic))
        assert len(subscriptions) == 1
        channel.queue_unbind(queue, exchange, "k")
        for i in range(3):
            channel.basic_publish(exchange, "k", f"late{i}".encode())  # unroutable now

        reader = connect(proxy)
        reading = reader.channel()
        reading.basic_qos(prefetch_count=10)
        received = []
        for method, _, body in reading.consume(queue, inactivity_timeout=3):
            if method is None:
                break
            received.append((method.delivery_tag, body))
        assert [b for _, b in received] == [f"m{i}".encode() for i in range(5)]

        # The lag is delivered but not acked: several passes leave the subscription alone.
        time.sleep(GRACE_MS / 1000 * 4)
        assert set(admin.subscription_stats(topic)) == subscriptions
        retired = [
            decode(zookeeper.get(f"{paths.retired('/')}/{c}")[0])  # type: ignore[index]
            for c in zookeeper.children(paths.retired("/"))
        ]
        assert [r.drain for r in retired if isinstance(r, RetiredSubscription)] == [True]

        for tag, _ in received[:4]:
            reading.basic_ack(tag)
        time.sleep(GRACE_MS / 1000 * 4)
        assert set(admin.subscription_stats(topic)) == subscriptions  # one still unacked

        reading.basic_ack(received[4][0])
        assert eventually(lambda: not admin.subscription_stats(topic))
        assert eventually(lambda: not zookeeper.children(paths.retired("/")))
        # The consumer that was reading it let go and goes on with the queue.
        channel.basic_publish("", queue, b"direct")
        method, _, body = next(reading.consume(queue, inactivity_timeout=10))
        assert body == b"direct"
        reading.basic_ack(method.delivery_tag)
        reader.close()
        channel.queue_delete(queue)
        channel.exchange_delete(exchange)


def test_drained_unbound_entries_of_a_shared_binding_set_are_pruned(
    start: Callable[[], ProxyThread], zookeeper: ZooKeeperClient, paths: Paths
) -> None:
    proxy = start()
    exchange, queue = unique("fan"), unique("q")
    with connect(proxy) as conn:
        channel = conn.channel()
        channel.exchange_declare(exchange, "fanout")
        channel.queue_declare(queue)
        for key in ("a", "b", "c"):
            channel.queue_bind(queue, exchange, key)
        channel.queue_unbind(queue, exchange, "a")
        channel.queue_unbind(queue, exchange, "b")
        base = paths.queue_bindings("/", queue)
        fanout_set = next(
            c for c in zookeeper.children(base) if c.startswith(naming.escape(exchange))
        )

        def entries() -> list[str]:
            found = zookeeper.get(f"{base}/{fanout_set}")
            assert found is not None
            record = decode(found[0])
            return [e.routing_key for e in record.entries]  # type: ignore[union-attr]

        assert eventually(lambda: entries() == ["c"])
        channel.confirm_delivery()
        channel.basic_publish(exchange, "", b"still routed")
        assert channel.queue_declare(queue, passive=True).method.message_count == 1
        channel.queue_delete(queue)
        channel.exchange_delete(exchange)


def test_messages_of_a_wait_queue_expire_after_the_cleaner_lead_moved(
    start: Callable[[], ProxyThread], zookeeper: ZooKeeperClient, paths: Paths
) -> None:
    """The expiry reaper runs on the cleaner's leader: a wait queue nobody reads still
    dead-letters its messages when the leader stops before they expire."""
    proxies = [start(), start()]
    observer = LeaderElection(zookeeper, paths.cleaner_election, "observer")
    assert eventually(lambda: len(zookeeper.children(paths.cleaner_election)) == 2)
    registered = {r.id: r for r in live_proxies(zookeeper, paths)}
    leader_id = observer.leader_identity()
    assert leader_id is not None
    leader_port = registered[leader_id].listeners[0].rsplit(":", 1)[1]
    leader = next(p for p in proxies if str(p.port) == leader_port)
    follower = next(p for p in proxies if p is not leader)
    wait_queue, work_queue = unique("wait"), unique("work")
    with connect(follower) as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.queue_declare(work_queue)
        channel.queue_declare(
            wait_queue,
            arguments={
                "x-message-ttl": 2000,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": work_queue,
            },
        )
        for i in range(3):
            channel.basic_publish("", wait_queue, f"m{i}".encode())
        leader.stop()
        bodies = []
        for method, _, body in channel.consume(work_queue, inactivity_timeout=WAIT):
            if method is None:
                break
            bodies.append(body)
            channel.basic_ack(method.delivery_tag)
            if len(bodies) == 3:
                break
        channel.cancel()
        assert sorted(bodies) == [b"m0", b"m1", b"m2"]
        # The leader acknowledged the sources: another proxy's count sees it within ~100 ms.
        assert eventually(
            lambda: channel.queue_declare(wait_queue, passive=True).method.message_count == 0, 5
        )
        channel.queue_delete(wait_queue)
        channel.queue_delete(work_queue)


def test_unacked_counts_are_published_per_proxy_and_their_folder_goes_with_the_queue(
    start: Callable[[], ProxyThread], zookeeper: ZooKeeperClient, paths: Paths
) -> None:
    proxy = start()
    queue = unique("held")
    folder = paths.held("/", queue)
    with connect(proxy) as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue)
        for i in range(3):
            channel.basic_publish("", queue, f"m{i}".encode())
        holder = conn.channel()
        tags = []
        for _ in range(2):
            method, _, _ = holder.basic_get(queue)
            while method is None:
                method, _, _ = holder.basic_get(queue)
            tags.append(method.delivery_tag)

        def written() -> list[bytes]:
            return [
                found[0]
                for child in zookeeper.children(folder)
                if (found := zookeeper.get(f"{folder}/{child}")) is not None
            ]

        assert eventually(lambda: written() == [b"2"], 5)
        holder.basic_ack(tags[0])
        assert eventually(lambda: written() == [b"1"], 5)
        # One held, one acked, one read ahead by the getter: one ready (once Pulsar heard
        # of the ack; docs/mapping.md#counts).
        assert eventually(
            lambda: channel.queue_declare(queue, passive=True).method.message_count == 1, 5
        )
        holder.basic_ack(tags[1])
        assert eventually(lambda: written() == [], 5)
        channel.queue_delete(queue)
    assert eventually(lambda: zookeeper.get(folder) is None)
