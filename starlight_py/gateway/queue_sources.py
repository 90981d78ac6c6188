"""Where a queue's messages are read from, for consumers and basic.get: the queue's record
and its binding sets (the topology cache's when it has them all, else ZooKeeper's), and
Pulsar's stats of their subscriptions, asked at once."""

from __future__ import annotations

import trio

from starlight_py.backend.pulsar_admin import SubscriptionStats
from starlight_py.gateway.topology_methods import VhostContext
from starlight_py.metadata.cache import TopologyCache
from starlight_py.metadata.records import BindingSet
from starlight_py.model import naming
from starlight_py.model.priorities import band_count, max_priority_of
from starlight_py.model.topology import Queue
from starlight_py.topology.service import TopologyService


def expected_set_count(queue: Queue) -> int:
    """How many binding sets a queue has at least: its default binding, and a priority
    queue's bands."""
    max_priority = max_priority_of(queue.arguments)
    return 1 + (band_count(max_priority) if max_priority is not None else 0)


class QueueSources:
    """The binding sets and subscription stats of one connection's queues."""

    def __init__(self, ctx: VhostContext, cache: TopologyCache, topology: TopologyService) -> None:
        self.ctx = ctx
        self.cache = cache
        self.topology = topology

    async def to_consume(self, queue: str) -> tuple[Queue, list[BindingSet]]:
        """The queue (usable by this connection: NotFound, ResourceLocked) and the binding
        sets to read, its own from the topology cache when it has them all (no ZooKeeper
        round trip for them), else from ZooKeeper. Registering the consumer then confirms
        in ZooKeeper that the queue is still there."""
        vhost = self.ctx.vhost
        cached = self.cache.queue(vhost, queue)
        if cached is not None:
            sets = await self.binding_sets_of(cached)
            self.topology.check_usable(vhost, cached, self.ctx.owner, (60, 20))
            return cached, sets
        record = await trio.to_thread.run_sync(
            self.topology.usable_queue, vhost, queue, self.ctx.owner, (60, 20)
        )
        found = await trio.to_thread.run_sync(self.topology.binding_sets, vhost, queue)
        return record, [s for s, _ in found]

    def cached_sets(self, queue: Queue) -> list[BindingSet] | None:
        """The queue's own binding sets from the topology cache, None unless it has at
        least those the queue was declared with."""
        sets = self.cache.binding_sets_of_queue(self.ctx.vhost, queue.name)
        if not sets or len(sets) < expected_set_count(queue):
            return None
        return sets

    async def binding_sets_of(self, queue: Queue) -> list[BindingSet]:
        """The binding sets to read `queue` from: its own (the cache's, else ZooKeeper's)
        and the retired ones still draining into it, always from ZooKeeper: an unbind a
        moment ago may not be in the cache yet, and its messages must not be left behind."""
        vhost = self.ctx.vhost
        cached = self.cached_sets(queue)
        if cached is None:
            found = await trio.to_thread.run_sync(self.topology.binding_sets, vhost, queue.name)
            return [s for s, _ in found]
        draining = await trio.to_thread.run_sync(self.topology.draining, vhost, queue.name)
        known = {s.subscription for s in cached}
        extra = [
            record.binding_set
            for record, _ in draining
            if record.binding_set is not None and record.binding_set.subscription not in known
        ]
        return cached + extra

    async def subscription_stats(self, sets: list[BindingSet]) -> dict[str, SubscriptionStats]:
        """Pulsar's stats of each set's subscription (asked at once), by subscription."""
        found: dict[str, SubscriptionStats] = {}

        async def one(binding_set: BindingSet) -> None:
            topic = naming.TopicName(self.ctx.namespace, binding_set.topic)
            stats = await trio.to_thread.run_sync(self.topology.admin.subscription_stats, topic)
            if binding_set.subscription in stats:
                found[binding_set.subscription] = stats[binding_set.subscription]

        async with trio.open_nursery() as nursery:
            for binding_set in sets:
                nursery.start_soon(one, binding_set)
        return found
