"""basic.publish: route with the watched cache, send to one Pulsar topic with send_async,
answer confirms in publish order, return unroutable mandatory messages first.

Hot path: the exchange and the route come from the in-memory cache; a producer per topic is
created once (in a worker thread) and reused; send results come back through one Batcher
per connection, so many confirms cost one wake-up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import trio
from pamqp import commands

from starlight_py.amqp.confirms import ConfirmTracker
from starlight_py.amqp.connection import AMQPConnection
from starlight_py.amqp.errors import (
    AccessRefused,
    NotFound,
    NotImplementedMethod,
    PreconditionFailed,
)
from starlight_py.backend.message_codec import (
    IN_PRIORITY_BAND_KEY,
    REFUSED_BY_KEY,
    encode_properties,
    refused_by_value,
)
from starlight_py.backend.pulsar_client import ProducerHandle, PulsarBackend
from starlight_py.gateway.bridge import Batcher
from starlight_py.gateway.channel_session import ChannelSession
from starlight_py.gateway.topology_methods import VhostContext
from starlight_py.metadata.cache import TopologyCache
from starlight_py.model import naming
from starlight_py.model.dead_letters import expiration_problem
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.permissions import Access
from starlight_py.model.priorities import band_of, max_priority_of
from starlight_py.model.queue_limits import REJECT_PUBLISH_DLX, LengthLimit
from starlight_py.model.routing import route_with_alternates
from starlight_py.model.topology import Exchange, message_delay_ms
from starlight_py.ops.metrics import ProxyMetrics
from starlight_py.topology.service import TopologyService

log = logging.getLogger("starlight.publish")

QUEUE_FULL_BACKOFF = 0.002


class ProducerPool:
    """One producer per topic for the whole proxy process; a producer unused for
    `idle_timeout` seconds is closed by `close_idle_forever` (short-lived queues, such as RPC reply
    queues, would otherwise keep one producer each for good)."""

    def __init__(self, backend: PulsarBackend, idle_timeout: float = 60.0) -> None:
        self.backend = backend
        self.idle_timeout = idle_timeout
        self._producers: dict[str, ProducerHandle] = {}
        self._last_used: dict[str, float] = {}
        self._locks: dict[str, trio.Lock] = {}

    def __len__(self) -> int:
        return len(self._producers)

    async def get(self, topic: naming.TopicName) -> ProducerHandle:
        key = str(topic)
        producer = self._producers.get(key)
        if producer is not None:
            self._last_used[key] = trio.current_time()
            return producer
        lock = self._locks.setdefault(key, trio.Lock())
        try:
            async with lock:
                producer = self._producers.get(key)
                if producer is None:
                    producer = await trio.to_thread.run_sync(self.backend.create_producer, topic)
                    self._producers[key] = producer
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._locks.pop(key, None)
        self._last_used[key] = trio.current_time()
        return producer

    def take_idle(self) -> list[ProducerHandle]:
        """Trio thread: forget the producers unused for `idle_timeout` with no send in
        flight, and return them for closing. A publish that comes later makes a new one."""
        cutoff = trio.current_time() - self.idle_timeout
        taken = []
        for key, used in list(self._last_used.items()):
            producer = self._producers.get(key)
            if used < cutoff and producer is not None and producer.idle:
                del self._producers[key]
                del self._last_used[key]
                taken.append(producer)
        return taken

    async def close_idle_forever(self) -> None:
        """Every tenth of `idle_timeout` (at most 10 s), close the idle producers."""
        while True:
            await trio.sleep(min(10.0, self.idle_timeout / 10))
            idle = self.take_idle()
            if idle:
                log.debug("closing %d idle Pulsar producers", len(idle))
                for producer in idle:
                    await trio.to_thread.run_sync(producer.close)

    def flush_all(self) -> None:
        """Blocking: wait until every publish handed to Pulsar so far is written. An unbind
        records the topic's last message as the binding's end, so a message published
        before the unbind must be written before it (RabbitMQ routes it at publish)."""
        for producer in list(self._producers.values()):
            producer.flush()

    def close(self) -> None:
        for producer in self._producers.values():
            producer.close()
        self._producers.clear()
        self._last_used.clear()


def message_copies(
    namespace: NamespaceName,
    topic: naming.TopicName,
    target: Exchange,
    pulsar_properties: dict[str, str],
    routed: set[str],
    refusing: set[str],
    priorities: dict[str, int],
    priority: int | None,
) -> list[tuple[naming.TopicName, dict[str, str]]]:
    """Where a message routed by `target` is written: the exchange's `topic` (whose binding
    subscriptions skip it for the queues in `refusing`), and, for each of the `routed`
    queues that is a priority queue (`priorities`: queue -> x-max-priority), the topic of
    the message's priority band (docs/mapping.md#priority-queues).

    A message for the default exchange that only priority queues take is not written to the
    exchange's topic at all. For any other exchange it is, marked as skipped by those
    queues, because a binding made a moment ago may not be in this proxy's cache yet."""
    banded = {
        q: band_of(priority, priorities[q]) for q in sorted(routed - refusing) if q in priorities
    }
    copies = []
    if not banded or target.name != "" or routed - refusing - banded.keys():
        main = pulsar_properties
        if refusing or banded:
            main = dict(pulsar_properties)
            if refusing:
                main[REFUSED_BY_KEY] = refused_by_value(refusing)
            if banded:
                main[IN_PRIORITY_BAND_KEY] = refused_by_value(set(banded))
        copies.append((topic, main))
    for queue, band in banded.items():
        copies.append((naming.priority_band_topic(namespace, queue, band), pulsar_properties))
    return copies


class LengthChecks(Protocol):
    """Queue length limits on the publish path (gateway/queue_lengths.py, bound to one
    connection)."""

    async def refusing(
        self, limits: dict[str, LengthLimit], size: int
    ) -> set[str]: ...  # the queues that refuse the message

    def published(self, limits: dict[str, LengthLimit]) -> None: ...  # trim drop-head ones

    async def dead_letter_refused(
        self,
        queue: str,
        exchange: str,
        routing_key: str,
        properties: commands.Basic.Properties,
        body: bytes,
    ) -> None: ...  # for reject-publish-dlx queues


# (channel, confirm sequence or None, ok, error text)
SendResult = tuple[int, int | None, bool, str]


def joined(copies: int, done: Callable[[bool, str], None]) -> Callable[[bool, str], None]:
    """A send callback for each of the `copies` of one message that calls `done` once, after
    the last, with ok only when Pulsar stored every copy (the first error otherwise). One
    copy, the usual case, is `done` itself. Callbacks come from pulsar-client's threads."""
    if copies == 1:
        return done
    lock = threading.Lock()
    left, stored, first_error = copies, True, ""

    def each(ok: bool, error: str) -> None:
        nonlocal left, stored, first_error
        with lock:
            if not ok and stored:
                stored, first_error = False, error
            left -= 1
            if left:
                return
        done(stored, first_error)

    return each


class Publisher:
    """Publishing for one connection."""

    def __init__(
        self,
        conn: AMQPConnection,
        ctx: VhostContext,
        cache: TopologyCache,
        topology: TopologyService,
        producers: ProducerPool,
        kick: Callable[[], None],
        metrics: ProxyMetrics | None = None,
        lengths: LengthChecks | None = None,
    ) -> None:
        self.lengths = lengths
        self.conn = conn
        self.ctx = ctx
        self.cache = cache
        self.topology = topology
        self.producers = producers
        self.kick = kick
        self.metrics = metrics or ProxyMetrics()
        self.confirms: dict[int, ConfirmTracker] = {}
        self.blocked = False
        self.results: Batcher[SendResult] = Batcher(
            trio.lowlevel.current_trio_token(), self._on_results
        )

    def confirm_select(self, channel: int) -> None:
        self.confirms.setdefault(channel, ConfirmTracker())

    def channel_closed(self, channel: int) -> None:
        self.confirms.pop(channel, None)

    async def _exchange(self, name: str) -> Exchange:
        if name == "":
            return Exchange("", "direct")
        exchange = self.cache.exchange(self.ctx.vhost, name)
        if exchange is None:
            # Declared a moment ago (maybe on another proxy): ask ZooKeeper itself.
            found = await trio.to_thread.run_sync(self.topology.get_exchange, self.ctx.vhost, name)
            if found is None:
                raise NotFound(f"no exchange '{name}' in vhost '{self.ctx.vhost}'", (60, 40))
            exchange = found[0]
        return exchange

    async def admit(
        self, method: commands.Basic.Publish, properties: commands.Basic.Properties
    ) -> Exchange:
        """The checks a publish passes before it is routed (also at publish time in a
        transaction, which sends only at commit); returns the target exchange. Raises
        NotFound (no exchange), AccessRefused (no write permission on the exchange, or an
        internal exchange), PreconditionFailed (user_id of someone else, invalid expiration),
        NotImplementedMethod (immediate)."""
        if method.immediate:
            raise NotImplementedMethod("immediate=true", (60, 40))
        await self.ctx.access.check_exchange(Access.WRITE, method.exchange or "", (60, 40))
        user_id = properties.user_id
        if user_id is not None and user_id != self.ctx.user:
            raise PreconditionFailed(
                f"user_id property set to '{user_id}' but authenticated user was '{self.ctx.user}'",
                (60, 40),
            )
        exchange = await self._exchange(method.exchange or "")
        if exchange.internal:
            raise AccessRefused(
                f"cannot publish to internal exchange '{exchange.name}' in vhost "
                f"'{self.ctx.vhost}'",
                (60, 40),
            )
        expiration = properties.expiration
        problem = None if expiration is None else expiration_problem(expiration)
        if problem is not None:
            raise PreconditionFailed(f"invalid expiration '{expiration}': {problem}", (60, 40))
        return exchange

    async def _route(
        self, exchange: Exchange, routing_key: str, headers: dict[str, Any] | None
    ) -> tuple[Exchange, ...]:
        """The exchanges the message passes through, the last routing it (its alternate
        exchanges while one routes nothing); empty when unroutable. Asks ZooKeeper itself
        only when the cache, which may lag by milliseconds, finds no route."""
        vhost = self.ctx.vhost
        path = route_with_alternates(
            exchange,
            lambda name: self.cache.exchange(vhost, name),
            lambda x: self.cache.has_route(vhost, x, routing_key, headers),
        )
        if path:
            return path

        def from_zookeeper() -> tuple[Exchange, ...]:
            def exchange_named(name: str) -> Exchange | None:
                found = self.topology.get_exchange(vhost, name)
                return None if found is None else found[0]

            return route_with_alternates(
                exchange,
                exchange_named,
                lambda x: self.topology.has_route(vhost, x, routing_key, headers),
            )

        return await trio.to_thread.run_sync(from_zookeeper)

    async def publish(
        self,
        session: ChannelSession,
        method: commands.Basic.Publish,
        properties: commands.Basic.Properties,
        body: bytes,
        raw_properties: bytes = b"",
    ) -> None:
        """Raises what `admit` raises."""
        channel = session.number
        exchange = await self.admit(method, properties)
        routing_key = method.routing_key or ""
        headers: dict[str, Any] | None = properties.headers
        tracker = self.confirms.get(channel)
        seq = tracker.reserve() if tracker is not None else None
        path = await self._route(exchange, routing_key, headers)
        self.metrics.published(self.ctx.vhost, len(body))
        if not path:
            if method.mandatory:
                self.metrics.returned()
                method_return = commands.Basic.Return(312, "NO_ROUTE", exchange.name, routing_key)
                if raw_properties:
                    self.conn.send_content_raw(channel, method_return, raw_properties, body)
                else:
                    self.conn.send_content(channel, method_return, properties, body)
            if tracker is not None and seq is not None:
                for frame in tracker.complete(seq, True):
                    self.conn.send_method(channel, frame)
            return
        # The message goes to the topic of the exchange that routes it (maybe an alternate
        # exchange) but keeps the exchange it was published to, as on RabbitMQ.
        target = path[-1]
        topic = naming.exchange_topic(
            self.ctx.namespace, target.name, target.routing_type, routing_key
        )
        pulsar_properties = encode_properties(
            exchange.name, routing_key, properties, raw_properties or None
        )
        vhost = self.ctx.vhost
        limits = self.cache.length_limits(vhost)  # usually empty: one lookup
        priorities = self.cache.max_priorities(vhost)  # the same
        lagging = target.name == "" and self.cache.queue(vhost, routing_key) is None
        if lagging:
            # Declared a moment ago: the cache has not seen the queue yet, ZooKeeper has.
            priorities = await self._with_fresh_priority(routing_key, priorities)
        routed = (
            self.cache.routed_queues(vhost, target, routing_key, headers)
            if (limits and self.lengths is not None) or priorities
            else set()
        )
        if lagging and routing_key in priorities:
            routed.add(routing_key)
        refusing: set[str] = set()
        if limits and self.lengths is not None:
            limited = {q: limits[q] for q in routed if q in limits}
            refusing = await self.lengths.refusing(limited, len(body)) if limited else set()
            if refusing:
                # RabbitMQ's reject-publish: the publisher gets a nack, the queues with
                # room still get the message.
                self.metrics.refused()
                for queue in sorted(refusing):
                    if limited[queue].overflow == REJECT_PUBLISH_DLX:
                        await self.lengths.dead_letter_refused(
                            queue, exchange.name, routing_key, properties, body
                        )
                if refusing >= routed:
                    if tracker is not None and seq is not None:
                        for frame in tracker.complete(seq, False):
                            self.conn.send_method(channel, frame)
                    return
            if limited:
                self.lengths.published({q: x for q, x in limited.items() if q not in refusing})
        copies = message_copies(
            self.ctx.namespace,
            topic,
            target,
            pulsar_properties,
            routed,
            refusing,
            priorities,
            properties.priority,
        )
        delay_ms = message_delay_ms(headers) if any(x.delays_messages for x in path) else 0
        handed_over = time.monotonic()
        stored = joined(
            len(copies),
            lambda ok, error: self.results.put((channel, seq, ok and not refusing, error)),
        )

        def done(ok: bool, error: str) -> None:
            self.metrics.send_done(ok, time.monotonic() - handed_over)
            stored(ok, error)

        for copy_topic, copy_properties in copies:
            producer = await self.producers.get(copy_topic)
            await self._send(producer, body, copy_properties, done, delay_ms)

    async def _with_fresh_priority(self, queue: str, priorities: dict[str, int]) -> dict[str, int]:
        found = await trio.to_thread.run_sync(self.topology.get_queue, self.ctx.vhost, queue)
        max_priority = None if found is None else max_priority_of(found[0].arguments)
        return priorities if max_priority is None else {**priorities, queue: max_priority}

    async def _send(
        self,
        producer: ProducerHandle,
        body: bytes,
        pulsar_properties: dict[str, str],
        done: Callable[[bool, str], None],
        delay_ms: int,
    ) -> None:
        if producer.has_room() and producer.send_async(body, pulsar_properties, done, delay_ms):
            return
        # Pulsar is behind: stop reading this client until it catches up, and say so to
        # clients that understand connection.blocked.
        self._set_blocked(True)
        try:
            while not (
                producer.has_room() and producer.send_async(body, pulsar_properties, done, delay_ms)
            ):
                await trio.sleep(QUEUE_FULL_BACKOFF)
        finally:
            self._set_blocked(False)

    def _set_blocked(self, blocked: bool) -> None:
        if blocked == self.blocked:
            return
        self.blocked = blocked
        capabilities = self.conn.client_properties.get("capabilities")
        if not (isinstance(capabilities, dict) and capabilities.get("connection.blocked")):
            return
        if blocked:
            self.conn.send_method(0, commands.Connection.Blocked("Pulsar is applying backpressure"))
        else:
            self.conn.send_method(0, commands.Connection.Unblocked())
        self.kick()

    def _on_results(self, results: list[SendResult]) -> None:
        for channel, seq, ok, error in results:
            if not ok:
                log.warning("publish on channel %s failed in Pulsar: %s", channel, error)
            tracker = self.confirms.get(channel)
            if seq is None or tracker is None:
                continue
            for frame in tracker.complete(seq, ok):
                self.conn.send_method(channel, frame)
        self.kick()

    def close(self) -> None:
        self.results.close()
