"""basic.get and drop-head trims: Pulsar consumers of a channel that read on demand
(`receive` with a timeout) rather than through a reader thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from starlight_py.backend.pulsar_client import ConsumerHandle, ReceivedMessage
from starlight_py.core.consumer import Deliverable
from starlight_py.gateway.channel_session import ChannelSession
from starlight_py.metadata.records import BindingSet
from starlight_py.model import naming
from starlight_py.model.counts import ready_messages
from starlight_py.model.priorities import PRIORITY_BAND_TYPE
from starlight_py.model.queue_limits import MAX_LENGTH
from starlight_py.model.streams import get_refused, is_stream
from starlight_py.model.topology import Queue
from starlight_py.topology.service import expires_after

if TYPE_CHECKING:
    from starlight_py.gateway.consuming import Consumers

# A new consumer gets its first message a few ms after subscribing; stats said it is there.
GET_WAIT = 0.5
# While Pulsar's stats still say a subscription has undispatched messages, a get keeps
# waiting for one (a loaded broker can take longer than GET_WAIT to dispatch to a new
# consumer) instead of answering get-empty next to a count of 1, up to this long in all.
GET_PATIENCE = 5.0
GETTER_IDLE = 0.5
HELD_WAIT = 0.005  # a message already in the getter's receiver queue comes at once
# Only delayed messages are pending: the broker hands one out once due, and only to a
# consumer that is there; a new getter gets a due one within a few ms of subscribing.
DELAYED_WAIT = 0.02
DEAD_LETTER_SETTLE_WAIT = 10.0  # a closing channel waits this long for its dead letters
TRIM_CHANNEL = 0  # dead letters of drop-head trims are settled as the connection's own
EXPIRE_READ_AHEAD = 50  # messages the expiry reaper's reader may hold at once


def rank(binding_set: BindingSet) -> int:
    """How a consumer orders what its subscriptions deliver: 1 + band for a priority
    queue's band (model/priorities.py), 0 for a binding subscription."""
    if binding_set.exchange_type != PRIORITY_BAND_TYPE:
        return 0
    parsed = naming.parse_priority_band_topic(binding_set.subscription_topic)
    return 0 if parsed is None else 1 + parsed[1]


class Getters:
    """basic.get for one connection (its getters live in each ChannelSession)."""

    def __init__(self, consumers: Consumers) -> None:
        self.consumers = consumers

    async def get(self, session: ChannelSession, queue: str, no_ack: bool) -> None:
        """basic.get through one Pulsar consumer per channel and subscription, kept between
        gets so that a message it prefetched is the next one returned, and closed once idle
        with nothing of its unacked (which returns any prefetched message to the queue).
        Empty queues are recognised from Pulsar's stats without waiting."""
        session.getting = True
        try:
            await self._get(session, queue, no_ack)
        finally:
            session.getting = False
            self._getter_used(session)
        self.consumers.execute(session, session.core.take_commands())

    async def _get(self, session: ChannelSession, queue: str, no_ack: bool) -> None:
        if self.consumers.trimmed is not None:
            await self.consumers.trimmed(self.consumers.ctx.vhost, queue)
        record = await trio.to_thread.run_sync(
            self.consumers.topology.usable_queue,
            self.consumers.ctx.vhost,
            queue,
            self.consumers.ctx.owner,
            (60, 70),
        )
        if is_stream(record.arguments):
            raise get_refused(queue, self.consumers.ctx.vhost)
        # The cache's record has the queue's policy applied (TTL, dead-lettering, expires).
        record = self.consumers.cache.queue(self.consumers.ctx.vhost, queue) or record
        if expires_after(record) is not None:
            await trio.to_thread.run_sync(
                self.consumers.topology.touch_queue, self.consumers.ctx.vhost, queue, True
            )
        sets = await self.consumers.sources.binding_sets_of(record)
        sets.sort(key=rank, reverse=True)  # a priority queue's highest band comes first
        ready: dict[str, int] = {}
        delayed: set[str] = set()
        waiting = 0  # backlog less delayed: ready or delivered and unacked
        batching = self.consumers.backend.batching
        stats = await self.consumers.sources.subscription_stats(sets)
        for subscription, found_stats in stats.items():
            # With batching, Pulsar counts entries: one partly acknowledged (or held by a
            # closing getter) may still have ready messages whatever `ready` says.
            ready[subscription] = found_stats.backlog if batching else found_stats.ready
            if found_stats.delayed > 0:
                delayed.add(subscription)
            waiting += max(0, found_stats.backlog - found_stats.delayed)
        # get-ok's message_count: the ready messages as RabbitMQ counts them, read ahead by
        # a proxy or not (TopologyService.queue_counts).
        topology = self.consumers.topology
        held = await trio.to_thread.run_sync(
            topology.held_messages, self.consumers.ctx.vhost, queue
        )
        total_ready = ready_messages(
            waiting,
            sum(ready.values()),
            held,
            topology.local_settling(self.consumers.ctx.vhost, queue),
        )
        for binding_set in sets:
            getter = session.getters.get(binding_set.subscription)
            # A message our getter read ahead is ready until it is delivered.
            if getter is not None and await self._get_from(
                session,
                getter,
                queue,
                binding_set,
                no_ack,
                max(0, total_ready - 1),
                HELD_WAIT,
                record,
            ):
                return
            wait = GET_WAIT
            if ready.get(binding_set.subscription, 0) <= 0:
                if binding_set.subscription not in delayed or getter is not None:
                    continue
                # Delayed messages the broker tracks: any that is due now goes to the getter
                # we open, and a getter kept open gets the others once they are due.
                wait = DELAYED_WAIT
            if getter is None:
                getter = await trio.to_thread.run_sync(
                    self.consumers.backend.subscribe,
                    naming.TopicName(self.consumers.ctx.namespace, binding_set.subscription_topic),
                    binding_set.subscription,
                    f"{self.consumers.prefix}/get/{session.number}",
                    1,
                    None,
                )
                session.getters[binding_set.subscription] = getter
            remaining = max(0, total_ready - 1)
            # While Pulsar still counts undispatched messages, wait again (RabbitMQ answers
            # a get with a message whenever its count says there is one); once it does not,
            # one short look at what may have reached the getter just now.
            deadline = trio.current_time() + GET_PATIENCE
            while True:
                if await self._get_from(
                    session, getter, queue, binding_set, no_ack, remaining, wait, record
                ):
                    return
                if wait != GET_WAIT or trio.current_time() >= deadline:
                    break
                if not await self._undispatched(binding_set):
                    wait = HELD_WAIT
        session.core.get_empty()

    async def _undispatched(self, binding_set: BindingSet) -> bool:
        """Whether Pulsar's stats still count messages of the subscription that no consumer
        (nor getter) holds."""
        fresh = await self.consumers.sources.subscription_stats([binding_set])
        found = fresh.get(binding_set.subscription)
        return found is not None and found.ready > 0

    async def _get_from(
        self,
        session: ChannelSession,
        handle: ConsumerHandle,
        queue: str,
        binding_set: BindingSet,
        no_ack: bool,
        remaining: int,
        wait: float,
        record: Queue | None = None,
    ) -> bool:
        while True:
            message = await trio.to_thread.run_sync(handle.receive, wait)
            if message is None:
                return False
            decoded = self.consumers._route(
                queue, {binding_set.subscription_topic: binding_set}, message
            )
            if decoded is None:
                handle.acknowledge(message)  # another binding's message: not this queue's
                continue
            if self.consumers.dead_letters.died_before_delivery(
                session.number, handle, message, record
            ):
                remaining = max(0, remaining - 1)
                continue  # expired or over the delivery limit: dead-lettered or dropped
            deliverable = Deliverable(
                decoded.exchange,
                decoded.routing_key,
                decoded.raw_properties,
                decoded.body,
                self.consumers._redelivered(message),
                record,
            )
            session.core.deliver_get(message, deliverable, no_ack, remaining)
            self.consumers.execute(session, session.core.take_commands())
            if no_ack:
                await self._close_getter(session, binding_set.subscription)
            else:
                session.getter_holds[id(handle)] += 1
            return True

    def settled(self, session: ChannelSession, sources: list[ReceivedMessage]) -> None:
        """Getters whose last unsettled delivery this was close now."""
        holds = session.getter_holds
        if not holds:
            return
        for message in sources:
            key = id(message.handle)
            if key not in holds:
                continue
            holds[key] -= 1
            if holds[key] > 0:
                continue
            del holds[key]
            for sub, getter in list(session.getters.items()):
                if getter is message.handle and not self.consumers.dead_letters.holds(getter):
                    del session.getters[sub]
                    self.consumers._close_soon(getter)

    async def drop_oldest(
        self, queue: str, topic: naming.TopicName, subscription: str, count: int
    ) -> int:
        """drop-head for a queue over its length limit: read up to `count` of the oldest
        ready messages of one binding subscription (what the broker hands out next, never a
        message delivered and unacked) and dead-letter them with reason `maxlen`, or drop
        them without a dead-letter exchange; returns how many. Raises BackendUnavailable."""
        if count <= 0:
            return 0

        def take(handle: ConsumerHandle, message: ReceivedMessage, record: Queue) -> bool:
            self.consumers.dead_letters.dead_letter(
                TRIM_CHANNEL, handle, message, record, MAX_LENGTH
            )
            return True

        return await self._take_oldest(queue, topic, subscription, "trim", count, take)

    async def expire_oldest(self, queue: str, topic: naming.TopicName, subscription: str) -> int:
        """The expiry reaper's read of a queue nobody consumes: take the oldest ready
        messages of one binding subscription while they are expired (or over the delivery
        limit) and dead-letter or drop them; the first live one stops it and goes back to the
        queue when the reader closes (Pulsar does not count that as a redelivery). Returns
        how many died. Raises BackendUnavailable."""

        def take(handle: ConsumerHandle, message: ReceivedMessage, record: Queue) -> bool:
            return self.consumers.dead_letters.died_before_delivery(
                TRIM_CHANNEL, handle, message, record
            )

        return await self._take_oldest(
            queue, topic, subscription, "expire", EXPIRE_READ_AHEAD, take, limit=None
        )

    async def _take_oldest(
        self,
        queue: str,
        topic: naming.TopicName,
        subscription: str,
        purpose: str,
        read_ahead: int,
        take: Callable[[ConsumerHandle, ReceivedMessage, Queue], bool],
        limit: int | None = -1,
    ) -> int:
        """Read the oldest ready messages of one binding subscription of `queue` with a
        reader of its own, passing each of the queue's to `take` (which dead-letters it and
        says True, or says False to stop there: that message goes back when the reader
        closes), at most `limit` (-1: `read_ahead`; None: no limit); returns how many were
        taken, once their dead letters are settled."""
        record = self.consumers.cache.queue(self.consumers.ctx.vhost, queue)
        if record is None:
            return 0
        limit = read_ahead if limit == -1 else limit
        known = {
            b.subscription_topic: b
            for b in self.consumers.cache.binding_sets_of_queue(self.consumers.ctx.vhost, queue)
        }
        # "/get/": not a consumer of the queue for the exclusive-consumer check.
        handle = await trio.to_thread.run_sync(
            self.consumers.backend.subscribe,
            topic,
            subscription,
            f"{self.consumers.prefix}/get/{purpose}",
            read_ahead,
            None,
        )
        taken = 0
        try:
            while limit is None or taken < limit:
                message = await trio.to_thread.run_sync(handle.receive, GET_WAIT)
                if message is None:
                    break
                if self.consumers._route(queue, known, message) is None:
                    handle.acknowledge(message)  # another binding's message: not this queue's
                    continue
                if not take(handle, message, record):
                    break
                taken += 1
            await self.consumers.dead_letters.settled(TRIM_CHANNEL, DEAD_LETTER_SETTLE_WAIT)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(handle.close)
        return taken

    async def _close_getter(self, session: ChannelSession, subscription: str) -> None:
        """Close a getter now (nothing of it is unacked): the message its receiver queue may
        hold goes back to the queue before anyone counts or gets again."""
        handle = session.getters.get(subscription)
        if handle is None or self.in_use(session, handle):
            return  # a dead letter it read is unsettled: the idle getters' closer does it
        del session.getters[subscription]
        await trio.to_thread.run_sync(handle.close)

    def in_use(self, session: ChannelSession, handle: ConsumerHandle) -> bool:
        """Closing `handle` would requeue a message: one it delivered that is unacked or a
        dead letter not yet acknowledged on its source."""
        return session.getter_holds.get(id(handle), 0) > 0 or self.consumers.dead_letters.holds(
            handle
        )

    def _getter_used(self, session: ChannelSession) -> None:
        session.getter_generation += 1
        self.consumers.spawn(self._close_idle_getters, session, session.getter_generation)

    async def _close_idle_getters(self, session: ChannelSession, generation: int) -> None:
        await trio.sleep(GETTER_IDLE)
        while session.getter_generation == generation and session.getters and not session.getting:
            idle = [
                sub for sub, handle in session.getters.items() if not self.in_use(session, handle)
            ]
            for sub in idle:
                handle = session.getters.pop(sub)
                await trio.to_thread.run_sync(handle.close)
            if not session.getters:
                return
            await trio.sleep(GETTER_IDLE)  # some still hold unacked gets: look again later
