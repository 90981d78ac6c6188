"""Before a message is written to a binding's own topic: the topic and its subscription
exist (they are made by the first publish the binding set routes,
topology/binding_topics.py)."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

import trio

from starlight_py.gateway.concurrency import concurrently
from starlight_py.gateway.publish.default_binding import CACHE_WAIT
from starlight_py.gateway.topology_methods import VhostContext
from starlight_py.metadata.cache import TopologyCache
from starlight_py.model import naming
from starlight_py.topology.service import TopologyService

__all__ = ["own_topics_ready", "unmade_own_topics"]


def unmade_own_topics(cache: TopologyCache, topics: Iterable[naming.TopicName]) -> list[str]:
    """The binding topics among `topics` (local names) that this proxy's cache does not
    show made: not made yet, or of a binding set it has not seen yet."""
    return [
        t.local
        for t in topics
        if not cache.binding_topic_made(t.local) and naming.parse_binding_topic(t.local)
    ]


async def own_topics_ready(
    cache: TopologyCache,
    topology: TopologyService,
    ctx: VhostContext,
    topics: Iterable[naming.TopicName],
) -> set[str]:
    """Make the binding topics among `topics` that are not made yet (at once, each its
    subscription first, so the message about to be written is the queue's); returns those
    whose binding set is gone meanwhile (local names: write nothing there). Returns once
    this proxy's cache shows them made (at most CACHE_WAIT s), so that the publishes that
    follow take the hot path. Raises MetadataUnavailable, BackendUnavailable,
    TopologyConflict."""
    unmade = unmade_own_topics(cache, topics)
    if not unmade:
        return set()
    gone: set[str] = set()

    async def one(local: str) -> None:
        parsed = naming.parse_binding_topic(local)
        assert parsed is not None
        exchange, queue, _ = parsed
        # Own topics are for topic and headers exchanges: one exchange topic, E(exchange).
        set_topic = naming.exchange_topic(ctx.namespace, exchange, "topic", "").local
        made = await trio.to_thread.run_sync(
            topology.binding_topic, ctx.vhost, ctx.namespace, queue, set_topic
        )
        if made is None or made.binding_topic != local:
            gone.add(local)

    await concurrently(*(partial(one, local) for local in unmade))
    waiting = [x for x in unmade if x not in gone]
    if waiting:
        await trio.to_thread.run_sync(
            cache.wait_until, lambda: all(cache.binding_topic_made(x) for x in waiting), CACHE_WAIT
        )
    return gone
