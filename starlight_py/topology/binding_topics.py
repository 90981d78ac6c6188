"""A binding's own topic and subscription, made by the first publish it routes.

A queue bound to a topic or headers exchange reads a topic of its own, which only the
messages routed to it by that binding set reach (docs/mapping.md). Made at bind, that topic
and its subscription cost Pulsar a topic creation, a subscription and, on every proxy that
consumes the queue, a Pulsar consumer, for each binding, whether or not a message ever
comes: the price of declaring thousands of queues, and of holding them idle.

So a binding set with its own topic is written `made=False`: the publishing proxy routes
by it (the set's bindings are in ZooKeeper as before), consumers and counts leave it alone
(nothing can be there), and the first publish that routes to it makes the subscription,
then marks the set made (one conditional write), and only then writes. Consumers follow the
marked set like a binding made after they started. A message is never written before the
subscription exists, so none is lost.

A stream's bindings are made at bind: a stream consumer numbers a topic's messages from
where it started reading it.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from starlight_py.backend.pulsar_admin import PulsarAdmin
from starlight_py.backend.subscription_maker import SubscriptionMaker
from starlight_py.metadata.records import BindingSet, Paths, decode, encode
from starlight_py.metadata.zookeeper import NodeMissing, VersionConflict, ZooKeeperClient
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from starlight_py.topology.errors import TopologyConflict

__all__ = ["make_binding_topic"]

log = logging.getLogger("starlight.topology")

MAX_ATTEMPTS = 20


def make_binding_topic(
    zk: ZooKeeperClient,
    paths: Paths,
    subscriptions: SubscriptionMaker,
    admin: PulsarAdmin,
    vhost: str,
    namespace: NamespaceName,
    queue: str,
    set_topic: str,
) -> BindingSet | None:
    """`queue`'s binding set on the exchange topic `set_topic` (a local name), made when it
    is not yet (its subscription first, then the set marked made); None when there is no
    such set. Two proxies making it at once make the same subscription, and both see the
    set made. A subscription made for a set that was unbound meanwhile is deleted again.

    Raises MetadataUnavailable, BackendUnavailable, PulsarAdminError (the namespace is
    gone), TopologyConflict."""
    set_path = paths.binding_set(vhost, queue, set_topic)
    made_here: set[tuple[str, str]] = set()  # subscriptions made by this call
    for _ in range(MAX_ATTEMPTS):
        found = zk.get(set_path)
        current = None if found is None else decode(found[0])
        if current is not None and not isinstance(current, BindingSet):
            raise TypeError(f"{set_path} holds {type(current).__name__}, not a binding set")
        if current is None or current.made:
            _delete_stale(subscriptions, admin, namespace, made_here, current)
            return current
        assert found is not None
        topic = naming.TopicName(namespace, current.binding_topic)
        subscriptions.create(topic, current.subscription)
        made_here.add((current.binding_topic, current.subscription))
        made = replace(current, made=True)
        try:
            zk.set(set_path, encode(made), found[1])
        except (VersionConflict, NodeMissing):
            continue  # made by another publish, a binding added, or unbound: read it again
        log.debug("made binding topic %s of queue %r in vhost %r", topic, queue, vhost)
        _delete_stale(subscriptions, admin, namespace, made_here, made)
        return made
    raise TopologyConflict(f"the bindings of queue {queue!r} kept changing; try again")


def _delete_stale(
    subscriptions: SubscriptionMaker,
    admin: PulsarAdmin,
    namespace: NamespaceName,
    made_here: set[tuple[str, str]],
    current: BindingSet | None,
) -> None:
    """Delete what this call made for a set that was unbound meanwhile (maybe bound again,
    with a new id): only this call made it, and nothing was written there."""
    for local, subscription in made_here:
        if current is None or (local, subscription) != (
            current.binding_topic,
            current.subscription,
        ):
            _delete_quietly(subscriptions, admin, naming.TopicName(namespace, local), subscription)


def _delete_quietly(
    subscriptions: SubscriptionMaker, admin: PulsarAdmin, topic: naming.TopicName, subscription: str
) -> None:
    try:
        subscriptions.delete(topic, subscription)
        admin.delete_topic(topic, force=False)
    except Exception as e:
        log.warning("could not delete subscription %s on %s: %s", subscription, topic, e)
