"""Where a queue's messages are read from, for consumers and basic.get: the queue's record
and its binding sets (the topology cache's when it has them all, else ZooKeeper's), and
Pulsar's stats of their subscriptions, asked at once."""

from __future__ import annotations

import trio

from starlight_py.amqp.method_ids import BASIC_CONSUME
from starlight_py.backend.pulsar_admin import SubscriptionStats
from starlight_py.gateway.topology_methods import VhostContext
from starlight_py.metadata.cache import TopologyCache
from starlight_py.metadata.records import BindingSet
from starlight_py.model import naming
from starlight_py.model.topology import Queue
from starlight_py.topology.service import TopologyService


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
            self.topology.check_usable(vhost, cached, self.ctx.owner, BASIC_CONSUME)
            return cached, sets
        record = await trio.to_thread.run_sync(
            self.topology.usable_queue, vhost, queue, self.ctx.owner, BASIC_CONSUME
        )
        found = await trio.to_thread.run_sync(self.topology.binding_sets, vhost, queue)
        return record, [s for s, _ in found]

    async def binding_sets_of(self, queue: Queue) -> list[BindingSet]:
        """The binding sets to read `queue` from, with the retired ones still draining into
        it, from ZooKeeper. Not from the cache: a binding this connection made a moment ago
        (declare, bind, consume in a row) may not be in it yet, and a consumer that started
        without it would never read that binding's messages (a fanout subscriber got
        nothing in CI), nor an unbind's messages still draining."""
        found = await trio.to_thread.run_sync(
            self.topology.binding_sets, self.ctx.vhost, queue.name
        )
        return [s for s, _ in found]

    async def subscription_stats(
        self, sets: list[BindingSet], counts_only: bool = False
    ) -> dict[str, SubscriptionStats]:
        """Pulsar's stats of each set's subscription (asked at once), by subscription.
        `counts_only`: backlog, unacknowledged and delayed messages only, from the brokers'
        plugin when they have it (one cheaper request: what basic.get needs)."""
        found: dict[str, SubscriptionStats] = {}
        admin = self.topology.admin

        def read(topic: naming.TopicName) -> dict[str, SubscriptionStats]:
            counted = admin.subscription_counts(topic) if counts_only else None
            return admin.subscription_stats(topic) if counted is None else counted

        async def one(binding_set: BindingSet) -> None:
            topic = naming.TopicName(self.ctx.namespace, binding_set.subscription_topic)
            stats = await trio.to_thread.run_sync(read, topic)
            if binding_set.subscription in stats:
                found[binding_set.subscription] = stats[binding_set.subscription]

        async with trio.open_nursery() as nursery:
            for binding_set in sets:
                nursery.start_soon(one, binding_set)
        return found
