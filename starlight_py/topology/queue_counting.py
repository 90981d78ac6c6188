"""How many messages a queue holds and how many consumers read it, as RabbitMQ counts them:
Pulsar's subscription stats for what is stored, ZooKeeper for the consumers and for the
deliveries other proxies hold unacknowledged, this process's own books for its deliveries
(declare-ok, queue.purge, basic.get's message count, starlight-admin and the metrics)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlight_py.backend.pulsar_admin import PulsarAdmin
from starlight_py.metadata.ephemeral import EphemeralNodes
from starlight_py.metadata.records import BindingSet, Paths, segment
from starlight_py.metadata.zookeeper import ZooKeeperClient
from starlight_py.model import naming
from starlight_py.model.counts import QueueFlow, ready_messages
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.queue_limits import QueueDepth
from starlight_py.model.streams import is_stream
from starlight_py.model.topology import Queue

__all__ = ["QueueCounting", "QueueCounts"]

log = logging.getLogger("starlight.topology")


@dataclass(frozen=True)
class QueueCounts:
    message_count: int
    consumer_count: int


class QueueCounting:
    """Counts of the queues in `paths` (synchronous: called from worker threads)."""

    def __init__(
        self,
        zookeeper: ZooKeeperClient,
        paths: Paths,
        admin: PulsarAdmin,
        ephemerals: EphemeralNodes,
        get_queue: Callable[[str, str], tuple[Queue, int] | None],
        binding_sets: Callable[[str, str], list[tuple[BindingSet, int]]],
    ) -> None:
        self.zk = zookeeper
        self.paths = paths
        self.admin = admin
        self.ephemerals = ephemerals
        self._get_queue = get_queue
        self._binding_sets = binding_sets
        # The other proxies' unacknowledged deliveries per queue, when read (held_messages).
        self._others_held: dict[tuple[str, str], tuple[float, int]] = {}
        # This process's own unacked deliveries of a queue (gateway/consume/held_messages.py),
        # exact where ZooKeeper's copy may lag: set by the proxy, none in the admin tool.
        self.local_held: Callable[[str, str], int] | None = None
        # ... and its deliveries settled a moment ago, which Pulsar may still count.
        self.local_settling: Callable[[str, str], int] = lambda _vhost, _queue: 0

    def queue_counts(self, vhost: str, namespace: NamespaceName, name: str) -> QueueCounts:
        """Ready messages and AMQP consumers, as RabbitMQ counts them.

        Ready: the backlog of the queue's subscriptions in Pulsar's stats (live), less the
        delayed messages the broker tracks and less the deliveries still unacked on every
        proxy (`held_messages`): what the proxies read ahead but have not delivered stays
        ready. Consumers: their ZooKeeper registrations; every proxy registers a consumer
        before consume-ok and removes it before cancel-ok, while a Pulsar consumer stays
        open after a cancel as long as the channel holds messages it delivered (and
        basic.get uses Pulsar consumers too)."""
        return self.queue_overview(vhost, namespace, name)[0]

    def queue_overview(
        self,
        vhost: str,
        namespace: NamespaceName,
        name: str,
        known: tuple[Queue | None, list[tuple[BindingSet, int]]] | None = None,
        consumers: int | None = None,
    ) -> tuple[QueueCounts, QueueFlow]:
        """`queue_counts`, and how messages flow through the queue (from the same stats
        calls). `known`: the queue and its `binding_sets` as just read (not read again);
        `consumers`: its consumer count as just read. Raises as `queue_depth`."""
        if consumers is None:
            consumers = self.consumer_count(vhost, name)
        if known is None:
            found = self._get_queue(vhost, name)
            queue = None if found is None else found[0]
        else:
            queue = known[0]
        if queue is not None and is_stream(queue.arguments):
            # RabbitMQ 3.10 counts no messages in a stream's declare-ok; its size is in
            # `queue_depth` (starlight-admin, metrics).
            return QueueCounts(0, consumers), QueueFlow()
        sets = None if known is None else known[1]
        depth, _, flow = self.queue_depth_and_flow(vhost, namespace, name, False, sets)
        return QueueCounts(depth.messages, consumers), flow

    def consumer_count(self, vhost: str, name: str) -> int:
        """The queue's AMQP consumers on every proxy (their ZooKeeper registrations)."""
        return len(self.zk.children(self.paths.queue_consumers(vhost, name)))

    def held_messages(self, vhost: str, name: str) -> int:
        """AMQP deliveries of the queue not yet acknowledged, on every proxy: this
        process's own exactly, the others' as they wrote them (at most FLUSH_INTERVAL old).
        The others' sum is kept for `recent_held_messages`."""
        others = self._held_by_others(vhost, name)
        if len(self._others_held) >= 10_000:
            self._others_held.clear()
        self._others_held[(vhost, name)] = (time.monotonic(), others)
        return self._own_held(vhost, name) + others

    def recent_held_messages(self, vhost: str, name: str, others_max_age: float) -> int | None:
        """`held_messages` when the others' sum was read at most `others_max_age` seconds
        ago (no ZooKeeper read: callable on the trio thread), else None."""
        read = self._others_held.get((vhost, name))
        if read is None or time.monotonic() - read[0] > others_max_age:
            return None
        return self._own_held(vhost, name) + read[1]

    def _own_held(self, vhost: str, name: str) -> int:
        return self.local_held(vhost, name) if self.local_held is not None else 0

    def _held_by_others(self, vhost: str, name: str) -> int:
        own = segment(self.ephemerals.owner_id) if self.local_held is not None else None
        total = 0
        base = self.paths.held(vhost, name)
        for child in self.zk.children(base):
            if child == own:
                continue
            found = self.zk.get(f"{base}/{child}")
            if found is not None:
                try:
                    total += int(found[0] or b"0")
                except ValueError:
                    log.warning("ignoring unreadable unacked count in %s/%s", base, child)
        return total

    def queue_depth(
        self, vhost: str, namespace: NamespaceName, name: str, with_bytes: bool
    ) -> tuple[QueueDepth, dict[str, tuple[naming.TopicName, int]]]:
        """A queue's ready messages (and, `with_bytes`, their stored size), counted as in
        `queue_counts`, with each binding subscription's topic and ready count as Pulsar
        sees it (for drop-head). Raises PulsarAdminError, BackendUnavailable,
        MetadataUnavailable."""
        depth, by_subscription, _ = self.queue_depth_and_flow(vhost, namespace, name, with_bytes)
        return depth, by_subscription

    def queue_depth_and_flow(
        self,
        vhost: str,
        namespace: NamespaceName,
        name: str,
        with_bytes: bool,
        sets: list[tuple[BindingSet, int]] | None = None,
    ) -> tuple[QueueDepth, dict[str, tuple[naming.TopicName, int]], QueueFlow]:
        """`queue_depth`, and the flow through the queue's subscriptions (`sets`: its
        `binding_sets` as just read). Raises as `queue_depth`."""
        flow = QueueFlow()
        waiting = 0
        undispatched = 0
        stored = 0
        backlog = 0
        by_subscription: dict[str, tuple[naming.TopicName, int]] = {}
        for binding_set, _ in self._binding_sets(vhost, name) if sets is None else sets:
            if not binding_set.made:
                continue  # no topic yet, so no message (topology/binding_topics.py)
            topic = naming.TopicName(namespace, binding_set.subscription_topic)
            stats = self.admin.subscription_stats(topic, with_bytes).get(binding_set.subscription)
            if stats is not None:
                waiting += max(0, stats.backlog - stats.delayed)
                undispatched += stats.ready
                stored += stats.backlog_bytes
                backlog += stats.backlog
                by_subscription[binding_set.subscription] = (topic, stats.ready)
                flow = flow.plus(stats.flow)
        ready = 0
        if waiting:
            ready = ready_messages(
                waiting,
                undispatched,
                self.held_messages(vhost, name),
                self.local_settling(vhost, name),
            )
        size = stored * ready // backlog if backlog > 0 else 0
        return QueueDepth(ready, size), by_subscription, flow
