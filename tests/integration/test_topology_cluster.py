"""Several proxies, one broker: what one proxy declares, the others see; races converge."""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pika.exceptions
import pytest

from starlight_py.backend.pulsar_admin import PulsarAdmin
from starlight_py.local import ServiceEndpoints
from starlight_py.metadata.cache import TopologyCache
from starlight_py.metadata.records import Paths
from starlight_py.metadata.zookeeper import ZooKeeperClient
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from tests.integration.conftest import ProxyFactory
from tests.support.proxy_runner import ProxyThread

ROOT = "/starlight"
NAMESPACE = NamespaceName("public", "default")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def connect(proxy: ProxyThread) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))


@pytest.fixture
def zookeeper(services: ServiceEndpoints) -> Iterator[ZooKeeperClient]:
    client = ZooKeeperClient(services.zookeeper)
    client.start()
    yield client
    client.stop()


@pytest.fixture
def admin(services: ServiceEndpoints) -> PulsarAdmin:
    return PulsarAdmin(services.pulsar_web_url)


def subscriptions_on(admin: PulsarAdmin, local_topic: str) -> set[str]:
    return set(admin.subscription_stats(naming.TopicName(NAMESPACE, local_topic)))


def test_what_one_proxy_declares_another_serves(start_proxy: ProxyFactory) -> None:
    first, second = start_proxy(), start_proxy()
    exchange, queue = unique("ex"), unique("q")
    with connect(first) as a:
        channel = a.channel()
        channel.exchange_declare(exchange, "topic")
        channel.queue_declare(queue)
        channel.queue_bind(queue, exchange, "orders.*")
    with connect(second) as b:
        channel = b.channel()
        channel.exchange_declare(exchange, passive=True)
        assert channel.queue_declare(queue, passive=True).method.queue == queue
        channel.queue_bind(queue, exchange, "orders.*")  # idempotent, on the other proxy
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.exchange_declare(exchange, "fanout")
        assert info.value.reply_code == 406
        b.channel().queue_delete(queue)
    with connect(first) as a, pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        a.channel().queue_declare(queue, passive=True)
    assert info.value.reply_code == 404


def test_a_proxy_started_from_nothing_serves_the_same_topology(
    start_proxy: ProxyFactory,
) -> None:
    first = start_proxy()
    exchange, queue = unique("ex"), unique("q")
    with connect(first) as a:
        channel = a.channel()
        channel.exchange_declare(exchange, "direct", durable=True)
        channel.queue_declare(queue, durable=True, arguments={"x-message-ttl": 60000})
        channel.queue_bind(queue, exchange, "k")
    first.stop()
    fresh = start_proxy()
    with connect(fresh) as b:
        channel = b.channel()
        channel.exchange_declare(exchange, passive=True)
        channel.queue_declare(queue, durable=True, arguments={"x-message-ttl": 60000})
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.queue_declare(queue, durable=True, arguments={"x-message-ttl": 1000})
        assert info.value.reply_code == 406
        assert "x-message-ttl" in info.value.reply_text


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def test_cache_propagation_to_another_proxy_is_measured(
    start_proxy: ProxyFactory, zookeeper: ZooKeeperClient
) -> None:
    """What one proxy writes reaches another proxy's routing cache; the delays are printed
    (and recorded in docs/metadata.md), not asserted beyond 'it arrives'."""
    proxy = start_proxy()
    observer = TopologyCache(zookeeper, Paths(ROOT))  # what any other proxy runs
    observer.start()
    assert observer.ready.wait(30)
    delays: dict[str, list[float]] = {"exchange.declare": [], "queue.bind": []}
    with connect(proxy) as connection:
        channel = connection.channel()
        queue = unique("q")
        channel.queue_declare(queue, exclusive=True)
        for _ in range(40):
            exchange = unique("ex")
            channel.exchange_declare(exchange, "fanout")
            acked = time.monotonic()
            assert observer.wait_until(lambda e=exchange: observer.exchange("/", e) is not None, 10)
            delays["exchange.declare"].append(time.monotonic() - acked)
            channel.queue_bind(queue, exchange)
            acked = time.monotonic()
            assert observer.wait_until(
                lambda e=exchange: bool(observer.binding_sets_of_exchange("/", e)), 10
            )
            delays["queue.bind"].append(time.monotonic() - acked)
    observer.close()
    for what, values in delays.items():
        ms = [v * 1000 for v in values]
        print(
            f"\ncache propagation after {what}-ok: n={len(ms)} "
            f"p50={statistics.median(ms):.1f} ms p99={percentile(ms, 0.99):.1f} ms "
            f"max={max(ms):.1f} ms"
        )


def test_znodes_are_what_docs_metadata_says(
    start_proxy: ProxyFactory, zookeeper: ZooKeeperClient, admin: PulsarAdmin
) -> None:
    proxy = start_proxy()
    exchange, queue = unique("ex x"), unique("q/1")
    with connect(proxy) as connection:
        channel = connection.channel()
        channel.exchange_declare(exchange, "headers", arguments={"alternate-exchange": "ae"})
        channel.queue_declare(queue, arguments={"x-max-length": 10})
        channel.queue_bind(queue, exchange, "", arguments={"x-match": "any", "a": 1})

    def record(path: str) -> dict[str, Any]:
        found = zookeeper.get(path)
        assert found is not None, path
        body: dict[str, Any] = json.loads(found[0])
        assert body["schema"] == 1
        return body

    vhost = f"{ROOT}/v1/vhosts/~2F"
    assert record(vhost) == {
        "schema": 1,
        "kind": "vhost",
        "name": "/",
        "namespace": "public/default",
        "explicit": False,
    }
    for predeclared in ("amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"):
        assert record(f"{vhost}/exchanges/{predeclared}")["kind"] == "exchange"
    ex_segment, q_segment = naming.escape(exchange), naming.escape(queue)
    assert record(f"{vhost}/exchanges/{ex_segment}") == {
        "schema": 1,
        "kind": "exchange",
        "name": exchange,
        "type": "headers",
        "durable": False,
        "auto_delete": False,
        "internal": False,
        "arguments": {"alternate-exchange": "ae"},
    }
    queue_record = record(f"{vhost}/queues/{q_segment}")
    assert queue_record["arguments"] == {"x-max-length": 10}
    assert (queue_record["durable"], queue_record["exclusive"]) == (False, False)
    # The headers binding: one set per topic. The implicit default-exchange binding is made
    # by the first publish through the default exchange (below).
    sets = sorted(zookeeper.children(f"{vhost}/queues/{q_segment}/bindings"))
    assert sets == [ex_segment]
    binding = record(f"{vhost}/queues/{q_segment}/bindings/{ex_segment}")
    assert binding["kind"] == "binding_set"
    assert (binding["queue"], binding["exchange"], binding["topic"]) == (
        queue,
        exchange,
        ex_segment,
    )
    assert binding["entries"] == [
        {
            "routing_key": "",
            "arguments": {"x-match": "any", "a": 1},
            "start": None,
            "end": None,
            "unbound": False,
        }
    ]
    assert binding["subscription"].startswith(q_segment + "~~")
    # A headers exchange's binding reads a topic of its own: <exchange>~~<queue>~~<set id>.
    set_id = binding["subscription"].rsplit("~~", 1)[1]
    assert binding["binding_topic"] == f"{ex_segment}~~{q_segment}~~{set_id}"
    assert zookeeper.children(f"{vhost}/exchanges/{ex_segment}/bound") == [
        f"{q_segment}~~{ex_segment}"
    ]
    # Neither topic nor subscription yet: the first message the binding routes makes them.
    assert binding["made"] is False
    assert subscriptions_on(admin, binding["binding_topic"]) == set()
    with connect(proxy) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(exchange, "", b"first", pika.BasicProperties(headers={"a": 1}))
    made = record(f"{vhost}/queues/{q_segment}/bindings/{ex_segment}")
    assert "made" not in made and {**made, "made": False} == binding
    # ...and the subscription it names exists in Pulsar, on that topic.
    assert subscriptions_on(admin, binding["binding_topic"]) == {binding["subscription"]}
    with connect(proxy) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"first through the default exchange")
    default = record(f"{vhost}/queues/{q_segment}/bindings/amq.default~~{q_segment}")
    assert (default["queue"], default["exchange"], default["topic"]) == (
        queue,
        "",
        f"amq.default~~{q_segment}",
    )
    assert [e["routing_key"] for e in default["entries"]] == [queue]
    assert "binding_topic" not in default  # it reads the topic of its exchange (and key)
    assert subscriptions_on(admin, f"amq.default~~{q_segment}") == {default["subscription"]}


def run_together(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run calls in threads released at the same moment; returns results or exceptions."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(index: int, call: Callable[[], Any]) -> None:
        barrier.wait()
        try:
            results[index] = call()
        except Exception as e:
            results[index] = e

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return results


def test_concurrent_equivalent_declares_on_two_proxies_make_one_queue(
    start_proxy: ProxyFactory, zookeeper: ZooKeeperClient, admin: PulsarAdmin
) -> None:
    proxies = [start_proxy(), start_proxy()]
    queue = unique("race")
    connections = [connect(proxies[i % 2]) for i in range(10)]

    def declare(connection: pika.BlockingConnection) -> Callable[[], str]:
        return lambda: connection.channel().queue_declare(queue, durable=True).method.queue

    results = run_together([declare(c) for c in connections])
    assert results == [queue] * 10
    q_segment = naming.escape(queue)
    bindings = f"{ROOT}/v1/vhosts/~2F/queues/{q_segment}/bindings"
    assert zookeeper.children(bindings) == []  # made by the first default-exchange publish

    def publish(connection: pika.BlockingConnection, index: int) -> Callable[[], None]:
        def call() -> None:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish("", queue, f"m{index}".encode())

        return call

    # Ten first publishes at once, through both proxies, each making the default-exchange
    # binding when its proxy has not seen it yet: one binding set, one subscription left
    # (each loser deleted its own), and every message in the queue.
    assert run_together([publish(c, i) for i, c in enumerate(connections)]) == [None] * 10
    assert zookeeper.children(bindings) == [f"amq.default~~{q_segment}"]
    assert len(subscriptions_on(admin, f"amq.default~~{q_segment}")) == 1
    channel = connections[0].channel()
    got = set()
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.add(body)
    for connection in connections:
        connection.close()
    assert got == {f"m{i}".encode() for i in range(10)}


def test_conflicting_concurrent_declares_have_one_winner_and_406s(
    start_proxy: ProxyFactory,
) -> None:
    proxies = [start_proxy(), start_proxy()]
    queue = unique("conflict")
    connections = [connect(proxies[i % 2]) for i in range(8)]

    def declare(connection: pika.BlockingConnection, durable: bool) -> Callable[[], bool]:
        def call() -> bool:
            connection.channel().queue_declare(queue, durable=durable)
            return durable

        return call

    results = run_together([declare(c, i % 2 == 0) for i, c in enumerate(connections)])
    winners = {r for r in results if isinstance(r, bool)}
    losers = [r for r in results if isinstance(r, Exception)]
    assert len(winners) == 1, results  # everyone who succeeded asked for the same thing
    assert losers and all(
        isinstance(e, pika.exceptions.ChannelClosedByBroker) and e.reply_code == 406 for e in losers
    ), results
    (durable,) = winners
    with connect(proxies[0]) as connection:
        connection.channel().queue_declare(queue, durable=durable)  # the survivor's shape
        connection.channel().queue_delete(queue)
    for connection in connections:
        if connection.is_open:
            connection.close()


def test_delete_racing_bind_leaves_no_orphans(
    start_proxy: ProxyFactory, zookeeper: ZooKeeperClient, admin: PulsarAdmin
) -> None:
    proxies = [start_proxy(), start_proxy()]
    exchange = unique("ex")
    with connect(proxies[0]) as connection:
        connection.channel().exchange_declare(exchange, "fanout")
    ex_segment = naming.escape(exchange)
    binder, deleter = connect(proxies[0]), connect(proxies[1])
    outcomes = []
    for _ in range(12):
        queue = unique("q")
        with connect(proxies[0]) as connection:
            connection.channel().queue_declare(queue)
        results = run_together(
            [
                lambda q=queue: binder.channel().queue_bind(q, exchange),
                lambda q=queue: deleter.channel().queue_delete(q),
            ]
        )
        outcomes.append(tuple(type(r).__name__ for r in results))
        bind_result = results[0]
        if isinstance(bind_result, Exception):
            assert isinstance(bind_result, pika.exceptions.ChannelClosedByBroker)
            assert bind_result.reply_code == 404
        q_segment = naming.escape(queue)
        # The queue is gone (the delete always wins in the end), and with it every trace.
        assert zookeeper.get(f"{ROOT}/v1/vhosts/~2F/queues/{q_segment}") is None
        assert (
            zookeeper.get(
                f"{ROOT}/v1/vhosts/~2F/exchanges/{ex_segment}/bound/{q_segment}~~{ex_segment}"
            )
            is None
        )

        # Pulsar's side goes right after delete-ok (topology/background_work.py).
        def leftover(q_segment: str = q_segment) -> set[str]:
            return {s for s in subscriptions_on(admin, ex_segment) if s.startswith(q_segment)}

        deadline = time.monotonic() + 30
        while leftover() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert leftover() == set(), (outcomes[-1], leftover())
    binder.close()
    deleter.close()
    print("\nbind/delete outcomes:", outcomes)


def test_an_exchange_binding_made_on_one_proxy_routes_on_another(
    start_proxy: ProxyFactory, zookeeper: ZooKeeperClient
) -> None:
    first, second = start_proxy(), start_proxy()
    source, destination, queue = unique("e2e-src"), unique("e2e-dst"), unique("e2e-q")
    with connect(first) as a:
        channel = a.channel()
        channel.exchange_declare(source, "topic")
        channel.exchange_declare(destination, "fanout")
        channel.queue_declare(queue)
        channel.queue_bind(queue, destination, "")
        channel.queue_bind(queue, source, "#")  # reachable twice: gets each message once
        channel.exchange_bind(destination, source, "a.*")
    vhost = f"{ROOT}/v1/vhosts/~2F"
    (entry,) = zookeeper.children(f"{vhost}/exchanges/{naming.escape(source)}/e2e")
    assert entry.startswith(naming.escape(destination) + "~~")
    found = zookeeper.get(f"{vhost}/exchanges/{naming.escape(source)}/e2e/{entry}")
    assert found is not None
    assert json.loads(found[0]) == {
        "schema": 1,
        "kind": "exchange_binding",
        "source": source,
        "destination": destination,
        "routing_key": "a.*",
        "arguments": {},
    }
    assert zookeeper.children(f"{vhost}/exchanges/{naming.escape(destination)}/e2e-in") == [
        naming.escape(source) + entry[entry.index("~~") :]
    ]
    time.sleep(0.5)  # the second proxy's cache follows within milliseconds
    with connect(second) as b:
        channel = b.channel()
        channel.confirm_delivery()
        channel.basic_publish(source, "a.b", b"through")
        bodies = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            method, _, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                if bodies:
                    break
                time.sleep(0.05)
                continue
            bodies.append(body)
        time.sleep(0.5)
        assert channel.basic_get(queue, auto_ack=True)[0] is None
        assert bodies == [b"through"]
        channel.exchange_delete(destination)
        channel.queue_delete(queue)
        channel.exchange_delete(source)
    assert zookeeper.get(f"{vhost}/exchanges/{naming.escape(source)}") is None


def test_a_queue_declared_again_gets_what_another_proxy_publishes_after_declare_ok(
    start_proxy: ProxyFactory,
) -> None:
    """Delete, declare again, publish through the other proxy at once: the new queue's
    default-exchange subscription is made by that publish (the other proxy's cache no
    longer routes by the deleted queue's once delete-ok is sent), so nothing goes to a
    topic the new queue does not read. As on RabbitMQ, every message arrives."""
    proxies = [start_proxy(), start_proxy()]
    queue = unique("again")
    with connect(proxies[0]) as first, connect(proxies[1]) as second:
        changer = first.channel()
        publisher = second.channel()
        publisher.confirm_delivery()
        for round_number in range(10):
            changer.queue_declare(queue)
            publisher.basic_publish("", queue, f"r{round_number}".encode())
            method, _, body = changer.basic_get(queue, auto_ack=True)
            assert method is not None, round_number
            assert body == f"r{round_number}".encode()
            changer.queue_delete(queue)
