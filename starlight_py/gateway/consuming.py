"""basic.consume / cancel / get / ack / nack / reject / recover for one connection.

An AMQP consumer reads every binding subscription of its queue through one Pulsar Shared
consumer each. Messages arrive on pulsar-client's listener thread and reach trio through a
Batcher; on the trio thread each is checked against the queue's bindings on that topic (the
pattern or headers, and the binding's position window): not routed to this queue ->
acknowledged and dropped; routed -> delivered with the channel's next delivery tag.

Prefetch (basic.qos) is credit: a consumer (and, with global, its channel) stops taking
messages at the limit and its Pulsar consumers are paused; acks resume them. Pulsar's
receiver queue is sized from the prefetch, so consumers on other proxies share a queue.

Requeueing: closing a Pulsar consumer makes the broker redeliver what it holds at once, so
channel and connection close requeue everything unacked. basic.cancel does NOT: delivered
unacked messages stay with the channel (as in RabbitMQ); the Pulsar consumers of a cancelled
consumer are kept open until those are acked, or until the channel closes.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import trio
from pamqp import commands

from starlight_py.amqp.connection import AMQPConnection
from starlight_py.amqp.errors import AccessRefused, NotAllowed, PreconditionFailed
from starlight_py.backend.message_codec import DecodedMessage, decode, skipped_by
from starlight_py.backend.pulsar_client import ConsumerHandle, PulsarBackend, ReceivedMessage
from starlight_py.gateway.bridge import Batcher
from starlight_py.gateway.dead_lettering import DeadLetters
from starlight_py.gateway.topology_methods import VhostContext
from starlight_py.metadata.cache import TopologyCache
from starlight_py.metadata.records import BindingSet
from starlight_py.model import naming
from starlight_py.model.dead_letters import REJECTED
from starlight_py.model.positions import MessageIdRecord
from starlight_py.model.priorities import PRIORITY_BAND_TYPE, RankedPending
from starlight_py.model.queue_limits import MAX_LENGTH
from starlight_py.model.routing import any_binding_routes
from starlight_py.model.topology import Queue
from starlight_py.ops.metrics import ProxyMetrics
from starlight_py.topology.service import TopologyService, expires_after

log = logging.getLogger("starlight.consume")

UNLIMITED_RECEIVER_QUEUE = 1000
# A new consumer gets its first message a few ms after subscribing; stats said it is there.
GET_WAIT = 0.5
GETTER_IDLE = 0.5
HELD_WAIT = 0.005  # a message already in the getter's receiver queue comes at once
MAX_OUTPUT_BACKLOG = 4 * 1024 * 1024
# How long a priority queue's consumer holds back lower bands after a higher one ran empty
# (model/priorities.py: a band's next message is a Pulsar round trip away).
BAND_REFILL_WAIT = 0.05
DEAD_LETTER_SETTLE_WAIT = 10.0  # a closing channel waits this long for its dead letters
TRIM_CHANNEL = 0  # dead letters of drop-head trims are settled as the connection's own


@dataclass
class Unacked:
    handle: ConsumerHandle
    message: ReceivedMessage
    consumer_tag: str | None  # None for basic.get
    queue: Queue | None = None  # where it came from (its dead-letter exchange, if any)


@dataclass
class AmqpConsumer:
    channel: int
    tag: str
    queue: str
    no_ack: bool
    prefetch: int
    exclusive: bool
    batcher: Batcher[tuple[ConsumerHandle, ReceivedMessage]]
    handles: dict[str, ConsumerHandle] = field(default_factory=dict)  # by subscription
    known_sets: dict[str, BindingSet] = field(default_factory=dict)  # by topic
    pending: RankedPending[tuple[ConsumerHandle, ReceivedMessage]] = field(
        default_factory=RankedPending
    )
    ranks: dict[str, int] = field(default_factory=dict)  # by subscription: 1 + priority band
    # A priority queue's bands that may be refilling: rank -> when it last ran empty
    refilling: dict[int, float] = field(default_factory=dict)
    wake_pending: bool = False
    unacked: int = 0
    started: bool = False
    cancelled: bool = False
    record: Queue | None = None  # the queue as declared (auto-delete, x-expires)
    registered: bool = False  # in ZooKeeper's consumers of the queue

    @property
    def registry_name(self) -> str:
        return f"{self.channel}/{self.tag}"


@dataclass
class ChannelState:
    number: int
    next_tag: int = 1
    unacked: dict[int, Unacked] = field(default_factory=dict)
    consumers: dict[str, AmqpConsumer] = field(default_factory=dict)
    prefetch_global: int = 0
    prefetch_consumer: int = 0
    getters: dict[str, ConsumerHandle] = field(default_factory=dict)  # by subscription
    getter_generation: int = 0
    getting: bool = False  # a basic.get is using the getters right now


def _rank(binding_set: BindingSet) -> int:
    """How a consumer orders what its subscriptions deliver: 1 + band for a priority
    queue's band (model/priorities.py), 0 for a binding subscription."""
    if binding_set.exchange_type != PRIORITY_BAND_TYPE:
        return 0
    parsed = naming.parse_priority_band_topic(binding_set.topic)
    return 0 if parsed is None else 1 + parsed[1]


def _name(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


class RequeuedPositions:
    """Messages this proxy requeued (subscription, position) and how often, so their next
    deliveries are marked redelivered and count towards a delivery limit; bounded, oldest
    forgotten first. Shared by the proxy's connections, all on the trio thread."""

    def __init__(self, limit: int = 100_000) -> None:
        self._limit = limit
        self._positions: OrderedDict[tuple[str, MessageIdRecord], int] = OrderedDict()

    def add(self, subscription: str, position: MessageIdRecord) -> None:
        key = (subscription, position)
        self._positions[key] = self._positions.pop(key, 0) + 1
        if len(self._positions) > self._limit:
            self._positions.popitem(last=False)

    def returns(self, subscription: str, position: MessageIdRecord) -> int:
        """How often this proxy requeued the message (Pulsar's redelivery count misses
        returns by a closing consumer, e.g. a basic.get's)."""
        return self._positions.get((subscription, position), 0)

    def add_all(self, items: Iterable[tuple[str, MessageIdRecord]]) -> None:
        for subscription, position in items:
            self.add(subscription, position)

    def pop(self, subscription: str, position: MessageIdRecord) -> bool:
        """Whether the message was requeued by this proxy (remembered for its delivery
        limit; forgotten only when the bound is reached)."""
        return (subscription, position) in self._positions


class Consumers:
    """Everything consume-side of one connection."""

    def __init__(
        self,
        conn: AMQPConnection,
        ctx: VhostContext,
        cache: TopologyCache,
        topology: TopologyService,
        backend: PulsarBackend,
        consumer_prefix: str,
        kick: Callable[[], None],
        spawn: Callable[..., None],
        requeued: RequeuedPositions,
        metrics: ProxyMetrics | None = None,
        dead_letters: DeadLetters | None = None,
    ) -> None:
        self.metrics = metrics or ProxyMetrics()
        self.dead_letters = dead_letters
        self.conn = conn
        self.ctx = ctx
        self.cache = cache
        self.topology = topology
        self.backend = backend
        self.prefix = consumer_prefix
        self.kick = kick
        self.spawn = spawn  # start a task in the connection's nursery
        self.requeued = requeued
        self.channels: dict[int, ChannelState] = {}
        self._cancelled_settled: list[ConsumerHandle] = []
        self._get_settled: list[ConsumerHandle] = []
        self._token = trio.lowlevel.current_trio_token()

    def channel(self, number: int) -> ChannelState:
        state = self.channels.get(number)
        if state is None:
            state = self.channels[number] = ChannelState(number)
        return state

    # ---- qos ----------------------------------------------------------------------------------

    def qos(self, number: int, prefetch_count: int, global_: bool) -> None:
        state = self.channel(number)
        if global_:
            state.prefetch_global = prefetch_count
        else:
            state.prefetch_consumer = prefetch_count
        for consumer in state.consumers.values():
            self._drain(state, consumer)

    # ---- consume ------------------------------------------------------------------------------

    async def consume(self, number: int, queue: str, method: commands.Basic.Consume) -> None:
        """Raises NotFound, ResourceLocked, NotAllowed (tag reused), AccessRefused
        (exclusive use)."""
        state = self.channel(number)
        tag = _name(method.consumer_tag) or "amq.ctag-" + secrets.token_urlsafe(16)[:22]
        if tag in state.consumers:
            raise NotAllowed(f"attempt to reuse consumer tag '{tag}'", (60, 20))
        record = await trio.to_thread.run_sync(
            self.topology.usable_queue, self.ctx.vhost, queue, self.ctx.owner, (60, 20)
        )
        sets = [
            s
            for s, _ in await trio.to_thread.run_sync(
                self.topology.binding_sets, self.ctx.vhost, queue
            )
        ]
        sets.sort(key=_rank, reverse=True)  # a priority queue's highest band comes first
        await self._check_exclusive_use(queue, sets, bool(method.exclusive))
        consumer = AmqpConsumer(
            number,
            tag,
            queue,
            bool(method.no_ack),
            state.prefetch_consumer,
            bool(method.exclusive),
            Batcher(self._token, lambda items: None),
            record=record,
        )
        consumer.batcher = Batcher(self._token, lambda items: self._on_messages(consumer, items))
        state.consumers[tag] = consumer
        try:
            # Registered first: an auto-delete racing this consume on another proxy either
            # sees the consumer or deletes the queue before it registers (then NotFound).
            await trio.to_thread.run_sync(
                self.topology.register_consumer,
                self.ctx.vhost,
                record,
                f"{self.prefix}/{consumer.registry_name}",
            )
            consumer.registered = True
            for binding_set in sets:
                await self._subscribe(consumer, binding_set)
        except BaseException:
            state.consumers.pop(tag, None)
            await self._close_handles(list(consumer.handles.values()))
            with trio.CancelScope(shield=True):
                await self._unregister(consumer, auto_delete=False)
            raise
        if not method.nowait:
            self.conn.send_method(number, commands.Basic.ConsumeOk(tag))
        consumer.started = True
        self._drain(state, consumer)
        self.kick()

    async def _check_exclusive_use(
        self, queue: str, sets: list[BindingSet], exclusive: bool
    ) -> None:
        names: set[str] = set()
        for binding_set in sets:
            topic = naming.TopicName(self.ctx.namespace, binding_set.topic)
            stats = await trio.to_thread.run_sync(self.topology.admin.subscription_stats, topic)
            found = stats.get(binding_set.subscription)
            if found is not None:
                names.update(n for n in found.consumer_names if "/get/" not in n)
        if (exclusive and names) or any(n.endswith("!x") for n in names):
            raise AccessRefused(
                f"queue '{queue}' in vhost '{self.ctx.vhost}' in exclusive use", (60, 20)
            )

    async def _subscribe(self, consumer: AmqpConsumer, binding_set: BindingSet) -> None:
        if binding_set.subscription in consumer.handles:
            return
        topic = naming.TopicName(self.ctx.namespace, binding_set.topic)
        name = f"{self.prefix}/{consumer.channel}/{consumer.tag}" + (
            "!x" if consumer.exclusive else ""
        )
        size = consumer.prefetch or UNLIMITED_RECEIVER_QUEUE
        handle = await trio.to_thread.run_sync(
            self.backend.subscribe,
            topic,
            binding_set.subscription,
            name,
            min(size, UNLIMITED_RECEIVER_QUEUE),
            lambda h, m: consumer.batcher.put((h, m)),
        )
        consumer.handles[binding_set.subscription] = handle
        consumer.known_sets[binding_set.topic] = binding_set
        rank = consumer.ranks[binding_set.subscription] = _rank(binding_set)
        if rank > 0:
            consumer.refilling[rank] = time.monotonic()

    async def follow_bindings(self) -> None:
        """Subscribe consumers to bindings added after they started; cancel (with
        basic.cancel, as RabbitMQ does with consumer_cancel_notify) consumers whose queue
        was deleted."""
        capabilities = self.conn.client_properties.get("capabilities")
        notify = isinstance(capabilities, dict) and bool(capabilities.get("consumer_cancel_notify"))
        for state in list(self.channels.values()):
            for consumer in list(state.consumers.values()):
                if consumer.cancelled:
                    continue
                if self.cache.queue(self.ctx.vhost, consumer.queue) is None:
                    still = await trio.to_thread.run_sync(
                        self.topology.get_queue, self.ctx.vhost, consumer.queue
                    )
                    if still is None:
                        await self._server_cancel(state, consumer, notify)
                    continue
                current = self.cache.binding_sets_of_queue(self.ctx.vhost, consumer.queue)
                for binding_set in current:
                    if binding_set.subscription not in consumer.handles:
                        await self._subscribe(consumer, binding_set)
                await self._let_go_of_retired(state, consumer, current)
        self.kick()

    async def _let_go_of_retired(
        self, state: ChannelState, consumer: AmqpConsumer, current: list[BindingSet]
    ) -> None:
        """Close the consumer's Pulsar consumers on subscriptions no longer read for its
        queue (drained retired ones, about to be deleted by the SubscriptionCleaner, which
        would otherwise reconnect and make the subscription again)."""
        active = {b.subscription for b in current}
        stale = []
        for subscription in consumer.handles:
            if subscription in active:
                continue
            retired = self.cache.retired(self.ctx.vhost, subscription)
            if retired is None or not retired.drain:
                stale.append(subscription)
        if not stale:
            return
        # The cache may lag behind a binding made a moment ago: ask ZooKeeper.
        fresh = await trio.to_thread.run_sync(
            self.topology.binding_sets, self.ctx.vhost, consumer.queue
        )
        still_read = {b.subscription for b, _ in fresh}
        holding = {id(u.handle) for u in state.unacked.values()}
        for subscription in stale:
            handle = consumer.handles.get(subscription)
            if subscription in still_read or handle is None or id(handle) in holding:
                continue
            del consumer.handles[subscription]
            await trio.to_thread.run_sync(handle.close)

    async def _server_cancel(
        self, state: ChannelState, consumer: AmqpConsumer, notify: bool
    ) -> None:
        state.consumers.pop(consumer.tag, None)
        consumer.cancelled = True
        consumer.batcher.close()
        if notify:
            self.conn.send_method(state.number, commands.Basic.Cancel(consumer.tag, nowait=True))
        await self._close_handles(list(consumer.handles.values()))
        await self._unregister(consumer, auto_delete=False)

    async def _unregister(self, consumer: AmqpConsumer, auto_delete: bool = True) -> None:
        """Take the consumer out of ZooKeeper's record; an auto-delete queue left without
        consumers goes (RabbitMQ: when its last consumer is cancelled or gone)."""
        if not consumer.registered or consumer.record is None:
            return
        consumer.registered = False
        record = consumer.record
        if not auto_delete:
            record = replace(record, auto_delete=False)
        try:
            await trio.to_thread.run_sync(
                self.topology.unregister_consumer,
                self.ctx.vhost,
                self.ctx.namespace,
                record,
                f"{self.prefix}/{consumer.registry_name}",
            )
        except Exception as e:
            # The ephemeral znode goes with this proxy's session at the latest; the
            # SubscriptionCleaner then does what is left (auto-delete).
            log.warning("could not unregister consumer %s of %r: %s", consumer.tag, record.name, e)

    # ---- delivery (trio thread, synchronous) ------------------------------------------------

    def _on_messages(
        self, consumer: AmqpConsumer, items: list[tuple[ConsumerHandle, ReceivedMessage]]
    ) -> None:
        for item in items:
            consumer.pending.put(consumer.ranks.get(item[0].subscription, 0), item)
        state = self.channels.get(consumer.channel)
        if state is not None:
            self._drain(state, consumer)
        self.kick()

    def _has_credit(self, state: ChannelState, consumer: AmqpConsumer) -> bool:
        if consumer.no_ack:
            return self.conn.pending_output < MAX_OUTPUT_BACKLOG
        if consumer.prefetch and consumer.unacked >= consumer.prefetch:
            return False
        return not (state.prefetch_global and len(state.unacked) >= state.prefetch_global)

    def _drain(self, state: ChannelState, consumer: AmqpConsumer) -> None:
        banded = bool(consumer.refilling)
        while consumer.pending and consumer.started and not consumer.cancelled:
            if not self._has_credit(state, consumer):
                break
            if banded and self._wait_for_higher_band(state, consumer):
                break
            handle, message = consumer.pending.pop()
            if banded:
                rank = consumer.ranks.get(handle.subscription, 0)
                if rank > 0 and consumer.pending.count(rank) == 0:
                    consumer.refilling[rank] = time.monotonic()
            decoded = self._route(consumer.queue, consumer.known_sets, message)
            if decoded is None:
                handle.acknowledge(message)  # not for this queue (another binding's)
                continue
            if self.dead_letters is not None and self.dead_letters.died_before_delivery(
                state.number, handle, message, consumer.record
            ):
                continue  # expired or over the delivery limit: dead-lettered or dropped
            tag = state.next_tag
            state.next_tag += 1
            if consumer.no_ack:
                handle.acknowledge(message)
            else:
                state.unacked[tag] = Unacked(handle, message, consumer.tag, consumer.record)
                consumer.unacked += 1
            redelivered = self._redelivered(handle, message)
            self.metrics.delivered(self.ctx.vhost, len(decoded.body), redelivered)
            self.conn.send_content_raw(
                state.number,
                commands.Basic.Deliver(
                    consumer.tag,
                    tag,
                    redelivered,
                    decoded.exchange,
                    decoded.routing_key,
                ),
                decoded.raw_properties,
                decoded.body,
            )
        # Flow control: stop Pulsar pushing to a consumer that cannot take more.
        limit = max(1, consumer.prefetch or UNLIMITED_RECEIVER_QUEUE)
        if banded:
            # A priority queue's consumer keeps up to `limit` messages of each band at hand
            # even without credit, so that a message of a higher band published meanwhile
            # is the next one delivered.
            for subscription, handle in consumer.handles.items():
                rank = consumer.ranks.get(subscription, 0)
                if consumer.cancelled or consumer.pending.count(rank) >= limit:
                    handle.pause()
                else:
                    handle.resume()
            return
        full = not self._has_credit(state, consumer) or len(consumer.pending) > 2 * limit
        for handle in consumer.handles.values():
            if full or consumer.cancelled:
                handle.pause()
            else:
                handle.resume()

    def _wait_for_higher_band(self, state: ChannelState, consumer: AmqpConsumer) -> bool:
        """Whether a priority queue's consumer should hold back the waiting message because
        a higher band ran empty less than BAND_REFILL_WAIT ago: Pulsar sends a band's next
        message only once the proxy took the previous one, and that round trip must not let
        a lower band's message overtake it. Schedules a new look when holding back."""
        top = consumer.pending.top_rank()
        now = time.monotonic()
        until = max(
            (
                since + BAND_REFILL_WAIT
                for rank, since in consumer.refilling.items()
                if top is not None and rank > top and now - since < BAND_REFILL_WAIT
            ),
            default=None,
        )
        if until is None:
            return False
        if not consumer.wake_pending:
            consumer.wake_pending = True
            self.spawn(self._drain_later, state, consumer, until - now)
        return True

    async def _drain_later(self, state: ChannelState, consumer: AmqpConsumer, delay: float) -> None:
        await trio.sleep(delay)
        consumer.wake_pending = False
        if not consumer.cancelled:
            self._drain(state, consumer)
            self.kick()

    def _route(
        self, queue: str, known_sets: dict[str, BindingSet], message: ReceivedMessage
    ) -> DecodedMessage | None:
        """The message as the queue gets it, or None when no binding of the queue on its
        topic routes it (decided on the freshest binding state: the cache, else what the
        consumer read from ZooKeeper, bounded by a retired subscription's end)."""
        if queue in skipped_by(message.properties):
            return None  # refused at its length limit, or in one of its priority bands
        topic = message.topic_local
        binding_set = self.cache.binding_set(self.ctx.vhost, queue, topic)
        if binding_set is None:
            known = known_sets.get(topic)
            retired = self.cache.retired(self.ctx.vhost, known.subscription) if known else None
            if retired is not None and retired.binding_set is not None:
                binding_set = retired.binding_set  # unbound: routes only up to its end
            else:
                binding_set = known  # the cache has not caught up with a new binding yet
        exchange_name, key = naming.exchange_and_key_of_topic(topic)
        decoded = decode(message.properties, message.body, exchange_name, key or "")
        if binding_set is None:
            return decoded
        # Only headers exchanges need the properties decoded.
        headers = decoded.properties.headers if binding_set.exchange_type == "headers" else None
        if any_binding_routes(
            binding_set.exchange_type,
            binding_set.entries,
            decoded.routing_key,
            headers,
            message.position,
        ):
            return decoded
        return None

    def _redelivered(self, handle: ConsumerHandle, message: ReceivedMessage) -> bool:
        # Pulsar's count survives negative acks but not a consumer closing, so requeues
        # seen by this proxy are remembered too (docs/compatibility.md).
        seen = self.requeued.pop(handle.subscription, message.position)
        return seen or message.redelivery_count > 0

    def output_flushed(self) -> None:
        """The writer sent its backlog: no-ack consumers may go on."""
        for state in self.channels.values():
            for consumer in state.consumers.values():
                if consumer.pending or any(h.paused for h in consumer.handles.values()):
                    self._drain(state, consumer)

    # ---- acks ---------------------------------------------------------------------------------

    def _take(
        self, state: ChannelState, tag: int, multiple: bool, method: tuple[int, int]
    ) -> list[Unacked]:
        if multiple:
            tags = [t for t in state.unacked if tag == 0 or t <= tag]
            if tag != 0 and tag not in state.unacked and not tags:
                raise PreconditionFailed(f"unknown delivery tag {tag}", method)
        else:
            if tag not in state.unacked:
                raise PreconditionFailed(f"unknown delivery tag {tag}", method)
            tags = [tag]
        taken = [state.unacked.pop(t) for t in tags]
        for item in taken:
            consumer = state.consumers.get(item.consumer_tag or "")
            if consumer is not None:
                consumer.unacked -= 1
            elif item.consumer_tag is None:
                self._get_settled.append(item.handle)
            else:
                self._cancelled_settled.append(item.handle)
        return taken

    def _close_settled_handles(self, state: ChannelState) -> None:
        # A cancelled consumer's Pulsar consumers close once nothing they delivered is
        # unacked (closing earlier would requeue those messages).
        holding = {id(u.handle) for u in state.unacked.values()}
        for handle in self._cancelled_settled:
            if not self._in_use(handle, holding):
                self._close_soon(handle)
        self._cancelled_settled.clear()
        for handle in self._get_settled:
            if not self._in_use(handle, holding):
                for sub, getter in list(state.getters.items()):
                    if getter is handle:
                        del state.getters[sub]
                        self._close_soon(handle)
        self._get_settled.clear()

    def _in_use(self, handle: ConsumerHandle, holding: set[int]) -> bool:
        """Closing `handle` would requeue a message: one it delivered that is unacked (its
        id in `holding`) or a dead letter not yet acknowledged on its source."""
        if id(handle) in holding:
            return True
        return self.dead_letters is not None and self.dead_letters.holds(handle)

    def _close_soon(self, handle: ConsumerHandle) -> None:
        self.spawn(trio.to_thread.run_sync, handle.close)

    def ack(self, number: int, tag: int, multiple: bool) -> None:
        state = self.channel(number)
        for item in self._take(state, tag, multiple, (60, 80)):
            item.handle.acknowledge(item.message)
        self._after_settle(state)

    def reject(
        self, number: int, tag: int, multiple: bool, requeue: bool, method: tuple[int, int]
    ) -> None:
        state = self.channel(number)
        for item in self._take(state, tag, multiple, method):
            if (
                requeue
                and self.dead_letters is not None
                and self.dead_letters.returned_too_often(
                    number, item.handle, item.message, item.queue
                )
            ):
                continue  # over the queue's delivery limit: dead-lettered or dropped
            if requeue:
                self.requeued.add(item.handle.subscription, item.message.position)
                item.handle.negative_acknowledge(item.message)
            elif self.dead_letters is not None:
                self.dead_letters.dead_letter(
                    number, item.handle, item.message, item.queue, REJECTED
                )
            else:
                item.handle.acknowledge(item.message)  # dropped
        self._after_settle(state)

    def recover(self, number: int) -> None:
        """basic.recover: every unacked message of the channel is requeued."""
        state = self.channel(number)
        if state.unacked:
            self.reject(number, 0, True, True, (60, 110))

    def _after_settle(self, state: ChannelState) -> None:
        self._close_settled_handles(state)
        for consumer in state.consumers.values():
            self._drain(state, consumer)
        self.kick()

    # ---- cancel -------------------------------------------------------------------------------

    async def cancel(self, number: int, tag: str, nowait: bool) -> None:
        state = self.channel(number)
        consumer = state.consumers.pop(tag, None)
        if consumer is not None:
            consumer.cancelled = True
            leftovers = consumer.pending.take_all() + consumer.batcher.close()
            for handle in consumer.handles.values():
                handle.pause()
            for handle, message in leftovers:
                handle.negative_acknowledge(message)  # never delivered: back to the queue
            holding = {id(u.handle) for u in state.unacked.values() if u.consumer_tag == tag}
            idle = [h for h in consumer.handles.values() if not self._in_use(h, holding)]
            await self._close_handles(idle)
            # Before cancel-ok: a client that sees cancel-ok no longer sees an auto-delete
            # queue whose last consumer this was.
            await self._unregister(consumer)
        if not nowait:
            self.conn.send_method(number, commands.Basic.CancelOk(tag))

    # ---- get ----------------------------------------------------------------------------------

    async def get(self, number: int, queue: str, no_ack: bool) -> None:
        """basic.get through one Pulsar consumer per channel and subscription, kept between
        gets so that a message it prefetched is the next one returned, and closed once idle
        with nothing of its unacked (which returns any prefetched message to the queue).
        Empty queues are recognised from Pulsar's stats without waiting."""
        state = self.channel(number)
        state.getting = True
        try:
            await self._get(state, queue, no_ack)
        finally:
            state.getting = False
            self._getter_used(state)

    async def _get(self, state: ChannelState, queue: str, no_ack: bool) -> None:
        number = state.number
        record = await trio.to_thread.run_sync(
            self.topology.usable_queue, self.ctx.vhost, queue, self.ctx.owner, (60, 70)
        )
        if expires_after(record) is not None:
            await trio.to_thread.run_sync(self.topology.touch_queue, self.ctx.vhost, queue, True)
        sets = [
            s
            for s, _ in await trio.to_thread.run_sync(
                self.topology.binding_sets, self.ctx.vhost, queue
            )
        ]
        sets.sort(key=_rank, reverse=True)  # a priority queue's highest band comes first
        ready: dict[str, int] = {}
        for binding_set in sets:
            topic = naming.TopicName(self.ctx.namespace, binding_set.topic)
            stats = await trio.to_thread.run_sync(self.topology.admin.subscription_stats, topic)
            found_stats = stats.get(binding_set.subscription)
            if found_stats is not None:
                ready[binding_set.subscription] = found_stats.ready
        total_ready = sum(ready.values())
        for binding_set in sets:
            getter = state.getters.get(binding_set.subscription)
            # A message our getter already holds is counted as unacked, not ready.
            if getter is not None and await self._get_from(
                state, getter, queue, binding_set, no_ack, total_ready, HELD_WAIT, record
            ):
                return
            if ready.get(binding_set.subscription, 0) <= 0:
                continue
            if getter is None:
                getter = await trio.to_thread.run_sync(
                    self.backend.subscribe,
                    naming.TopicName(self.ctx.namespace, binding_set.topic),
                    binding_set.subscription,
                    f"{self.prefix}/get/{number}",
                    1,
                    None,
                )
                state.getters[binding_set.subscription] = getter
            remaining = max(0, total_ready - 1)
            if await self._get_from(
                state, getter, queue, binding_set, no_ack, remaining, GET_WAIT, record
            ):
                return
        self.conn.send_method(number, commands.Basic.GetEmpty())

    async def _get_from(
        self,
        state: ChannelState,
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
            decoded = self._route(queue, {binding_set.topic: binding_set}, message)
            if decoded is None:
                handle.acknowledge(message)  # another binding's message: not this queue's
                continue
            if self.dead_letters is not None and self.dead_letters.died_before_delivery(
                state.number, handle, message, record
            ):
                remaining = max(0, remaining - 1)
                continue  # expired or over the delivery limit: dead-lettered or dropped
            tag = state.next_tag
            state.next_tag += 1
            if no_ack:
                handle.acknowledge(message)
                await self._close_getter(state, binding_set.subscription)
            else:
                state.unacked[tag] = Unacked(handle, message, None, record)
            redelivered = self._redelivered(handle, message)
            self.metrics.delivered(self.ctx.vhost, len(decoded.body), redelivered)
            self.conn.send_content_raw(
                state.number,
                commands.Basic.GetOk(
                    tag,
                    redelivered,
                    decoded.exchange,
                    decoded.routing_key,
                    remaining,
                ),
                decoded.raw_properties,
                decoded.body,
            )
            return True

    async def drop_oldest(
        self, queue: str, topic: naming.TopicName, subscription: str, count: int
    ) -> int:
        """drop-head for a queue over its length limit: read up to `count` of the oldest
        ready messages of one binding subscription (what the broker hands out next, never a
        message delivered and unacked) and dead-letter them with reason `maxlen`, or drop
        them without a dead-letter exchange; returns how many. Raises BackendUnavailable."""
        record = self.cache.queue(self.ctx.vhost, queue)
        if record is None or count <= 0:
            return 0
        known = {b.topic: b for b in self.cache.binding_sets_of_queue(self.ctx.vhost, queue)}
        # "/get/": not a consumer of the queue for the exclusive-consumer check.
        handle = await trio.to_thread.run_sync(
            self.backend.subscribe, topic, subscription, f"{self.prefix}/get/trim", count, None
        )
        dropped = 0
        try:
            while dropped < count:
                message = await trio.to_thread.run_sync(handle.receive, GET_WAIT)
                if message is None:
                    break
                if self._route(queue, known, message) is None:
                    handle.acknowledge(message)  # another binding's message: not this queue's
                    continue
                dropped += 1
                if self.dead_letters is None:
                    handle.acknowledge(message)
                else:
                    self.dead_letters.dead_letter(TRIM_CHANNEL, handle, message, record, MAX_LENGTH)
            if self.dead_letters is not None:
                await self.dead_letters.settled(TRIM_CHANNEL, DEAD_LETTER_SETTLE_WAIT)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(handle.close)
        return dropped

    async def _close_getter(self, state: ChannelState, subscription: str) -> None:
        """Close a getter now (nothing of it is unacked): the message its receiver queue may
        hold goes back to the queue before anyone counts or gets again."""
        handle = state.getters.get(subscription)
        if handle is None or self._in_use(handle, set()):
            return  # a dead letter it read is unsettled: the idle getters' closer does it
        del state.getters[subscription]
        await trio.to_thread.run_sync(handle.close)

    def _getter_used(self, state: ChannelState) -> None:
        state.getter_generation += 1
        self.spawn(self._close_idle_getters, state, state.getter_generation)

    async def _close_idle_getters(self, state: ChannelState, generation: int) -> None:
        await trio.sleep(GETTER_IDLE)
        while state.getter_generation == generation and state.getters and not state.getting:
            holding = {id(u.handle) for u in state.unacked.values()}
            idle = [
                sub for sub, handle in state.getters.items() if not self._in_use(handle, holding)
            ]
            for sub in idle:
                handle = state.getters.pop(sub)
                await trio.to_thread.run_sync(handle.close)
            if not state.getters:
                return
            await trio.sleep(GETTER_IDLE)  # some still hold unacked gets: look again later

    # ---- the end ------------------------------------------------------------------------------

    async def close_channel(self, number: int) -> None:
        """Channel gone: close its Pulsar consumers; the broker requeues what they held."""
        state = self.channels.pop(number, None)
        if state is None:
            return
        if self.dead_letters is not None:
            # Closing first would requeue the dead letters not yet acknowledged as well.
            await self.dead_letters.settled(number, DEAD_LETTER_SETTLE_WAIT)
        self.requeued.add_all(
            (u.handle.subscription, u.message.position) for u in state.unacked.values()
        )
        handles: list[ConsumerHandle] = list(state.getters.values())
        state.getters.clear()
        for consumer in state.consumers.values():
            consumer.cancelled = True
            consumer.batcher.close()
            handles.extend(consumer.handles.values())
        handles.extend(u.handle for u in state.unacked.values())
        await self._close_handles(list({id(h): h for h in handles}.values()))
        for consumer in state.consumers.values():
            await self._unregister(consumer)

    async def close_all(self) -> None:
        for number in list(self.channels):
            await self.close_channel(number)

    async def _close_handles(self, handles: list[ConsumerHandle]) -> None:
        for handle in handles:
            await trio.to_thread.run_sync(handle.close)
