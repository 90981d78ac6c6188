"""Dead-lettering for one connection: messages that die in a queue (rejected or nacked
without requeue, expired, returned more often than the queue's delivery limit) are
republished to the queue's dead-letter exchange and acknowledged on their source
subscription only once Pulsar has stored the copy.

The at-least-once boundary: the source message is acknowledged after Pulsar confirmed the
dead letter, never before. A proxy that dies in between leaves the source message unacked,
so Pulsar redelivers it and it is dead-lettered (or delivered) again: a duplicate in the
dead-letter queue, never a loss. A failed republish (Pulsar refused it) negatively
acknowledges the source message, which comes back to the queue. Within one connection a
message read again (an acknowledgement lost while its topic moved, or a reader closed before
the copy was confirmed) is not dead-lettered twice: core/dead_letter_memory.py.

Dead letters are republished by one task per connection, in the order they died; Pulsar's
send results come back through a Batcher (gateway/bridge.py). The Pulsar consumer that read
a dead letter stays open until its source acknowledgement is sent (`holds`), and a closing
channel waits for its dead letters (`settled`), because closing the consumer first would
requeue the message as well.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio
from pamqp import commands

from starlight_py.backend.message_codec import (
    EXPIRATION_KEY,
    DecodedMessage,
    decode,
    encode_properties,
)
from starlight_py.backend.pulsar_admin import BackendUnavailable
from starlight_py.backend.pulsar_client import (
    BackendError,
    ConsumerHandle,
    ProducerHandle,
    ReceivedMessage,
)
from starlight_py.core.dead_letter_memory import DeadLetterMemory, Seen
from starlight_py.core.held import HeldCounts
from starlight_py.gateway.bridge import Batcher
from starlight_py.gateway.publish.default_binding import default_binding_ready
from starlight_py.gateway.publish.exchange_routing import (
    follows_bindings,
    route_through_bindings,
    written_copies,
)
from starlight_py.gateway.publish.message_copies import (
    copy_targets,
    has_own_topics,
    message_copies,
    stored_copy_targets,
)
from starlight_py.gateway.publish.own_topics import OwnTopics
from starlight_py.gateway.publish.producer_pool import ProducerPool
from starlight_py.gateway.topology_methods import VhostContext
from starlight_py.metadata.cache import TopologyCache
from starlight_py.metadata.zookeeper import MetadataUnavailable
from starlight_py.model import naming
from starlight_py.model.dead_letters import (
    DELIVERY_LIMIT,
    NO_POLICY,
    Death,
    MessagePolicy,
    dead_letter_routing_key,
    dead_lettered_properties,
    death_at_delivery,
    death_routing_keys,
    is_automatic_cycle,
    over_limit_when_returned,
)
from starlight_py.model.positions import MessageIdRecord
from starlight_py.model.queue_limits import MAX_LENGTH
from starlight_py.model.topology import Exchange, Queue
from starlight_py.topology.service import TopologyService

log = logging.getLogger("starlight.dead_letter")

SEND_BACKOFF = 0.002  # the DLX producer is full: try again after this long


def policy_of(queue: Queue | None) -> MessagePolicy:
    if queue is None:
        return NO_POLICY
    # Asked for every delivery: kept on the (frozen) record, read once.
    cached = _POLICIES.get(id(queue))
    if cached is not None and cached[0] is queue:
        return cached[1]
    policy = MessagePolicy.of(queue.arguments)
    if len(_POLICIES) >= _MAX_POLICIES:
        _POLICIES.clear()
    _POLICIES[id(queue)] = (queue, policy)
    return policy


# By id() of a Queue record (kept alive by the entry, so the id is not reused meanwhile).
# Consumers deliver with the metadata cache's long-lived records; each basic.get reads a fresh
# record from ZooKeeper, so entries come and go with gets: a small bound keeps what they hold
# (each entry keeps its record alive) at a few hundred KiB.
_MAX_POLICIES = 512
_POLICIES: dict[int, tuple[Queue, MessagePolicy]] = {}


class _Copies:
    """The copies of one dead letter still without an outcome; `done` runs on the trio
    thread once all have one, with ok only when Pulsar stored every copy."""

    __slots__ = ("done", "error", "left", "ok")

    def __init__(self, copies: int, done: Callable[[bool, str], None]) -> None:
        self.left = copies
        self.ok = True
        self.error = ""
        self.done = done


@dataclass(frozen=True, slots=True)
class DeadLetter:
    channel: int
    handle: ConsumerHandle  # the consumer that read it: acknowledges it on the source
    message: ReceivedMessage
    queue: Queue
    reason: str
    counted: bool = False  # held in the source's counts meanwhile (it died undelivered)


def _key(item: DeadLetter) -> tuple[str, MessageIdRecord]:
    """What identifies a dead letter's source message (core/dead_letter_memory.py)."""
    return item.handle.subscription, item.message.position


class DeadLetters:
    """The dead letters of one connection's channels."""

    def __init__(
        self,
        ctx: VhostContext,
        cache: TopologyCache,
        topology: TopologyService,
        producers: ProducerPool,
        spawn: Callable[..., None],
        returns: Callable[[str, MessageIdRecord], int] = lambda _s, _p: 0,
        now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        held: HeldCounts | None = None,
    ) -> None:
        """`returns(subscription, position)`: how often this proxy requeued a message,
        which counts towards a delivery limit where Pulsar's redelivery count is lower.
        `held`: the vhost's unacked deliveries for exact counts; a message that dies
        undelivered is held there until its source is acknowledged, and then counts as
        settled, so the source queue never counts it once its dead letter can be read
        (Pulsar hears of the acknowledgement up to ~100 ms later)."""
        self.ctx = ctx
        self.cache = cache
        self.topology = topology
        self.own_topics = OwnTopics(cache, topology, ctx)
        self.producers = producers
        self.spawn = spawn  # start a task in the connection's nursery
        self.returns = returns
        self.now_ms = now_ms
        self.held = held
        self._waiting: deque[DeadLetter] = deque()
        self._wakeup = trio.Event()
        self._changed = trio.Event()
        self._worker = False
        self._unsettled: Counter[int] = Counter()  # by channel: waiting or being sent
        self._sending: Counter[int] = Counter()  # by channel: handed to Pulsar
        self._holding: Counter[int] = Counter()  # by id() of the source's ConsumerHandle
        self._memory: DeadLetterMemory[DeadLetter] = DeadLetterMemory()
        self._results: Batcher[tuple[_Copies, ProducerHandle, bool, str]] = Batcher(
            trio.lowlevel.current_trio_token(), self._on_results
        )

    # ---- what dies (trio thread, synchronous) -----------------------------------------------

    def died_before_delivery(
        self, channel: int, handle: ConsumerHandle, message: ReceivedMessage, queue: Queue | None
    ) -> bool:
        """True when the message must not be delivered: it expired (queue TTL or its own
        expiration) or came back more often than the queue's delivery limit. It is then
        dead-lettered or dropped here."""
        expiration = message.properties.get(EXPIRATION_KEY)
        policy = policy_of(queue)
        if expiration is None and not policy.checks_deliveries:
            return False
        reason = death_at_delivery(
            policy,
            message.publish_time_ms,
            expiration,
            self._returned(handle, message),
            self.now_ms(),
        )
        if reason is None or queue is None:
            return False
        self.dead_letter(channel, handle, message, queue, reason, undelivered=True)
        return True

    def returned_too_often(
        self, channel: int, handle: ConsumerHandle, message: ReceivedMessage, queue: Queue | None
    ) -> bool:
        """Called instead of requeueing a message: True when that return exceeds its queue's
        delivery limit, and the message has been dead-lettered or dropped instead."""
        if queue is None or not over_limit_when_returned(
            policy_of(queue), self._returned(handle, message)
        ):
            return False
        self.dead_letter(channel, handle, message, queue, DELIVERY_LIMIT, undelivered=True)
        return True

    def dead_letter(
        self,
        channel: int,
        handle: ConsumerHandle,
        message: ReceivedMessage,
        queue: Queue | None,
        reason: str,
        undelivered: bool = False,
    ) -> None:
        """Republish the message to its queue's dead-letter exchange, then acknowledge it;
        without a dead-letter exchange just acknowledge it (dropped, as RabbitMQ does).
        `undelivered`: no client holds it (it expired or came back once too often), so the
        source's counts learn of it here rather than from a channel's ack or reject."""
        counted = undelivered and queue is not None and self.held is not None
        if queue is None or policy_of(queue).dead_letter_exchange is None:
            self._drop(handle, message, queue, counted)
            return
        item = DeadLetter(channel, handle, message, queue, reason, counted)
        seen = self._memory.see(_key(item), item)
        if seen is Seen.STORED:
            # Read again after its dead letter was stored (say, its source acknowledgement
            # was lost while the topic moved): acknowledged again, not dead-lettered twice.
            self._drop(handle, message, queue, counted)
            return
        if counted and self.held is not None:
            self.held.hold(queue.name, 1)
        self._unsettled[channel] += 1
        self._holding[id(handle)] += 1
        if seen is Seen.ON_ITS_WAY:
            return  # settled with the first copy, once Pulsar answers for it
        self._waiting.append(item)
        self._wakeup.set()
        if not self._worker:
            self._worker = True
            self.spawn(self._work)

    def _drop(
        self, handle: ConsumerHandle, message: ReceivedMessage, queue: Queue | None, counted: bool
    ) -> None:
        """Acknowledge a dying message without a dead letter; `counted`: it died
        undelivered, so the source's counts learn of it here."""
        handle.acknowledge(message)
        if counted and queue is not None and self.held is not None:
            self.held.acknowledged(queue.name, 1, time.monotonic())

    def _returned(self, handle: ConsumerHandle, message: ReceivedMessage) -> int:
        return max(message.redelivery_count, self.returns(handle.subscription, message.position))

    def holds(self, handle: ConsumerHandle) -> bool:
        """Whether a dead letter read by `handle` is not yet acknowledged on its source:
        closing `handle` now would requeue it too."""
        return self._holding[id(handle)] > 0

    async def settled(self, channel: int, timeout: float) -> None:
        """Wait (at most `timeout` s) until the channel's dead letters are acknowledged on
        their source or given back, so that closing its consumers requeues none of them."""
        with trio.move_on_after(timeout):
            while self._unsettled[channel] > 0 and (self._worker or self._sending[channel] > 0):
                self._changed = trio.Event()
                await self._changed.wait()

    async def settled_all(self, timeout: float) -> None:
        with trio.move_on_after(timeout):
            for channel in list(self._unsettled):
                await self.settled(channel, timeout)

    # ---- republishing (the connection's dead-letter task) -----------------------------------

    async def _work(self) -> None:
        try:
            while True:
                if not self._waiting:
                    self._wakeup = trio.Event()
                    await self._wakeup.wait()
                    continue
                item = self._waiting.popleft()
                try:
                    await self._republish(item)
                except (BackendUnavailable, BackendError, MetadataUnavailable) as e:
                    log.warning(
                        "could not dead-letter a message of queue %r; it goes back to the "
                        "queue: %s",
                        item.queue.name,
                        e,
                    )
                    self._settle(item, requeue=True)
                except Exception:
                    # Our bug (say, a header pamqp cannot encode again): the message stays
                    # in its queue rather than the connection dying with it.
                    log.exception("dead-lettering a message of queue %r", item.queue.name)
                    self._settle(item, requeue=True)
        finally:
            self._worker = False
            self._changed.set()

    async def _republish(self, item: DeadLetter) -> None:
        decoded = self._decoded(item.message)

        def done(ok: bool, error: str) -> None:
            self._sending[item.channel] -= 1
            if not ok:
                log.warning(
                    "Pulsar refused a dead letter of queue %r; it goes back to the queue: %s",
                    item.queue.name,
                    error,
                )
            self._settle(item, requeue=not ok)

        def sending() -> None:
            self._sending[item.channel] += 1

        sent = await self._send(
            item.queue,
            item.reason,
            decoded.exchange,
            decoded.routing_key,
            decoded.properties,
            item.message.body,
            done,
            sending,
        )
        if not sent:
            self._settle(item, requeue=False)  # dropped

    async def dead_letter_refused(
        self,
        queue: Queue,
        exchange: str,
        routing_key: str,
        properties: commands.Basic.Properties,
        body: bytes,
    ) -> None:
        """Dead-letter a message a `reject-publish-dlx` queue refused at publish (reason
        `maxlen`), as RabbitMQ does; the publisher gets its nack whatever happens here.
        Raises BackendUnavailable, BackendError, MetadataUnavailable."""

        def done(ok: bool, error: str) -> None:
            if not ok:
                log.warning("Pulsar refused a dead letter of queue %r: %s", queue.name, error)

        await self._send(queue, MAX_LENGTH, exchange, routing_key, properties, body, done)

    async def _send(
        self,
        queue: Queue,
        reason: str,
        exchange_name: str,
        routing_key: str,
        properties: commands.Basic.Properties,
        body: bytes,
        done: Callable[[bool, str], None],
        sending: Callable[[], None] = lambda: None,
    ) -> bool:
        """Send a message that died in `queue` to the queue's dead-letter exchange; False
        when it is dropped instead (no such exchange, an automatic cycle, unroutable)."""
        policy = policy_of(queue)
        exchange = await self._exchange(policy.dead_letter_exchange or "")
        headers = properties.headers
        if exchange is None or is_automatic_cycle(headers, queue.name, reason):
            # RabbitMQ drops dead letters whose exchange is gone, and ones that went round a
            # cycle of queues with no rejection in it.
            return False
        dead_key = dead_letter_routing_key(policy, routing_key)
        now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        death = Death(
            reason, queue.name, exchange_name, death_routing_keys(routing_key, headers), now
        )
        dead_properties = dead_lettered_properties(
            properties, death, drop_cc=policy.dead_letter_routing_key is not None
        )
        if follows_bindings(self.cache, self.ctx.vhost, exchange):
            return await self._send_through_bindings(
                exchange, dead_key, dead_properties, body, done, sending
            )
        if not await self._routes(exchange, dead_key, dead_properties.headers):
            return False  # unroutable dead letters are dropped
        topic = naming.exchange_topic(
            self.ctx.namespace, exchange.name, exchange.routing_type, dead_key
        )
        pulsar_properties = encode_properties(exchange.name, dead_key, dead_properties)
        priorities = self.cache.max_priorities(self.ctx.vhost)  # usually empty
        targets = copy_targets(
            self.cache,
            self.ctx.vhost,
            exchange,
            dead_key,
            dead_properties.headers,
            bool(priorities),
        )
        if has_own_topics(exchange) and not targets.routed:
            targets = await trio.to_thread.run_sync(
                stored_copy_targets,
                self.topology,
                self.ctx.vhost,
                exchange,
                dead_key,
                dead_properties.headers,
            )
        copies = message_copies(
            self.ctx.namespace,
            topic,
            exchange,
            pulsar_properties,
            targets.routed,
            set(),
            priorities,
            dead_properties.priority,
            targets.own_topics,
            targets.exchange_topic_read,
        )
        if (
            exchange.name == ""
            and copies
            and not await default_binding_ready(self.cache, self.topology, self.ctx, dead_key)
        ):
            return False  # the queue went away meanwhile: unroutable
        if not copies:
            return False  # its binding went away meanwhile: unroutable
        pending = _Copies(len(copies), done)
        sending()
        for copy_topic, copy_properties in copies:
            producer = await self.producers.get(copy_topic, self.own_topics.before(copy_topic))
            while not producer.has_room():
                await trio.sleep(SEND_BACKOFF)
            producer.send_tracked(body, copy_properties, self._copy_callback(pending, producer))
        return True

    async def _send_through_bindings(
        self,
        exchange: Exchange,
        dead_key: str,
        dead_properties: commands.Basic.Properties,
        body: bytes,
        done: Callable[[bool, str], None],
        sending: Callable[[], None],
    ) -> bool:
        """`_send` for a dead-letter exchange with exchange-to-exchange bindings: one copy
        per reached exchange that serves a queue first (gateway/publish/exchange_routing.py)."""
        vhost = self.ctx.vhost
        headers = dead_properties.headers
        route = await route_through_bindings(
            self.cache, self.topology, vhost, exchange, dead_key, headers
        )
        if route is None:
            return False  # unroutable dead letters are dropped
        copies = written_copies(
            self.cache,
            self.ctx.namespace,
            vhost,
            route,
            dead_key,
            headers,
            encode_properties(exchange.name, dead_key, dead_properties),
            None,
            self.cache.max_priorities(vhost),
            dead_properties.priority,
        )
        pending = _Copies(len(copies), done)
        sending()
        for copy_topic, copy_properties, _ in copies:
            producer = await self.producers.get(copy_topic, self.own_topics.before(copy_topic))
            while not producer.has_room():
                await trio.sleep(SEND_BACKOFF)
            producer.send_tracked(body, copy_properties, self._copy_callback(pending, producer))
        return True

    def _copy_callback(
        self, pending: _Copies, producer: ProducerHandle
    ) -> Callable[[bool, str], None]:
        put = self._results.put

        def done(ok: bool, error: str) -> None:
            put((pending, producer, ok, error))

        return done

    def _decoded(self, message: ReceivedMessage) -> DecodedMessage:
        exchange, key = naming.exchange_and_key_of_topic(message.topic_local)
        return decode(message.properties, message.body, exchange, key or "")

    async def _exchange(self, name: str) -> Exchange | None:
        if name == "":
            return Exchange("", "direct")
        exchange = self.cache.exchange(self.ctx.vhost, name)
        if exchange is not None:
            return exchange
        found = await trio.to_thread.run_sync(self.topology.get_exchange, self.ctx.vhost, name)
        return None if found is None else found[0]

    async def _routes(self, exchange: Exchange, routing_key: str, headers: Any) -> bool:
        vhost = self.ctx.vhost
        if self.cache.has_route(vhost, exchange, routing_key, headers):
            return True
        # The cache may lag by milliseconds behind a binding made on another proxy.
        return await trio.to_thread.run_sync(
            self.topology.has_route, vhost, exchange, routing_key, headers
        )

    # ---- results (trio thread) ----------------------------------------------------------------

    def _on_results(self, results: list[tuple[_Copies, ProducerHandle, bool, str]]) -> None:
        for pending, producer, ok, error in results:
            producer.tracked_done()
            if not ok and pending.ok:
                pending.ok, pending.error = False, error
            pending.left -= 1
            if not pending.left:
                pending.done(pending.ok, pending.error)

    def _settle(self, item: DeadLetter, requeue: bool) -> None:
        """The outcome of `item`, and of its copies read again meanwhile."""
        for each in (item, *self._memory.finish(_key(item), stored=not requeue)):
            self._settle_one(each, requeue)

    def _settle_one(self, item: DeadLetter, requeue: bool) -> None:
        if requeue:
            item.handle.negative_acknowledge(item.message)
        else:
            item.handle.acknowledge(item.message)
        if item.counted and self.held is not None:
            self.held.release(item.queue.name, 1, None if requeue else time.monotonic())
        self._unsettled[item.channel] -= 1
        if self._unsettled[item.channel] <= 0:
            del self._unsettled[item.channel]
        self._holding[id(item.handle)] -= 1
        if self._holding[id(item.handle)] <= 0:
            del self._holding[id(item.handle)]
        self._changed.set()

    def close(self) -> None:
        self._results.close()
