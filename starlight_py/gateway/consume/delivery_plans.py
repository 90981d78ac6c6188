"""What every delivery of one AMQP consumer from one Pulsar consumer has in common, worked
out once per change of the topology cache instead of once per message.

`Consumers.vet` asks, for each message it delivers, which binding set of the queue is on
the message's topic, which exchange and routing key the topic stands for, the queue's
record and whether its policy checks deliveries (TTL, delivery limit). None of that
depends on the message: a `DeliveryPlan` keeps it, with the binding keys that route
without a window (bound since the subscription was made, still bound). A message the
plan cannot settle alone (special properties, a routing key no such binding takes, a
headers exchange) takes the general path, which decides everything again."""

from __future__ import annotations

from typing import Protocol

from starlight_py.gateway.dead_lettering import policy_of
from starlight_py.metadata.records import BindingSet, RetiredSubscription
from starlight_py.model import naming
from starlight_py.model.priorities import PRIORITY_BAND_TYPE
from starlight_py.model.routing import topic_matches
from starlight_py.model.topology import Queue

MAX_REMEMBERED_KEYS = 256  # routing keys a topic exchange's plan remembers the match of


class PlanSource(Protocol):
    """What a plan reads of the topology cache (metadata/cache.py's TopologyCache)."""

    changes: int

    def binding_set_reading(self, vhost: str, queue: str, topic: str) -> BindingSet | None: ...

    def retired(self, vhost: str, subscription: str) -> RetiredSubscription | None: ...

    def queue(self, vhost: str, name: str) -> Queue | None: ...


class PlannedLink(Protocol):
    """What a plan reads of the consumer (gateway/consume/consuming.py's ConsumerLink)."""

    queue: str
    record: Queue | None
    known_sets: dict[str, BindingSet]


class DeliveryPlan:
    """One consumer's view of one topic, valid while `version` is the cache's `changes`."""

    __slots__ = (
        "_matched",
        "_patterns",
        "checks_deliveries",
        "exchange",
        "exchange_type",
        "key",
        "keys",
        "record",
        "routes_all",
        "version",
    )

    def __init__(
        self,
        version: int,
        exchange: str,
        key: str,
        record: Queue | None,
        binding_set: BindingSet | None,
    ) -> None:
        self.version = version
        self.exchange = exchange  # for a message without its own (a Pulsar-native one)
        self.key = key
        self.record = record
        self.checks_deliveries = policy_of(record).checks_deliveries
        self.exchange_type = binding_set.exchange_type if binding_set is not None else ""
        # The binding keys that route everything matching them: no window to check.
        unconditional = (
            [e.routing_key for e in binding_set.entries if e.start is None and not e.unbound]
            if binding_set is not None
            else []
        )
        self.routes_all = (
            binding_set is None
            or self.exchange_type == PRIORITY_BAND_TYPE
            or (self.exchange_type == "fanout" and bool(unconditional))
        )
        self.keys = frozenset(unconditional)
        self._patterns = tuple(unconditional) if self.exchange_type == "topic" else ()
        self._matched: dict[str, bool] = {}

    def routes(self, routing_key: str) -> bool:
        """True when the queue gets a message with this routing key without looking at the
        message further; False means "ask the general path", never "not routed"."""
        if self.routes_all:
            return True
        kind = self.exchange_type
        if kind == "topic":
            matched = self._matched.get(routing_key)
            if matched is None:
                matched = any(topic_matches(p, routing_key) for p in self._patterns)
                if len(self._matched) >= MAX_REMEMBERED_KEYS:
                    self._matched.clear()
                self._matched[routing_key] = matched
            return matched
        if kind in ("headers", "fanout"):
            return False  # headers: the message's own headers decide
        return routing_key in self.keys  # direct and the default exchange


def current_binding_set(
    cache: PlanSource, vhost: str, queue: str, known_sets: dict[str, BindingSet], topic: str
) -> BindingSet | None:
    """The bindings of `queue` read from `topic` (a local topic name: the exchange's, or
    the bindings' own), from the freshest state: the cache, else what the consumer read
    from ZooKeeper (`known_sets`, by the topic read), bounded by a retired subscription's
    end."""
    binding_set = cache.binding_set_reading(vhost, queue, topic)
    if binding_set is not None:
        return binding_set
    known = known_sets.get(topic)
    retired = cache.retired(vhost, known.subscription) if known else None
    if retired is not None and retired.binding_set is not None:
        return retired.binding_set  # unbound: routes only up to its end
    return known  # the cache has not caught up with a new binding yet


def plan_deliveries(cache: PlanSource, vhost: str, link: PlannedLink, topic: str) -> DeliveryPlan:
    """The plan for `link`'s messages read from `topic` (a local topic name)."""
    version = cache.changes  # read first: a change made meanwhile makes a new plan next time
    binding_set = current_binding_set(cache, vhost, link.queue, link.known_sets, topic)
    exchange, key = naming.exchange_and_key_of_topic(topic)
    record = cache.queue(vhost, link.queue) or link.record
    return DeliveryPlan(version, exchange, key or "", record, binding_set)
