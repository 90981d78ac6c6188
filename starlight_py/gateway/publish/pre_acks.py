"""Pre-acknowledgements: a message of a fanout, topic or headers exchange leaves the
subscriptions of the queues it was not routed to soon after it is stored.

Such an exchange has one topic, which the subscription of every bound queue reads
(docs/mapping.md); a queue's reader drops, when it reads them, the messages none of the
queue's bindings route. Until then Pulsar counts them in that queue's backlog, so a queue
nobody reads would report, and a purge would count, messages RabbitMQ never routed to it.

So when a publish goes to such a topic and some binding there does not route it, the
publishing proxy asks for its message id (a tracked send), and `PRE_ACK_DELAY` after Pulsar
stored it acknowledges it on the subscriptions that do not route it. It decides again at that
moment with the binding records the readers use (entries with their position windows, from
the topology cache), so a binding made on another proxy just before the publish, which this
proxy's cache may have shown a few milliseconds late, still gets the message. Acknowledging
goes through one consumer per subscription that never receives anything (no receiver queue);
they are closed when idle or when their binding set goes.

A pre-ack lost (the proxy stops in between, or Pulsar refuses it) leaves the message to the
queue's reader, which drops it as before: nothing here can take a message from a queue that
a binding routes it to.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from starlight_py.backend.pulsar_admin import BackendUnavailable
from starlight_py.backend.pulsar_client import AckOnlyConsumer, BackendError, PulsarBackend
from starlight_py.metadata.cache import TopologyCache
from starlight_py.model import naming
from starlight_py.model.positions import MessageIdRecord
from starlight_py.model.routing import any_binding_routes, binding_matches
from starlight_py.model.topology import Exchange

log = logging.getLogger("starlight.pre_ack")

PRE_ACK_DELAY = 0.5  # s after Pulsar stored a message (see the module docstring)
TICK = 0.1  # s: how often stored messages are looked at
IDLE_CLOSE = 60.0  # s: an acknowledging consumer unused this long is closed
RECENT_CHANGE = 2.0  # s: a topology change this recent may not be in the cache everywhere
SHARED_TOPIC_TYPES = ("fanout", "topic", "headers")

# ProducerHandle.send_tracked's `stored(position, message_id)`, called on a pulsar thread.
StoredCallback = Callable[[MessageIdRecord, Any], None]


@dataclass(frozen=True, slots=True)
class _Stored:
    vhost: str
    exchange: str
    routing_key: str
    headers: dict[str, Any] | None
    topic: naming.TopicName
    position: MessageIdRecord
    message_id: Any
    at: float  # time.monotonic() when stored
    # Queues that get the message from another copy (exchange-to-exchange bindings):
    # their subscriptions on this topic do not route this copy either.
    skipped: frozenset[str] = frozenset()


class PreAcks:
    """One per proxy process; `run` until cancelled."""

    def __init__(self, cache: TopologyCache, backend: PulsarBackend, proxy_id: str) -> None:
        self.cache = cache
        self.backend = backend
        self.consumer_name = f"{proxy_id}/get/ack"  # "/get/": not an AMQP consumer
        self.acked = 0  # messages acknowledged on subscriptions that do not route them
        # Appended by pulsar threads, taken by the trio thread (deque ends are thread-safe).
        self._stored: deque[_Stored] = deque()
        self._consumers: dict[tuple[str, str], AckOnlyConsumer] = {}
        self._opening: dict[tuple[str, str], list[Any]] = {}
        self._nursery: trio.Nursery | None = None
        self._seen_changes = -1
        # Nothing stored and no consumer open: the loop sleeps until a store wakes it
        # (`_wake_if_idle`, from a pulsar thread) instead of ticking.
        self._idle = False
        self._woken = trio.Event()
        self._token: trio.lowlevel.TrioToken | None = None

    def wanted(
        self, vhost: str, exchange: Exchange, routing_key: str, headers: dict[str, Any] | None
    ) -> bool:
        """Whether some subscription on the exchange's topic would not get this message:
        then its publish must learn the message id (`stored`)."""
        if exchange.routing_type not in SHARED_TOPIC_TYPES:
            return False
        if not self.cache.reads_exchange_topic(vhost, exchange.name):
            return False  # its bindings have topics of their own: nothing to pre-ack
        if not self.settled():
            # This proxy's cache may not show a binding made a moment ago elsewhere: decide
            # when the message is stored.
            return True
        for binding_set in self.cache.binding_sets_of_exchange(vhost, exchange.name):
            if binding_set.binding_topic:
                continue  # reads only what was routed to it
            if not any(
                binding_matches(
                    binding_set.exchange_type, e.routing_key, e.arguments, routing_key, headers
                )
                for e in binding_set.active_entries
            ):
                return True
        return False

    def settled(self) -> bool:
        """Whether `wanted` answers from the bindings, and so keeps its answer until the
        topology changes: no change in the last RECENT_CHANGE s."""
        return time.time() - self.cache.last_change >= RECENT_CHANGE

    def stored_callback(
        self,
        vhost: str,
        exchange: str,
        routing_key: str,
        headers: dict[str, Any] | None,
        topic: naming.TopicName,
        skipped: frozenset[str] = frozenset(),
    ) -> StoredCallback:
        """For ProducerHandle.send_tracked: records the stored message (pulsar thread).
        `skipped`: queues whose subscriptions on `topic` skip this copy."""
        append = self._stored.append
        wake_if_idle = self._wake_if_idle

        def stored(position: MessageIdRecord, message_id: Any) -> None:
            append(
                _Stored(
                    vhost,
                    exchange,
                    routing_key,
                    headers,
                    topic,
                    position,
                    message_id,
                    time.monotonic(),
                    skipped,
                )
            )
            wake_if_idle()

        return stored

    def _wake_if_idle(self) -> None:
        """After a store (any thread): the loop goes on if it was sleeping."""
        if self._idle and self._token is not None:
            self._idle = False
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._woken.set)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            idle_check = trio.current_time()
            self._token = trio.lowlevel.current_trio_token()
            while True:
                await self._sleep()
                cutoff = time.monotonic() - PRE_ACK_DELAY
                stored = self._stored
                while stored and stored[0].at <= cutoff:
                    self._pre_ack(stored.popleft())
                now = trio.current_time()
                if self.cache.changes != self._seen_changes or now - idle_check > IDLE_CLOSE:
                    self._seen_changes = self.cache.changes
                    idle_check = now
                    self._close_unused(now)

    async def _sleep(self) -> None:
        """TICK while anything is stored or open; else until a store comes."""
        if self._stored or self._consumers or self._opening:
            await trio.sleep(TICK)
            return
        self._woken = trio.Event()
        self._idle = True
        if self._stored:  # stored before the flag was up
            self._idle = False
            return
        await self._woken.wait()
        await trio.sleep(TICK)  # as before: a store is looked at a tick later

    def _pre_ack(self, item: _Stored) -> None:
        for binding_set in self.cache.binding_sets_of_exchange(item.vhost, item.exchange):
            if binding_set.subscription_topic != item.topic.local:
                continue
            if binding_set.queue not in item.skipped and any_binding_routes(
                binding_set.exchange_type,
                binding_set.entries,
                item.routing_key,
                item.headers,
                item.position,
            ):
                continue
            key = (str(item.topic), binding_set.subscription)
            consumer = self._consumers.get(key)
            if consumer is not None:
                consumer.last_used = trio.current_time()
                consumer.acknowledge_id(item.message_id)
                self.acked += 1
                continue
            waiting = self._opening.get(key)
            if waiting is not None:
                waiting.append(item.message_id)
                continue
            self._opening[key] = [item.message_id]
            assert self._nursery is not None
            self._nursery.start_soon(self._open, item.topic, binding_set.subscription)

    async def _open(self, topic: naming.TopicName, subscription: str) -> None:
        key = (str(topic), subscription)
        try:
            consumer = await trio.to_thread.run_sync(
                self.backend.ack_only_consumer, topic, subscription, self.consumer_name
            )
        except (BackendUnavailable, BackendError) as e:
            # The readers drop these messages instead, as without pre-acks.
            log.debug("cannot pre-acknowledge on %s: %s", subscription, e)
            self._opening.pop(key, None)
            return
        consumer.last_used = trio.current_time()
        self._consumers[key] = consumer
        for message_id in self._opening.pop(key, []):
            consumer.acknowledge_id(message_id)
            self.acked += 1

    def _close_unused(self, now: float) -> None:
        """Close the consumers of subscriptions that are no longer a binding set (a consumer
        left open would keep a retired subscription from being deleted), and idle ones."""
        active = {binding_set.subscription for _, binding_set in self.cache.all_binding_sets()}
        for key, consumer in list(self._consumers.items()):
            if key[1] not in active or now - consumer.last_used > IDLE_CLOSE:
                del self._consumers[key]
                assert self._nursery is not None
                self._nursery.start_soon(trio.to_thread.run_sync, consumer.close)

    def close(self) -> None:
        for consumer in self._consumers.values():
            consumer.close()
        self._consumers.clear()
