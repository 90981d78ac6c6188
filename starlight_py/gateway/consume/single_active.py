"""`x-single-active-consumer`: of a queue's consumers, on every proxy, one reads.

Each consumer of such a queue takes a place in the queue's line in ZooKeeper (an ephemeral
sequential znode, `QueueConsumers.stand_in_line`) when it starts; the first in line is the
active one. The others are registered consumers (consume-ok, `consumer_count`) that read
nothing: they look at the line every `POLL` and subscribe once the consumers before them
are gone (cancelled, their channel or connection closed, their proxy dead). What the
previous consumer had delivered and not acknowledged goes back to the queue when its channel
closes, and so to the next one.
"""

from __future__ import annotations

import logging

import trio

from starlight_py.gateway.consume.consumer_link import ConsumerLink
from starlight_py.gateway.consume.consuming_services import ConsumingServices
from starlight_py.gateway.consume.getting import rank
from starlight_py.metadata.zookeeper import MetadataUnavailable
from starlight_py.model.topology import Queue

log = logging.getLogger("starlight.consume")

ARGUMENT = "x-single-active-consumer"
POLL = 0.2  # s: how often a waiting consumer looks at its line


def is_single_active(queue: Queue) -> bool:
    return queue.arguments.get(ARGUMENT) is True


async def join_line(consumers: ConsumingServices, link: ConsumerLink) -> None:
    """Take the consumer's place in its queue's line; `link.waiting` says whether others
    are before it. Raises NotFound (queue gone), MetadataUnavailable."""
    topology = consumers.topology
    vhost = consumers.ctx.vhost
    link.place = await trio.to_thread.run_sync(
        topology.consumers.stand_in_line,
        vhost,
        link.queue,
        f"{consumers.prefix}/{link.registry_name}",
    )
    first = await trio.to_thread.run_sync(topology.consumers.first_in_line, vhost, link.queue)
    link.waiting = first != link.place


async def wait_for_turn(consumers: ConsumingServices, link: ConsumerLink) -> None:
    """Until the consumer is first in line (or goes): then subscribe it to its queue."""
    topology = consumers.topology
    vhost = consumers.ctx.vhost
    while link.waiting and not link.cancelled and link in consumers.links:
        await trio.sleep(POLL)
        try:
            first = await trio.to_thread.run_sync(
                topology.consumers.first_in_line, vhost, link.queue, abandon_on_cancel=True
            )
        except MetadataUnavailable as e:
            log.debug("single active consumer %s: %s", link.tag, e)
            continue
        if first != link.place or link.cancelled or link not in consumers.links:
            continue
        link.waiting = False
        sets = await trio.to_thread.run_sync(topology.binding_sets, vhost, link.queue)
        for binding_set, _ in sorted(sets, key=lambda s: rank(s[0]), reverse=True):
            await consumers.subscribe(link, binding_set)
        consumers.kick()


async def leave_line(consumers: ConsumingServices, link: ConsumerLink) -> None:
    """The consumer goes: the next in line (on whichever proxy) takes over."""
    link.waiting = False
    if link.place is None:
        return
    place, link.place = link.place, None
    try:
        await trio.to_thread.run_sync(
            consumers.topology.consumers.leave_line, consumers.ctx.vhost, link.queue, place
        )
    except MetadataUnavailable as e:
        # Ephemeral: it goes with this proxy's session at the latest.
        log.warning("consumer %s stays in the line of %r: %s", link.tag, link.queue, e)
