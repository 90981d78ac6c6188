"""Where the slow publish path writes a message: the exchange's topic, priority bands,
what queue length limits refuse, and whether pre-acks need the stored message's id. The
parts of a publish that may wait (a fresh priority from ZooKeeper, a queue's depth) live here;
gateway/publish/publishing.py sends."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio
from pamqp import commands

from starlight_py.amqp.errors import AccessRefused, PreconditionFailed
from starlight_py.amqp.hot_frames import Publish
from starlight_py.amqp.method_ids import BASIC_PUBLISH
from starlight_py.backend.message_codec import encode_properties
from starlight_py.gateway.publish.default_binding import default_binding_ready
from starlight_py.gateway.publish.message_copies import (
    copy_targets,
    has_own_topics,
    message_copies,
    stored_copy_targets,
)
from starlight_py.gateway.publish.pre_acks import PreAcks, StoredCallback
from starlight_py.gateway.topology_methods import VhostContext
from starlight_py.metadata.cache import TopologyCache
from starlight_py.model import naming
from starlight_py.model.dead_letters import expiration_problem, message_expiration_ms
from starlight_py.model.priorities import max_priority_of
from starlight_py.model.queue_limits import REJECT_PUBLISH_DLX, LengthLimit
from starlight_py.model.topology import Exchange, message_delay_ms
from starlight_py.ops.metrics import ProxyMetrics
from starlight_py.topology.service import TopologyService


@dataclass(frozen=True, slots=True)
class Plan:
    """Where one admitted, routed publish goes."""

    copies: list[tuple[naming.TopicName, dict[str, str]]]
    delay_ms: int
    refused: bool
    topic: naming.TopicName | None = None  # the exchange's topic, of the copy to pre-ack
    pre_ack: StoredCallback | None = None


class SlowPlanner:
    """The slow path's decisions for one connection's publishes."""

    def __init__(
        self,
        ctx: VhostContext,
        cache: TopologyCache,
        topology: TopologyService,
        lengths: Any,
        metrics: ProxyMetrics,
        pre_acks: PreAcks | None,
        expiring: Callable[[str, str, int], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.cache = cache
        self.topology = topology
        self.lengths = lengths  # publishing.LengthChecks, or None
        self.metrics = metrics
        self.pre_acks = pre_acks
        self.expiring = expiring  # see Publisher

    def pre_ack(
        self,
        exchange: Exchange,
        routing_key: str,
        headers: dict[str, Any] | None,
        topic: naming.TopicName,
    ) -> StoredCallback | None:
        """The `stored` callback of a message some subscription on `topic` does not route
        (gateway/publish/pre_acks.py); None when every one routes it."""
        pre_acks = self.pre_acks
        if pre_acks is None or not pre_acks.wanted(self.ctx.vhost, exchange, routing_key, headers):
            return None
        return pre_acks.stored_callback(self.ctx.vhost, exchange.name, routing_key, headers, topic)

    def pre_acks_settled(self) -> bool:
        """Whether `pre_ack` now answers for as long as the topology stays as it is (not
        "every message, to be safe" in the seconds after a change: PreAcks.settled)."""
        return self.pre_acks is None or self.pre_acks.settled()

    async def plan(
        self,
        path: tuple[Exchange, ...],
        method: Publish,
        properties: commands.Basic.Properties,
        body: bytes,
        raw_properties: bytes,
    ) -> Plan | None:
        """Where a routed message is written; None when every queue it is routed to refuses
        it at its length limit."""
        # The message goes to the topic of the exchange that routes it (maybe an alternate
        # exchange) but keeps the exchange it was published to, as on RabbitMQ.
        target = path[-1]
        routing_key = method.routing_key
        headers = properties.headers
        topic = naming.exchange_topic(
            self.ctx.namespace, target.name, target.routing_type, routing_key
        )
        pulsar_properties = encode_properties(
            method.exchange, routing_key, properties, raw_properties
        )
        vhost = self.ctx.vhost
        limits = self.cache.length_limits(vhost)  # usually empty: one lookup
        priorities = self.cache.max_priorities(vhost)  # the same
        lagging = target.name == "" and self.cache.queue(vhost, routing_key) is None
        if lagging:
            # Declared a moment ago: the cache has not seen the queue yet, ZooKeeper has.
            priorities = await self._with_fresh_priority(routing_key, priorities)
        need_routed = bool((limits and self.lengths is not None) or priorities)
        targets = copy_targets(self.cache, vhost, target, routing_key, headers, need_routed)
        if has_own_topics(target) and not targets.routed:
            # Routed per ZooKeeper, not yet per the cache (a binding made a moment ago on
            # another proxy): the binding topics come from ZooKeeper too.
            targets = await trio.to_thread.run_sync(
                stored_copy_targets, self.topology, vhost, target, routing_key, headers
            )
        routed = set(targets.routed)  # empty unless needed, or the exchange has own topics
        if lagging and routing_key in priorities:
            routed.add(routing_key)
        refusing = await self.refusing(limits, routed, method, properties, body)
        if refusing is None:
            return None
        copies = message_copies(
            self.ctx.namespace,
            topic,
            target,
            pulsar_properties,
            routed,
            refusing,
            priorities,
            properties.priority,
            targets.own_topics,
            targets.exchange_topic_read,
        )
        if (
            target.name == ""
            and copies
            and not await default_binding_ready(self.cache, self.topology, self.ctx, routing_key)
        ):
            copies = []  # the queue went away meanwhile: unroutable
        delay_ms = message_delay_ms(headers) if any(x.delays_messages for x in path) else 0
        banded = bool(routed & priorities.keys())
        pre_ack = None if banded else self.pre_ack(target, routing_key, headers, topic)
        return Plan(copies, delay_ms, bool(refusing), topic, pre_ack)

    async def refusing(
        self,
        limits: dict[str, LengthLimit],
        routed: set[str],
        method: Publish,
        properties: commands.Basic.Properties,
        body: bytes,
    ) -> set[str] | None:
        """The `routed` queues that refuse the message at their length limit (dead-lettering
        it for reject-publish-dlx ones); None when every one does."""
        refusing: set[str] = set()
        if not limits or self.lengths is None:
            return refusing
        limited = {q: limits[q] for q in routed if q in limits}
        refusing = await self.lengths.refusing(limited, len(body)) if limited else set()
        if refusing:
            # RabbitMQ's reject-publish: the publisher gets a nack, the queues with room
            # still get the message.
            self.metrics.refused()
            for queue in sorted(refusing):
                if limited[queue].overflow == REJECT_PUBLISH_DLX:
                    await self.lengths.dead_letter_refused(
                        queue, method.exchange, method.routing_key, properties, body
                    )
            if refusing >= routed:
                return None
        if limited:
            self.lengths.published({q: x for q, x in limited.items() if q not in refusing})
        return refusing

    async def _with_fresh_priority(self, queue: str, priorities: dict[str, int]) -> dict[str, int]:
        found = await trio.to_thread.run_sync(self.topology.get_queue, self.ctx.vhost, queue)
        max_priority = None if found is None else max_priority_of(found[0].arguments)
        return priorities if max_priority is None else {**priorities, queue: max_priority}

    def check_message(self, exchange: Exchange, properties: commands.Basic.Properties) -> None:
        """Raises AccessRefused (internal exchange), PreconditionFailed (user_id of someone
        else, invalid expiration)."""
        user_id = properties.user_id
        if user_id is not None and user_id != self.ctx.user:
            raise PreconditionFailed(
                f"user_id property set to '{user_id}' but authenticated user was '{self.ctx.user}'",
                BASIC_PUBLISH,
            )
        if exchange.internal:
            raise AccessRefused(
                f"cannot publish to internal exchange '{exchange.name}' in vhost "
                f"'{self.ctx.vhost}'",
                BASIC_PUBLISH,
            )
        expiration = properties.expiration
        problem = None if expiration is None else expiration_problem(expiration)
        if problem is not None:
            raise PreconditionFailed(f"invalid expiration '{expiration}': {problem}", BASIC_PUBLISH)

    def note_expiring(
        self, exchange: Exchange, routing_key: str, properties: commands.Basic.Properties
    ) -> None:
        """Tell the expiry reaper where a message with an `expiration` goes, so that it
        expires on time in a queue nobody reads."""
        if self.expiring is None or properties.expiration is None:
            return
        expires_in = message_expiration_ms(properties.expiration)
        if expires_in is None:
            return
        at = int(time.time() * 1000) + expires_in
        vhost = self.ctx.vhost
        for queue in self.cache.routed_queues(vhost, exchange, routing_key, properties.headers):
            self.expiring(vhost, queue, at)
