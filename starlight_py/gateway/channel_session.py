"""What the gateway keeps per open channel: the message core's `Channel`, and the Pulsar side
of what only the gateway does for it (basic.get's consumers, the last queue declared)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import trio

from starlight_py.backend.pulsar_client import ConsumerHandle
from starlight_py.core.channel import Channel
from starlight_py.metadata.records import BindingSet
from starlight_py.model.topology import Queue


@dataclass(eq=False)
class ChannelSession:
    number: int
    core: Channel
    # AMQP: an empty queue name in later methods means the last queue declared here.
    last_queue: str | None = None
    # basic.get reads through one Pulsar consumer per binding subscription, kept between
    # gets (a message it prefetched is the next one returned) and closed once it has not
    # been got from for a while (gateway/consume/getting.py).
    getters: dict[str, ConsumerHandle] = field(default_factory=dict)
    # Deliveries of each getter not settled yet (by id() of the handle): it stays open
    # while it holds any, since closing it would requeue them.
    getter_holds: Counter[int] = field(default_factory=Counter)
    # When a get last read each getter (trio clock), by subscription: each getter's own
    # idle time, so that polling one queue never keeps another queue's getter open.
    getter_used: dict[str, float] = field(default_factory=dict)
    # The binding sets the last get of each queue read, by queue: the next get of the queue
    # asks Pulsar for their stats while ZooKeeper confirms them.
    get_sources: dict[str, list[BindingSet]] = field(default_factory=dict)
    # The process's count of default-exchange bindings made (TopologyService) when
    # `get_sources` was last emptied: a publish that made one since may have written to a
    # subscription none of them has (topology/default_bindings.py).
    get_sources_made: int = 0
    # The topology cache's record of each queue when a get of it last confirmed it in
    # ZooKeeper, with the process's queue deletions then: while both are still what they
    # were, the next get of the queue skips that read (gateway/consume/getting.py).
    get_records: dict[str, tuple[Queue, int]] = field(default_factory=dict)
    getter_closer: bool = False  # the task closing idle getters runs
    # Set once the broker has handled what each getter acknowledged so far, by
    # subscription: a get reads Pulsar's stats only then, or it would count what an earlier
    # get took.
    getter_acks: dict[str, trio.Event] = field(default_factory=dict)
    getting: bool = False  # a basic.get is using the getters right now
    # Queues a queue.delete of this channel is deleting: their consumers here hear
    # basic.cancel after the delete-ok, from the delete itself (not from the cache).
    deleting: set[str] = field(default_factory=set)
