"""/api/queues/{vhost}/{name}/pulsar: what a queue is in Pulsar, which no RabbitMQ API has.

A queue is read through subscriptions, one per binding set (the bindings of the queue to
one exchange topic), and, after an unbind, through retired subscriptions that still drain
what the bindings routed before it (metadata/records.py). For each subscription this
answers its topic, backlog, unacknowledged and delayed counts, stored backlog size and
consumers; for each topic the broker that owns it (Pulsar's lookup, which loads an
unloaded topic, as a client would), its stored size and producers. The subscriptions
come from this proxy's topology cache (metadata/cache.py), the numbers from Pulsar's
admin API at the time of the request. A topic Pulsar cannot answer for is listed with its
`error` instead of failing the whole answer. The queue's binding to the default exchange is
listed `unused`, with no numbers, until the first publish through it has made its
subscription.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlight_py.backend.pulsar_admin import (
    BackendUnavailable,
    PulsarAdmin,
    PulsarAdminError,
    SubscriptionStats,
    TopicStats,
)
from starlight_py.management.api import Answer, ApiCall
from starlight_py.management.errors import ObjectNotFound
from starlight_py.management.vhost_access import usable_vhost
from starlight_py.metadata.records import BindingSet, RetiredSubscription
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import TopicName, exchange_topic

ACTIVE = "active"  # a binding set's subscription: its bindings route into the queue
DRAINING = "draining"  # retired by an unbind: delivers what came before, then goes
RETIRED = "retired"  # retired by a queue's deletion: the cleaner deletes it
# The queue's binding to the default exchange before its first publish through it, which
# makes its subscription (topology/default_bindings.py), and a binding set with a topic of
# its own before the first publish it routes (topology/binding_topics.py): no topic or
# subscription yet.
UNUSED = "unused"


@dataclass(frozen=True)
class QueueSubscription:
    """One subscription behind a queue, as the cache knows it."""

    topic: str  # local name in the vhost's namespace
    subscription: str
    state: str  # ACTIVE, DRAINING, RETIRED or UNUSED
    exchange: str = ""
    exchange_type: str = ""
    routing_keys: tuple[str, ...] = ()
    retired_at: float = 0.0  # s since the epoch; 0.0 while active


def queue_subscriptions(
    binding_sets: list[BindingSet], retired: list[RetiredSubscription]
) -> list[QueueSubscription]:
    """The subscriptions a queue reads through (its `binding_sets`) and those of its
    `retired` records, ordered by topic then subscription. Pure."""
    found = [
        QueueSubscription(
            binding_set.subscription_topic,
            binding_set.subscription,
            ACTIVE if binding_set.made else UNUSED,
            binding_set.exchange,
            binding_set.exchange_type,
            tuple(entry.routing_key for entry in binding_set.active_entries),
        )
        for binding_set in binding_sets
    ]
    for record in retired:
        bindings = record.binding_set
        found.append(
            QueueSubscription(
                record.topic,
                record.subscription,
                DRAINING if record.drain else RETIRED,
                bindings.exchange if bindings is not None else "",
                bindings.exchange_type if bindings is not None else "",
                tuple(entry.routing_key for entry in bindings.entries) if bindings else (),
                record.retired_at,
            )
        )
    return sorted(found, key=lambda s: (s.topic, s.subscription, s.state))


def subscription_json(
    namespace: NamespaceName, item: QueueSubscription, stats: SubscriptionStats | None
) -> dict[str, Any]:
    """One subscription as the endpoint lists it; `stats` None: Pulsar has no such
    subscription (or topic) now. Pure."""
    shaped: dict[str, Any] = {
        "topic": str(TopicName(namespace, item.topic)),
        "subscription": item.subscription,
        "state": item.state,
        "exchange": item.exchange,
        "exchange_type": item.exchange_type,
        "routing_keys": list(item.routing_keys),
        "exists": stats is not None,
    }
    if item.retired_at:
        shaped["retired_at"] = int(item.retired_at * 1000)
    if stats is not None:
        shaped.update(
            {
                "backlog": stats.backlog,
                "unacked": stats.unacked,
                "delayed": stats.delayed,
                "ready": stats.ready,
                "backlog_size": stats.backlog_bytes,
                "consumers": list(stats.consumer_names),
                "msg_rate_out": round(stats.flow.deliver_rate, 1),
                "msg_rate_ack": round(stats.flow.ack_rate, 1),
                "msg_rate_redeliver": round(stats.flow.redeliver_rate, 1),
            }
        )
    return shaped


def topic_json(
    namespace: NamespaceName,
    topic: str,
    stats: TopicStats | None,
    owner: str,
    error: str = "",
) -> dict[str, Any]:
    """One topic as the endpoint lists it. Pure."""
    shaped: dict[str, Any] = {
        "topic": str(TopicName(namespace, topic)),
        "owner_broker": owner,
        "exists": stats is not None,
    }
    if stats is not None:
        first = next(iter(stats.subscriptions.values()), None)
        shaped.update(
            {
                "storage_size": stats.storage_size,
                "producers": stats.producers,
                "subscriptions": len(stats.subscriptions),
                "msg_rate_in": round(first.flow.publish_rate, 1) if first else 0.0,
            }
        )
    if error:
        shaped["error"] = error
    return shaped


def _topic_facts(admin: PulsarAdmin, topic: TopicName) -> tuple[TopicStats | None, str, str]:
    """(stats, owning broker, error) of one topic; Pulsar's failures become the error."""
    try:
        stats = admin.topic_stats(topic, with_bytes=True)
        owner = admin.topic_owner(topic) if stats is not None else ""
    except (PulsarAdminError, BackendUnavailable) as e:
        return None, "", str(e)
    return stats, owner, ""


def queue_in_pulsar(call: ApiCall) -> Answer:
    """The queue's topics and subscriptions with Pulsar's numbers. Raises ObjectNotFound
    (no such queue or vhost); a topic Pulsar does not answer for carries its `error`."""
    record = usable_vhost(call, call.params["vhost"])
    name = call.params["name"]
    services = call.context.services
    if services.topology.get_queue(record.name, name) is None:
        raise ObjectNotFound()
    cache = services.cache
    retired = [
        each
        for vhost, each in cache.retired_records()
        if vhost == record.name and each.queue == name
    ]
    namespace = record.namespace
    sets = cache.binding_sets_of_queue(record.name, name)
    subscriptions = queue_subscriptions(sets, retired)
    if not any(b.exchange == "" for b in sets):
        default = exchange_topic(namespace, "", "direct", name).local
        subscriptions.insert(0, QueueSubscription(default, "", UNUSED, "", "direct", (name,)))
    topics: list[dict[str, Any]] = []
    stats_by_topic: dict[str, TopicStats | None] = {}
    for local in sorted({s.topic for s in subscriptions if s.state != UNUSED}):
        stats, owner, error = _topic_facts(services.topology.admin, TopicName(namespace, local))
        stats_by_topic[local] = stats
        topics.append(topic_json(namespace, local, stats, owner, error))
    listed = []
    for item in subscriptions:
        topic_stats = stats_by_topic.get(item.topic)
        found = topic_stats.subscriptions.get(item.subscription) if topic_stats else None
        listed.append(subscription_json(namespace, item, found))
    value = {
        "vhost": record.name,
        "name": name,
        "namespace": str(namespace),
        "topics": topics,
        "subscriptions": listed,
    }
    return Answer(200, value)
