"""Declares, deletes, binds and unbinds: ZooKeeper metadata plus Pulsar subscriptions, with
RabbitMQ's answers. Synchronous (the gateway calls it from a worker thread, one hop per AMQP
method); every method raises AMQPError subclasses for what the client did wrong, and
MetadataUnavailable / BackendUnavailable when a service cannot be reached.

Concurrency between proxies is settled by ZooKeeper: creates that race lose with
NodeAlreadyExists and turn into an equivalence check (RabbitMQ's answer to a redeclare);
updates are compare-and-set on the znode version and are retried; changes that touch several
znodes are one multi-op transaction with `Check` operations on what they depend on, so a
delete racing a bind leaves either the binding or nothing, never half of it.

Pulsar subscriptions are created before the metadata that points to them (so a message
published after bind-ok reaches the queue); when the metadata write then fails, the new
subscription is deleted again.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

from starlight_py.amqp.errors import NotFound, PreconditionFailed
from starlight_py.amqp.method_ids import (
    EXCHANGE_DECLARE,
    EXCHANGE_DELETE,
    QUEUE_BIND,
    QUEUE_DECLARE,
    QUEUE_DELETE,
    QUEUE_PURGE,
    QUEUE_UNBIND,
)
from starlight_py.backend.pulsar_admin import PulsarAdmin
from starlight_py.backend.pulsar_client import PulsarBackend
from starlight_py.backend.subscription_maker import SubscriptionMaker
from starlight_py.metadata.ephemeral import EphemeralNodes
from starlight_py.metadata.multi_read import Children, Data, Read
from starlight_py.metadata.records import (
    BindingEntry,
    BindingSet,
    Paths,
    RetiredSubscription,
    VhostRecord,
    decode,
    encode,
    now,
    segment,
)
from starlight_py.metadata.zookeeper import (
    Check,
    Create,
    Delete,
    NodeAlreadyExists,
    NodeMissing,
    Op,
    ReadAnswers,
    SetData,
    TransactionFailed,
    VersionConflict,
    ZooKeeperClient,
)
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.priorities import PRIORITY_BAND_TYPE, band_count, max_priority_of
from starlight_py.model.routing import binding_matches
from starlight_py.model.streams import is_stream, purge_refused
from starlight_py.model.topology import (
    DEFAULT_EXCHANGE,
    PREDECLARED_EXCHANGES,
    Exchange,
    Queue,
    check_exchange_name_creatable,
    queue_locked,
    validate_binding_arguments,
    validate_exchange,
    validate_queue,
    validate_queue_arguments,
)
from starlight_py.topology.background_work import at_once
from starlight_py.topology.binding_topics import make_binding_topic
from starlight_py.topology.default_bindings import (
    default_binding_set,
    made_at_declare,
    make_default_binding,
)
from starlight_py.topology.errors import TopologyConflict
from starlight_py.topology.exchange_bindings import ExchangeBindings, unique_deletes
from starlight_py.topology.queue_consumers import (
    EXCLUSIVE_MARK,
    QueueConsumers,
    QueueState,
    expires_after,
    use_stamp,
)
from starlight_py.topology.queue_counting import QueueCounting, QueueCounts

__all__ = [
    "EXCLUSIVE_MARK",
    "QueueCounts",
    "QueueState",
    "TopologyConflict",
    "TopologyService",
    "expires_after",
]

log = logging.getLogger("starlight.topology")

MAX_ATTEMPTS = 20
TOUCH_INTERVAL = 1.0  # seconds
T = TypeVar("T")


def _retrying(operation: Callable[[], T]) -> T:
    for _ in range(MAX_ATTEMPTS):
        try:
            return operation()
        except (VersionConflict, _Retry):
            continue
    raise TopologyConflict("too many concurrent changes; try again")


class _Retry(Exception):
    """Internal: the state read is stale, start over."""


class TopologyService:
    def __init__(
        self,
        zookeeper: ZooKeeperClient,
        paths: Paths,
        admin: PulsarAdmin,
        backend: PulsarBackend | None = None,
        ephemerals: EphemeralNodes | None = None,
    ) -> None:
        self.zk = zookeeper
        self.paths = paths
        self.admin = admin
        self.backend = backend  # for purging subscriptions that have unacked messages
        # Binding subscriptions: made over the binary protocol when there is a client.
        self.subscriptions = SubscriptionMaker(admin, backend)
        self.ephemerals = ephemerals or EphemeralNodes(zookeeper, "unnamed")
        # Queue deletions this process started: what a get confirmed in ZooKeeper before one
        # is confirmed there again (gateway/consume/getting.py).
        self.queue_deletions = 0
        # Default-exchange bindings and binding topics this process asked for (made, or
        # found made by another process): a get whose channel read the queue's binding sets
        # before reads them again (gateway/consume/getting.py).
        self.bindings_made = 0
        # What queues hold and who reads them (queue_counting.py), and the consumers'
        # records (queue_consumers.py).
        self.counts = QueueCounting(
            zookeeper, paths, admin, self.ephemerals, self.get_queue, self.binding_sets
        )
        self.consumers = QueueConsumers(zookeeper, paths, self.ephemerals, self.get_queue)
        self.exchange_bindings = ExchangeBindings(zookeeper, paths, self.get_exchange)
        # Runs the Pulsar side of a queue deletion (see background_work.py): at once in the
        # admin tool, after delete-ok in the proxy.
        self.after_reply: Callable[[Callable[[], object]], None] = at_once
        # An exchange as a watched copy knows it (the proxy's topology cache), or None: a
        # queue deletion reads an exchange from ZooKeeper only if it may be auto-delete.
        self.known_exchange: Callable[[str, str], Exchange | None] = lambda _vhost, _name: None
        # Blocking, from a worker thread: close this process's producer of a retired
        # binding topic about to be deleted (the gateway's ProducerPool.release).
        self.release_producers: Callable[[naming.TopicName], None] = lambda _topic: None

    # ---- reading ------------------------------------------------------------------------------

    def _read(self, path: str) -> tuple[Any, int] | None:
        found = self.zk.get(path)
        return None if found is None else _decoded(found)

    def get_vhost(self, vhost: str) -> VhostRecord | None:
        found = self._read(self.paths.vhost(vhost))
        return found[0] if found else None

    def get_exchange(self, vhost: str, name: str) -> tuple[Exchange, int] | None:
        if name == DEFAULT_EXCHANGE:
            return Exchange(DEFAULT_EXCHANGE, "direct"), -1
        return self._read(self.paths.exchange(vhost, name))

    def get_queue(self, vhost: str, name: str) -> tuple[Queue, int] | None:
        return self._read(self.paths.queue(vhost, name))

    def binding_sets(self, vhost: str, queue: str) -> list[tuple[BindingSet, int]]:
        """The queue's binding sets to read, and the retired ones still draining into it
        (version -1). Not the sets whose subscription the first publish they route makes
        (topology/binding_topics.py): there is nothing to read there yet."""
        listed = self.zk.read(self._set_listings(vhost, queue))
        active, draining = self._read_sets(vhost, queue, listed)
        return self._with_draining([x for x in active if x[0].made], draining)

    def _set_listings(self, vhost: str, queue: str) -> list[Read]:
        """The child lists `_read_sets` needs: the queue's binding sets, the retired
        subscriptions."""
        return [
            Children(self.paths.queue_bindings(vhost, queue)),
            Children(self.paths.retired(vhost)),
        ]

    def _read_sets(
        self, vhost: str, queue: str, listed: ReadAnswers
    ) -> tuple[list[tuple[BindingSet, int]], list[tuple[RetiredSubscription, int]]]:
        """The queue's binding sets, and the retired subscriptions of it that still hold
        messages routed to it, from the child lists of `_set_listings` (one more read)."""
        bindings = self.paths.queue_bindings(vhost, queue)
        retired = self.paths.retired(vhost)
        # Retired records are named after their subscription, `E(queue)~~id`: skip other
        # queues' records by name instead of reading every one of them.
        prefix = segment(naming.escape(queue) + naming.SEPARATOR)
        set_paths = [f"{bindings}/{child}" for child in listed.children(bindings)]
        retired_paths = [
            f"{retired}/{child}" for child in listed.children(retired) if child.startswith(prefix)
        ]
        found = self.zk.read([Data(path) for path in (*set_paths, *retired_paths)])
        sets = [_decoded(x) for x in map(found.data, set_paths) if x is not None]
        draining = []
        for record in map(found.data, retired_paths):
            if record is None:
                continue
            decoded = _decoded(record)
            if decoded[0].queue == queue and decoded[0].drain:
                draining.append(decoded)
        return sets, draining

    @staticmethod
    def _with_draining(
        active: list[tuple[BindingSet, int]], draining: list[tuple[RetiredSubscription, int]]
    ) -> list[tuple[BindingSet, int]]:
        return active + [(r.binding_set, -1) for r, _ in draining if r.binding_set is not None]

    def draining(self, vhost: str, queue: str) -> list[tuple[RetiredSubscription, int]]:
        """Retired subscriptions of `queue` that still hold messages routed to it."""
        return self._read_sets(vhost, queue, self.zk.read(self._set_listings(vhost, queue)))[1]

    def _require_exchange(self, vhost: str, name: str, method: tuple[int, int]) -> Exchange:
        found = self.get_exchange(vhost, name)
        if found is None:
            raise NotFound(f"no exchange '{name}' in vhost '{vhost}'", method)
        exchange: Exchange = found[0]
        return exchange

    def _require_queue(self, vhost: str, name: str, method: tuple[int, int]) -> Queue:
        found = self.get_queue(vhost, name)
        if found is None:
            raise NotFound(f"no queue '{name}' in vhost '{vhost}'", method)
        queue: Queue = found[0]
        return queue

    def has_route(
        self, vhost: str, exchange: Exchange, routing_key: str, headers: dict[str, Any] | None
    ) -> bool:
        """Like TopologyCache.has_route, but read from ZooKeeper: the authority when the
        cache, which may lag by milliseconds, says there is no route."""
        if exchange.name == DEFAULT_EXCHANGE:
            return self.get_queue(vhost, routing_key) is not None
        return next(self._routing_sets(vhost, exchange, routing_key, headers), None) is not None

    def routed_sets(
        self, vhost: str, exchange: Exchange, routing_key: str, headers: dict[str, Any] | None
    ) -> list[BindingSet]:
        """Like TopologyCache.routed_sets, but read from ZooKeeper (every binding set of the
        exchange: for when the cache, which may lag by milliseconds, finds no route)."""
        return list(self._routing_sets(vhost, exchange, routing_key, headers))

    def _routing_sets(
        self, vhost: str, exchange: Exchange, routing_key: str, headers: dict[str, Any] | None
    ) -> Iterator[BindingSet]:
        """The exchange's binding sets whose active bindings route the message, read from
        ZooKeeper one by one (a caller that needs one stops there)."""
        for child in self.zk.children(self.paths.exchange_bound(vhost, exchange.name)):
            queue_segment, _, topic_segment = child.partition("~~")
            found = self._read(
                f"{self.paths.queues(vhost)}/{queue_segment}/bindings/{topic_segment}"
            )
            if found is None:
                continue
            binding_set: BindingSet = found[0]
            if any(
                binding_matches(
                    exchange.routing_type, entry.routing_key, entry.arguments, routing_key, headers
                )
                for entry in binding_set.active_entries
            ):
                yield binding_set

    # ---- vhosts -------------------------------------------------------------------------------

    def ensure_vhost(
        self, vhost: str, namespace: NamespaceName, explicit: bool = False
    ) -> VhostRecord:
        """The vhost's record, created with its predeclared exchanges on first use
        (`explicit`: mapped by an operator, not by the rules)."""
        existing = self.get_vhost(vhost)
        if existing is not None:
            return existing
        self.zk.ensure_path(self.paths.vhosts)
        record = VhostRecord(vhost, namespace, explicit=explicit)
        ops: list[Op] = [
            Create(self.paths.vhost(vhost), encode(record)),
            Create(self.paths.exchanges(vhost)),
            Create(self.paths.queues(vhost)),
            Create(self.paths.retired(vhost)),
        ]
        for name, kind in PREDECLARED_EXCHANGES:
            ops.append(Create(self.paths.exchange(vhost, name), encode(Exchange(name, kind))))
            ops.append(Create(self.paths.exchange_bound(vhost, name)))
        try:
            self.zk.commit(ops)
            log.info("created vhost %r (Pulsar namespace %s)", vhost, namespace)
        except TransactionFailed as e:
            if not isinstance(e.cause, NodeAlreadyExists):
                raise
        current = self.get_vhost(vhost)
        assert current is not None
        return current

    # ---- exchanges ----------------------------------------------------------------------------

    def declare_exchange(self, vhost: str, wanted: Exchange, passive: bool) -> None:
        """Raises NotFound (passive, missing), CommandInvalid (unknown type) or
        PreconditionFailed (bad arguments, or not equivalent)."""
        if not passive:
            validate_exchange(wanted, vhost)
        found = self.get_exchange(vhost, wanted.name)
        if passive:
            if found is None:
                raise NotFound(f"no exchange '{wanted.name}' in vhost '{vhost}'", EXCHANGE_DECLARE)
            return
        if found is None:
            check_exchange_name_creatable(wanted.name)
            try:
                self.zk.commit(
                    [
                        Check(self.paths.vhost(vhost), -1),
                        Create(self.paths.exchange(vhost, wanted.name), encode(wanted)),
                        Create(self.paths.exchange_bound(vhost, wanted.name)),
                    ]
                )
                return
            except TransactionFailed as e:
                if not isinstance(e.cause, NodeAlreadyExists):
                    raise
            found = self.get_exchange(vhost, wanted.name)
            if found is None:
                raise TopologyConflict(f"exchange '{wanted.name}' changed while declaring it")
        found[0].check_equivalent(wanted, vhost)

    def exchange_in_use(self, vhost: str, name: str) -> bool:
        return bool(
            self.zk.children(self.paths.exchange_bound(vhost, name))
        ) or self.exchange_bindings.in_use_as_source(vhost, name)

    def delete_exchange(self, vhost: str, name: str, if_unused: bool) -> None:
        """RabbitMQ 3.x: deleting a missing exchange is fine. Raises PreconditionFailed
        (if_unused and bound)."""

        def attempt() -> None:
            found = self.get_exchange(vhost, name)
            if found is None:
                return
            exchange, version = found
            bound = self.zk.children(self.paths.exchange_bound(vhost, name))
            in_use = bound or self.exchange_bindings.in_use_as_source(vhost, name)
            if in_use and if_unused:
                raise PreconditionFailed(
                    f"exchange '{name}' in vhost '{vhost}' in use", EXCHANGE_DELETE
                )
            ops: list[Op] = []
            retired: list[RetiredSubscription] = []
            for child in bound:
                queue_segment, _, topic_segment = child.partition("~~")
                set_path = f"{self.paths.queues(vhost)}/{queue_segment}/bindings/{topic_segment}"
                found_set = self._read(set_path)
                if found_set is None:
                    raise _Retry
                binding_set, set_version = found_set
                ops += [
                    Delete(set_path, set_version),
                    Delete(f"{self.paths.exchange_bound(vhost, name)}/{child}"),
                ]
                if not binding_set.made:
                    continue  # nothing in Pulsar: nothing to retire (as in _delete_queue)
                end = self.admin.last_message_id(self._topic(vhost, binding_set.subscription_topic))
                retired.append(self._retire(binding_set, end, drain=True))
                ops.append(
                    Create(
                        self.paths.retired_subscription(vhost, binding_set.subscription),
                        encode(retired[-1]),
                    )
                )
            # It goes with its exchange-to-exchange bindings, as source and as destination.
            ops += self.exchange_bindings.exchange_delete_ops(vhost, name, version)
            # Auto-delete exchanges whose last binding led here go too (RabbitMQ).
            ops += self.exchange_bindings.cascade_ops(vhost, {name})
            self._commit_or_retry(unique_deletes(ops))
            log.info("deleted exchange %r in vhost %r", exchange.name, vhost)
            for record in retired:
                if not record.drain:
                    namespace = self._topic(vhost, record.topic).namespace
                    self._drop_subscription_now(vhost, namespace, record)

        _retrying(attempt)

    # ---- queues -------------------------------------------------------------------------------

    def declare_queue(
        self, vhost: str, namespace: NamespaceName, wanted: Queue, passive: bool, owner: str
    ) -> QueueCounts:
        """Raises NotFound (passive, missing), ResourceLocked (another connection's
        exclusive queue), PreconditionFailed (not equivalent)."""
        found = self.get_queue(vhost, wanted.name)
        if found is None and not passive:
            # RabbitMQ validates arguments when it creates; a redeclaration is compared first.
            validate_queue(wanted, vhost)
            created = self._create_queue(vhost, namespace, wanted)
            if created:
                return QueueCounts(0, 0)
            found = self.get_queue(vhost, wanted.name)
        if found is None:
            raise NotFound(f"no queue '{wanted.name}' in vhost '{vhost}'", QUEUE_DECLARE)
        queue: Queue = found[0]
        self._check_owner(vhost, queue, owner, QUEUE_DECLARE)
        if not passive:
            queue.check_equivalent(wanted, vhost)
            validate_queue_arguments(wanted.name, vhost, wanted.arguments)
        if expires_after(queue) is not None:
            self.consumers.touch_queue(vhost, queue.name)
        return self.counts.queue_counts(vhost, namespace, queue.name)

    def usable_queue(self, vhost: str, name: str, owner: str, method: tuple[int, int]) -> Queue:
        """The queue, for a connection that wants to read it; raises NotFound, or
        ResourceLocked for another connection's exclusive queue."""
        queue = self._require_queue(vhost, name, method)
        self._check_owner(vhost, queue, owner, method)
        return queue

    def check_usable(self, vhost: str, queue: Queue, owner: str, method: tuple[int, int]) -> None:
        """`usable_queue` for a record at hand (the cache's): raises ResourceLocked for
        another connection's exclusive queue."""
        self._check_owner(vhost, queue, owner, method)

    def _check_owner(
        self, vhost: str, queue: Queue, owner: str | None, method: tuple[int, int]
    ) -> None:
        """`owner` None: the cluster itself (the SubscriptionCleaner), which may touch any
        queue."""
        if owner is not None and queue.exclusive and queue.owner != owner:
            raise queue_locked(queue.name, vhost, method)

    def _create_queue(self, vhost: str, namespace: NamespaceName, queue: Queue) -> bool:
        """Create the queue (with its implicit binding to the default exchange where that
        is made at declare: topology/default_bindings.py); False when another declaration
        won the race."""
        default = [default_binding_set(namespace, queue.name)] if made_at_declare(queue) else []
        sets = [*default, *self._priority_bands(namespace, queue)]
        created: list[tuple[naming.TopicName, BindingSet]] = []
        try:
            for set_topic, each in sets:
                self.subscriptions.create(set_topic, each.subscription)
                created.append((set_topic, each))
        except BaseException:
            self._delete_subscriptions(created)
            raise
        ops: list[Op] = [
            Check(self.paths.vhost(vhost), -1),
            Create(self.paths.queue(vhost, queue.name), encode(queue)),
            Create(self.paths.queue_bindings(vhost, queue.name)),
            *(
                Create(self.paths.binding_set(vhost, queue.name, t.local), encode(each))
                for t, each in sets
            ),
            Create(self.paths.queue_consumers(vhost, queue.name)),
        ]
        owner_path = self.paths.queue_owner(vhost, queue.name)
        if queue.exclusive and queue.owner is not None:
            # Ephemeral: if the owning proxy dies, its session ends and the queue is
            # recognisably orphaned (the SubscriptionCleaner deletes it).
            ops.append(Create(owner_path, queue.owner.encode(), ephemeral=True))
        if expires_after(queue) is not None:
            ops.append(Create(self.paths.queue_used(vhost, queue.name), use_stamp()))
        try:
            self.zk.commit(ops)
            if queue.exclusive and queue.owner is not None:
                self.ephemerals.remember(owner_path, queue.owner.encode())
        except TransactionFailed as e:
            self._delete_subscriptions(created)
            if isinstance(e.cause, NodeAlreadyExists):
                return False
            raise
        log.info("declared queue %r in vhost %r", queue.name, vhost)
        return True

    def default_binding(
        self, vhost: str, namespace: NamespaceName, queue: str
    ) -> BindingSet | None:
        """`queue`'s default-exchange binding set, made now if the queue has none yet
        (topology/default_bindings.py); None when the queue does not exist. Raises
        MetadataUnavailable, BackendUnavailable, TopologyConflict."""
        made = make_default_binding(
            self.zk, self.paths, self.subscriptions, vhost, namespace, queue
        )
        if made is not None:
            self.bindings_made += 1
        return made

    def binding_topic(
        self, vhost: str, namespace: NamespaceName, queue: str, set_topic: str
    ) -> BindingSet | None:
        """`queue`'s binding set on the exchange topic `set_topic` (a local name), its own
        topic and subscription made now if they are not yet (topology/binding_topics.py);
        None when there is no such set. Raises MetadataUnavailable, BackendUnavailable,
        TopologyConflict."""
        made = make_binding_topic(
            self.zk, self.paths, self.subscriptions, self.admin, vhost, namespace, queue, set_topic
        )
        if made is not None:
            self.bindings_made += 1
        return made

    @staticmethod
    def _priority_bands(
        namespace: NamespaceName, queue: Queue
    ) -> list[tuple[naming.TopicName, BindingSet]]:
        """A priority queue's band subscriptions (model/priorities.py), highest band first;
        none for other queues. They are binding sets of the queue with no entries, so counts,
        purge, delete, TTL sweeps and consumers cover them like bindings."""
        max_priority = max_priority_of(queue.arguments)
        if max_priority is None:
            return []
        bands = []
        for band in reversed(range(band_count(max_priority))):
            topic = naming.priority_band_topic(namespace, queue.name, band)
            bands.append(
                (
                    topic,
                    BindingSet(
                        queue=queue.name,
                        exchange=DEFAULT_EXCHANGE,
                        topic=topic.local,
                        subscription=naming.subscription_name(
                            queue.name, naming.new_binding_set_id()
                        ),
                        created=now(),
                        exchange_type=PRIORITY_BAND_TYPE,
                    ),
                )
            )
        return bands

    def _delete_subscriptions(self, sets: list[tuple[naming.TopicName, BindingSet]]) -> None:
        for topic, binding_set in sets:
            try:
                self.admin.delete_subscription(topic, binding_set.subscription)
            except Exception as e:
                log.warning("could not delete subscription %s: %s", binding_set.subscription, e)

    def delete_queue(
        self,
        vhost: str,
        namespace: NamespaceName,
        name: str,
        if_unused: bool,
        if_empty: bool,
        owner: str | None,
    ) -> int:
        """Delete a queue with its bindings; returns the ready messages it held. A missing
        queue is fine (RabbitMQ 3.x answers delete-ok with 0). Raises PreconditionFailed
        (if-unused / if-empty), ResourceLocked. `owner` None: the cluster deletes it."""
        deleted = self._delete_queue(vhost, namespace, name, if_unused, if_empty, owner, None)
        return deleted or 0

    def delete_abandoned_queue(
        self,
        vhost: str,
        namespace: NamespaceName,
        name: str,
        still_abandoned: Callable[[Queue], bool],
        reason: str,
    ) -> bool:
        """Delete a queue the cluster found abandoned (auto-delete without consumers,
        exclusive without owner, expired), unless `still_abandoned(queue)` says otherwise
        on a fresh read or an AMQP consumer registers meanwhile (the transaction deletes
        the consumers znode, which fails while it has children). True when deleted."""
        deleted = self._delete_queue(
            vhost, namespace, name, False, False, None, still_abandoned, reason
        )
        return deleted is not None

    def _delete_queue(
        self,
        vhost: str,
        namespace: NamespaceName,
        name: str,
        if_unused: bool,
        if_empty: bool,
        owner: str | None,
        still_abandoned: Callable[[Queue], bool] | None,
        reason: str = "",
    ) -> int | None:
        self.queue_deletions += 1  # before the delete: a get that reads it after looks again

        def attempt() -> int | None:
            base = self.paths.queue(vhost, name)
            listed = self.zk.read(
                [
                    Data(base),
                    Children(base),
                    *(Children(f"{base}/{child}") for child in _COUNTED_CHILDREN),
                    *self._set_listings(vhost, name),
                ]
            )
            found = listed.data(base)
            if found is None:
                return 0 if still_abandoned is None else None
            queue, version = _decoded(found)
            self._check_owner(vhost, queue, owner, QUEUE_DELETE)
            children = self._queue_children_ops(vhost, name, still_abandoned is None, listed)
            if children is None or (still_abandoned is not None and not still_abandoned(queue)):
                return None  # in use again
            extra_ops, consumer_count = children
            # Read once: the counts and the transaction below work from the same records.
            sets, draining = self._read_sets(vhost, name, listed)
            counts = self.counts.queue_overview(
                vhost,
                namespace,
                name,
                (queue, self._with_draining(sets, draining)),
                consumer_count,
            )[0]
            if if_unused and counts.consumer_count:
                raise PreconditionFailed(f"queue '{name}' in vhost '{vhost}' in use", QUEUE_DELETE)
            if if_empty and counts.message_count:
                raise PreconditionFailed(
                    f"queue '{name}' in vhost '{vhost}' not empty", QUEUE_DELETE
                )
            ops: list[Op] = []
            retired = []
            for binding_set, set_version in sets:
                ops.append(
                    Delete(self.paths.binding_set(vhost, name, binding_set.topic), set_version)
                )
                if binding_set.exchange != DEFAULT_EXCHANGE:
                    ops.append(
                        Delete(
                            self.paths.exchange_bound_entry(
                                vhost, binding_set.exchange, name, binding_set.topic
                            )
                        )
                    )
                if not binding_set.made:
                    # Nothing in Pulsar to delete, so no record of it: a first message
                    # making its topic meanwhile finds the set gone and deletes what it
                    # made (topology/binding_topics.py).
                    continue
                retired.append(self._retire(binding_set, None, drain=False))
                ops.append(
                    Create(
                        self.paths.retired_subscription(vhost, binding_set.subscription),
                        encode(retired[-1]),
                    )
                )
            for retired_record, draining_version in draining:
                undrained = replace(retired_record, drain=False)
                retired.append(undrained)
                ops.append(
                    SetData(
                        self.paths.retired_subscription(vhost, retired_record.subscription),
                        encode(undrained),
                        draining_version,
                    )
                )
            ops += extra_ops
            ops += [
                Delete(self.paths.queue_bindings(vhost, name)),
                Delete(self.paths.queue(vhost, name), version),
            ]
            ops += self._auto_delete_ops(vhost, [b for b, _ in sets], removing_queue=name)
            self._commit_or_retry(ops)
            self.ephemerals.forget_under(self.paths.queue(vhost, name) + "/")
            log.info("deleted queue %r in vhost %r%s", name, vhost, f" ({reason})" * bool(reason))
            if is_stream(queue.arguments):
                # Before the reply: the topic is named after the queue, so a stream declared
                # again right after must not lose its first messages to a late delete.
                self._delete_stream_topic(namespace, name)

            def drop() -> None:
                # Subscriptions have names of their own, binding topics too: a queue
                # declared again meanwhile has others.
                for record in retired:
                    self._drop_subscription_now(vhost, namespace, record)

            self.after_reply(drop)
            return counts.message_count

        return _retrying(attempt)

    def _queue_children_ops(
        self, vhost: str, name: str, with_consumers: bool, listed: ReadAnswers
    ) -> tuple[list[Op], int] | None:
        """Deletes of a queue's znodes besides its bindings (consumers, owner, marks), and
        the number of its AMQP consumers, from `listed`: the queue's children and theirs
        (_COUNTED_CHILDREN). With `with_consumers` False, None when AMQP consumers are
        registered; otherwise their znodes are left out, so a consumer registering
        meanwhile fails the transaction."""
        ops: list[Op] = []
        base = self.paths.queue(vhost, name)
        consumer_count = 0
        for child in listed.children(base):
            if child == "bindings":
                continue
            if child in _COUNTED_CHILDREN:
                consumers = listed.children(f"{base}/{child}")
                if consumers and not with_consumers:
                    return None
                ops += [Delete(f"{base}/{child}/{c}") for c in consumers]
                if child == "consumers":
                    consumer_count = len(consumers)
            ops.append(Delete(f"{base}/{child}"))
        return ops, consumer_count

    # ---- queue lifecycle: consumers, ownership, use ------------------------------------------

    def unregister_consumer(
        self, vhost: str, namespace: NamespaceName, queue: Queue, consumer: str
    ) -> bool:
        """The consumer went away (cancel, channel or connection close). An auto-delete
        queue left without consumers is deleted; True when that happened."""
        path = self.paths.queue_consumer(vhost, queue.name, consumer)
        self.ephemerals.forget(path)
        with contextlib.suppress(NodeMissing):
            self.zk.delete(path)
        if expires_after(queue) is not None:
            self.consumers.touch_queue(vhost, queue.name)
        if not queue.auto_delete:
            return False
        return self.delete_abandoned_queue(
            vhost,
            namespace,
            queue.name,
            lambda q: (
                q.auto_delete and self.zk.get(self.paths.queue_consumed(vhost, q.name)) is not None
            ),
            "auto-delete: its last consumer went away",
        )

    def purge_queue(self, vhost: str, namespace: NamespaceName, name: str, owner: str) -> int:
        """Drop the ready messages of a queue; returns how many: the ready count of the
        stats read just before for a subscription skipped whole, the messages actually taken
        for one drained. Raises NotFound, ResourceLocked."""
        queue = self._require_queue(vhost, name, QUEUE_PURGE)
        self._check_owner(vhost, queue, owner, QUEUE_PURGE)
        if is_stream(queue.arguments):
            raise purge_refused(name, vhost)
        purged = 0
        for binding_set, _ in self.binding_sets(vhost, name):
            topic = naming.TopicName(namespace, binding_set.subscription_topic)
            stats = self.admin.subscription_stats(topic).get(binding_set.subscription)
            if stats is not None and stats.unacked and self.backend is not None:
                # skip_all would also drop delivered-unacked messages, which RabbitMQ's
                # purge leaves to their consumers: take only what the broker hands out
                # (not a message a consumer has prefetched, so count what was taken).
                purged += self.backend.drain_subscription(
                    topic, binding_set.subscription, f"purge/{owner}"
                )
            else:
                self.admin.skip_all(topic, binding_set.subscription)
                purged += stats.ready if stats is not None else 0
        return purged

    def _drop_subscription_now(
        self, vhost: str, namespace: NamespaceName, record: RetiredSubscription
    ) -> None:
        topic = naming.TopicName(namespace, record.topic)
        try:
            if record.binding_set is not None and not record.binding_set.made:
                # Never made: no subscription, no topic (a publish making them meanwhile
                # finds the set gone and deletes them: topology/binding_topics.py).
                self.zk.delete(self.paths.retired_subscription(vhost, record.subscription))
                return
            # Not forced: a consumer still attached would reconnect and make the
            # subscription again. Consumers let go when they see the record; the
            # SubscriptionCleaner deletes what is refused here. Nothing else reads a
            # binding's own topic: it goes with its subscription, once this process's
            # producer of it is closed (others close theirs when they see the record).
            if record.owns_topic:
                self.release_producers(topic)
            self.admin.drop_subscription(topic, record.subscription, record.owns_topic)
            self.zk.delete(self.paths.retired_subscription(vhost, record.subscription))
        except Exception as e:
            log.debug(
                "subscription %s on %s left to the cleaner: %s", record.subscription, topic, e
            )

    def _delete_stream_topic(self, namespace: NamespaceName, name: str) -> None:
        """A deleted stream's messages go with it, as on RabbitMQ: its own topic (the
        default exchange's, which only this queue name reads) is deleted, so a stream
        declared again under the name numbers its messages from 0 (docs/mapping.md)."""
        topic = naming.exchange_topic(namespace, "", "direct", name)
        try:
            self.admin.delete_topic(topic, force=True)
        except Exception as e:
            log.warning(
                "could not delete %s of deleted stream %r (a stream declared again under "
                "the name goes on numbering its messages from the old ones): %s",
                topic,
                name,
                e,
            )

    # ---- bindings -----------------------------------------------------------------------------

    def bind(
        self,
        vhost: str,
        namespace: NamespaceName,
        queue_name: str,
        exchange_name: str,
        routing_key: str,
        arguments: dict[str, Any],
        owner: str,
    ) -> None:
        """Raises NotFound (queue or exchange), ResourceLocked, AccessRefused (default
        exchange; checked by the caller), PreconditionFailed (bad headers arguments)."""

        def set_path_of(exchange: Exchange) -> tuple[naming.TopicName, str]:
            topic = naming.exchange_topic(
                namespace, exchange.name, exchange.routing_type, routing_key
            )
            return topic, self.paths.binding_set(vhost, queue_name, topic.local)

        def attempt() -> None:
            # The exchange, the queue and (where the cache knows the exchange's type) the
            # binding set, in one read.
            exchange_path = self.paths.exchange(vhost, exchange_name)
            queue_path = self.paths.queue(vhost, queue_name)
            known = self.known_exchange(vhost, exchange_name)
            guessed = set_path_of(known)[1] if known is not None else None
            listed = self.zk.read(
                [
                    *([Data(exchange_path)] if exchange_name != DEFAULT_EXCHANGE else []),
                    Data(queue_path),
                    *([Data(guessed)] if guessed is not None else []),
                ]
            )
            # With both missing RabbitMQ reports the exchange.
            if exchange_name == DEFAULT_EXCHANGE:
                exchange = Exchange(DEFAULT_EXCHANGE, "direct")
            elif (raw_exchange := listed.data(exchange_path)) is not None:
                exchange = _decoded(raw_exchange)[0]
            else:
                raise NotFound(f"no exchange '{exchange_name}' in vhost '{vhost}'", QUEUE_BIND)
            found_queue = listed.data(queue_path)
            if found_queue is None:
                raise NotFound(f"no queue '{queue_name}' in vhost '{vhost}'", QUEUE_BIND)
            queue: Queue = _decoded(found_queue)[0]
            self._check_owner(vhost, queue, owner, QUEUE_BIND)
            validate_binding_arguments(exchange, arguments)
            topic, set_path = set_path_of(exchange)
            found_set = (
                (None if (raw := listed.data(set_path)) is None else _decoded(raw))
                if set_path == guessed
                else self._read(set_path)
            )
            if found_set is None:
                self._create_binding_set(vhost, queue, exchange, topic, routing_key, arguments)
                return
            binding_set, set_version = found_set
            if any(e.same_binding(routing_key, arguments) for e in binding_set.active_entries):
                return  # binding twice is idempotent
            start = (
                self.admin.last_message_id(
                    naming.TopicName(namespace, binding_set.subscription_topic)
                )
                if binding_set.made
                else None  # no topic yet: nothing was written before this binding
            )
            entry = BindingEntry(routing_key, arguments, start=start)
            updated = binding_set.with_entries((*binding_set.entries, entry))
            self._commit_or_retry(
                [
                    Check(self.paths.exchange(vhost, exchange.name), -1),
                    SetData(set_path, encode(updated), set_version),
                ]
            )

        _retrying(attempt)

    def _create_binding_set(
        self,
        vhost: str,
        queue: Queue,
        exchange: Exchange,
        topic: naming.TopicName,
        routing_key: str,
        arguments: dict[str, Any],
    ) -> None:
        set_id = naming.new_binding_set_id()
        own_topic = (
            naming.binding_topic(topic.namespace, exchange.name, queue.name, set_id)
            if exchange.routing_type in naming.OWN_TOPIC_EXCHANGE_TYPES
            else None
        )
        binding_set = BindingSet(
            queue=queue.name,
            exchange=exchange.name,
            topic=topic.local,
            subscription=naming.subscription_name(queue.name, set_id),
            entries=(BindingEntry(routing_key, arguments),),
            created=now(),
            exchange_type=exchange.routing_type,
            binding_topic="" if own_topic is None else own_topic.local,
            # Its topic and subscription are made by the first publish it routes
            # (topology/binding_topics.py), but a stream's: a stream consumer that started
            # before then would begin that topic at its first read, past what came first.
            made=own_topic is None or is_stream(queue.arguments),
        )
        read_topic = topic if own_topic is None else own_topic
        if binding_set.made:
            self.subscriptions.create(read_topic, binding_set.subscription)
        try:
            self.zk.commit(
                [
                    Check(self.paths.queue(vhost, queue.name), -1),
                    Create(
                        self.paths.binding_set(vhost, queue.name, topic.local),
                        encode(binding_set),
                    ),
                    Create(
                        self.paths.exchange_bound_entry(
                            vhost, exchange.name, queue.name, topic.local
                        )
                    ),
                ]
            )
        except TransactionFailed as e:
            if binding_set.made:
                self.admin.delete_subscription(read_topic, binding_set.subscription)
                if own_topic is not None:
                    self.admin.delete_topic(own_topic)
            if isinstance(e.cause, NodeMissing):
                # The queue or the exchange went away meanwhile: answer as if it never was.
                if e.index == 0:
                    raise NotFound(f"no queue '{queue.name}' in vhost '{vhost}'", QUEUE_BIND) from e
                raise NotFound(
                    f"no exchange '{exchange.name}' in vhost '{vhost}'", QUEUE_BIND
                ) from e
            if isinstance(e.cause, NodeAlreadyExists):
                raise _Retry from e
            raise

    def unbind(
        self,
        vhost: str,
        namespace: NamespaceName,
        queue_name: str,
        exchange_name: str,
        routing_key: str,
        arguments: dict[str, Any],
        owner: str,
    ) -> None:
        """Raises NotFound (queue or exchange), ResourceLocked. Unbinding a binding that
        does not exist is fine (RabbitMQ 3.x)."""

        def attempt() -> None:
            # RabbitMQ 3.x: unbinding what does not exist (binding, queue or exchange) is ok.
            found_queue = self.get_queue(vhost, queue_name)
            found_exchange = self.get_exchange(vhost, exchange_name)
            if found_queue is None or found_exchange is None:
                return
            queue: Queue = found_queue[0]
            exchange: Exchange = found_exchange[0]
            topic = naming.exchange_topic(
                namespace, exchange.name, exchange.routing_type, routing_key
            )
            set_path = self.paths.binding_set(vhost, queue_name, topic.local)
            found_set = self._read(set_path)
            if found_set is None:
                return
            binding_set, set_version = found_set
            active = binding_set.active_entries
            if not any(e.same_binding(routing_key, arguments) for e in active):
                return
            self._check_owner(vhost, queue, owner, QUEUE_UNBIND)
            end = (
                self.admin.last_message_id(
                    naming.TopicName(namespace, binding_set.subscription_topic)
                )
                if binding_set.made
                else None  # nothing was written: nothing to drain
            )
            remaining = [e for e in active if not e.same_binding(routing_key, arguments)]
            if remaining:
                entries = tuple(
                    replace(e, end=end, unbound=True)
                    if e.active and e.same_binding(routing_key, arguments)
                    else e
                    for e in binding_set.entries
                )
                self._commit_or_retry(
                    [SetData(set_path, encode(binding_set.with_entries(entries)), set_version)]
                )
                return
            ops: list[Op] = [
                Delete(set_path, set_version),
                Delete(
                    self.paths.exchange_bound_entry(vhost, exchange.name, queue_name, topic.local)
                ),
            ]
            if binding_set.made:  # else nothing in Pulsar to retire (as in _delete_queue)
                record = self._retire(binding_set, end, drain=True)
                retired_now.append(record)
                ops.append(
                    Create(
                        self.paths.retired_subscription(vhost, binding_set.subscription),
                        encode(record),
                    )
                )
            ops += self._auto_delete_ops(vhost, [binding_set], removing_queue=queue_name)
            self._commit_or_retry(ops)

        retired_now: list[RetiredSubscription] = []
        _retrying(attempt)
        for record in retired_now[-1:]:
            if not record.drain:
                self._drop_subscription_now(vhost, namespace, record)

    # ---- helpers ------------------------------------------------------------------------------

    def _auto_delete_ops(
        self, vhost: str, removed: list[BindingSet], removing_queue: str
    ) -> list[Op]:
        """Deletes of auto-delete exchanges that lose their last binding with `removed`
        (and of auto-delete exchanges bound only to those, up the chain)."""
        ops: list[Op] = []
        gone: set[str] = set()
        for exchange_name in {b.exchange for b in removed if b.exchange != DEFAULT_EXCHANGE}:
            cached = self.known_exchange(vhost, exchange_name)
            if cached is not None and not cached.auto_delete:
                # An exchange's auto-delete flag is fixed at its declaration.
                continue
            found = self.get_exchange(vhost, exchange_name)
            if found is None or not found[0].auto_delete:
                continue
            version = found[1]
            bound = set(self.zk.children(self.paths.exchange_bound(vhost, exchange_name)))
            leaving = {
                self.paths.exchange_bound_entry(
                    vhost, exchange_name, removing_queue, b.topic
                ).rsplit("/", 1)[1]
                for b in removed
                if b.exchange == exchange_name
            }
            if bound - leaving or self.exchange_bindings.in_use_as_source(vhost, exchange_name):
                continue
            ops += self.exchange_bindings.exchange_delete_ops(vhost, exchange_name, version)
            gone.add(exchange_name)
        if gone:
            ops += self.exchange_bindings.cascade_ops(vhost, gone)
        return unique_deletes(ops)

    def _commit_or_retry(self, ops: list[Op]) -> None:
        try:
            self.zk.commit(ops)
        except TransactionFailed as e:
            # Someone changed what we read (or deleted/created it): read again and redo.
            log.debug("topology transaction lost (%s); retrying", e)
            raise _Retry from e

    @staticmethod
    def _retire(binding_set: BindingSet, end: Any, drain: bool) -> RetiredSubscription:
        final = binding_set.with_entries(
            tuple(
                e if e.unbound else replace(e, end=end, unbound=True) for e in binding_set.entries
            )
        )
        return RetiredSubscription(
            topic=binding_set.subscription_topic,
            subscription=binding_set.subscription,
            queue=binding_set.queue,
            end=end,
            # Nothing was published while bound: nothing to drain, delete at once.
            drain=drain and any(e.end is not None for e in final.entries),
            retired_at=now(),
            binding_set=final,
            owns_topic=bool(binding_set.binding_topic),
        )

    def _topic(self, vhost: str, local: str) -> naming.TopicName:
        record = self.get_vhost(vhost)
        if record is None:
            raise NotFound(f"no vhost '{vhost}'")
        return naming.TopicName(record.namespace, local)


# A queue's children whose own children (AMQP consumers, single-active turns) its deletion
# lists and deletes first.
_COUNTED_CHILDREN = ("consumers", "active")


def _decoded(found: tuple[bytes, int]) -> tuple[Any, int]:
    return decode(found[0]), found[1]


def server_named_queue() -> str:
    """RabbitMQ's format: amq.gen- followed by 22 URL-safe base64 characters."""
    return "amq.gen-" + secrets.token_urlsafe(16)[:22]
