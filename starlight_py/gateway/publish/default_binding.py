"""Before a message is written to a queue's default-exchange topic: the queue's binding to
the default exchange exists (it is made by the first publish that needs it,
topology/default_bindings.py)."""

from __future__ import annotations

import trio

from starlight_py.gateway.topology_methods import VhostContext
from starlight_py.metadata.cache import TopologyCache
from starlight_py.model import naming
from starlight_py.topology.service import TopologyService

__all__ = ["CACHE_WAIT", "default_binding_ready", "has_default_binding"]

CACHE_WAIT = 2.0  # s: how long a publish that made a binding waits for the cache to show it


def has_default_binding(cache: TopologyCache, ctx: VhostContext, queue: str) -> bool:
    """Whether this proxy's cache knows `queue`'s default-exchange binding set (a dict
    lookup; the hot publish path asks it before writing to the queue's own topic)."""
    local = naming.exchange_topic(ctx.namespace, "", "direct", queue).local
    return cache.binding_set(ctx.vhost, queue, local) is not None


async def default_binding_ready(
    cache: TopologyCache, topology: TopologyService, ctx: VhostContext, queue: str
) -> bool:
    """Make `queue`'s default-exchange binding if it has none yet (its subscription first,
    so the message about to be written is the queue's); False when the queue is gone.
    Returns once this proxy's cache shows it (at most CACHE_WAIT s): the publishes that
    follow then take the hot path, batched as the queue's consumers allow, and the proxy's
    own consumers of the queue read it. Raises MetadataUnavailable, BackendUnavailable,
    TopologyConflict."""
    if has_default_binding(cache, ctx, queue):
        return True
    made = await trio.to_thread.run_sync(topology.default_binding, ctx.vhost, ctx.namespace, queue)
    if made is None:
        return False
    await trio.to_thread.run_sync(
        cache.wait_until, lambda: has_default_binding(cache, ctx, queue), CACHE_WAIT
    )
    return True
