"""The SubscriptionCleaner: one proxy at a time (the elected leader) tidies up what nobody
else will.

Each pass:

- **Retired subscriptions** (of unbound bindings and deleted queues). One still draining is
  left alone until its cursor's mark-delete position reaches the binding's end (every message
  routed to the queue through it is acknowledged); then it is marked drained, consumers that
  still read it let go, and a later pass deletes the subscription (not forced while consumers
  hold it, forced after the grace period) and the record.
- **Unbound entries** of binding sets still in use, once drained the same way.
- **Expired messages** of queues with an `x-message-ttl` and no dead-letter exchange:
  Pulsar's expireMessages acknowledges, on each of the queue's subscriptions, what was
  published more than the TTL (rounded up to whole seconds) ago, so expired messages of a
  queue nobody reads stop counting. (Deliveries skip expired messages anyway; queues with a
  dead-letter exchange are left to their readers, which dead-letter them.)
- **Abandoned queues**: exclusive queues whose owner znode is gone (the owning proxy died),
  auto-delete queues that had a consumer and have none (a proxy died before it could delete
  them), queues unused for longer than their `x-expires`. A queue must look abandoned for
  the grace period (a proxy that lost its ZooKeeper session is re-creating its ephemeral
  znodes), except expired queues, whose timer is their own.

Every action is logged and counted in `CleanerStats`; a pass does at most `max_actions`
deletions, the rest waits for the next pass.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace

from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdminError
from starlight_py.cluster.election import LeaderElection
from starlight_py.metadata.cache import TopologyCache, name_of
from starlight_py.metadata.records import BindingSet, RetiredSubscription, decode, encode
from starlight_py.metadata.zookeeper import (
    MetadataUnavailable,
    NodeMissing,
    NodeNotEmpty,
    VersionConflict,
)
from starlight_py.model import naming
from starlight_py.model.dead_letters import MessagePolicy
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.streams import StreamRetention, is_stream
from starlight_py.model.topology import Queue
from starlight_py.topology.service import QueueState, TopologyService, expires_after

log = logging.getLogger("starlight.cleaner")


@dataclass
class CleanerStats:
    """What the cleaner did since this process started (exported as metrics)."""

    passes: int = 0
    passes_as_leader: int = 0
    subscriptions_deleted: int = 0
    subscriptions_drained: int = 0
    entries_pruned: int = 0
    expiry_sweeps: int = 0  # expireMessages calls on queues with x-message-ttl
    queues_deleted: Counter[str] = field(default_factory=Counter)  # by reason
    errors: int = 0
    leader: bool = False
    # Each stream's size at the last pass (leader only): (vhost, queue) -> (messages, bytes)
    # its subscriptions keep.
    stream_sizes: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)


@dataclass
class PassReport:
    actions: int = 0
    waiting_to_drain: int = 0
    deferred: bool = False  # stopped at max_actions


class _Budget(Exception):
    """This pass has done all it may."""


class SubscriptionCleaner:
    def __init__(
        self,
        topology: TopologyService,
        cache: TopologyCache,
        election: LeaderElection,
        grace: float,
        max_actions: int,
    ) -> None:
        self.topology = topology
        self.admin = topology.admin
        self.zk = topology.zk
        self.paths = topology.paths
        self.cache = cache
        self.election = election
        self.grace = grace
        self.max_actions = max_actions
        self.stats = CleanerStats()
        # Memory of the current leadership (reset when it is lost):
        self._suspects: dict[tuple[str, str, str], float] = {}  # first seen abandoned
        self._last_in_use: dict[tuple[str, str], float] = {}  # x-expires queues
        self._refused: dict[tuple[str, str], float] = {}  # first non-forced delete refused
        self._report = PassReport()

    # ---- one pass --------------------------------------------------------------------------

    def run_once(self) -> PassReport | None:
        """One pass if this proxy leads; None otherwise. Raises MetadataUnavailable when
        ZooKeeper cannot tell who leads."""
        self.stats.passes += 1
        leading = self.election.is_leader()
        if leading != self.stats.leader:
            self.stats.leader = leading
            if leading:
                log.info("this proxy now leads the SubscriptionCleaner")
            else:
                log.info("this proxy no longer leads the SubscriptionCleaner")
            self._suspects.clear()
            self._last_in_use.clear()
            self._refused.clear()
        if not leading:
            return None
        self.stats.passes_as_leader += 1
        self._report = PassReport()
        try:
            self._retired_subscriptions()
            self._unbound_entries()
            self._expired_messages()
            self._stream_retention()
            self._abandoned_queues()
            self._stale_held_counts()
        except _Budget:
            self._report.deferred = True
            log.info("cleaner pass stopped after %d actions; the rest waits", self.max_actions)
        if self._report.actions:
            log.info(
                "cleaner pass: %d actions, %d subscriptions still draining",
                self._report.actions,
                self._report.waiting_to_drain,
            )
        return self._report

    def _spend(self) -> None:
        self._report.actions += 1
        if self._report.actions >= self.max_actions:
            raise _Budget

    def _namespace(self, vhost: str) -> NamespaceName | None:
        record = self.topology.get_vhost(vhost)
        return record.namespace if record else None

    # ---- retired subscriptions -------------------------------------------------------------

    def _retired_subscriptions(self) -> None:
        for vhost, cached in self.cache.retired_records():
            namespace = self._namespace(vhost)
            if namespace is None:
                continue
            try:
                self._retired_one(vhost, namespace, cached)
            except (PulsarAdminError, BackendUnavailable, MetadataUnavailable) as e:
                self.stats.errors += 1
                log.warning("cleaner: subscription %s: %s", cached.subscription, e)

    def _retired_one(
        self, vhost: str, namespace: NamespaceName, cached: RetiredSubscription
    ) -> None:
        path = self.paths.retired_subscription(vhost, cached.subscription)
        found = self.zk.get(path)
        if found is None:
            return
        record = decode(found[0])
        if not isinstance(record, RetiredSubscription):
            return
        topic = naming.TopicName(namespace, record.topic)
        if record.drain:
            position = self.admin.cursor_position(topic, record.subscription)
            if position is not None and record.end is not None and position < record.end.entry():
                self._report.waiting_to_drain += 1
                return
            # Drained (or gone): consumers still reading it let go when they see this.
            try:
                self.zk.set(path, encode(replace(record, drain=False)), found[1])
            except (VersionConflict, NodeMissing):
                return
            self.stats.subscriptions_drained += 1
            log.info(
                "cleaner: subscription %s of queue %r in vhost %r drained up to %s",
                record.subscription,
                record.queue,
                vhost,
                record.end,
            )
            self._spend()
            return
        key = (vhost, record.subscription)
        refused_at = self._refused.get(key)
        force = refused_at is not None and time.monotonic() - refused_at >= self.grace
        try:
            # A binding's own topic has no other reader: it goes too, never by force (a
            # producer still on it would make it again; proxies close their producers of
            # retired binding topics within seconds: ProducerPool.retired).
            self.admin.drop_subscription(topic, record.subscription, record.owns_topic, force)
        except PulsarAdminError as e:
            if e.status != 412:
                raise
            # Consumers (or producers) still attached: they let go once they see the
            # record, or when idle; wait.
            self._refused.setdefault(key, time.monotonic())
            return
        self._refused.pop(key, None)
        with contextlib.suppress(NodeMissing):
            self.zk.delete(path)
        self.stats.subscriptions_deleted += 1
        log.info(
            "cleaner: deleted subscription %s on %s (queue %r, vhost %r)%s",
            record.subscription,
            topic,
            record.queue,
            vhost,
            " by force" if force else "",
        )
        self._spend()

    # ---- unbound entries of live binding sets -----------------------------------------------

    def _unbound_entries(self) -> None:
        for vhost, cached in self.cache.all_binding_sets():
            if all(e.active for e in cached.entries):
                continue
            namespace = self._namespace(vhost)
            if namespace is None:
                continue
            try:
                self._prune(vhost, namespace, cached)
            except (PulsarAdminError, BackendUnavailable, MetadataUnavailable) as e:
                self.stats.errors += 1
                log.warning("cleaner: binding set %s: %s", cached.subscription, e)

    def _prune(self, vhost: str, namespace: NamespaceName, cached: BindingSet) -> None:
        topic = naming.TopicName(namespace, cached.subscription_topic)
        # A set not made yet has no messages: its unbound entries go at once.
        position = self.admin.cursor_position(topic, cached.subscription) if cached.made else None
        if position is None and cached.made:
            return
        path = self.paths.binding_set(vhost, cached.queue, cached.topic)
        found = self.zk.get(path)
        if found is None:
            return
        current = decode(found[0])
        if not isinstance(current, BindingSet):
            return
        if current.made and position is None:
            return  # made since the cache showed it: next pass
        keep = tuple(
            e
            for e in current.entries
            if e.active or (position is not None and e.end is not None and position < e.end.entry())
        )
        if len(keep) == len(current.entries):
            return
        try:
            self.zk.set(path, encode(current.with_entries(keep)), found[1])
        except (VersionConflict, NodeMissing):
            return  # changed meanwhile: next pass
        pruned = len(current.entries) - len(keep)
        self.stats.entries_pruned += pruned
        log.info(
            "cleaner: dropped %d drained unbound entries of queue %r on %s",
            pruned,
            cached.queue,
            topic,
        )
        self._spend()

    # ---- abandoned queues ------------------------------------------------------------------

    def _expired_messages(self) -> None:
        for vhost, cached in self.cache.queues():
            policy = MessagePolicy.of(cached.arguments)
            if policy.message_ttl_ms is None or policy.dead_letter_exchange is not None:
                continue
            namespace = self._namespace(vhost)
            if namespace is None:
                continue
            older_than = math.ceil(policy.message_ttl_ms / 1000)
            for binding_set in self.cache.made_sets_of_queue(vhost, cached.name):
                topic = naming.TopicName(namespace, binding_set.subscription_topic)
                try:
                    self.admin.expire_messages(topic, binding_set.subscription, older_than)
                    self.stats.expiry_sweeps += 1
                except (PulsarAdminError, BackendUnavailable) as e:
                    self.stats.errors += 1
                    log.warning("cleaner: expiring messages of queue %r: %s", cached.name, e)

    def _stream_retention(self) -> None:
        """Streams keep their messages on subscriptions nothing reads: let go of those older
        than x-max-age (Pulsar's expireMessages) and of the oldest beyond x-max-length-bytes
        (skip), so that Pulsar's retention can delete them (docs/mapping.md#stream-queues);
        and note each stream's size for the metrics."""
        sizes: dict[tuple[str, str], tuple[int, int]] = {}
        for vhost, cached in self.cache.queues():
            if not is_stream(cached.arguments):
                continue
            namespace = self._namespace(vhost)
            if namespace is None:
                continue
            retention = StreamRetention.of(cached.arguments)
            sets = [
                *self.cache.made_sets_of_queue(vhost, cached.name),
                *self.cache.draining_sets(vhost, cached.name),
            ]
            messages = size = 0
            for binding_set in sets:
                topic = naming.TopicName(namespace, binding_set.subscription_topic)
                try:
                    kept = self._retain(topic, binding_set.subscription, retention)
                except (PulsarAdminError, BackendUnavailable) as e:
                    self.stats.errors += 1
                    log.warning("cleaner: retention of stream %r: %s", cached.name, e)
                    continue
                messages, size = messages + kept[0], size + kept[1]
            sizes[(vhost, cached.name)] = (messages, size)
        self.stats.stream_sizes = sizes

    def _retain(
        self, topic: naming.TopicName, subscription: str, retention: StreamRetention | None
    ) -> tuple[int, int]:
        """Apply the retention to one subscription; what it keeps then (messages, bytes)."""
        if retention is not None and retention.max_age_seconds is not None:
            self.admin.expire_messages(topic, subscription, retention.max_age_seconds)
            self.stats.expiry_sweeps += 1
        stats = self.admin.subscription_stats(topic, with_bytes=True).get(subscription)
        if stats is None:
            return (0, 0)
        over = retention.messages_over(stats.backlog, stats.backlog_bytes) if retention else 0
        if over:
            self.admin.skip_messages(topic, subscription, over)
            self._spend()
            kept = stats.backlog - over
            return (kept, stats.backlog_bytes * kept // max(1, stats.backlog))
        return (stats.backlog, stats.backlog_bytes)

    def _stale_held_counts(self) -> None:
        """The folders of unacked counts (gateway/consume/held_messages.py) of queues that no longer
        exist, once no proxy has a count in them."""
        root = self.paths.held_root
        for vhost_segment in self.zk.children(root):
            vhost = name_of(vhost_segment)
            for queue_segment in self.zk.children(f"{root}/{vhost_segment}"):
                if self.cache.queue(vhost, name_of(queue_segment)) is not None:
                    continue
                with contextlib.suppress(NodeMissing, NodeNotEmpty):
                    self.zk.delete(f"{root}/{vhost_segment}/{queue_segment}")
                    self._spend()

    def _abandoned_queues(self) -> None:
        now = time.monotonic()
        seen: set[tuple[str, str, str]] = set()
        for vhost, cached in self.cache.queues():
            if not (cached.exclusive or cached.auto_delete or expires_after(cached)):
                continue
            try:
                state = self.topology.consumers.queue_state(vhost, cached.name)
                if state is None:
                    continue
                reason = self._abandoned(vhost, state, now)
                if reason is None:
                    continue
                key = (vhost, cached.name, reason)
                seen.add(key)
                first = self._suspects.setdefault(key, now)
                if now - first < self.grace and not reason.startswith("expired"):
                    continue
                self._delete(vhost, state.queue, reason)
            except (PulsarAdminError, BackendUnavailable, MetadataUnavailable) as e:
                self.stats.errors += 1
                log.warning("cleaner: queue %r in vhost %r: %s", cached.name, vhost, e)
        for key in set(self._suspects) - seen:
            del self._suspects[key]

    def _abandoned(self, vhost: str, state: QueueState, now: float) -> str | None:
        queue = state.queue
        if queue.exclusive and not state.has_owner:
            return "exclusive: its owning connection's proxy is gone"
        if queue.auto_delete and state.consumed and state.consumers == 0:
            return "auto-delete: its last consumer is gone"
        # A policy's `expires` is in the cache's record, not in the declared one.
        expires = expires_after(self.cache.queue(vhost, queue.name) or queue)
        if expires is None:
            return None
        key = (vhost, queue.name)
        if state.used_at is None:
            # Declared without x-expires, so never marked used: a policy gave it `expires`
            # just now, and its clock starts now (as RabbitMQ's, when a policy changes).
            self.topology.consumers.touch_queue(vhost, queue.name)
            return None
        if state.consumers:
            self._last_in_use[key] = now
            return None
        # Unused since the later of: the last use written to ZooKeeper (declare, get,
        # consumer changes) and the last pass of this leader that saw consumers.
        idle_for = time.time() - (state.used_at or 0.0)
        if key in self._last_in_use:
            idle_for = min(idle_for, now - self._last_in_use[key])
        if idle_for < expires:
            return None
        return f"expired: unused for {idle_for:.1f} s (x-expires {expires:.1f} s)"

    def _delete(self, vhost: str, queue: Queue, reason: str) -> None:
        namespace = self._namespace(vhost)
        if namespace is None:
            return

        def still_abandoned(current: Queue) -> bool:
            state = self.topology.consumers.queue_state(vhost, current.name)
            return state is not None and self._abandoned(vhost, state, time.monotonic()) is not None

        if self.topology.delete_abandoned_queue(
            vhost, namespace, queue.name, still_abandoned, f"cleaner, {reason}"
        ):
            self.stats.queues_deleted[reason.split(":", 1)[0]] += 1
            self._last_in_use.pop((vhost, queue.name), None)
            self._spend()
