"""Publishing through exchange-to-exchange bindings (docs/mapping.md#exchange-to-exchange-bindings).

A message published to an exchange that is the source of exchange-to-exchange bindings
reaches other exchanges (model.routing.exchanges_reached). It is written once to the topic of
each reached exchange whose own bindings route it to a queue not served by an earlier one;
every copy lists the queues that get the message from an earlier copy, and their
subscriptions skip it (backend.message_codec.skipped_by), so each queue gets it once.

Such publishes never use the hot path's route plans (gateway/publish/publishing.py): they take the
slow path, which asks this module where the copies go.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import trio

from starlight_py.backend.message_codec import (
    REFUSED_BY_KEY,
    ROUTED_ELSEWHERE_KEY,
    refused_by_value,
)
from starlight_py.gateway.publish.message_copies import (
    has_own_topics,
    message_copies,
    own_topics_of,
)
from starlight_py.gateway.publish.pre_acks import PreAcks, StoredCallback
from starlight_py.metadata.cache import TopologyCache
from starlight_py.metadata.records import ExchangeBinding
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.routing import assign_queues, exchanges_reached
from starlight_py.model.topology import Exchange
from starlight_py.topology.exchange_bindings import ExchangeBindings
from starlight_py.topology.service import TopologyService

# (the exchange whose topic gets a copy, the queues whose subscriptions skip that copy)
ChainCopies = list[tuple[Exchange, frozenset[str]]]
# How long after a topology change the cache may not show it yet (it usually shows it
# within milliseconds): meanwhile an exchange it finds no new queue for is checked in
# ZooKeeper.
CACHE_LAG = 1.0  # seconds


@dataclass(frozen=True)
class ChainRoute:
    copies: ChainCopies
    queues: set[str]  # every queue reached
    reached: int  # how many exchanges the message reached
    served: tuple[frozenset[str], ...] = ()  # the queues each copy serves (as `copies`)

    @property
    def complete(self) -> bool:
        """Every reached exchange gets a copy (nothing the cache may lag on is left out)."""
        return len(self.copies) == self.reached


def chain_copies(
    exchange: Exchange,
    routing_key: str,
    headers: dict[str, Any] | None,
    bindings_from: Callable[[str], Iterable[ExchangeBinding]],
    exchange_named: Callable[[str], Exchange | None],
    routed_queues: Callable[[Exchange], set[str]],
) -> ChainRoute:
    """Where a message published to `exchange` is written, and every queue it reaches (none:
    unroutable through the bindings)."""
    queues_of: dict[str, set[str]] = {}

    def routed_by(x: Exchange) -> set[str]:
        found = queues_of.get(x.name)
        if found is None:
            found = queues_of[x.name] = routed_queues(x)
        return found

    reached = exchanges_reached(
        exchange,
        routing_key,
        headers,
        bindings_from,
        exchange_named,
        lambda x: bool(routed_by(x)),
    )
    routed = [(x.name, routed_by(x)) for x in reached]
    by_name = {x.name: x for x in reached}
    copies = [(by_name[name], skip) for name, skip in assign_queues(routed)]
    served = tuple(frozenset(routed_by(x) - skip) for x, skip in copies)
    queues: set[str] = set()
    for _, each in routed:
        queues |= each
    return ChainRoute(copies, queues, len(reached), served)


def cached_chain_copies(
    cache: TopologyCache,
    vhost: str,
    exchange: Exchange,
    routing_key: str,
    headers: dict[str, Any] | None,
) -> ChainRoute:
    """`chain_copies` per this proxy's topology cache."""
    return chain_copies(
        exchange,
        routing_key,
        headers,
        lambda name: cache.exchange_bindings_from(vhost, name),
        lambda name: cache.exchange(vhost, name),
        lambda x: cache.routed_queues(vhost, x, routing_key, headers),
    )


def stored_chain_copies(
    topology: TopologyService,
    vhost: str,
    exchange: Exchange,
    routing_key: str,
    headers: dict[str, Any] | None,
) -> ChainRoute:
    """`chain_copies` per ZooKeeper itself (for when the cache, which may lag, finds no
    queue); synchronous: call it in a worker thread."""
    bindings: ExchangeBindings = topology.exchange_bindings

    def exchange_named(name: str) -> Exchange | None:
        found = topology.get_exchange(vhost, name)
        return None if found is None else found[0]

    return chain_copies(
        exchange,
        routing_key,
        headers,
        lambda name: bindings.bindings_from(vhost, name),
        exchange_named,
        lambda x: bindings.routed_queues(vhost, x, routing_key, headers),
    )


def copy_destinations(
    namespace: NamespaceName,
    copies: ChainCopies,
    routing_key: str,
    pulsar_properties: dict[str, str],
) -> list[tuple[naming.TopicName, dict[str, str]]]:
    """The topic and Pulsar properties of each copy."""
    written = []
    for exchange, skip in copies:
        topic = naming.exchange_topic(namespace, exchange.name, exchange.routing_type, routing_key)
        properties = pulsar_properties
        if skip:
            properties = {**pulsar_properties, ROUTED_ELSEWHERE_KEY: refused_by_value(set(skip))}
        written.append((topic, properties))
    return written


async def route_through_bindings(
    cache: TopologyCache,
    topology: TopologyService,
    vhost: str,
    exchange: Exchange,
    routing_key: str,
    headers: dict[str, Any] | None,
) -> ChainRoute | None:
    """Where a message published to `exchange` goes, per the cache; per ZooKeeper when the
    cache finds no queue, or leaves a reached exchange out soon after a topology change (a
    binding made a moment ago may not be in it yet). None: no queue is reached."""
    route = cached_chain_copies(cache, vhost, exchange, routing_key, headers)
    recent = time.time() - cache.last_change < CACHE_LAG
    if not route.queues or (recent and not route.complete):
        route = await trio.to_thread.run_sync(
            stored_chain_copies, topology, vhost, exchange, routing_key, headers
        )
    return route if route.queues else None


def written_copies(
    cache: TopologyCache,
    namespace: NamespaceName,
    vhost: str,
    route: ChainRoute,
    routing_key: str,
    headers: dict[str, Any] | None,
    pulsar_properties: dict[str, str],
    pre_acks: PreAcks | None,
    priorities: dict[str, int],
    priority: int | None,
    refusing: frozenset[str] = frozenset(),
) -> list[tuple[naming.TopicName, dict[str, str], StoredCallback | None]]:
    """Each copy's topic, Pulsar properties and `stored` callback: the subscriptions that do
    not route a copy, or skip it, leave it soon after it is stored (gateway/publish/pre_acks.py).
    A copy that serves priority queues (`priorities`: queue -> x-max-priority) also goes to
    their priority bands (gateway/publish/message_copies.py), as a publish to its exchange would;
    the `refusing` queues (at their length limit) skip it."""
    written: list[tuple[naming.TopicName, dict[str, str], StoredCallback | None]] = []
    destinations = copy_destinations(namespace, route.copies, routing_key, pulsar_properties)
    for (exchange, skip), (topic, properties), served in zip(
        route.copies, destinations, route.served, strict=True
    ):
        refused = served & refusing
        ready = served - refused
        banded = ready & priorities.keys()
        # Queues that refused it, get it elsewhere or on a band: it leaves their
        # subscriptions soon after it is stored, so their counts show it once.
        skipped = skip | refused | banded
        stored = None
        if pre_acks is not None and (
            skipped or pre_acks.wanted(vhost, exchange, routing_key, headers)
        ):
            stored = pre_acks.stored_callback(
                vhost, exchange.name, routing_key, headers, topic, skipped
            )
        if has_own_topics(exchange):
            # The queues it serves with bindings of their own topics get it there.
            sets = cache.routed_sets(vhost, exchange, routing_key, headers)
            own = own_topics_of(b for b in sets if b.queue in served)
            for copy_topic, copy_properties in message_copies(
                namespace,
                topic,
                exchange,
                properties,
                set(served),
                set(refused),
                priorities,
                priority,
                own,
                cache.reads_exchange_topic(vhost, exchange.name) or bool(ready - own.keys()),
            ):
                written.append(
                    (copy_topic, copy_properties, stored if copy_topic == topic else None)
                )
            continue
        if not banded:
            marked = properties
            if refused:
                marked = {**properties, REFUSED_BY_KEY: refused_by_value(set(refused))}
            written.append((topic, marked, stored))
            continue
        for copy_topic, copy_properties in message_copies(
            namespace, topic, exchange, properties, set(served), set(refused), priorities, priority
        ):
            written.append((copy_topic, copy_properties, stored if copy_topic == topic else None))
    return written


def follows_bindings(cache: TopologyCache, vhost: str, exchange: Exchange) -> bool:
    """Whether a message published to `exchange` may go through exchange-to-exchange
    bindings: it, or one of its alternate exchanges, is the source of one. One dictionary
    lookup for an exchange without an alternate."""
    seen: set[str] = set()
    current: Exchange | None = exchange
    while current is not None and current.name not in seen:
        if cache.has_exchange_bindings(vhost, current.name):
            return True
        seen.add(current.name)
        alternate = current.alternate_exchange
        current = None if alternate is None else cache.exchange(vhost, alternate)
    return False
