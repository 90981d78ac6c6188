"""A queue's binding to the default exchange, made when it is first used.

Every queue is bound to the default exchange (a publish to `""` with the queue's name as
routing key reaches it). Its subscription is on the topic `amq.default~~E(queue)`, which
only that queue reads. Most queues that are bound to other exchanges never get a message
through the default exchange: made at declare, their default-exchange topic, subscription
and Pulsar consumers cost topic creation, broker memory and pulsar-client's timers for
nothing (half of what a topic-bound queue costs).

So a plain queue is declared without it: the queue's record alone makes the default
exchange route to it (`has_route` is "does the queue exist"), and the first publish that
writes to the topic makes the subscription, then its binding set znode, before it writes.
From then on the queue's consumers follow the new binding set like any binding made after
they started. A message is never written before the subscription exists, so none is lost.

Streams and priority queues keep the binding made at declare: a stream's offsets are
positions on that topic from its first message, and a priority queue's default-exchange
publishes go to its bands, whose sets are made at declare with it.
"""

from __future__ import annotations

import logging

from starlight_py.backend.subscription_maker import SubscriptionMaker
from starlight_py.metadata.records import BindingEntry, BindingSet, Paths, decode, encode, now
from starlight_py.metadata.zookeeper import (
    Check,
    Create,
    NodeAlreadyExists,
    NodeMissing,
    TransactionFailed,
    ZooKeeperClient,
)
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.priorities import max_priority_of
from starlight_py.model.streams import is_stream
from starlight_py.model.topology import DEFAULT_EXCHANGE, Queue
from starlight_py.topology.errors import TopologyConflict

__all__ = ["default_binding_set", "made_at_declare", "make_default_binding"]

log = logging.getLogger("starlight.topology")

MAX_ATTEMPTS = 20


def made_at_declare(queue: Queue) -> bool:
    """Whether `queue`'s default-exchange binding is made when it is declared (streams and
    priority queues) rather than by the first publish that needs it."""
    return is_stream(queue.arguments) or max_priority_of(queue.arguments) is not None


def default_binding_set(
    namespace: NamespaceName, queue: str
) -> tuple[naming.TopicName, BindingSet]:
    """A new binding set of `queue` on its default-exchange topic (a fresh subscription
    name), and that topic."""
    topic = naming.exchange_topic(namespace, DEFAULT_EXCHANGE, "direct", queue)
    binding_set = BindingSet(
        queue=queue,
        exchange=DEFAULT_EXCHANGE,
        topic=topic.local,
        subscription=naming.subscription_name(queue, naming.new_binding_set_id()),
        entries=(BindingEntry(queue),),
        created=now(),
    )
    return topic, binding_set


def make_default_binding(
    zk: ZooKeeperClient,
    paths: Paths,
    subscriptions: SubscriptionMaker,
    vhost: str,
    namespace: NamespaceName,
    queue: str,
) -> BindingSet | None:
    """`queue`'s default-exchange binding set, made (subscription, then znode) when it does
    not exist yet; None when the queue does not exist. Two proxies making it at once agree:
    the loser deletes its subscription and takes the winner's set.

    Raises MetadataUnavailable, BackendUnavailable, PulsarAdminError (the namespace is
    gone), TopologyConflict."""
    queue_path = paths.queue(vhost, queue)
    for _ in range(MAX_ATTEMPTS):
        topic, wanted = default_binding_set(namespace, queue)
        set_path = paths.binding_set(vhost, queue, topic.local)
        found = zk.get(set_path)
        if found is not None:
            existing = decode(found[0])
            if not isinstance(existing, BindingSet):
                raise TypeError(f"{set_path} holds {type(existing).__name__}, not a binding set")
            return existing
        if zk.get(queue_path) is None:
            return None
        subscriptions.create(topic, wanted.subscription)
        try:
            zk.commit([Check(queue_path, -1), Create(set_path, encode(wanted))])
        except TransactionFailed as e:
            _delete_quietly(subscriptions, topic, wanted.subscription)
            if isinstance(e.cause, NodeMissing):
                return None  # the queue went away meanwhile
            if isinstance(e.cause, NodeAlreadyExists):
                continue  # another publish made it: read theirs
            raise
        except BaseException:
            _delete_quietly(subscriptions, topic, wanted.subscription)
            raise
        log.debug("made the default-exchange binding of queue %r in vhost %r", queue, vhost)
        return wanted
    raise TopologyConflict(f"the default binding of queue {queue!r} kept changing; try again")


def _delete_quietly(
    subscriptions: SubscriptionMaker, topic: naming.TopicName, subscription: str
) -> None:
    try:
        subscriptions.delete(topic, subscription)
    except Exception as e:
        log.warning("could not delete subscription %s on %s: %s", subscription, topic, e)
