"""The Pulsar side of consuming for one connection: subscriptions, reading, basic.get (its
Pulsar consumers are in gateway/consume/getting.py), and carrying out what the message core
(core/channel.py) decides.

An AMQP consumer reads every binding subscription of its queue through one Pulsar Shared
consumer each, whose reader thread hands messages over in batches (backend/pulsar_client.py)
through one `Batcher` per consumer: one wake-up of the trio thread per batch. The core
decides what is delivered when (credit, prefetch, priority bands) and asks back, at the
moment of delivery, whether a message is still the queue's (`vet`): routed to it by one of
its bindings on that topic, not expired, not over its delivery limit. Its commands (ack,
requeue, reject, pause, close a cancelled consumer) are carried out by `execute`.

Requeueing: closing a Pulsar consumer makes the broker redeliver what it holds at once, so
channel and connection close requeue everything unacked. basic.cancel does NOT: delivered
unacked messages stay with the channel (as in RabbitMQ); the Pulsar consumers of a cancelled
consumer are kept open until those are settled (`ConsumerSettled`), or the channel closes.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

import trio

from starlight_py.amqp.method_ids import BASIC_NACK
from starlight_py.backend.message_codec import (
    DecodedMessage,
    decode,
    plain_delivery,
    skipped_by,
)
from starlight_py.backend.pulsar_client import ConsumerHandle, PulsarBackend, ReceivedMessage
from starlight_py.backend.stream_reader import StreamMessage, StreamReaderHandle
from starlight_py.core.commands import (
    AckMessages,
    Command,
    ConsumerSettled,
    DrainLater,
    GiveBack,
    PauseReading,
    RejectMessages,
    RequeueMessages,
    ResumeReading,
    Unacked,
)
from starlight_py.core.consumer import Consumer, Deliverable
from starlight_py.gateway.bridge import Batcher
from starlight_py.gateway.channel_session import ChannelSession
from starlight_py.gateway.concurrency import concurrently
from starlight_py.gateway.consume.batch_requeues import BatchRequeues
from starlight_py.gateway.consume.consumer_link import ConsumerLink, LinkSet
from starlight_py.gateway.consume.delivery_plans import (
    current_binding_set,
    plan_deliveries,
)
from starlight_py.gateway.consume.getting import DEAD_LETTER_SETTLE_WAIT, Getters, rank
from starlight_py.gateway.consume.queue_sources import QueueSources
from starlight_py.gateway.consume.requeued import RequeuedPositions
from starlight_py.gateway.consume.single_active import (
    is_single_active,
    join_line,
    leave_line,
    wait_for_turn,
)
from starlight_py.gateway.consume.stream_consuming import (
    delivered_offset,
    open_stream_handle,
    stream_start_of,
    topic_starts,
    with_offset_header,
)
from starlight_py.gateway.dead_lettering import DeadLetters
from starlight_py.gateway.topology_methods import VhostContext
from starlight_py.metadata.cache import TopologyCache
from starlight_py.metadata.records import BindingSet
from starlight_py.model import naming
from starlight_py.model.dead_letters import REJECTED
from starlight_py.model.routing import any_binding_routes
from starlight_py.model.streams import StreamStart, settle_refused
from starlight_py.topology.service import TopologyService

log = logging.getLogger("starlight.consume")

UNLIMITED_RECEIVER_QUEUE = 1000


def _name(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


class Consumers:
    """Everything consume-side of one connection that touches Pulsar or ZooKeeper."""

    def __init__(
        self,
        ctx: VhostContext,
        cache: TopologyCache,
        topology: TopologyService,
        backend: PulsarBackend,
        consumer_prefix: str,
        kick: Callable[[], None],
        spawn: Callable[..., None],
        requeued: RequeuedPositions,
        dead_letters: DeadLetters,
        notify_cancel: Callable[[ChannelSession, str], None],
    ) -> None:
        self.ctx = ctx
        self.cache = cache
        self.topology = topology
        self.backend = backend
        self.prefix = consumer_prefix
        self.kick = kick
        self.spawn = spawn  # start a task in the connection's nursery
        self.requeued = requeued
        self.dead_letters = dead_letters
        # Tell the client its consumer was cancelled (basic.cancel from the server), when it
        # understands consumer_cancel_notify.
        self.notify_cancel = notify_cancel
        self.links = LinkSet()
        self.sources = QueueSources(ctx, cache, topology)
        self.getters = Getters(self)
        # Requeues of batch messages wait for the rest of their entry (batch_requeues.py).
        self.batch_requeues = BatchRequeues(backend.ack_grouping_ms / 1000, spawn)
        # Waits for a drop-head trim of the queue running on this proxy (QueueLengths).
        self.trimmed: Callable[[str, str], Awaitable[None]] | None = None
        self._token = trio.lowlevel.current_trio_token()
        # Pulsar consumers that acknowledge in lists (backend/list_acks.py) with
        # acknowledgements gathered this round of the trio loop: sent when it ends, one
        # command per consumer for every basic.ack the round's socket reads carried.
        self._gathered_acks: Batcher[ConsumerHandle] = Batcher(self._token, _send_gathered)

    # ---- consume ------------------------------------------------------------------------------

    async def consume(
        self,
        session: ChannelSession,
        queue: str,
        tag: str,
        no_ack: bool,
        exclusive: bool,
        nowait: bool,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """Raises NotFound, ResourceLocked, NotAllowed (tag reused), AccessRefused
        (exclusive use); for a stream queue PreconditionFailed (no prefetch, a bad
        x-stream-offset) and NotImplementedMethod (no_ack)."""
        channel = session.core
        channel.check_tag_free(tag)
        record, sets = await self.sources.to_consume(queue)
        start = stream_start_of(
            record, self.ctx.vhost, channel.prefetch_consumer, no_ack, arguments
        )
        sets.sort(key=rank, reverse=True)  # a priority queue's highest band comes first
        link = ConsumerLink(session, tag, queue, exclusive, record, stream=start)
        link.core = channel.add_consumer(tag, queue, no_ack, exclusive, link)
        link.prefetch = link.core.prefetch
        link.batcher = Batcher(self._token, lambda batches: self._on_messages(link, batches))
        self.links.add(link)
        try:
            # Registered first: an auto-delete racing this consume on another proxy either
            # sees the consumer or deletes the queue before it registers (then NotFound).
            # Registering also checks exclusive use (403), from the other registrations.
            await trio.to_thread.run_sync(
                self.topology.consumers.register_consumer,
                self.ctx.vhost,
                record,
                f"{self.prefix}/{link.registry_name}",
                exclusive,
            )
            link.registered = True
            if is_single_active(record):
                await join_line(self, link)
            if start is not None:
                link.topic_starts = await topic_starts(
                    self.topology.admin,
                    self.ctx.namespace,
                    queue,
                    [s.subscription_topic for s in sets],
                    start,
                )
            if not link.waiting:
                await self._subscribe_all(link, sets)
        except BaseException:
            channel.remove_consumer(link.core)
            self.execute(session, channel.take_commands())
            await self._drop_link(link)
            with trio.CancelScope(shield=True):
                await self._unregister(link, auto_delete=False)
            raise
        channel.start_consumer(link.core, nowait)
        self.execute(session, channel.take_commands())
        self.kick()
        if link.waiting:
            self.spawn(wait_for_turn, self, link)

    async def _subscribe_all(self, link: ConsumerLink, sets: list[BindingSet]) -> None:
        """Subscribe to every set at once (a priority queue's bands arrive together, as
        RabbitMQ hands them over); a priority queue's consumer first learns each band's
        backlog, so that a lower band waits for a higher band's messages."""
        banded = [s for s in sets if rank(s) > 0]
        stats = await self.sources.subscription_stats(banded) if banded else {}
        # What the band can send this consumer: its backlog less what other consumers hold.
        backlogs = {
            subscription: max(0, found.backlog - found.unacked)
            for subscription, found in stats.items()
        }
        if len(sets) == 1:
            await self.subscribe(link, sets[0], backlogs.get(sets[0].subscription))
            return
        await concurrently(
            *(partial(self.subscribe, link, s, backlogs.get(s.subscription)) for s in sets)
        )

    async def subscribe(
        self, link: ConsumerLink, binding_set: BindingSet, backlog: int | None = None
    ) -> None:
        subscription = binding_set.subscription
        if subscription in link.handles or subscription in link.opening or link.core is None:
            return
        # follow_bindings may ask again while this one waits for Pulsar: a second consumer
        # would leak (a stream's would deliver everything twice).
        link.opening.add(subscription)
        try:
            await self._open(link, binding_set, backlog)
        finally:
            link.opening.discard(subscription)

    async def _open(self, link: ConsumerLink, binding_set: BindingSet, backlog: int | None) -> None:
        assert link.core is not None
        topic = naming.TopicName(self.ctx.namespace, binding_set.subscription_topic)
        name = f"{self.prefix}/{link.registry_name}"
        size = link.core.prefetch or UNLIMITED_RECEIVER_QUEUE
        batcher = link.batcher
        assert batcher is not None
        # Known before the first message can arrive: the reader thread starts reading while
        # `subscribe` returns, and a message of a band taken for rank 0 would go last.
        link.known_sets[binding_set.subscription_topic] = binding_set
        link.plans.clear()
        band = link.ranks[binding_set.subscription] = rank(binding_set)
        link.session.core.reads_band(link.core, band, backlog)
        if link.stream is not None:
            start = await self._stream_start(link, binding_set.subscription_topic)
            handle: ConsumerHandle = await open_stream_handle(
                self.backend,
                self.topology.admin,
                topic,
                binding_set.subscription,
                start,
                name,
                min(size, UNLIMITED_RECEIVER_QUEUE),
                lambda h, batch: batcher.put((h, batch)),
                link.floors,
            )
        else:
            handle = await trio.to_thread.run_sync(
                self.backend.subscribe,
                topic,
                binding_set.subscription,
                name,
                min(size, UNLIMITED_RECEIVER_QUEUE),
                lambda h, batch: batcher.put((h, batch)),
            )
        link.handles[binding_set.subscription] = handle
        if link.core.reading.get(band if link.core.ranks else None) is False:
            handle.pause()  # the core has it paused already

    async def _stream_start(self, link: ConsumerLink, topic: str) -> StreamStart:
        """Where a stream consumer starts reading `topic`, one of its stream's topics."""
        assert link.core is not None and link.stream is not None
        if link.core.started:
            return StreamStart("next")  # a binding made since: read from then on
        start = link.topic_starts.get(topic)
        if start is None:
            # A binding the consume did not see yet (this proxy's cache catching up): where
            # the consumer starts on it, among every topic of the stream known now.
            known = self.cache.binding_sets_of_queue(self.ctx.vhost, link.queue)
            topics = sorted({topic, *link.topic_starts, *(b.subscription_topic for b in known)})
            starts = await topic_starts(
                self.topology.admin, self.ctx.namespace, link.queue, topics, link.stream
            )
            start = link.topic_starts.setdefault(topic, starts[topic])
        return start

    async def follow_bindings(self, queues: set[str] | None = None) -> None:
        """Subscribe consumers of `queues` (None: of every queue) to bindings added after
        they started; cancel (with basic.cancel, as RabbitMQ does with
        consumer_cancel_notify) consumers whose queue was deleted."""
        for link in self.links.of_queues(queues):
            if link.cancelled:
                continue
            if self.cache.queue(self.ctx.vhost, link.queue) is None:
                still = await trio.to_thread.run_sync(
                    self.topology.get_queue, self.ctx.vhost, link.queue
                )
                # Not if cancelled meanwhile (queue_deleted): one basic.cancel per consumer;
                # nor while its own channel deletes the queue (the cancel follows the ok).
                if still is None and not link.cancelled and link.queue not in link.session.deleting:
                    await self._server_cancel(link)
                continue
            if link.waiting:
                continue  # not its turn: it subscribes when it comes
            current = self.cache.made_sets_of_queue(self.ctx.vhost, link.queue)
            for binding_set in current:
                if binding_set.subscription not in link.handles:
                    await self.subscribe(link, binding_set)
            await self._let_go_of_retired(link, current)
        self.kick()

    async def _let_go_of_retired(self, link: ConsumerLink, current: list[BindingSet]) -> None:
        """Close the consumer's Pulsar consumers on subscriptions no longer read for its
        queue (drained retired ones, about to be deleted by the SubscriptionCleaner, which
        would otherwise reconnect and make the subscription again)."""
        active = {b.subscription for b in current}
        stale = []
        for subscription in link.handles:
            if subscription in active:
                continue
            retired = self.cache.retired(self.ctx.vhost, subscription)
            if retired is None or not retired.drain:
                stale.append(subscription)
        if not stale:
            return
        # The cache may lag behind a binding made a moment ago: ask ZooKeeper.
        fresh = await trio.to_thread.run_sync(
            self.topology.binding_sets, self.ctx.vhost, link.queue
        )
        still_read = {b.subscription for b, _ in fresh}
        holding = self._holding(link.session)
        for subscription in stale:
            handle = link.handles.get(subscription)
            if subscription in still_read or handle is None or id(handle) in holding:
                continue
            del link.handles[subscription]
            link.plans.pop(handle, None)
            await trio.to_thread.run_sync(handle.close)

    def queue_deleted(self, queue: str, spare: ChannelSession | None = None) -> None:
        """`queue` was deleted through this proxy: cancel its consumers on this connection
        but those of channel `spare` (the deleting one, whose delete-ok goes first) at once,
        so that their basic.cancel is written before the deleting channel's delete-ok, as
        RabbitMQ orders them (a client that re-declares on the cancel has done so before it
        uses the queue again). Closing their Pulsar consumers follows."""
        for link in self.links.of_queues({queue}):
            if not link.cancelled and link.session is not spare:
                self._cancel_now(link)
                self.spawn(self._finish_server_cancel, link)

    async def _server_cancel(self, link: ConsumerLink) -> None:
        self._cancel_now(link)
        await self._finish_server_cancel(link)

    def _cancel_now(self, link: ConsumerLink) -> None:
        session = link.session
        if link.core is not None:
            session.core.cancel(link.tag)
            self.execute(session, session.core.take_commands())
        self.notify_cancel(session, link.tag)

    async def _finish_server_cancel(self, link: ConsumerLink) -> None:
        await self._drop_link(link)
        await self._unregister(link, auto_delete=False)

    async def _drop_link(self, link: ConsumerLink) -> None:
        """Close all of a consumer's Pulsar consumers and forget it."""
        self.links.discard(link)
        if link.batcher is not None:
            for handle, batch in link.batcher.close():
                for message in batch:
                    handle.negative_acknowledge(message)
        handles = list(link.handles.values())
        link.handles.clear()
        link.plans.clear()
        await self._close_handles(handles)

    async def _unregister(self, link: ConsumerLink, auto_delete: bool = True) -> None:
        """Take the consumer out of ZooKeeper's record; an auto-delete queue left without
        consumers goes (RabbitMQ: when its last consumer is cancelled or gone)."""
        if not link.registered or link.record is None:
            return
        link.registered = False
        link.waiting = False
        record = link.record
        await leave_line(self, link)
        if not auto_delete:
            record = replace(record, auto_delete=False)
        try:
            await trio.to_thread.run_sync(
                self.topology.unregister_consumer,
                self.ctx.vhost,
                self.ctx.namespace,
                record,
                f"{self.prefix}/{link.registry_name}",
            )
        except Exception as e:
            # The ephemeral znode goes with this proxy's session at the latest; the
            # SubscriptionCleaner then does what is left (auto-delete).
            log.warning("could not unregister consumer %s of %r: %s", link.tag, record.name, e)

    # ---- cancel -------------------------------------------------------------------------------

    async def cancel(self, session: ChannelSession, tag: str) -> None:
        """basic.cancel: what the consumer delivered stays unacked with the channel; its
        Pulsar consumers holding none of it close now, the others once it is settled."""
        consumer = session.core.cancel(tag)
        if consumer is None:
            return
        link: ConsumerLink = consumer.link
        holding = {id(m.handle) for m in session.core.holding(consumer)}
        for handle in link.handles.values():
            handle.pause()
        self.execute(session, session.core.take_commands())
        if link.batcher is not None:
            held = self._held_by(session)
            for _, batch in link.batcher.close():
                for message in batch:  # never delivered: back to the queue
                    self.batch_requeues.negative_acknowledge(message, held)
        idle = [
            (sub, h)
            for sub, h in link.handles.items()
            if id(h) not in holding and not self.dead_letters.holds(h)
        ]
        for sub, handle in idle:
            del link.handles[sub]
            link.plans.pop(handle, None)
        await self._close_handles([h for _, h in idle])
        if not link.handles:
            self.links.discard(link)
        # Before cancel-ok: a client that sees cancel-ok no longer sees an auto-delete
        # queue whose last consumer this was.
        await self._unregister(link)

    # ---- delivery (trio thread, synchronous) ------------------------------------------------

    def _on_messages(
        self, link: ConsumerLink, batches: list[tuple[ConsumerHandle, list[ReceivedMessage]]]
    ) -> None:
        consumer = link.core
        if consumer is None:
            return
        session = link.session
        ranks = link.ranks
        if link.stream is None:
            held = self._held_by(session)
            sort = link.returns.sort
            batches = [(h, kept) for h, batch in batches if (kept := sort(h, batch, held))]
            if not batches:
                return
        if len(batches) == 1:
            handle, batch = batches[0]
            session.core.messages_of_rank_arrived(
                consumer, ranks.get(handle.subscription, 0), batch
            )
        else:
            items = [
                (ranks.get(handle.subscription, 0), m) for handle, batch in batches for m in batch
            ]
            session.core.messages_arrived(consumer, items)
        if session.core._commands:
            self.execute(session, session.core.take_commands())
        self.kick()

    def vet(self, consumer: Consumer, message: ReceivedMessage) -> Deliverable | None:
        """The core asks at delivery: is this message still the queue's to deliver? Most
        are settled by the consumer's plan for their topic; the rest by `_vet_fully`."""
        link: ConsumerLink = consumer.link
        if link.stream is not None:
            return self._vet_stream(link, message)
        handle = message.handle
        plan = link.plans.get(handle)
        if plan is None or plan.version != self.cache.changes:
            plan = link.plans[handle] = plan_deliveries(
                self.cache, self.ctx.vhost, link, handle.topic.local
            )
        if plan.checks_deliveries:
            return self._vet_fully(link, message)
        view = plain_delivery(message.properties, plan.exchange, plan.key)
        if view is None or not plan.routes(view[1]):
            return self._vet_fully(link, message)
        redelivered = self.redelivered(message, link)
        return Deliverable(view[0], view[1], view[2], message.body, redelivered, plan.record)

    def _vet_fully(self, link: ConsumerLink, message: ReceivedMessage) -> Deliverable | None:
        decoded = self.route(link.queue, link.known_sets, message)
        if decoded is None:
            message.handle.acknowledge(message)  # not for this queue (another binding's)
            return None
        # The cache's record: a policy set since the consumer started applies now.
        record = self.cache.queue(self.ctx.vhost, link.queue) or link.record
        if self.dead_letters.died_before_delivery(
            link.session.number, message.handle, message, record
        ):
            return None  # expired or over the delivery limit: dead-lettered or dropped
        return Deliverable(
            decoded.exchange,
            decoded.routing_key,
            decoded.raw_properties,
            decoded.body,
            self.redelivered(message, link),
            record,
        )

    def _vet_stream(self, link: ConsumerLink, message: ReceivedMessage) -> Deliverable | None:
        """A stream's message: delivered with its offset when it is at or after the
        consumer's start and one of the stream's bindings routes it; nothing is settled."""
        assert link.stream is not None and isinstance(message, StreamMessage)
        floor = link.floors.get(message.handle.subscription)
        if floor is not None and message.position < floor:
            return None  # past the stream's retention
        start = link.topic_starts.get(message.handle.topic.local, link.stream)
        if not start.admits(message.index, message.publish_time_ms):
            return None
        decoded = self.route(link.queue, link.known_sets, message)
        if decoded is None:
            return None
        own_topic = naming.exchange_topic(self.ctx.namespace, "", "direct", link.queue).local
        return Deliverable(
            decoded.exchange,
            decoded.routing_key,
            with_offset_header(decoded, delivered_offset(own_topic, message)),
            decoded.body,
            False,
            link.record,
        )

    def route(
        self, queue: str, known_sets: dict[str, BindingSet], message: ReceivedMessage
    ) -> DecodedMessage | None:
        """The message as the queue gets it, or None when no binding of the queue on its
        topic routes it (decided on the freshest binding state: the cache, else what the
        consumer read from ZooKeeper, bounded by a retired subscription's end)."""
        properties = message.properties
        if queue in skipped_by(properties):
            return None  # refused at its length limit, or in one of its priority bands
        topic = message.handle.topic.local
        binding_set = current_binding_set(self.cache, self.ctx.vhost, queue, known_sets, topic)
        exchange_name, key = naming.exchange_and_key_of_topic(topic)
        decoded = decode(properties, message.body, exchange_name, key or "")
        if binding_set is None:
            return decoded
        # Only headers exchanges need the properties decoded.
        headers = decoded.properties.headers if binding_set.exchange_type == "headers" else None
        if any_binding_routes(
            binding_set.exchange_type,
            binding_set.entries,
            decoded.routing_key,
            headers,
            lambda: message.position,
        ):
            return decoded
        return None

    def redelivered(self, message: ReceivedMessage, link: ConsumerLink | None = None) -> bool:
        # Pulsar's count survives negative acks but not a consumer closing or a topic
        # reload, so requeues seen by this proxy and returns (returns.py) count too
        # (docs/compatibility.md).
        returned = link is not None and link.returns.returned(message)
        return message.redelivery_count > 0 or self._requeued_here(message) or returned

    def _requeued_here(self, message: ReceivedMessage) -> bool:
        subscription = message.handle.subscription
        return self.requeued.knows(subscription) and self.requeued.pop(
            subscription, message.position
        )

    # ---- carrying out the core's commands -------------------------------------------------

    def execute(self, session: ChannelSession, commands: list[Command]) -> None:
        for command in commands:
            self._handlers[type(command)](self, session, command)

    def _ack(self, session: ChannelSession, command: AckMessages) -> None:
        # One call per run of messages of the same Pulsar consumer (usually one run).
        for handle, messages in runs_by_handle(command.sources):
            if not handle.acks_in_lists:
                handle.acknowledge_all(messages)
            elif handle.gather_acks(messages):
                self._gathered_acks.put(handle)
        self.getters.settled(session, command.sources)

    def _requeue(self, session: ChannelSession, command: RequeueMessages) -> None:
        self._refuse_stream_settle(command.deliveries)
        held = self._held_by(session)
        for item in command.deliveries:
            message: ReceivedMessage = item.source
            handle = message.handle
            if self.dead_letters.returned_too_often(session.number, handle, message, item.queue):
                continue  # over the queue's delivery limit: dead-lettered or dropped
            self.requeued.add(handle.subscription, message.position)
            self.batch_requeues.negative_acknowledge(message, held)
        sources = [item.source for item in command.deliveries]
        self.getters.settled(session, sources)
        self.getters.requeued(session, sources)

    def _refuse_stream_settle(self, deliveries: list[Unacked]) -> None:
        """basic.nack and basic.reject of a stream's delivery close the connection (540),
        as RabbitMQ."""
        for item in deliveries:
            if isinstance(item.source.handle, StreamReaderHandle):
                raise settle_refused(item.queue.name, self.ctx.vhost, BASIC_NACK)

    def _reject(self, session: ChannelSession, command: RejectMessages) -> None:
        self._refuse_stream_settle(command.deliveries)
        for item in command.deliveries:
            message: ReceivedMessage = item.source
            self.dead_letters.dead_letter(
                session.number, message.handle, message, item.queue, REJECTED
            )
        self.getters.settled(session, [item.source for item in command.deliveries])

    def _give_back(self, session: ChannelSession, command: GiveBack) -> None:
        held = self._held_by(session)
        for message in command.sources:
            self.batch_requeues.negative_acknowledge(message, held)

    @staticmethod
    def _held_by(session: ChannelSession) -> Callable[[], Iterator[Any]]:
        """What the channel holds now: its unacknowledged deliveries and what its consumers
        have read and not delivered yet (BatchRequeues looks there for a message's entry)."""

        def held() -> Iterator[Any]:
            for item in session.core.unacked.values():
                yield item.source
            for consumer in session.core.consumers.values():
                yield from consumer.pending

        return held

    def _pause(self, session: ChannelSession, command: PauseReading) -> None:
        for handle in self._handles_of(command.consumer.link, command.rank):
            handle.pause()

    def _resume(self, session: ChannelSession, command: ResumeReading) -> None:
        for handle in self._handles_of(command.consumer.link, command.rank):
            handle.resume()

    def _handles_of(self, link: ConsumerLink, rank: int | None) -> list[ConsumerHandle]:
        if rank is None:
            return list(link.handles.values())
        return [h for sub, h in link.handles.items() if link.ranks.get(sub, 0) == rank]

    def _consumer_settled(self, session: ChannelSession, command: ConsumerSettled) -> None:
        link: ConsumerLink = command.consumer.link
        handles = [h for h in link.handles.values() if not self.dead_letters.holds(h)]
        for handle in handles:
            self._close_soon(handle)
        link.handles = {s: h for s, h in link.handles.items() if h not in handles}
        if not link.handles:
            self.links.discard(link)

    def _drain_later(self, session: ChannelSession, command: DrainLater) -> None:
        self.spawn(self._drain_after, session, command.consumer, command.delay)

    async def _drain_after(self, session: ChannelSession, consumer: Consumer, delay: float) -> None:
        await trio.sleep(delay)
        session.core.drain(consumer)
        self.execute(session, session.core.take_commands())
        self.kick()

    _handlers: dict[type, Callable[[Consumers, ChannelSession, Any], None]] = {
        AckMessages: _ack,
        RequeueMessages: _requeue,
        RejectMessages: _reject,
        GiveBack: _give_back,
        PauseReading: _pause,
        ResumeReading: _resume,
        ConsumerSettled: _consumer_settled,
        DrainLater: _drain_later,
    }

    def output_drained(self, sessions: Iterable[ChannelSession]) -> None:
        """The writer sent its backlog: consumers may go on."""
        for session in sessions:
            if session.core.consumers:
                session.core.output_drained()
                self.execute(session, session.core.take_commands())

    # ---- get ----------------------------------------------------------------------------------

    def _holding(self, session: ChannelSession) -> set[int]:
        return {id(item.source.handle) for item in session.core.unacked.values()}

    async def get(self, session: ChannelSession, queue: str, no_ack: bool) -> None:
        await self.getters.get(session, queue, no_ack)

    async def drop_oldest(
        self, queue: str, topic: naming.TopicName, subscription: str, count: int
    ) -> int:
        """See Getters.drop_oldest."""
        return await self.getters.drop_oldest(queue, topic, subscription, count)

    # ---- the end ------------------------------------------------------------------------------

    async def close_channel(self, session: ChannelSession) -> None:
        """Channel gone: close its Pulsar consumers; the broker requeues what they held."""
        if session.core.closed:
            return
        # Closing first would requeue the dead letters not yet acknowledged as well.
        await self.dead_letters.settled(session.number, DEAD_LETTER_SETTLE_WAIT)
        released = session.core.close()
        self.execute(session, session.core.take_commands())
        self.requeued.add_all(
            (item.source.handle.subscription, item.source.position) for item in released.unacked
        )
        handles: list[ConsumerHandle] = list(session.getters.values())
        session.getters.clear()
        session.getter_holds.clear()
        links = [link for link in self.links if link.session is session]
        for link in links:
            self.links.discard(link)
            if link.batcher is not None:
                link.batcher.close()
            handles.extend(link.handles.values())
            link.handles = {}
        handles.extend(item.source.handle for item in released.unacked)
        await self._close_handles(list({id(h): h for h in handles}.values()))
        # What was read and never delivered went back when its consumer closed.
        for link in links:
            await self._unregister(link)

    async def close_all(self, sessions: Iterable[ChannelSession]) -> None:
        for session in list(sessions):
            await self.close_channel(session)

    def _close_soon(self, handle: ConsumerHandle) -> None:
        self.spawn(trio.to_thread.run_sync, handle.close)

    async def _close_handles(self, handles: list[ConsumerHandle]) -> None:
        for handle in handles:
            await trio.to_thread.run_sync(handle.close)


def new_consumer_tag(requested: object) -> str:
    """The consumer tag asked for, or a server-generated one as RabbitMQ makes them."""
    return _name(requested) or "amq.ctag-" + secrets.token_urlsafe(16)[:22]


def runs_by_handle(messages: list[Any]) -> Iterator[tuple[Any, list[Any]]]:
    """The messages in runs that share their `handle` (the Pulsar consumer that read
    them), in order: (handle, run)."""
    if not messages:
        return
    handle = messages[0].handle
    start = 0
    for index, message in enumerate(messages):
        if message.handle is not handle:
            yield handle, messages[start:index]
            handle, start = message.handle, index
    yield handle, messages[start:] if start else messages


def _send_gathered(handles: list[ConsumerHandle]) -> None:
    for handle in handles:
        handle.send_gathered_acks()
