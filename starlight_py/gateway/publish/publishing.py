"""basic.publish: admit and route with the watched cache, send to Pulsar, report outcomes.

Hot path: a publish whose exchange, route and producer are all known (the cache, the
producer pool) is planned and sent without awaiting anything (`publish_now`); anything else
(a name the cache has not seen yet, an unroutable message, a queue length limit, a producer
to create or a full one) takes `publish`, which may ask ZooKeeper or Pulsar first.

Outcomes: sends carry no callback. At the end of each socket read the connection calls
`flush()`, which flushes every producer this connection sent to since the last flush; one
callback per producer reports the outcome of all of them (backend/pulsar_client.py), and
they reach the trio thread through one Batcher. Each publish's `PublishOutcome` then goes
to its target: the channel's confirms (core/channel.py), or a transaction's commit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import trio
from pamqp import commands

from starlight_py.amqp.connection import AMQPConnection
from starlight_py.amqp.errors import (
    NotFound,
    NotImplementedMethod,
)
from starlight_py.amqp.field_codec import unvalidated
from starlight_py.amqp.framing import encode_method
from starlight_py.amqp.hot_frames import Publish, content_frames
from starlight_py.amqp.method_ids import BASIC_PUBLISH
from starlight_py.backend.message_codec import (
    encode_properties,
)
from starlight_py.backend.pulsar_client import (
    TRACKED_SIZE,
    FlushCallback,
    ProducerHandle,
)
from starlight_py.config import MAX_UNCHUNKED_MESSAGE_SIZE
from starlight_py.gateway.bridge import Batcher
from starlight_py.gateway.publish.default_binding import has_default_binding
from starlight_py.gateway.publish.exchange_routing import (
    follows_bindings,
    route_through_bindings,
    written_copies,
)
from starlight_py.gateway.publish.message_copies import copy_targets, message_copies
from starlight_py.gateway.publish.own_topics import OwnTopics
from starlight_py.gateway.publish.pre_acks import PreAcks, StoredCallback
from starlight_py.gateway.publish.producer_pool import ProducerPool
from starlight_py.gateway.publish.publish_planning import SlowPlanner
from starlight_py.gateway.publish.route_plans import MAX_PLANS, RoutePlan
from starlight_py.gateway.topology_methods import VhostContext
from starlight_py.metadata.cache import TopologyCache
from starlight_py.model import naming
from starlight_py.model.dead_letters import message_expiration_ms
from starlight_py.model.permissions import Access, ResourceKind
from starlight_py.model.queue_limits import LengthLimit
from starlight_py.model.routing import route_with_alternates
from starlight_py.model.topology import Exchange, message_delay_ms
from starlight_py.ops.metrics import ProxyMetrics
from starlight_py.topology.service import TopologyService

log = logging.getLogger("starlight.publish")

QUEUE_FULL_BACKOFF = 0.002
DEFAULT_EXCHANGE = Exchange("", "direct")


class LengthChecks(Protocol):
    """Queue length limits on the publish path (gateway/publish/queue_lengths.py, bound to one
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


class OutcomeTarget(Protocol):
    """Where publish outcomes go: a channel's confirms (core.channel.Channel) or a commit."""

    def reserve_publish(self) -> int: ...  # the publish's number (0: nobody counts them)

    def settle_publishes(self, outcomes: list[tuple[int, bool]]) -> None: ...


class PublishOutcome:
    """The outcome of one publish, complete once each of its copies has one."""

    __slots__ = ("left", "ok", "refused", "seq", "target")

    def __init__(self, target: OutcomeTarget, seq: int, copies: int, refused: bool) -> None:
        self.target = target
        self.seq = seq
        self.left = copies
        self.ok = True
        self.refused = refused  # a queue refused it at its length limit: nack at the end


# (producer, untracked sends covered, their outcomes, ok, error, when the first was sent)
_Flushed = tuple[ProducerHandle, int, list[PublishOutcome], bool, str, float]
_Tracked = tuple[ProducerHandle, PublishOutcome | None, bool, str]


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
        expiring: Callable[[str, str, int], None] | None = None,
        pre_acks: PreAcks | None = None,
    ) -> None:
        """`expiring(vhost, queue, at_ms)`: told of each queue a message with an
        `expiration` is routed to (the expiry reaper looks at the queue then)."""
        self.lengths = lengths
        self.expiring = expiring
        self.pre_acks = pre_acks
        # Called with the error when a producer this connection sent to could not be made
        # (ProducerPool): the connection closes with it, its publishes unconfirmed, as when
        # the publish itself waited for the producer. None: they are nacked.
        self.on_backend_failure: Callable[[Exception], None] | None = None
        self.conn = conn
        self.ctx = ctx
        self.cache = cache
        self.topology = topology
        self.own_topics = OwnTopics(cache, topology, ctx)
        self.producers = producers
        self.kick = kick
        self.metrics = metrics or ProxyMetrics()
        self.blocked = False
        token = trio.lowlevel.current_trio_token()
        self._flushed: Batcher[_Flushed] = Batcher(token, self._on_flushed)
        self._tracked: Batcher[_Tracked] = Batcher(token, self._on_tracked)
        self._closed = False
        # Producers sent to since the last flush, with the outcomes waiting for it.
        # Sends since the producer's last flush: their outcomes, when the first was sent,
        # and how many may share a batch entry (None: no limit).
        self._unflushed: dict[ProducerHandle, tuple[list[PublishOutcome], float, int | None]] = {}
        self._count = 0  # published since the metrics were last updated
        self._bytes = 0
        self._plans: dict[tuple[str, str], RoutePlan] = {}
        self.planner = SlowPlanner(ctx, cache, topology, lengths, self.metrics, pre_acks, expiring)

    # ---- the hot path -----------------------------------------------------------------------

    def publish_now(
        self,
        target: OutcomeTarget,
        method: Publish,
        properties: commands.Basic.Properties,
        body: bytes,
        raw_properties: bytes,
    ) -> bool:
        """Publish without awaiting anything if everything it needs is at hand; False
        (nothing done) when it is not: then `publish` does it. Raises what `admit` raises."""
        if method.immediate or (
            len(body) > MAX_UNCHUNKED_MESSAGE_SIZE and self.producers.backend.batching
        ):
            return False  # a large message with batching on: `publish` sends it in order
        access = self.ctx.access
        if access.permissions is not None and not access.allows_now(
            Access.WRITE, ResourceKind.EXCHANGE, method.exchange
        ):
            return False
        plan = self._plans.get((method.exchange, method.routing_key))
        if plan is None or plan.version != self.cache.changes or plan.producer.retired:
            return self._publish_unplanned(target, method, properties, body, raw_properties)
        producer = plan.producer
        if not producer.has_room():
            return False
        if plan.internal or properties.user_id is not None or properties.expiration is not None:
            self.planner.check_message(plan.exchange, properties)
            self.planner.note_expiring(plan.exchange, method.routing_key, properties)
        pulsar_properties = plan.properties.get(raw_properties)
        if pulsar_properties is None:
            pulsar_properties = plan.properties_of(properties, raw_properties)
        outcome = PublishOutcome(target, target.reserve_publish(), 1, False)
        self._count += 1
        self._bytes += len(body)
        delay_ms = message_delay_ms(properties.headers) if plan.delays else 0
        self._send(producer, body, pulsar_properties, outcome, delay_ms, plan.pre_ack)
        return True

    def _publish_unplanned(
        self,
        target: OutcomeTarget,
        method: Publish,
        properties: commands.Basic.Properties,
        body: bytes,
        raw_properties: bytes,
    ) -> bool:
        """`publish_now` without a plan: everything is looked up in the cache, and a plan is
        kept for the next publish with the same exchange and routing key when one fits."""
        ctx = self.ctx
        vhost = ctx.vhost
        name = method.exchange
        cache = self.cache
        version = cache.changes
        exchange = DEFAULT_EXCHANGE if name == "" else cache.exchange(vhost, name)
        if exchange is None or follows_bindings(cache, vhost, exchange):
            return False  # exchange-to-exchange bindings: `publish` follows them
        self.planner.check_message(exchange, properties)
        routing_key = method.routing_key
        headers = properties.headers
        self.planner.note_expiring(exchange, routing_key, properties)
        if exchange.alternate_exchange is None:
            if not cache.has_route(vhost, exchange, routing_key, headers):
                return False
            path: tuple[Exchange, ...] = (exchange,)
        else:
            path = route_with_alternates(
                exchange,
                lambda other: cache.exchange(vhost, other),
                lambda x: cache.has_route(vhost, x, routing_key, headers),
            )
            if not path:
                return False
        target_exchange = path[-1]
        limits = cache.length_limits(vhost)
        priorities = cache.max_priorities(vhost)
        if target_exchange.name == "" and (
            routing_key in limits or cache.queue(vhost, routing_key) is None
        ):
            return False
        targets = copy_targets(
            cache,
            vhost,
            target_exchange,
            routing_key,
            headers,
            need_routed=bool(limits or priorities),
        )
        routed = targets.routed
        if routed & limits.keys():
            return False  # the limit needs the queue's depth
        topic = naming.exchange_topic(
            ctx.namespace, target_exchange.name, target_exchange.routing_type, routing_key
        )
        pulsar_properties = encode_properties(name, routing_key, properties, raw_properties)
        banded = bool(routed & priorities.keys())  # where it goes depends on its priority
        copies = message_copies(
            ctx.namespace,
            topic,
            target_exchange,
            pulsar_properties,
            routed,
            set(),
            priorities,
            properties.priority,
            targets.own_topics,
            targets.exchange_topic_read,
        )
        if not copies or (
            target_exchange.name == "" and not has_default_binding(cache, ctx, routing_key)
        ):
            # Routed per the cache, but to no topic it knows (ask ZooKeeper), or to a queue
            # whose default-exchange binding the first publish makes. (A binding topic not
            # made yet has no producer below, or one whose making comes first:
            # gateway/publish/own_topics.py.)
            return False
        producers = []
        for copy_topic, _ in copies:
            producer = self.producers.peek(copy_topic)
            if producer is None or not producer.has_room():
                return False
            producers.append(producer)
        delays = any(x.delays_messages for x in path)
        pre_ack = (
            None if banded else self.planner.pre_ack(target_exchange, routing_key, headers, topic)
        )
        if (
            not banded
            and len(copies) == 1
            and all(x.routing_type != "headers" for x in path)
            and (pre_ack is None or self.planner.pre_acks_settled())
        ):
            # Nothing of this route depends on the message itself: keep it, until the
            # topology changes or the producer closes. Not while pre-acks are asked for
            # only because the topology changed a moment ago: kept, the plan would send
            # every later message of the route tracked, in a batch entry of its own.
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            plan_pre_ack = pre_ack if copies[0][0] == topic else None
            self._plans[(name, routing_key)] = RoutePlan(
                version, producers[0], exchange, delays, name, routing_key, plan_pre_ack
            )
        outcome = PublishOutcome(target, target.reserve_publish(), len(copies), False)
        self._count += 1
        self._bytes += len(body)
        delay_ms = message_delay_ms(headers) if delays else 0
        for producer, (copy_topic, copy_properties) in zip(producers, copies, strict=True):
            stored = pre_ack if copy_topic == topic else None
            self._send(producer, body, copy_properties, outcome, delay_ms, stored)
        return True

    def _send(
        self,
        producer: ProducerHandle,
        body: bytes,
        pulsar_properties: dict[str, str],
        outcome: PublishOutcome,
        delay_ms: int,
        stored: StoredCallback | None = None,
    ) -> None:
        if delay_ms > 0 or len(body) >= TRACKED_SIZE or stored is not None:
            # Not batched (delayed), maybe too large for Pulsar, or its id is needed for
            # pre-acks: an outcome of its own.
            producer.send_tracked(
                body,
                pulsar_properties,
                lambda ok, error: self._tracked.put((producer, outcome, ok, error)),
                delay_ms,
                stored,
            )
            return
        producer.send(body, pulsar_properties)
        waiting = self._unflushed.get(producer)
        if waiting is None:
            outcomes = [outcome]
            # Asked once per batch: the read that fills it takes well under a millisecond.
            limit = self._batch_limit(producer) if producer.batching else None
            self._unflushed[producer] = (outcomes, time.monotonic(), limit)
        else:
            outcomes, _, limit = waiting
            outcomes.append(outcome)
        if limit is not None and len(outcomes) >= limit:
            # A queue without consumers reads the topic (one entry per message, as
            # unbatched), or the share of its consumers' prefetch is reached:
            # TopologyCache.batch_limit says why.
            outcomes, since, _ = self._unflushed.pop(producer)
            producer.flush(self._flush_callback(producer, outcomes, since))

    def _batch_limit(self, producer: ProducerHandle) -> int | None:
        topic = producer.topic
        return None if topic is None else self.cache.batch_limit(self.ctx.vhost, topic.local)

    # ---- everything else --------------------------------------------------------------------

    async def admit(self, method: Publish, properties: commands.Basic.Properties) -> Exchange:
        """The checks a publish passes before it is routed (also at publish time in a
        transaction, which sends only at commit); returns the target exchange. Raises
        NotFound (no exchange), AccessRefused (no write permission on the exchange, or an
        internal exchange), PreconditionFailed (user_id of someone else, invalid expiration),
        NotImplementedMethod (immediate)."""
        if method.immediate:
            raise NotImplementedMethod("immediate=true", BASIC_PUBLISH)
        await self.ctx.access.check_exchange(Access.WRITE, method.exchange, BASIC_PUBLISH)
        exchange = await self._exchange(method.exchange)
        self.planner.check_message(exchange, properties)
        return exchange

    async def _exchange(self, name: str) -> Exchange:
        if name == "":
            return DEFAULT_EXCHANGE
        exchange = self.cache.exchange(self.ctx.vhost, name)
        if exchange is None:
            # Declared a moment ago (maybe on another proxy): ask ZooKeeper itself.
            found = await trio.to_thread.run_sync(self.topology.get_exchange, self.ctx.vhost, name)
            if found is None:
                raise NotFound(f"no exchange '{name}' in vhost '{self.ctx.vhost}'", BASIC_PUBLISH)
            exchange = found[0]
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
        target: OutcomeTarget,
        method: Publish,
        properties: commands.Basic.Properties,
        body: bytes,
        raw_properties: bytes,
        channel: int,
    ) -> None:
        """The whole publish path, which may wait for ZooKeeper, Pulsar's stats or a
        producer. Raises what `admit` raises."""
        exchange = await self.admit(method, properties)
        routing_key = method.routing_key
        headers: dict[str, Any] | None = properties.headers
        self.planner.note_expiring(exchange, routing_key, properties)
        seq = target.reserve_publish()
        path: tuple[Exchange, ...] = ()
        if follows_bindings(self.cache, self.ctx.vhost, exchange):
            # Alternate exchanges are followed in the same walk, as on RabbitMQ.
            if await self._publish_through_bindings(
                exchange, seq, target, method, properties, body, raw_properties
            ):
                return
        else:
            path = await self._route(exchange, routing_key, headers)
        self._count += 1
        self._bytes += len(body)
        if not path:
            if method.mandatory:
                self.metrics.returned()
                method_return = unvalidated(
                    commands.Basic.Return,
                    reply_code=312,
                    reply_text="NO_ROUTE",
                    exchange=exchange.name,
                    routing_key=routing_key,
                )
                self.conn.write_channel(
                    channel,
                    encode_method(channel, method_return)
                    + content_frames(channel, raw_properties, body, self.conn.frame_max),
                )
            target.settle_publishes([(seq, True)])
            return
        plan = await self.planner.plan(path, method, properties, body, raw_properties)
        if plan is None:
            target.settle_publishes([(seq, False)])  # every routed queue refused it
            return
        if not plan.copies:
            target.settle_publishes([(seq, True)])  # its binding went away meanwhile
            return
        outcome = PublishOutcome(target, seq, len(plan.copies), plan.refused)
        for copy_topic, copy_properties in plan.copies:
            producer = await self.producers.get(copy_topic, self.own_topics.before(copy_topic))
            await self._wait_for_room(producer)
            stored = plan.pre_ack if copy_topic == plan.topic else None
            await self._send_in_order(
                producer, body, copy_properties, outcome, plan.delay_ms, stored
            )

    async def _publish_through_bindings(
        self,
        exchange: Exchange,
        seq: int,
        target: OutcomeTarget,
        method: Publish,
        properties: commands.Basic.Properties,
        body: bytes,
        raw_properties: bytes,
    ) -> bool:
        """Publish to an exchange with exchange-to-exchange bindings: one copy per reached
        exchange that serves a queue first (gateway/publish/exchange_routing.py). False (nothing
        done) when no queue is reached, through the bindings and the alternate exchanges
        of the walk: then the message is unroutable."""
        vhost = self.ctx.vhost
        routing_key, headers = method.routing_key, properties.headers
        route = await route_through_bindings(
            self.cache, self.topology, vhost, exchange, routing_key, headers
        )
        if route is None:
            return False
        self._count += 1
        self._bytes += len(body)
        limits = self.cache.length_limits(vhost)  # usually empty: one lookup
        refusing = await self.planner.refusing(limits, route.queues, method, properties, body)
        if refusing is None:
            target.settle_publishes([(seq, False)])  # every queue reached refused it
            return True
        expires_in = (
            None if properties.expiration is None else message_expiration_ms(properties.expiration)
        )
        if self.expiring is not None and expires_in is not None:
            at = int(time.time() * 1000) + expires_in
            for queue in sorted(route.queues):
                self.expiring(vhost, queue, at)
        pulsar_properties = encode_properties(
            method.exchange, routing_key, properties, raw_properties
        )
        written = written_copies(
            self.cache,
            self.ctx.namespace,
            vhost,
            route,
            routing_key,
            headers,
            pulsar_properties,
            self.pre_acks,
            self.cache.max_priorities(vhost),
            properties.priority,
            frozenset(refusing),
        )
        delay_ms = message_delay_ms(headers) if exchange.delays_messages else 0
        outcome = PublishOutcome(target, seq, len(written), bool(refusing))
        for copy_topic, copy_properties, stored in written:
            producer = await self.producers.get(copy_topic, self.own_topics.before(copy_topic))
            await self._wait_for_room(producer)
            await self._send_in_order(producer, body, copy_properties, outcome, delay_ms, stored)
        return True

    async def _send_in_order(
        self,
        producer: ProducerHandle,
        body: bytes,
        pulsar_properties: dict[str, str],
        outcome: PublishOutcome,
        delay_ms: int,
        stored: StoredCallback | None,
    ) -> None:
        """`_send`, except for a body a batching producer cannot send (over
        MAX_UNCHUNKED_MESSAGE_SIZE): that one goes, chunked, through the topic's second,
        unbatched producer, after what this connection sent before is stored and before
        anything it sends next (the connection's frames wait for this publish)."""
        if not (producer.batching and len(body) > MAX_UNCHUNKED_MESSAGE_SIZE):
            self._send(producer, body, pulsar_properties, outcome, delay_ms, stored)
            return
        await self._stored_so_far(producer)
        await self.producers.large(producer)
        token = trio.lowlevel.current_trio_token()
        sent = trio.Event()

        def done(ok: bool, error: str) -> None:
            self._tracked.put((producer, outcome, ok, error))
            token.run_sync_soon(sent.set)

        producer.send_large(body, pulsar_properties, done, delay_ms, stored)
        await sent.wait()

    async def _stored_so_far(self, producer: ProducerHandle) -> None:
        """Wait until every message sent through `producer` so far is stored (or failed)."""
        self.flush()
        token = trio.lowlevel.current_trio_token()
        flushed = trio.Event()
        covered_by_it = 0

        def done(covered: int, ok: bool, error: str) -> None:
            nonlocal covered_by_it
            covered_by_it = covered
            token.run_sync_soon(flushed.set)

        producer.flush(done)
        await flushed.wait()
        producer.flushed(covered_by_it)

    async def _wait_for_room(self, producer: ProducerHandle) -> None:
        if producer.has_room():
            return
        # Pulsar is behind: stop reading this client until it catches up, and say so to
        # clients that understand connection.blocked. What was sent is flushed, or no
        # outcome would ever make room.
        self.flush()
        self._set_blocked(True)
        try:
            while not producer.has_room():
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

    # ---- outcomes -----------------------------------------------------------------------------

    def flush(self) -> None:
        """End of a batch of publishes: flush every producer sent to, and publish the
        batch's metrics."""
        if self._count:
            self.metrics.published(self.ctx.vhost, self._count, self._bytes)
            self._count = self._bytes = 0
        if not self._unflushed:
            return
        unflushed, self._unflushed = self._unflushed, {}
        now = trio.current_time()
        for producer, (outcomes, since, _) in unflushed.items():
            producer.last_used = now
            producer.flush(self._flush_callback(producer, outcomes, since))

    def _flush_callback(
        self, producer: ProducerHandle, outcomes: list[PublishOutcome], since: float
    ) -> FlushCallback:
        put = self._flushed.put

        def done(covered: int, ok: bool, error: str) -> None:
            put((producer, covered, outcomes, ok, error, since))

        return done

    def _on_flushed(self, results: list[_Flushed]) -> None:
        if self._closed:
            # Nobody is left to confirm to, but the shared producer gets its room back.
            for producer, covered, *_ in results:
                producer.flushed(covered)
            return
        by_target: dict[OutcomeTarget, list[tuple[int, bool]]] = {}
        now = time.monotonic()
        for producer, covered, outcomes, ok, error, since in results:
            producer.flushed(covered)
            self.metrics.sends_done(ok, len(outcomes), now - since)
            if not ok and self._closes_for(producer):
                continue
            if not ok:
                log.warning("%d publish(es) failed in Pulsar: %s", len(outcomes), error)
            _settle(outcomes, ok, by_target)
        for target, settled in by_target.items():
            target.settle_publishes(settled)
        self.kick()

    def _on_tracked(self, results: list[_Tracked]) -> None:
        if self._closed:
            for producer, *_ in results:
                producer.tracked_done()
            return
        by_target: dict[OutcomeTarget, list[tuple[int, bool]]] = {}
        for producer, outcome, ok, error in results:
            producer.tracked_done()
            self.metrics.sends_done(ok, 1, 0.0)
            if not ok and self._closes_for(producer):
                continue
            if not ok:
                log.warning("a publish failed in Pulsar: %s", error)
            if outcome is not None:
                _settle((outcome,), ok, by_target)
        for target, settled in by_target.items():
            target.settle_publishes(settled)
        self.kick()

    def _closes_for(self, producer: ProducerHandle) -> bool:
        """Whether a failed send is the failure of its producer's making, for which the
        connection closes (`on_backend_failure`) instead of nacking."""
        cause = producer.creation_error
        if cause is None or self.on_backend_failure is None:
            return False
        self.on_backend_failure(cause)
        return True

    @property
    def unflushed(self) -> bool:
        return bool(self._unflushed)

    def close(self) -> None:
        """The connection is gone. Sends still in flight keep their room in the shared
        producers until Pulsar answers them (`_on_flushed`, `_on_tracked`): their outcomes
        only give it back from then on."""
        self._closed = True


def _settle(
    outcomes: Sequence[PublishOutcome],
    ok: bool,
    by_target: dict[OutcomeTarget, list[tuple[int, bool]]],
) -> None:
    """One answer from Pulsar for `outcomes` (sends of one producer, in order): each outcome
    whose last copy this was goes to its target's list in `by_target`. Runs once per
    message published: consecutive outcomes of one target share a lookup."""
    if not ok:
        for outcome in outcomes:
            outcome.ok = False
    settled: list[tuple[int, bool]] = []
    last: OutcomeTarget | None = None
    for outcome in outcomes:
        outcome.left -= 1
        if outcome.left:
            continue
        if outcome.target is not last:
            last = outcome.target
            settled = by_target.get(last) or by_target.setdefault(last, [])
        settled.append((outcome.seq, outcome.ok and not outcome.refused))
