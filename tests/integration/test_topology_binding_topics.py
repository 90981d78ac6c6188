"""Topic and headers exchanges write each message only to the topics of the bindings that
route it (docs/mapping.md#exchanges---topics), counted message by message: many bindings on
one exchange, bindings made and removed while messages flow (on one proxy and across two),
bindings made by the version before binding topics, and the cleaner removing a retired
binding's topic. The tests with a `broker` run against RabbitMQ too
(STARLIGHT_TEST_AMQP_URL), so the expected figures are RabbitMQ's."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from starlight_py.backend.pulsar_admin import PulsarAdmin
from starlight_py.local import ServiceEndpoints
from starlight_py.metadata.records import Paths
from starlight_py.metadata.zookeeper import ZooKeeperClient
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.routing import topic_matches
from tests.integration.conftest import Broker, ProxyFactory
from tests.support.amqp_fixtures import Created
from tests.support.proxy_runner import ProxyThread

NAME_PREFIX = "bt"
NAMESPACE = NamespaceName("public", "default")
QUEUES = 250
PATTERNS_PER_QUEUE = 4  # 1,000 bindings on one exchange
WAIT = 20.0  # seconds: generous bound for messages to arrive and the cleaner to act


def patterns_of(i: int) -> list[str]:
    """Four bindings of queue i; several can match one key (the queue gets it once)."""
    return [f"k.{i}.*", f"k.*.{i % 7}", f"#.q{i % 50}", f"x.{i}.#"]


def keys() -> list[str]:
    found = [f"k.{a}.{a % 11}" for a in range(0, QUEUES, 3)]
    found += [f"z.q{b}" for b in range(0, 60, 4)]
    found += [f"x.{a}" for a in range(0, QUEUES, 17)]
    found += ["nothing.matches", "k", "k.1"]
    return found


def confirming(connection: pika.BlockingConnection) -> BlockingChannel:
    channel = connection.channel()
    channel.confirm_delivery()
    return channel


def get_all(
    channel: BlockingChannel, queue: str, expected: int, settle: float = 1.0
) -> list[bytes]:
    """Every message of `queue` with basic.get (auto-ack): waits for `expected` of them, then
    goes on until nothing came for `settle` seconds (a queue may hold more)."""
    bodies: list[bytes] = []
    deadline = time.monotonic() + WAIT
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            bodies.append(body)
            quiet_since = time.monotonic()
            continue
        if len(bodies) >= expected and time.monotonic() - quiet_since >= settle:
            break
        time.sleep(0.02)
    return bodies


def test_a_thousand_bindings_on_one_topic_exchange_route_each_message_once_per_queue(
    broker: Broker, created: Created
) -> None:
    exchange = created.exchange("many")
    queues = [created.queue(f"q{i}") for i in range(QUEUES)]
    with pika.BlockingConnection(pika.URLParameters(broker.url())) as connection:
        connection.channel().exchange_declare(exchange, "topic")

    def declare_and_bind(part: int) -> None:
        with pika.BlockingConnection(pika.URLParameters(broker.url())) as connection:
            channel = connection.channel()
            for i in range(part, QUEUES, 4):
                channel.queue_declare(queues[i])
                for pattern in patterns_of(i):
                    channel.queue_bind(queues[i], exchange, pattern)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(declare_and_bind, range(4)))

    expected: dict[str, list[bytes]] = {q: [] for q in queues}
    with pika.BlockingConnection(pika.URLParameters(broker.url())) as connection:
        channel = confirming(connection)
        for n, key in enumerate(keys()):
            body = f"{n}:{key}".encode()
            channel.basic_publish(exchange, key, body)
            for i, queue in enumerate(queues):
                if any(topic_matches(p, key) for p in patterns_of(i)):
                    expected[queue].append(body)
        assert sum(len(b) for b in expected.values()) > 200  # the keys reach many queues
        # Counts: exactly what was routed, on every queue (RabbitMQ's message_count).
        counts = {q: channel.queue_declare(q, passive=True).method.message_count for q in queues}
        want = {q: len(b) for q, b in expected.items()}
        deadline = time.monotonic() + WAIT
        while counts != want and time.monotonic() < deadline:
            time.sleep(0.2)
            counts = {
                q: channel.queue_declare(q, passive=True).method.message_count for q in queues
            }
        assert counts == want
        # Contents: each queue its matches, once each.
        for queue in queues[::10]:
            assert sorted(get_all(channel, queue, len(expected[queue]))) == sorted(expected[queue])


ROUND_ROBIN_QUEUES = 120
ROUND_ROBIN_ROUNDS = 5


@pytest.mark.parametrize("mode", ["transaction", "no confirms"])
def test_a_round_robin_over_new_binding_topics_delivers_each_message_once_in_order(
    broker: Broker, created: Created, mode: str
) -> None:
    """Each queue's first message is its binding topic's first: the proxy makes that
    topic's producer while the publisher goes on (gateway/publish/producer_pool.py), and what was
    sent meanwhile must be written in the order it was published, nothing lost, nothing
    twice; a commit answers only once all of it is stored."""
    exchange = created.exchange("rr")
    queues = [created.queue(f"rr{i}") for i in range(ROUND_ROBIN_QUEUES)]
    with pika.BlockingConnection(pika.URLParameters(broker.url())) as connection:
        channel = connection.channel()
        channel.exchange_declare(exchange, "topic")
        for i, queue in enumerate(queues):
            channel.queue_declare(queue)
            channel.queue_bind(queue, exchange, f"rr.{i}.*")
    with pika.BlockingConnection(pika.URLParameters(broker.url())) as connection:
        channel = connection.channel()
        if mode == "transaction":
            channel.tx_select()
        # Round robin: every queue's n-th message before any queue's (n+1)-th.
        for n in range(ROUND_ROBIN_ROUNDS):
            for i in range(ROUND_ROBIN_QUEUES):
                channel.basic_publish(exchange, f"rr.{i}.x", f"{i}:{n}".encode())
        if mode == "transaction":
            channel.tx_commit()
            # Committed means stored: counted at once (RabbitMQ: enqueued).
            assert {
                q: channel.queue_declare(q, passive=True).method.message_count for q in queues
            } == dict.fromkeys(queues, ROUND_ROBIN_ROUNDS)
        for i, queue in enumerate(queues):
            got = get_all(channel, queue, ROUND_ROBIN_ROUNDS, settle=0.2)
            assert got == [f"{i}:{n}".encode() for n in range(ROUND_ROBIN_ROUNDS)], queue


@dataclass
class Publishing:
    """A publisher thread sending numbered messages with confirms, one at a time."""

    url: str
    exchange: str
    key: str
    started: int = 0  # the number of the last message it began to send
    confirmed: int = 0  # the number of the last message confirmed
    stop: threading.Event = field(default_factory=threading.Event)
    error: list[BaseException] = field(default_factory=list)

    def run(self) -> None:
        try:
            with pika.BlockingConnection(pika.URLParameters(self.url)) as connection:
                channel = confirming(connection)
                n = 0
                while not self.stop.is_set():
                    n += 1
                    self.started = n
                    channel.basic_publish(self.exchange, self.key, str(n).encode())
                    self.confirmed = n
        except BaseException as e:
            self.error.append(e)


def bind_and_unbind_while_publishing(publisher_url: str, binder_url: str, created: Created) -> None:
    must: set[int] = set()  # numbers that must reach the queue
    # What each binding may have routed: the messages after those confirmed before the
    # bind was sent, up to those begun before unbind-ok (RabbitMQ routes one sent while a
    # bind or unbind is on its way either way).
    windows: list[tuple[int, int]] = []
    exchange = created.exchange("churn")
    queue = created.queue("churn")
    other = created.queue("always")  # keeps the exchange routing before and after
    with pika.BlockingConnection(pika.URLParameters(binder_url)) as connection:
        channel = connection.channel()
        channel.exchange_declare(exchange, "topic")
        channel.queue_declare(queue)
        channel.queue_declare(other)
        channel.queue_bind(other, exchange, "w.#")
    publishing = Publishing(publisher_url, exchange, "w.1")
    thread = threading.Thread(target=publishing.run, daemon=True)
    thread.start()
    try:
        with pika.BlockingConnection(pika.URLParameters(binder_url)) as connection:
            channel = connection.channel()
            for _ in range(3):
                # Bind and unbind several times while messages flow: each binding gets a
                # topic of its own, the unbound ones drain into the queue.
                before = publishing.confirmed
                while publishing.confirmed < before + 20:
                    time.sleep(0.005)
                unrouted_until = publishing.confirmed  # stored before the bind was sent
                channel.queue_bind(queue, exchange, "w.*")
                bound_at = publishing.started  # every later message must reach the queue
                while publishing.confirmed < bound_at + 40:
                    time.sleep(0.005)
                kept_until = publishing.confirmed  # confirmed while bound: in the queue
                channel.queue_unbind(queue, exchange, "w.*")
                unbound_at = publishing.started  # no later message may reach the queue
                must.update(range(bound_at + 1, kept_until + 1))
                windows.append((unrouted_until, unbound_at))
            last = publishing.confirmed
            while publishing.confirmed < last + 20:
                time.sleep(0.005)
    finally:
        publishing.stop.set()
        thread.join(30)
    assert not publishing.error, publishing.error
    total = publishing.confirmed
    with pika.BlockingConnection(pika.URLParameters(binder_url)) as connection:
        channel = connection.channel()
        got = [int(b) for b in get_all(channel, queue, len(must))]
        everything = [int(b) for b in get_all(channel, other, total)]
    assert len(got) == len(set(got))  # no message twice
    assert must <= set(got)  # none lost while bound
    # None routed outside a binding's window.
    assert all(any(start < n <= end for start, end in windows) for n in got)
    assert sorted(everything) == list(range(1, total + 1))


def test_binding_and_unbinding_while_publishing_loses_nothing_and_routes_nothing_extra(
    broker: Broker, created: Created
) -> None:
    bind_and_unbind_while_publishing(broker.url(), broker.url(), created)


def test_a_binding_made_on_another_proxy_routes_every_message_published_after_bind_ok(
    start_proxy: ProxyFactory, created: Created
) -> None:
    """Publishes through proxy A, binds through proxy B: bind-ok on B waits until A routes
    by the binding (metadata/routing_barrier.py)."""
    a, b = start_proxy(), start_proxy()
    bind_and_unbind_while_publishing(a.amqp_url(), b.amqp_url(), created)


def test_headers_bindings_across_two_proxies_route_by_all_and_any(
    start_proxy: ProxyFactory, created: Created
) -> None:
    a, b = start_proxy(), start_proxy()
    exchange = created.exchange("hdr")
    everything, some = created.queue("all"), created.queue("any")
    with pika.BlockingConnection(pika.URLParameters(b.amqp_url())) as connection:
        channel = connection.channel()
        channel.exchange_declare(exchange, "headers")
        channel.queue_declare(everything)
        channel.queue_declare(some)
        channel.queue_bind(everything, exchange, arguments={"x-match": "all", "a": 1, "b": 2})
        channel.queue_bind(some, exchange, arguments={"x-match": "any", "a": 1, "b": 2})
    with pika.BlockingConnection(pika.URLParameters(a.amqp_url())) as connection:
        channel = confirming(connection)
        sent = {
            b"both": {"a": 1, "b": 2},
            b"a": {"a": 1},
            b"b": {"b": 2, "c": 3},
            b"none": {"c": 3},
        }
        for body, headers in sent.items():
            channel.basic_publish(exchange, "", body, pika.BasicProperties(headers=headers))
        assert channel.queue_declare(everything, passive=True).method.message_count == 1
        assert sorted(get_all(channel, some, 3)) == [b"a", b"b", b"both"]
        assert get_all(channel, everything, 1) == [b"both"]


# ---- proxy-only: what the topics look like in Pulsar ------------------------------------


@pytest.fixture
def admin(services: ServiceEndpoints) -> PulsarAdmin:
    return PulsarAdmin(services.pulsar_web_url)


def topics_of(admin: PulsarAdmin, exchange: str) -> list[str]:
    prefix = f"persistent://{NAMESPACE}/{naming.escape(exchange)}"
    listed = admin._request("GET", f"/admin/v2/persistent/{NAMESPACE}")
    return sorted(t for t in listed if t == prefix or t.startswith(prefix + naming.SEPARATOR))


def test_a_binding_topic_is_made_by_its_first_message_and_removed_once_drained(
    start_proxy: ProxyFactory, admin: PulsarAdmin, services: ServiceEndpoints
) -> None:
    root = f"/bt-{uuid.uuid4().hex[:8]}"
    proxy = start_proxy(
        starlightMetadataRoot=root,
        subscriptionCleanerIntervalMillis="200",
        subscriptionCleanerGracePeriodMillis="600",
    )
    exchange, queue, quiet = (f"bt-{kind}-{uuid.uuid4().hex[:8]}" for kind in ("x", "q", "quiet"))
    with pika.BlockingConnection(pika.URLParameters(proxy.amqp_url())) as connection:
        channel = confirming(connection)
        channel.exchange_declare(exchange, "topic")
        channel.queue_declare(queue)
        channel.queue_declare(quiet)
        channel.queue_bind(queue, exchange, "a.*")
        channel.queue_bind(quiet, exchange, "b.*")
        # No topic yet: a binding's own topic is made by the first message it routes; none
        # for the exchange itself either: nothing reads it.
        assert topics_of(admin, exchange) == []
        assert channel.queue_declare(queue, passive=True).method.message_count == 0
        for n in range(5):
            channel.basic_publish(exchange, "a.x", f"m{n}".encode())
        topics = topics_of(admin, exchange)
        (own,) = topics
        assert naming.escape(queue) in own and naming.parse_binding_topic(own.rsplit("/", 1)[1])
        name = naming.TopicName(NAMESPACE, own.rsplit("/", 1)[1])
        stats = admin.subscription_stats(name)
        assert sum(s.backlog for s in stats.values()) == 5
        assert channel.queue_declare(queue, passive=True).method.message_count == 5
        assert channel.queue_declare(quiet, passive=True).method.message_count == 0
        # Unbound with 5 messages in it: it drains into the queue, then goes.
        channel.queue_unbind(queue, exchange, "a.*")
        assert topics_of(admin, exchange) == topics
        assert len(get_all(channel, queue, 5)) == 5
        zk = ZooKeeperClient(services.zookeeper)
        zk.start()
        try:
            retired = Paths(root).retired("/")

            def gone() -> bool:
                return topics_of(admin, exchange) == [] and not zk.children(retired)

            deadline = time.monotonic() + WAIT
            while not gone() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert gone()
            # The quiet queue's binding, never used, goes with no topic ever made.
            channel.queue_unbind(quiet, exchange, "b.*")
            assert not zk.children(retired)
            assert topics_of(admin, exchange) == []
        finally:
            zk.stop()
        channel.queue_delete(queue)
        channel.queue_delete(quiet)
        channel.exchange_delete(exchange)


def test_bindings_made_before_binding_topics_keep_routing(
    proxy: ProxyThread, created: Created, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A binding set of the previous version reads the exchange's topic: publishes write
    there too (with pre-acks for the queues it does not route), next to the new topics."""
    exchange, old, new = created.exchange("mixed"), created.queue("old"), created.queue("new")
    with pika.BlockingConnection(pika.URLParameters(proxy.amqp_url())) as connection:
        channel = confirming(connection)
        channel.exchange_declare(exchange, "topic")
        channel.queue_declare(old)
        channel.queue_declare(new)
        with monkeypatch.context() as previous_version:
            previous_version.setattr(naming, "OWN_TOPIC_EXCHANGE_TYPES", frozenset())
            channel.queue_bind(old, exchange, "o.*")
        channel.queue_bind(new, exchange, "n.*")
        for key in ["o.1", "n.1", "o.2", "x.1", "n.2", "n.3"]:
            channel.basic_publish(exchange, key, key.encode())
        assert sorted(get_all(channel, old, 2)) == [b"o.1", b"o.2"]
        assert sorted(get_all(channel, new, 3)) == [b"n.1", b"n.2", b"n.3"]
        # The old queue counts only what was routed to it (the others are pre-acked).
        for key in ["o.3", "n.4"]:
            channel.basic_publish(exchange, key, key.encode())

        def counts() -> tuple[int, int]:
            return (
                channel.queue_declare(old, passive=True).method.message_count,
                channel.queue_declare(new, passive=True).method.message_count,
            )

        deadline = time.monotonic() + WAIT
        while counts() != (1, 1) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert counts() == (1, 1)


def test_a_publish_right_after_bind_ok_through_another_proxy_reaches_the_queue(
    start_proxy: ProxyFactory, created: Created
) -> None:
    """The sharpest case of the routing barrier: proxy A publishes the moment proxy B
    answered bind-ok, before A's cache could have seen the binding by itself. Another
    queue routes every key, so A's cache finds a route and does not ask ZooKeeper."""
    a, b = start_proxy(), start_proxy()
    exchange = created.exchange("now")
    everything = created.queue("all")
    queues = [created.queue(f"now{i}") for i in range(20)]
    with (
        pika.BlockingConnection(pika.URLParameters(b.amqp_url())) as binder,
        pika.BlockingConnection(pika.URLParameters(a.amqp_url())) as publisher,
    ):
        binding = binder.channel()
        binding.exchange_declare(exchange, "topic")
        binding.queue_declare(everything)
        binding.queue_bind(everything, exchange, "now.#")
        for queue in queues:
            binding.queue_declare(queue)
        publishing = confirming(publisher)
        publishing.basic_publish(exchange, "now.first", b"first")  # A routes by `everything`
        for i, queue in enumerate(queues):
            binding.queue_bind(queue, exchange, f"now.{i}")
            publishing.basic_publish(exchange, f"now.{i}", str(i).encode())
        counts = [binding.queue_declare(q, passive=True).method.message_count for q in queues]
        assert counts == [1] * len(queues)
        assert binding.queue_declare(everything, passive=True).method.message_count == 21
