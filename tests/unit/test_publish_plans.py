"""The publish fast path (gateway/publish/publishing.py): routes kept per (exchange, routing
key) are used only while the topology is unchanged and their producer is in the pool, and
never for a route that depends on the message itself (priority bands, headers exchanges)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import trio
from pamqp import commands, header

from starlight_py.amqp.hot_frames import Publish
from starlight_py.backend.message_codec import IN_PRIORITY_BAND_KEY, ROUTING_KEY_KEY
from starlight_py.backend.pulsar_client import ProducerHandle
from starlight_py.core.channel import Channel
from starlight_py.gateway.publish.producer_pool import ProducerPool
from starlight_py.gateway.publish.publishing import Publisher, PublishOutcome, _settle
from starlight_py.gateway.topology_methods import VhostContext
from starlight_py.metadata.records import BindingSet
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.topology import Exchange, Queue

NAMESPACE = NamespaceName("public", "default")


class RawProducer:
    """Stands in for pulsar-client's producer and its flusher: records what is sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.tracked: list[bool] = []  # whether each send came with a callback of its own

    def send_async(self, message: Any, callback: Any) -> None:
        self.sent.append(message)
        self.tracked.append(callback is not None)

    def flush(self, callback: Any) -> None:
        if callback is not None:
            callback(0)  # pulsar_result_Ok


class Wrapper:
    def __init__(self) -> None:
        self._producer = RawProducer()


class Cache:
    """The watched topology cache, as far as the publish path reads it."""

    def __init__(self) -> None:
        self.changes = 0
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        self.priorities: dict[str, int] = {}
        self.routes: dict[tuple[str, str], set[str]] = {}  # (exchange, key) -> queues
        self.e2e_sources: set[str] = set()  # exchanges with exchange-to-exchange bindings
        self.own_topics: dict[str, str] = {}  # queue -> its binding topic (none: legacy)
        # Queues whose default-exchange binding the first publish makes (not made yet).
        self.without_default: set[str] = set()
        self.asked = 0

    def exchange(self, vhost: str, name: str) -> Exchange | None:
        self.asked += 1
        return self.exchanges.get(name)

    def queue(self, vhost: str, name: str) -> Queue | None:
        return self.queues.get(name)

    def has_route(self, vhost: str, exchange: Exchange, key: str, headers: Any) -> bool:
        if exchange.name == "":
            return key in self.queues
        return bool(self.routes.get((exchange.name, key)))

    def routed_queues(self, vhost: str, exchange: Exchange, key: str, headers: Any) -> set[str]:
        if exchange.name == "":
            return {key} if key in self.queues else set()
        return set(self.routes.get((exchange.name, key), set()))

    def routed_sets(
        self, vhost: str, exchange: Exchange, key: str, headers: Any
    ) -> list[BindingSet]:
        return [
            BindingSet(
                queue,
                exchange.name,
                exchange.name,
                f"{queue}~~0123456789ab",
                binding_topic=self.own_topics.get(queue, ""),
            )
            for queue in sorted(self.routed_queues(vhost, exchange, key, headers))
        ]

    def binding_set(self, vhost: str, queue: str, topic: str) -> BindingSet | None:
        if queue not in self.queues or queue in self.without_default:
            return None
        return BindingSet(queue, "", topic, f"{queue}~~0123456789ab", entries=())

    def reads_exchange_topic(self, vhost: str, exchange: str) -> bool:
        return not self.own_topics

    def has_exchange_bindings(self, vhost: str, source: str) -> bool:
        return source in self.e2e_sources

    def length_limits(self, vhost: str) -> dict[str, Any]:
        return {}

    def max_priorities(self, vhost: str) -> dict[str, int]:
        return self.priorities


class Sink:
    pending_output = 0

    def write_channel(self, channel: int, data: bytes) -> None:
        pass


def properties_of(**fields: Any) -> tuple[commands.Basic.Properties, bytes]:
    properties = commands.Basic.Properties(**fields)
    return properties, header.ContentHeader(0, 0, properties).marshal()[12:]


Setup = tuple[Publisher, Cache, ProducerPool, Channel]


def in_trio(test: Callable[[Setup], None]) -> Callable[[], None]:
    """Run the test body inside trio (the publish path reads trio's clock and its Batchers
    need a trio token), with a publisher on a fake cache and producer pool."""

    def run() -> None:
        async def main() -> None:
            cache = Cache()
            pool = ProducerPool(None)  # type: ignore[arg-type]
            ctx = VhostContext("/", NAMESPACE, "owner")
            publisher = Publisher(Sink(), ctx, cache, None, pool, lambda: None)  # type: ignore[arg-type]
            channel = Channel(1, Sink(), lambda c, s: None, frame_max=131072, clock=time.monotonic)
            test((publisher, cache, pool, channel))

        trio.run(main)

    run.__name__ = test.__name__
    return run


def flush(publisher: Publisher) -> None:
    """End of a read: flush, and hand the outcomes over as the Batcher would."""
    flushed: list[Any] = []
    publisher._flushed.put = flushed.append  # type: ignore[method-assign]
    publisher.flush()
    publisher._on_flushed(flushed)


def producer_for(pool: ProducerPool, topic: naming.TopicName) -> RawProducer:
    wrapper = Wrapper()
    handle = ProducerHandle(wrapper, 1000, topic, flusher=wrapper._producer)
    pool._producers[str(topic)] = handle
    raw: RawProducer = handle._raw
    return raw


@in_trio
def test_a_route_is_planned_once_and_used_while_the_topology_is_unchanged(setup: Setup) -> None:
    publisher, cache, pool, channel = setup
    cache.queues["q"] = Queue("q")
    raw = producer_for(pool, naming.exchange_topic(NAMESPACE, "", "direct", "q"))
    properties, encoded = properties_of(delivery_mode=2)
    publish = Publish("", "q", False, False)
    for _ in range(3):
        assert publisher.publish_now(channel, publish, properties, b"m", encoded)
    assert len(raw.sent) == 3
    assert list(publisher._plans) == [("", "q")]
    # The queue goes away: the next publish looks again and leaves it to the slow path.
    del cache.queues["q"]
    cache.changes += 1
    assert not publisher.publish_now(channel, publish, properties, b"m", encoded)
    assert len(raw.sent) == 3


@in_trio
def test_a_queue_without_its_default_binding_is_left_to_the_slow_path_which_makes_it(
    setup: Setup,
) -> None:
    publisher, cache, pool, channel = setup
    cache.queues["q"] = Queue("q")
    cache.without_default.add("q")
    raw = producer_for(pool, naming.exchange_topic(NAMESPACE, "", "direct", "q"))
    properties, encoded = properties_of()
    publish = Publish("", "q", False, False)
    # Nothing is written before the subscription exists (it would reach no queue).
    assert not publisher.publish_now(channel, publish, properties, b"m", encoded)
    assert raw.sent == []
    assert publisher._plans == {}
    # Made (the cache shows its binding set): the hot path takes it from then on.
    cache.without_default.clear()
    cache.changes += 1
    assert publisher.publish_now(channel, publish, properties, b"m", encoded)
    assert len(raw.sent) == 1


@in_trio
def test_a_topic_exchange_writes_only_to_the_binding_topics_of_the_queues_it_routes_to(
    setup: Setup,
) -> None:
    publisher, cache, pool, channel = setup
    cache.exchanges["t"] = Exchange("t", "topic")
    topics = {q: naming.binding_topic(NAMESPACE, "t", q, f"{i:012x}") for i, q in enumerate("abc")}
    cache.own_topics = {q: topic.local for q, topic in topics.items()}
    cache.routes[("t", "k.1")] = {"a"}
    cache.routes[("t", "k.2")] = {"b", "c"}
    raw = {q: producer_for(pool, topic) for q, topic in topics.items()}
    exchange_topic = producer_for(pool, naming.exchange_topic(NAMESPACE, "t", "topic", ""))
    properties, encoded = properties_of()
    for _ in range(2):
        assert publisher.publish_now(
            channel, Publish("t", "k.1", False, False), properties, b"1", encoded
        )
    assert publisher.publish_now(
        channel, Publish("t", "k.2", False, False), properties, b"2", encoded
    )
    assert [len(raw[q].sent) for q in "abc"] == [2, 1, 1]
    assert exchange_topic.sent == []
    # One queue reached: a plan; two: each publish looks again (one copy per queue).
    assert list(publisher._plans) == [("t", "k.1")]


@in_trio
def test_a_closed_producer_is_never_used_by_a_plan(setup: Setup) -> None:
    publisher, cache, pool, channel = setup
    cache.queues["q"] = Queue("q")
    topic = naming.exchange_topic(NAMESPACE, "", "direct", "q")
    producer_for(pool, topic)
    properties, encoded = properties_of()
    publish = Publish("", "q", False, False)
    assert publisher.publish_now(channel, publish, properties, b"m", encoded)
    flush(publisher)
    pool._producers[str(topic)].last_used = float("-inf")  # idle for long
    taken = pool.take_idle()
    assert [p.retired for p in taken] == [True]
    # The plan's producer is retired; there is no producer for the topic any more.
    assert not publisher.publish_now(channel, publish, properties, b"m", encoded)


@in_trio
def test_routes_that_depend_on_the_message_are_not_planned(setup: Setup) -> None:
    publisher, cache, pool, channel = setup
    cache.queues["prio"] = Queue("prio", arguments={"x-max-priority": 5})
    cache.priorities["prio"] = 5
    for band in range(6):
        producer_for(pool, naming.priority_band_topic(NAMESPACE, "prio", band))
    publish = Publish("", "prio", False, False)
    for priority in (1, 4):
        properties, encoded = properties_of(priority=priority)
        assert publisher.publish_now(channel, publish, properties, b"m", encoded)
    assert publisher._plans == {}
    sent_to = {
        str(topic): handle._raw.sent
        for topic, handle in pool._producers.items()
        if handle._raw.sent
    }
    assert len(sent_to) == 2  # two priorities, two bands


@in_trio
def test_exchanges_with_exchange_to_exchange_bindings_are_left_to_the_slow_path(
    setup: Setup,
) -> None:
    publisher, cache, pool, channel = setup
    cache.exchanges["x"] = Exchange("x", "direct")
    cache.routes[("x", "k")] = {"q"}
    producer_for(pool, naming.exchange_topic(NAMESPACE, "x", "direct", "k"))
    properties, encoded = properties_of()
    publish = Publish("x", "k", False, False)
    assert publisher.publish_now(channel, publish, properties, b"m", encoded)
    # An exchange.bind with "x" as its source: the plan is stale, and none is made again.
    cache.e2e_sources.add("x")
    cache.changes += 1
    assert not publisher.publish_now(channel, publish, properties, b"m", encoded)
    assert publisher._plans[("x", "k")].version == 0  # the old one, never replaced


@in_trio
def test_headers_exchanges_are_not_planned(setup: Setup) -> None:
    publisher, cache, pool, channel = setup
    cache.exchanges["h"] = Exchange("h", "headers")
    cache.routes[("h", "")] = {"q"}
    raw = producer_for(pool, naming.exchange_topic(NAMESPACE, "h", "headers", ""))
    properties, encoded = properties_of(headers={"a": 1})
    assert publisher.publish_now(channel, Publish("h", "", False, False), properties, b"m", encoded)
    assert len(raw.sent) == 1
    assert publisher._plans == {}


@in_trio
def test_property_maps_name_the_exchange_and_routing_key(setup: Setup) -> None:
    publisher, cache, pool, channel = setup
    cache.exchanges["x"] = Exchange("x", "direct")
    cache.routes[("x", "k")] = {"q"}
    producer_for(pool, naming.exchange_topic(NAMESPACE, "x", "direct", "k"))
    properties, encoded = properties_of(content_type="text/plain")
    publish = Publish("x", "k", False, False)
    assert publisher.publish_now(channel, publish, properties, b"m", encoded)
    assert publisher.publish_now(channel, publish, properties, b"m", encoded)
    [plan] = publisher._plans.values()
    [mapped] = plan.properties.values()
    assert mapped[ROUTING_KEY_KEY] == "k" and mapped["amqp.exchange"] == "x"
    assert IN_PRIORITY_BAND_KEY not in mapped


@in_trio
def test_confirms_come_from_the_flush(setup: Setup) -> None:
    publisher, cache, pool, channel = setup
    cache.queues["q"] = Queue("q")
    producer_for(pool, naming.exchange_topic(NAMESPACE, "", "direct", "q"))
    channel.confirm_select(nowait=True)
    properties, encoded = properties_of()
    for _ in range(3):
        publisher.publish_now(channel, Publish("", "q", False, False), properties, b"m", encoded)
    assert channel.unconfirmed == 3
    handle = next(iter(pool._producers.values()))
    assert handle.in_flight == 3
    flush(publisher)
    assert channel.unconfirmed == 0
    assert handle.in_flight == 0


class PreAcksStandIn:
    """PreAcks as the publish path asks it: right after a topology change every publish to
    a shared topic is pre-acknowledged, to be safe; once settled, only unrouted ones."""

    def __init__(self) -> None:
        self.settled_now = False

    def settled(self) -> bool:
        return self.settled_now

    def wanted(self, vhost: str, exchange: Exchange, key: str, headers: Any) -> bool:
        return not self.settled_now  # the fanout's bindings all route every message

    def stored_callback(self, *args: Any) -> Callable[[Any, Any], None]:
        return lambda position, message_id: None


@in_trio
def test_a_route_is_not_planned_while_pre_acks_are_asked_for_a_recent_change(
    setup: Setup,
) -> None:
    publisher, cache, pool, channel = setup
    pre_acks = PreAcksStandIn()
    publisher.planner.pre_acks = pre_acks  # type: ignore[assignment]
    cache.exchanges["fan"] = Exchange("fan", "fanout")
    cache.routes[("fan", "")] = {"a", "b"}
    raw = producer_for(pool, naming.exchange_topic(NAMESPACE, "fan", "fanout", ""))
    properties, encoded = properties_of()
    publish = Publish("fan", "", False, False)
    assert publisher.publish_now(channel, publish, properties, b"m", encoded)
    assert raw.tracked == [True]  # pre-acknowledged, to be safe
    assert not publisher._plans
    pre_acks.settled_now = True
    for _ in range(2):
        assert publisher.publish_now(channel, publish, properties, b"m", encoded)
    assert raw.tracked == [True, False, False]
    assert list(publisher._plans) == [("fan", "")]


class Target:
    """An OutcomeTarget that records what is settled."""

    def __init__(self) -> None:
        self.next = 0

    def reserve_publish(self) -> int:
        self.next += 1
        return self.next

    def settle_publishes(self, outcomes: list[tuple[int, bool]]) -> None:
        raise AssertionError("_settle only collects")


def test_settle_confirms_each_publish_once_its_last_copy_is_answered() -> None:
    first, second = Target(), Target()
    two_copies = PublishOutcome(first, 1, 2, False)
    refused = PublishOutcome(first, 2, 1, True)
    other = PublishOutcome(second, 7, 1, False)
    later = PublishOutcome(first, 3, 1, False)
    by_target: dict[Any, list[tuple[int, bool]]] = {}

    _settle([two_copies, refused, other, later], True, by_target)
    # The two-copy publish waits for its other copy; a refused one is nacked; targets
    # keep their publishes in order.
    assert by_target == {first: [(2, False), (3, True)], second: [(7, True)]}

    _settle((two_copies,), False, by_target)  # its other copy failed: nacked
    assert by_target[first] == [(2, False), (3, True), (1, False)]
    assert two_copies.left == 0


def test_settle_nacks_every_outcome_of_a_failed_flush_even_before_its_last_copy() -> None:
    target = Target()
    two_copies = PublishOutcome(target, 1, 2, False)
    by_target: dict[Any, list[tuple[int, bool]]] = {}
    _settle([two_copies], False, by_target)
    assert by_target == {}
    _settle([two_copies], True, by_target)  # the other copy was stored, the first was not
    assert by_target == {target: [(1, False)]}
