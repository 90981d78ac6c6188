"""basic.get and drop-head trims: Pulsar consumers of a channel that read on demand
(`receive` with a timeout) rather than through a reader thread.

Theory of operation of a get. A channel reads each binding subscription of a queue through
a *getter*: a Pulsar consumer with a receiver queue of one, kept open between gets so that a
poller does not pay a subscribe, a first dispatch and a close per get (tens of ms each on a
busy broker), and so that the broker pushes the next message to it as soon as it is stored.
The price of keeping it: pulsar-client asks for one message ahead whenever its receiver
queue is empty, so an open getter holds the next message of its queue where no other
consumer, getter or the expiry reaper can reach it. A getter is therefore closed (which
hands what it holds back to the queue, not as a redelivery) once *it* has not been got from
for GETTER_IDLE, whatever the channel gets from meanwhile, unless it holds an unacked get
or a dead letter not yet acknowledged on its source.

A get asks, at once, ZooKeeper for the queue and its binding sets, the proxies' unacked
counts, and Pulsar for the counts of the subscriptions the channel's last get of the queue
read; it then takes what a getter holds, or, while Pulsar's counts show messages nobody
holds, waits for the broker to dispatch one. `get-empty` comes from the counts, not from a
wait. A poller's repeated gets of one queue skip most of the ZooKeeper reads: the queue's
record and binding sets come from the topology cache while it shows what the last get
confirmed, and the other proxies' unacked counts are re-read every OTHERS_HELD_AGE. Pulsar's
counts come from the brokers' plugin in one request when they have it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import trio

from starlight_py.amqp.method_ids import BASIC_GET
from starlight_py.backend.pulsar_admin import SubscriptionStats
from starlight_py.backend.pulsar_client import ConsumerHandle, ReceivedMessage
from starlight_py.core.consumer import Deliverable
from starlight_py.gateway.channel_session import ChannelSession
from starlight_py.gateway.concurrency import concurrently
from starlight_py.gateway.consume.consuming_services import ConsumingServices
from starlight_py.metadata.records import BindingSet
from starlight_py.model import naming
from starlight_py.model.counts import ready_messages
from starlight_py.model.priorities import PRIORITY_BAND_TYPE
from starlight_py.model.queue_limits import MAX_LENGTH
from starlight_py.model.streams import get_refused, is_stream
from starlight_py.model.topology import Queue
from starlight_py.topology.service import expires_after

# A new consumer gets its first message a few ms after subscribing; stats said it is there.
GET_WAIT = 0.5
# While Pulsar's stats still say a subscription has undispatched messages, a get keeps
# waiting for one (a loaded broker can take longer than GET_WAIT to dispatch to a new
# consumer) instead of answering get-empty next to a count of 1, up to this long in all.
GET_PATIENCE = 5.0
# A getter nobody got from for this long is closed: what it prefetched goes back to the
# queue. Pollers that get more often than this keep theirs open.
GETTER_IDLE = 0.5
# A kept getter is looked at again this often while it holds an unacked get or dead letter.
GETTER_RECHECK = 0.1
HELD_WAIT = 0.005  # a message the broker just dispatched reaches the getter within this
# A kept getter is first looked at without waiting, on the trio thread (a look at
# pulsar-client's receiver queue costs ~0.1 ms; a worker thread costs more under load).
NO_WAIT = 0.0
# Only delayed messages are pending: the broker hands one out once due, and only to a
# consumer that is there; a new getter gets a due one within a few ms of subscribing.
DELAYED_WAIT = 0.02
DEAD_LETTER_SETTLE_WAIT = 10.0  # a closing channel waits this long for its dead letters
TRIM_CHANNEL = 0  # dead letters of drop-head trims are settled as the connection's own
EXPIRE_READ_AHEAD = 50  # messages the expiry reaper's reader may hold at once
MAX_GET_SOURCES = 64  # queues whose binding sets a channel remembers for its next gets
# A get counts the deliveries other proxies hold unacknowledged (which they write to
# ZooKeeper every 0.25 s) as read by a get of the queue up to this long ago.
OTHERS_HELD_AGE = 0.2


@dataclass(frozen=True, slots=True)
class GetCounts:
    """What a get reads of its subscriptions' counts, by subscription."""

    ready: dict[str, int]
    delayed: set[str]  # with delayed messages the broker tracks
    pending: set[str]  # with messages not acknowledged yet
    waiting: int  # backlog less delayed, in all: ready or delivered and unacked

    @classmethod
    def of(cls, stats: dict[str, SubscriptionStats], batching: bool) -> GetCounts:
        ready: dict[str, int] = {}
        delayed: set[str] = set()
        pending: set[str] = set()
        waiting = 0
        for subscription, found in stats.items():
            # With batching, Pulsar counts entries: one partly acknowledged (or held by a
            # closing getter) may still have ready messages whatever `ready` says.
            ready[subscription] = found.backlog if batching else found.ready
            if found.delayed > 0:
                delayed.add(subscription)
            waiting += max(0, found.backlog - found.delayed)
            if found.backlog > found.delayed:
                pending.add(subscription)
        return cls(ready, delayed, pending, waiting)


def rank(binding_set: BindingSet) -> int:
    """How a consumer orders what its subscriptions deliver: 1 + band for a priority
    queue's band (model/priorities.py), 0 for a binding subscription."""
    if binding_set.exchange_type != PRIORITY_BAND_TYPE:
        return 0
    parsed = naming.parse_priority_band_topic(binding_set.subscription_topic)
    return 0 if parsed is None else 1 + parsed[1]


class Getters:
    """basic.get for one connection (its getters live in each ChannelSession)."""

    def __init__(self, consumers: ConsumingServices) -> None:
        self.consumers = consumers

    async def get(self, session: ChannelSession, queue: str, no_ack: bool) -> None:
        """basic.get through the channel's getters (see the module's docstring): a message a
        getter holds is returned at once; empty queues are recognised from Pulsar's stats
        without waiting. Raises what the topology service raises for an unusable queue
        (NotFound, ResourceLocked), BackendUnavailable, MetadataUnavailable."""
        session.getting = True
        try:
            await self._get(session, queue, no_ack)
        finally:
            session.getting = False
            self._getters_used(session, queue)
        self.consumers.execute(session, session.core.take_commands())

    async def _get(self, session: ChannelSession, queue: str, no_ack: bool) -> None:
        consumers = self.consumers
        vhost = consumers.ctx.vhost
        if consumers.trimmed is not None:
            await consumers.trimmed(vhost, queue)
        topology = consumers.topology
        # Looked up at once rather than one after the other: a poller's get used to take
        # the sum of four ZooKeeper and Pulsar round trips.
        if session.get_sources_made != topology.bindings_made:
            session.get_sources.clear()
            session.get_sources_made = topology.bindings_made
        last_sets = session.get_sources.get(queue)
        found = await concurrently(
            partial(self._usable_record, session, queue),
            partial(self._binding_sets, queue, last_sets),
            partial(self._held, queue),
            partial(self._stats, session, last_sets or []),
        )
        record: Queue = found[0]
        sets: list[BindingSet] = list(found[1])
        held: int = found[2]
        stats: dict[str, SubscriptionStats] = found[3]
        if is_stream(record.arguments):
            raise get_refused(queue, vhost)
        # The cache's record has the queue's policy applied (TTL, dead-lettering, expires).
        record = consumers.cache.queue(vhost, queue) or record
        if expires_after(record) is not None:
            await trio.to_thread.run_sync(topology.consumers.touch_queue, vhost, queue, True)
        sets.sort(key=rank, reverse=True)  # a priority queue's highest band comes first
        if last_sets is None or [b.subscription for b in last_sets] != [
            b.subscription for b in sets
        ]:
            stats = await self._stats(session, sets)
        if len(session.get_sources) >= MAX_GET_SOURCES and queue not in session.get_sources:
            session.get_sources.clear()  # a channel getting from ever new queues (replies)
            session.get_records.clear()
        session.get_sources[queue] = sets
        counts = GetCounts.of(stats, consumers.backend.batching)
        # get-ok's message_count: the ready messages as RabbitMQ counts them, read ahead by
        # a proxy or not (QueueCounting.queue_counts).
        total_ready = ready_messages(
            counts.waiting,
            sum(counts.ready.values()),
            held,
            topology.counts.local_settling(vhost, queue),
        )
        for binding_set in sets:
            if await self._get_from_set(
                session, queue, binding_set, counts, total_ready, no_ack, record
            ):
                return
        session.core.get_empty()

    async def _get_from_set(
        self,
        session: ChannelSession,
        queue: str,
        binding_set: BindingSet,
        counts: GetCounts,
        total_ready: int,
        no_ack: bool,
        record: Queue,
    ) -> bool:
        """Deliver one message of the binding set's subscription if the counts say there is
        one (its getter's, or one the broker dispatches to it); False when there is none."""
        subscription = binding_set.subscription
        getter = session.getters.get(subscription)
        remaining = max(0, total_ready - 1)
        # A message our getter read ahead is ready until it is delivered. Pulsar may count
        # as dispatched one that is still on its way to the getter (published just now):
        # while the subscription holds any and the count says some are ready, a second
        # look waits a moment for it.
        if getter is not None:
            for look in (NO_WAIT, HELD_WAIT):
                if look == HELD_WAIT and (total_ready <= 0 or subscription not in counts.pending):
                    break
                if await self._get_from(
                    session, getter, queue, binding_set, no_ack, remaining, look, record
                ):
                    return True
        wait = GET_WAIT
        if counts.ready.get(subscription, 0) <= 0:
            if subscription not in counts.delayed or getter is not None:
                return False
            # Delayed messages the broker tracks: any that is due now goes to the getter we
            # open, and a getter kept open gets the others once they are due.
            wait = DELAYED_WAIT
        if getter is None:
            getter = await self._open_getter(session, binding_set)
        # While Pulsar still counts undispatched messages, wait again (RabbitMQ answers a
        # get with a message whenever its count says there is one); once it does not, one
        # short look at what may have reached the getter just now.
        deadline = trio.current_time() + GET_PATIENCE
        while True:
            if await self._get_from(
                session, getter, queue, binding_set, no_ack, remaining, wait, record
            ):
                return True
            if wait != GET_WAIT or trio.current_time() >= deadline:
                return False
            if not await self._undispatched(binding_set):
                wait = HELD_WAIT

    async def _open_getter(
        self, session: ChannelSession, binding_set: BindingSet
    ) -> ConsumerHandle:
        getter: ConsumerHandle = await trio.to_thread.run_sync(
            # The next get's count must not see the message this one takes.
            partial(self.consumers.backend.subscribe, ack_at_once=True),
            naming.TopicName(self.consumers.ctx.namespace, binding_set.subscription_topic),
            binding_set.subscription,
            f"{self.consumers.prefix}/get/{session.number}",
            1,
            None,
        )
        session.getters[binding_set.subscription] = getter
        session.getter_used[binding_set.subscription] = trio.current_time()
        return getter

    async def _held(self, queue: str) -> int:
        """The queue's deliveries unacknowledged on every proxy, the others' as read up to
        OTHERS_HELD_AGE ago (then without leaving the trio thread)."""
        topology = self.consumers.topology
        vhost = self.consumers.ctx.vhost
        recent = topology.counts.recent_held_messages(vhost, queue, OTHERS_HELD_AGE)
        if recent is not None:
            return recent
        held: int = await trio.to_thread.run_sync(topology.counts.held_messages, vhost, queue)
        return held

    async def _usable_record(self, session: ChannelSession, queue: str) -> Queue:
        """The queue (NotFound, ResourceLocked) as ZooKeeper has it, or, while the topology
        cache shows the record the channel's last get of it confirmed there and this
        process deleted no queue since, as the cache has it: a poller's gets skip a
        ZooKeeper read. A delete on another proxy reaches a get when it reaches the cache
        (milliseconds), as a binding does (`_binding_sets`)."""
        consumers = self.consumers
        vhost = consumers.ctx.vhost
        topology = consumers.topology
        cached = consumers.cache.queue(vhost, queue)
        deletions = topology.queue_deletions
        if cached is not None and session.get_records.get(queue) == (cached, deletions):
            topology.check_usable(vhost, cached, consumers.ctx.owner, BASIC_GET)
            return cached
        record: Queue = await trio.to_thread.run_sync(
            topology.usable_queue, vhost, queue, consumers.ctx.owner, BASIC_GET
        )
        if cached is not None:
            session.get_records[queue] = (cached, deletions)
        return record

    async def _binding_sets(
        self, queue: str, last_sets: list[BindingSet] | None
    ) -> list[BindingSet]:
        """The binding sets to read `queue` from (with the retired ones still draining into
        it): those the channel's last get of it read while the topology cache shows the
        same, else ZooKeeper's. A poller's gets thus skip a chain of ZooKeeper reads; a
        binding made on another proxy reaches a get when it reaches the cache, as it
        reaches this proxy's routing (milliseconds)."""
        cache = self.consumers.cache
        vhost = self.consumers.ctx.vhost
        if last_sets is not None:
            cached = cache.made_sets_of_queue(vhost, queue) + cache.draining_sets(vhost, queue)
            if sorted(b.subscription for b in cached) == sorted(b.subscription for b in last_sets):
                return last_sets
        found = await trio.to_thread.run_sync(self.consumers.topology.binding_sets, vhost, queue)
        return [binding_set for binding_set, _ in found]

    async def _stats(
        self, session: ChannelSession, sets: list[BindingSet]
    ) -> dict[str, SubscriptionStats]:
        """Pulsar's stats of the sets' subscriptions, once the broker has handled what the
        channel's getters of them acknowledged (what earlier gets took)."""
        for binding_set in sets:
            acked = session.getter_acks.get(binding_set.subscription)
            if acked is not None:
                await acked.wait()
        return await self.consumers.sources.subscription_stats(sets, counts_only=True)

    def _sync_acks(self, session: ChannelSession, handle: ConsumerHandle) -> None:
        """The getter acknowledged something: the channel's next stats of its subscription
        wait until the broker has handled it (while the get-ok travels, as a rule)."""
        done = trio.Event()
        session.getter_acks[handle.subscription] = done

        async def sync() -> None:
            try:
                await trio.to_thread.run_sync(handle.sync)
            finally:
                done.set()
                if session.getter_acks.get(handle.subscription) is done:
                    del session.getter_acks[handle.subscription]

        self.consumers.spawn(sync)

    async def _undispatched(self, binding_set: BindingSet) -> bool:
        """Whether Pulsar's stats still count messages of the subscription that no consumer
        (nor getter) holds."""
        fresh = await self.consumers.sources.subscription_stats([binding_set], counts_only=True)
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
            if wait == NO_WAIT:
                message = handle.receive_nowait()
            else:
                message = await trio.to_thread.run_sync(handle.receive, wait)
            if message is None:
                return False
            decoded = self.consumers.route(
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
                self.consumers.redelivered(message),
                record,
            )
            session.core.deliver_get(message, deliverable, no_ack, remaining)
            self.consumers.execute(session, session.core.take_commands())
            if not no_ack:
                session.getter_holds[id(handle)] += 1
            return True

    def settled(self, session: ChannelSession, sources: list[ReceivedMessage]) -> None:
        """Deliveries of getters were settled: a getter holding none may close once idle
        (a poller that gets and acks in turn keeps it)."""
        getters = {id(handle): handle for handle in session.getters.values()}
        synced: set[int] = set()
        for message in sources:
            key = id(message.handle)
            if key in getters and key not in synced:
                synced.add(key)
                self._sync_acks(session, getters[key])
        holds = session.getter_holds
        if not holds:
            return
        for message in sources:
            key = id(message.handle)
            if key not in holds:
                continue
            holds[key] -= 1
            if holds[key] <= 0:
                del holds[key]

    def requeued(self, session: ChannelSession, sources: list[ReceivedMessage]) -> None:
        """Deliveries of getters went back to the queue (nack, reject or recover with
        requeue): such a getter closes now, unless it still holds others, so that the
        message is the queue's again for any consumer or getter; kept open, it would come
        back to this getter only, which may not take it back at all (a chunked message
        does not fit its one-message receiver queue)."""
        keys = {id(message.handle) for message in sources}
        for subscription, handle in list(session.getters.items()):
            if id(handle) not in keys or self.in_use(session, handle):
                continue
            del session.getters[subscription]
            session.getter_used.pop(subscription, None)
            self.consumers.spawn(trio.to_thread.run_sync, handle.close)

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
                if self.consumers.route(queue, known, message) is None:
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

    def in_use(self, session: ChannelSession, handle: ConsumerHandle) -> bool:
        """Closing `handle` would requeue a message: one it delivered that is unacked or a
        dead letter not yet acknowledged on its source."""
        return session.getter_holds.get(id(handle), 0) > 0 or self.consumers.dead_letters.holds(
            handle
        )

    def _getters_used(self, session: ChannelSession, queue: str) -> None:
        """After a get of `queue`: its getters were used now. The channel's idle getters are
        closed by one task, started with its first getter."""
        now = trio.current_time()
        for binding_set in session.get_sources.get(queue, ()):
            if binding_set.subscription in session.getters:
                session.getter_used[binding_set.subscription] = now
        if session.getters and not session.getter_closer:
            session.getter_closer = True
            self.consumers.spawn(self._close_idle_getters, session)

    async def _close_idle_getters(self, session: ChannelSession) -> None:
        try:
            while session.getters:
                now = trio.current_time()
                busy = {sub for sub, h in session.getters.items() if self.in_use(session, h)}
                idle = (
                    []
                    if session.getting
                    else idle_getters(
                        session.getter_used, set(session.getters), busy, now, GETTER_IDLE
                    )
                )
                for sub in idle:
                    handle = session.getters.pop(sub, None)
                    session.getter_used.pop(sub, None)
                    if handle is not None:  # not closed meanwhile (`requeued`)
                        await trio.to_thread.run_sync(handle.close)
                if not session.getters:
                    return
                await trio.sleep(
                    next_idle_look(session.getter_used, set(session.getters), busy, now)
                    if not session.getting
                    else GETTER_RECHECK
                )
        finally:
            session.getter_closer = False


def idle_getters(
    used: dict[str, float], open_getters: set[str], busy: set[str], now: float, idle: float
) -> list[str]:
    """The getters (by subscription) to close now: open, holding nothing (not `busy`), and
    not got from for `idle` seconds (`used`: when each was last got from)."""
    return sorted(
        sub for sub in open_getters if sub not in busy and now - used.get(sub, now) >= idle
    )


def next_idle_look(
    used: dict[str, float], open_getters: set[str], busy: set[str], now: float
) -> float:
    """Seconds until the next getter may be idle long enough to close (GETTER_RECHECK while
    only busy ones are open)."""
    due = [used.get(sub, now) + GETTER_IDLE - now for sub in open_getters if sub not in busy]
    return max(0.001, min(due)) if due else GETTER_RECHECK
