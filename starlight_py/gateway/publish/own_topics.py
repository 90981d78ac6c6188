"""Before a message is written to a binding's own topic: the topic and its subscription
exist. They are made by the first publish the binding set routes
(topology/binding_topics.py), in the producer pool's task that makes the topic's producer:
the publishing connection does not wait for them, and what it sends there is written, in
order, once they exist. A connection publishing round robin to 1,000 new bindings thus
has them made at once, not one after the other."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from starlight_py.gateway.topology_methods import VhostContext
from starlight_py.metadata.cache import TopologyCache
from starlight_py.model import naming
from starlight_py.topology.service import TopologyService

__all__ = ["OwnTopics"]


class OwnTopics:
    """What one connection's publishes do before a binding topic's first producer."""

    def __init__(self, cache: TopologyCache, topology: TopologyService, ctx: VhostContext) -> None:
        self.cache = cache
        self.topology = topology
        self.ctx = ctx

    def before(self, topic: naming.TopicName) -> Callable[[], Awaitable[bool]] | None:
        """For ProducerPool.get: None when `topic` is not a binding topic, or one this
        proxy's cache shows made; else what makes it, answering False when its binding
        set is gone meanwhile (write nothing there)."""
        local = topic.local
        if self.cache.binding_topic_made(local):
            return None
        parsed = naming.parse_binding_topic(local)
        if parsed is None:
            return None
        exchange, queue, _ = parsed
        # Own topics are for topic and headers exchanges: one exchange topic, E(exchange).
        set_topic = naming.exchange_topic(self.ctx.namespace, exchange, "topic", "").local
        vhost, namespace, topology = self.ctx.vhost, self.ctx.namespace, self.topology

        async def make() -> bool:
            # Abandoned on cancel, as the producer it comes before (ProducerPool._make).
            made = await trio.to_thread.run_sync(
                topology.binding_topic,
                vhost,
                namespace,
                queue,
                set_topic,
                abandon_on_cancel=True,
            )
            return made is not None and made.binding_topic == local

        return make
