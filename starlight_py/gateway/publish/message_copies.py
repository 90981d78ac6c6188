"""Where a routed message is written: the exchange's topic, the binding topics of the queues a
topic or headers exchange routes it to, and, for priority queues, the topic of the message's
priority band (docs/mapping.md#priority-queues)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from starlight_py.backend.message_codec import (
    FURTHER_COPY_KEY,
    IN_PRIORITY_BAND_KEY,
    REFUSED_BY_KEY,
    refused_by_value,
)
from starlight_py.metadata.cache import TopologyCache
from starlight_py.metadata.records import BindingSet
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.priorities import band_of
from starlight_py.model.topology import Exchange
from starlight_py.topology.service import TopologyService


def message_copies(
    namespace: NamespaceName,
    topic: naming.TopicName,
    target: Exchange,
    pulsar_properties: dict[str, str],
    routed: set[str],
    refusing: set[str],
    priorities: dict[str, int],
    priority: int | None,
    own_topics: Mapping[str, str] | None = None,
    exchange_topic_read: bool = True,
) -> list[tuple[naming.TopicName, dict[str, str]]]:
    """Where a message routed by `target` is written: the exchange's `topic` (whose binding
    subscriptions skip it for the queues in `refusing`), the own topic of each routed queue
    whose bindings have one (`own_topics`: queue -> local name of its binding topic, topic
    and headers exchanges), and, for each of the `routed` queues that is a priority queue
    (`priorities`: queue -> x-max-priority), the topic of the message's priority band
    (docs/mapping.md#priority-queues).

    The exchange's topic gets it only when some binding set reads it (`exchange_topic_read`).
    A message for the default exchange that only priority queues take is not written there
    at all. For any other exchange it is, marked as skipped by those queues, because a
    binding made a moment ago may not be in this proxy's cache yet."""
    own = own_topics or {}
    taking = routed - refusing
    banded = {q: band_of(priority, priorities[q]) for q in sorted(taking) if q in priorities}
    copies = []
    if exchange_topic_read and (not banded or target.name != "" or taking - banded.keys()):
        main = pulsar_properties
        if refusing or banded:
            main = dict(pulsar_properties)
            if refusing:
                main[REFUSED_BY_KEY] = refused_by_value(refusing)
            if banded:
                main[IN_PRIORITY_BAND_KEY] = refused_by_value(set(banded))
        copies.append((topic, main))
    for queue in sorted(taking - banded.keys()):
        own_topic = own.get(queue)
        if own_topic is not None:
            properties = (
                {**pulsar_properties, FURTHER_COPY_KEY: "1"} if copies else pulsar_properties
            )
            copies.append((naming.TopicName(namespace, own_topic), properties))
    for queue, band in banded.items():
        copies.append((naming.priority_band_topic(namespace, queue, band), pulsar_properties))
    return copies


def own_topics_of(routed_sets: Iterable[BindingSet]) -> dict[str, str]:
    """queue -> its binding topic, for the `routed_sets` that have one."""
    return {b.queue: b.binding_topic for b in routed_sets if b.binding_topic}


def joined(copies: int, done: Callable[[bool, str], None]) -> Callable[[bool, str], None]:
    """A send callback for each of the `copies` of one message that calls `done` once, after
    the last, with ok only when Pulsar stored every copy (the first error otherwise). One
    copy, the usual case, is `done` itself. Callbacks come from pulsar-client's threads."""
    if copies == 1:
        return done
    lock = threading.Lock()
    left, stored, first_error = copies, True, ""

    def each(ok: bool, error: str) -> None:
        nonlocal left, stored, first_error
        with lock:
            if not ok and stored:
                stored, first_error = False, error
            left -= 1
            if left:
                return
        done(stored, first_error)

    return each


@dataclass(frozen=True, slots=True)
class CopyTargets:
    """What `message_copies` needs to know of a routed message's exchange."""

    routed: set[str]  # the queues it reaches (empty when nobody asked and it does not matter)
    own_topics: dict[str, str]  # queue -> its binding topic (topic and headers exchanges)
    exchange_topic_read: bool  # whether a binding set reads the exchange's topic


def has_own_topics(exchange: Exchange) -> bool:
    """Whether `exchange` routes at publish into its bindings' own topics."""
    return exchange.name != "" and exchange.routing_type in naming.OWN_TOPIC_EXCHANGE_TYPES


def copy_targets(
    cache: TopologyCache,
    vhost: str,
    target: Exchange,
    routing_key: str,
    headers: dict[str, Any] | None,
    need_routed: bool,
) -> CopyTargets:
    """The `CopyTargets` of a message routed by `target`, per this proxy's cache. The queues
    are looked up when `need_routed` (length limits, priority queues) or when the exchange
    writes to its bindings' own topics."""
    if has_own_topics(target):
        sets = cache.routed_sets(vhost, target, routing_key, headers)
        return CopyTargets(
            {b.queue for b in sets},
            own_topics_of(sets),
            cache.reads_exchange_topic(vhost, target.name),
        )
    routed = cache.routed_queues(vhost, target, routing_key, headers) if need_routed else set()
    return CopyTargets(routed, {}, True)


def stored_copy_targets(
    topology: TopologyService,
    vhost: str,
    target: Exchange,
    routing_key: str,
    headers: dict[str, Any] | None,
) -> CopyTargets:
    """`copy_targets` of an exchange with own topics, read from ZooKeeper: for a publish
    the cache found no route for (a binding made a moment ago on another proxy).
    Synchronous: call it in a worker thread."""
    sets = topology.routed_sets(vhost, target, routing_key, headers)
    return CopyTargets(
        {b.queue for b in sets},
        own_topics_of(sets),
        any(not b.binding_topic for b in sets),
    )
