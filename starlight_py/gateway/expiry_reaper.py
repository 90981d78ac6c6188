"""The expiry reaper: expired messages of queues nobody consumes leave on time.

RabbitMQ expires messages at the head of a queue as their TTL passes, with or without a
consumer; the retry pattern "a wait queue with a TTL and a dead-letter exchange, and no
consumer" depends on it. Deliveries and gets expire what they read (gateway/consume/consuming.py,
getting.py); this task covers the queues nobody reads.

What it watches:

- On the SubscriptionCleaner's leader: every queue with an `x-message-ttl` or a dead-letter
  exchange (the queues whose messages can expire on their own or go somewhere when they do).
- On every proxy: the queues this proxy just published a message with an `expiration` to
  (`hint`), so that a per-message TTL is met without polling every queue.

For a watched queue without AMQP consumers it peeks at the head of each of the queue's
subscriptions (Pulsar's admin API, nothing is taken) and works out when that message
expires. When the time comes it reads the queue's oldest messages while they are expired and
dead-letters (reason `expired`) or drops them (Getters.expire_oldest), then peeks again. An
empty queue with a TTL is looked at again one TTL later (nothing published after the look
can expire sooner); a queue whose head does not expire is looked at again after
`IDLE_POLL` on the leader, and forgotten by a proxy that only had a hint.

Queues with consumers are left to them: their deliveries expire what they read.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from starlight_py.backend.message_codec import EXPIRATION_KEY
from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdminError
from starlight_py.backend.pulsar_client import BackendError, PulsarBackend
from starlight_py.core.held import HeldCounts
from starlight_py.gateway.consume.consuming import Consumers
from starlight_py.gateway.consume.requeued import RequeuedPositions
from starlight_py.gateway.dead_lettering import DeadLetters
from starlight_py.gateway.publish.producer_pool import ProducerPool
from starlight_py.gateway.topology_methods import VhostContext
from starlight_py.metadata.cache import QueueChange, TopologyCache
from starlight_py.metadata.zookeeper import MetadataUnavailable
from starlight_py.model import naming
from starlight_py.model.dead_letters import (
    MessagePolicy,
    expires_at_ms,
    message_expiration_ms,
    next_expiry_look,
)
from starlight_py.model.namespaces import NamespaceName
from starlight_py.topology.service import TopologyService

log = logging.getLogger("starlight.expiry")

REFRESH = 0.5  # s: whether this proxy leads is asked again this often (and on a change)
# ... and this often when the candidates are watched (a change is heard at once; the look
# is a safety net, two ZooKeeper reads: idle proxies do not poll).
REFRESH_WATCHED = 10.0
# s: the topology is looked at for new queues at least this often; a change wakes the loop
# at once (TopologyCache.on_change), so this is a safety net, not a poll.
TICK = 5.0
IDLE_POLL = 1.0  # s: the leader looks again at a queue whose head does not expire
BUSY_POLL = 1.0  # s: a queue with consumers is looked at again after this long
MAX_WAIT = 60.0  # s: the longest a watched queue goes unseen (TTLs can be days)
RETRY = 2.0  # s: after Pulsar or ZooKeeper failed a look
PARALLEL = 8  # queues looked at at once


def _may_expire(arguments: dict[str, object]) -> bool:
    """A queue whose messages can expire on their own, or go somewhere when they do."""
    return "x-message-ttl" in arguments or "x-dead-letter-exchange" in arguments


@dataclass
class _Watch:
    vhost: str
    queue: str
    due: float  # trio clock: look at the queue then
    hinted: bool = False  # a local publish asked for it (kept after the lead is lost)
    busy: bool = False  # a look is running


class ExpiryReaper:
    """One per proxy process; `run` until cancelled."""

    def __init__(
        self,
        cache: TopologyCache,
        topology: TopologyService,
        backend: PulsarBackend,
        producers: ProducerPool,
        requeued: RequeuedPositions,
        proxy_id: str,
        # Blocking: whether this proxy leads the cleaners (None: cannot tell right now).
        leading: Callable[[], bool | None],
        now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        # A vhost's unacked deliveries, where messages dying here are held meanwhile.
        held_of: Callable[[str], HeldCounts | None] = lambda _vhost: None,
        # Blocking: call the given function (from any thread) whenever the candidates for
        # the lead change, so that a new leader takes over at once, not at its next poll.
        watch_lead: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self.cache = cache
        self.topology = topology
        self.backend = backend
        self.producers = producers
        self.requeued = requeued
        self.proxy_id = proxy_id
        self.leading = leading
        self.now_ms = now_ms
        self.held_of = held_of
        self.expired = 0  # messages that died here (metrics, tests)
        self._watches: dict[tuple[str, str], _Watch] = {}
        self._readers: dict[str, Consumers] = {}  # by vhost
        self._wakeup = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._limiter = trio.CapacityLimiter(PARALLEL)
        self._leading = False  # as of the last refresh
        self.watch_lead = watch_lead
        self._lead_changed = False  # the candidates changed since the lead was last asked
        # What changed in the topology since the watches were last made: every queue
        # (`_refresh_all`) or the queues in `_touched`.
        self._refresh_all = True
        self._touched: set[tuple[str, str]] = set()

    # ---- from publishers (trio thread) ---------------------------------------------------------

    def hint(self, vhost: str, queue: str, expires_at: int) -> None:
        """A message that expires at `expires_at` (ms since the epoch) was published to the
        queue through this proxy: look at the queue then."""
        at = trio.current_time() + max(0.0, (expires_at + 1 - self.now_ms()) / 1000)
        watch = self._watches.get((vhost, queue))
        if watch is None:
            self._watches[(vhost, queue)] = _Watch(vhost, queue, at, hinted=True)
        else:
            watch.hinted = True
            watch.due = min(watch.due, at)
        self._wakeup.set()

    # ---- the loop --------------------------------------------------------------------------------

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._hear_changes(trio.lowlevel.current_trio_token())
            if self.watch_lead is not None:
                nursery.start_soon(
                    self._watch_lead, self.watch_lead, trio.lowlevel.current_trio_token()
                )
            asked = float("-inf")  # when the lead was last asked for
            self._refresh_all = True
            while True:
                now = trio.current_time()
                refresh = REFRESH if self.watch_lead is None else REFRESH_WATCHED
                if now - asked >= refresh or self._lead_changed:
                    self._lead_changed = False
                    leading = await self._ask_lead()
                    if leading != self._leading:
                        self._refresh_all = True  # the queues to watch change with the lead
                    self._leading = leading
                    asked = now
                if self._refresh_all or self._touched:
                    self._refresh(now)
                for watch in list(self._watches.values()):
                    if not watch.busy and watch.due <= now:
                        watch.busy = True
                        # Here, not when the look starts: a hint that comes before then
                        # must lower it, not be overwritten.
                        watch.due = float("inf")
                        nursery.start_soon(self._look, watch)
                waiting = [w.due for w in self._watches.values() if not w.busy]
                # A queue declared meanwhile wakes the loop (`_hear_changes`).
                until = min([now + TICK, *waiting])
                self._wakeup = trio.Event()
                with trio.move_on_at(until):
                    await self._wakeup.wait()

    async def _watch_lead(
        self, watch: Callable[[Callable[[], None]], None], token: trio.lowlevel.TrioToken
    ) -> None:
        def changed() -> None:  # on kazoo's thread
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._candidates_changed)

        while True:
            try:
                await trio.to_thread.run_sync(watch, changed, abandon_on_cancel=True)
                return
            except MetadataUnavailable as e:
                log.debug("expiry: cannot watch the lead yet: %s", e)
                await trio.sleep(RETRY)

    def _hear_changes(self, token: trio.lowlevel.TrioToken) -> None:
        """Wake the loop when the topology changes (a queue with a TTL declared, a policy
        set), instead of looking at the cache every few tenths of a second. The changes
        are gathered on the watched tree's thread and handed over in one call while trio
        has not taken the earlier ones: a burst of changes (1,000 queues deleted) wakes
        trio once per round, not once per znode."""
        lock = threading.Lock()
        pending: set[tuple[str, str]] | None = set()
        scheduled = False

        def take() -> None:  # on trio's thread
            nonlocal pending, scheduled
            with lock:
                changes, pending, scheduled = pending, set(), False
            if changes is None:
                self._topology_changed(None)
            else:
                self._touched |= changes
                self._wakeup.set()

        def changed(touched: QueueChange) -> None:  # on the watched tree's thread
            nonlocal pending, scheduled
            with lock:
                if touched is None:
                    pending = None
                elif pending is not None:
                    pending.add(touched)
                if scheduled:
                    return
                scheduled = True
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(take)

        self.cache.on_change(changed)

    def _topology_changed(self, touched: QueueChange) -> None:
        if touched is None:
            self._refresh_all = True
        else:
            self._touched.add(touched)
        self._wakeup.set()

    def _candidates_changed(self) -> None:
        self._lead_changed = True
        self._wakeup.set()

    async def _ask_lead(self) -> bool:
        try:
            # Abandoned on cancel: a shutdown while ZooKeeper is away does not wait for it.
            leading = await trio.to_thread.run_sync(self.leading, abandon_on_cancel=True)
            return self._leading if leading is None else leading
        except MetadataUnavailable as e:
            log.debug("expiry: cannot tell who leads: %s", e)
            return self._leading

    def _refresh(self, now: float) -> None:
        """The leader watches every queue with a TTL or a dead-letter exchange; others keep
        only what they were hinted. Deleted queues are dropped. Only the queues touched
        since the last refresh are looked at, unless every queue may have changed (a
        policy, a vhost, the lead)."""
        if self._refresh_all:
            self._refresh_all = False
            self._touched = set()
            keys: set[tuple[str, str]] = set(self._watches)
            if self._leading:
                keys.update((vhost, queue.name) for vhost, queue in self.cache.queues())
        else:
            keys, self._touched = self._touched, set()
        for key in keys:
            watch = self._watches.get(key)
            if watch is not None and watch.busy:
                self._touched.add(key)  # looked at again once its look is over
                continue
            queue = self.cache.queue(*key)
            wanted = self._leading and queue is not None and _may_expire(queue.arguments)
            if watch is None:
                if wanted:
                    self._watches[key] = _Watch(key[0], key[1], now)
            elif queue is None or (not wanted and not watch.hinted):
                del self._watches[key]

    async def _look(self, watch: _Watch) -> None:
        # `due` is inf from when the look was scheduled: a hint meanwhile lowers it.
        try:
            async with self._limiter:
                wait = await self._look_at(watch.vhost, watch.queue)
        except (BackendUnavailable, BackendError, PulsarAdminError, MetadataUnavailable) as e:
            log.warning("expiry: queue %r in vhost %r: %s", watch.queue, watch.vhost, e)
            wait = RETRY
        except Exception:
            log.exception("expiry: queue %r in vhost %r", watch.queue, watch.vhost)
            wait = RETRY
        finally:
            watch.busy = False
        if wait is None:
            # No expiry in sight at the heads: the hint is served.
            if not self._leading and watch.due == float("inf"):
                self._watches.pop((watch.vhost, watch.queue), None)
                return
            watch.hinted = False
            wait = IDLE_POLL
        watch.due = min(watch.due, trio.current_time() + min(wait, MAX_WAIT))
        self._wakeup.set()

    async def _look_at(self, vhost: str, name: str) -> float | None:
        """Expire what is due at the heads of one queue; seconds until the next look (None:
        nothing expires at the heads now)."""
        queue = self.cache.queue(vhost, name)
        record = self.cache.vhost(vhost)
        if queue is None or record is None:
            return None
        consumers = await trio.to_thread.run_sync(
            self.topology.zk.children,
            self.topology.paths.queue_consumers(vhost, name),
            abandon_on_cancel=True,
        )
        if consumers:
            return BUSY_POLL
        policy = MessagePolicy.of(queue.arguments)
        heads: list[int | None] = []
        empty = True
        for binding_set in self.cache.made_sets_of_queue(vhost, name):
            topic = naming.TopicName(record.namespace, binding_set.subscription_topic)
            while True:
                head = await trio.to_thread.run_sync(
                    self.topology.admin.peek_head,
                    topic,
                    binding_set.subscription,
                    abandon_on_cancel=True,
                )
                if head is None:
                    break
                empty = False
                # A batch entry is seen whole: its soonest message decides when to look
                # (expire_oldest then takes only what is due at the head).
                expiries = [
                    expires_at_ms(
                        head.publish_time_ms,
                        policy.message_ttl_ms,
                        message_expiration_ms(properties.get(EXPIRATION_KEY)),
                    )
                    for properties in head.each_message_properties()
                ]
                known = [at for at in expiries if at is not None]
                expires = min(known) if known else None
                if expires is None or expires >= self.now_ms():
                    heads.append(expires)
                    break
                reader = self._reader(vhost, record.namespace)
                died = await reader.getters.expire_oldest(name, topic, binding_set.subscription)
                self.expired += died
                if died:
                    log.debug("expiry: %d messages of queue %r died", died, name)
                else:
                    # Not ours to expire (another binding's message, a consumer holds it):
                    # look again later rather than spin on it.
                    heads.append(self.now_ms() + int(IDLE_POLL * 1000))
                    break
        return next_expiry_look(self.now_ms(), heads, policy.message_ttl_ms, empty)

    def _reader(self, vhost: str, namespace: NamespaceName) -> Consumers:
        """A connection-less Consumers for the vhost: its getters read and its DeadLetters
        republish, as a client connection's do."""
        reader = self._readers.get(vhost)
        if reader is None:
            assert self._nursery is not None
            ctx = VhostContext(vhost, namespace, f"{self.proxy_id}/expiry")
            dead_letters = DeadLetters(
                ctx,
                self.cache,
                self.topology,
                self.producers,
                self._nursery.start_soon,
                self.requeued.returns,
                self.now_ms,
                self.held_of(vhost),
            )
            reader = Consumers(
                ctx,
                self.cache,
                self.topology,
                self.backend,
                f"{self.proxy_id}/expiry",
                lambda: None,
                self._nursery.start_soon,
                self.requeued,
                dead_letters,
                lambda _session, _tag: None,
            )
            self._readers[vhost] = reader
        return reader
