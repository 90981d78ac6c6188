"""Queue length limits (`x-max-length`, `x-max-length-bytes`, `x-overflow`) for one proxy.

A publish routed to a queue with a limit asks `QueueLengths` how deep the queue is: Pulsar's
subscription stats, read again when older than `STATS_MAX_AGE`, plus what this proxy
published to the queue since it read them. Before the stats are read, this proxy's producers
are flushed, so its own publishes are in them. `reject-publish` queues at their limit refuse
the message (the publisher's confirm is a nack); `drop-head` queues take it, and once they
look over their limit a trim task reads (through the connection's `Consumers`) the oldest
ready messages past the limit and dead-letters them with reason `maxlen`, or drops them.

How exact this is (other proxies' publishes are seen only through the stats; bytes are
Pulsar's stored sizes) is in docs/mapping.md. Everything here runs on the trio thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio
from pamqp import commands

from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdminError
from starlight_py.backend.pulsar_client import BackendError
from starlight_py.gateway.dead_lettering import DeadLetters
from starlight_py.gateway.publish.producer_pool import ProducerPool
from starlight_py.metadata.cache import TopologyCache
from starlight_py.metadata.zookeeper import MetadataUnavailable
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.queue_limits import DROP_HEAD, LengthLimit, QueueDepth
from starlight_py.topology.service import TopologyService

log = logging.getLogger("starlight.queue_length")

STATS_MAX_AGE = 0.25  # seconds: stats older than this are read again before a check
TRIM_WAIT = 2.0  # seconds a count or basic.get waits at most for a running trim

# Reads and drops (or dead-letters) up to N of the oldest ready messages of one binding
# subscription of a queue; returns how many it took. Provided by the connection's Consumers.
DropOldest = Callable[[str, naming.TopicName, str, int], Awaitable[int]]


@dataclass
class _Seen:
    depth: QueueDepth = field(default_factory=QueueDepth)
    read_at: float = float("-inf")
    added: QueueDepth = field(default_factory=QueueDepth)  # published here since the read
    subscriptions: dict[str, tuple[naming.TopicName, int]] = field(default_factory=dict)

    @property
    def estimate(self) -> QueueDepth:
        return self.depth.plus(self.added.messages, self.added.bytes)


class QueueLengths:
    """The depth of queues with a length limit, as this proxy sees it."""

    def __init__(
        self,
        topology: TopologyService,
        producers: ProducerPool,
        max_age: float = STATS_MAX_AGE,
    ) -> None:
        self.topology = topology
        self.producers = producers
        self.max_age = max_age
        self._seen: dict[tuple[str, str], _Seen] = {}
        self._locks: dict[tuple[str, str], trio.Lock] = {}
        self._trimming: set[tuple[str, str]] = set()
        self._trimmed: dict[tuple[str, str], trio.Event] = {}  # set when a trim ends
        self._again: set[tuple[str, str]] = set()  # published to while being trimmed

    async def refusing(
        self,
        vhost: str,
        namespace: NamespaceName,
        limits: dict[str, LengthLimit],
        size: int,
    ) -> set[str]:
        """The queues of `limits` (all routed by one publish of `size` body bytes) that
        refuse it; the others count it as published. Stats that cannot be read refuse
        nothing (a limit is not worth failing publishes for)."""
        refused: set[str] = set()
        for queue, limit in limits.items():
            seen = await self._fresh(vhost, namespace, queue, limit)
            if limit.refuses(seen.estimate, size):
                refused.add(queue)
            else:
                seen.added = seen.added.plus(1, size)
        return refused

    def over_limit(self, vhost: str, queue: str, limit: LengthLimit) -> bool:
        """Whether a drop-head queue looks over its limit after what was published here."""
        seen = self._seen.get((vhost, queue))
        return seen is not None and limit.excess(seen.estimate, _average(seen)) > 0

    async def _fresh(
        self, vhost: str, namespace: NamespaceName, queue: str, limit: LengthLimit
    ) -> _Seen:
        key = (vhost, queue)
        seen = self._seen.setdefault(key, _Seen())
        if time.monotonic() - seen.read_at <= self.max_age:
            return seen
        lock = self._locks.setdefault(key, trio.Lock())
        async with lock:
            if time.monotonic() - seen.read_at <= self.max_age:
                return seen
            await self._read(vhost, namespace, queue, limit, seen)
        return seen

    async def _read(
        self, vhost: str, namespace: NamespaceName, queue: str, limit: LengthLimit, seen: _Seen
    ) -> None:
        started = time.monotonic()
        before = seen.added
        try:
            # What this proxy sent must be stored before the stats can count it.
            await trio.to_thread.run_sync(self.producers.flush_all)
            depth, subscriptions = await trio.to_thread.run_sync(
                self.topology.counts.queue_depth,
                vhost,
                namespace,
                queue,
                limit.max_bytes is not None,
            )
        except (PulsarAdminError, BackendUnavailable, MetadataUnavailable) as e:
            log.warning("cannot read the depth of queue %r: %s", queue, e)
            seen.read_at = started
            return
        seen.depth, seen.subscriptions = depth, subscriptions
        # Publishes counted while the stats were read may be missing from them: keep those
        # (an overestimate lasts until the next read; an underestimate would miss a trim).
        seen.added = seen.added.plus(-before.messages, -before.bytes)
        seen.read_at = started

    def trim_soon(
        self,
        spawn: Callable[..., None],
        vhost: str,
        namespace: NamespaceName,
        queue: str,
        limit: LengthLimit,
        drop_oldest: DropOldest,
    ) -> None:
        """Start (unless one runs) a task that takes a drop-head queue back to its limit."""
        key = (vhost, queue)
        if key in self._trimming:
            self._again.add(key)
            return
        self._trimming.add(key)
        self._trimmed[key] = trio.Event()
        spawn(self._trim, vhost, namespace, queue, limit, drop_oldest)

    async def trimmed(self, vhost: str, queue: str) -> None:
        """Wait (at most TRIM_WAIT) until no trim of the queue runs on this proxy: RabbitMQ
        drops the head as it enqueues, so a count or a basic.get after a confirmed publish
        never sees what the publish pushed out."""
        done = self._trimmed.get((vhost, queue))
        if done is not None:
            with trio.move_on_after(TRIM_WAIT):
                await done.wait()

    async def _trim(
        self,
        vhost: str,
        namespace: NamespaceName,
        queue: str,
        limit: LengthLimit,
        drop_oldest: DropOldest,
    ) -> None:
        key = (vhost, queue)
        seen = self._seen.setdefault(key, _Seen())
        try:
            again = True
            while again:  # once more when publishes came while it trimmed
                self._again.discard(key)
                await self._read(vhost, namespace, queue, limit, seen)
                excess = limit.excess(seen.depth, _average(seen))
                dropped = 0
                # The fullest subscription first: with one binding per topic (the usual
                # case) that is the queue's oldest messages.
                ordered = sorted(seen.subscriptions.items(), key=lambda item: -item[1][1])
                for subscription, (topic, ready) in ordered:
                    if dropped >= excess:
                        break
                    wanted = min(ready, excess - dropped)
                    dropped += await drop_oldest(queue, topic, subscription, wanted)
                if dropped:
                    log.info(
                        "queue %r over its length limit: dropped %d message(s)", queue, dropped
                    )
                # Read again at the next publish: what was dropped is not in `added`.
                seen.read_at = float("-inf")
                again = key in self._again
        except (PulsarAdminError, BackendUnavailable, MetadataUnavailable) as e:
            log.warning("cannot trim queue %r to its length limit: %s", queue, e)
        finally:
            self._trimming.discard(key)
            self._again.discard(key)
            done = self._trimmed.pop(key, None)
            if done is not None:
                done.set()


class ConnectionLengthChecks:
    """`QueueLengths` for one connection's publishes (the LengthChecks of
    gateway/publish/publishing.py)."""

    def __init__(
        self,
        lengths: QueueLengths,
        vhost: str,
        namespace: NamespaceName,
        spawn: Callable[..., None],
        drop_oldest: DropOldest,
        cache: TopologyCache,
        dead_letters: DeadLetters,
    ) -> None:
        self.lengths = lengths
        self.vhost = vhost
        self.namespace = namespace
        self.spawn = spawn  # start a task in the connection's nursery
        self.drop_oldest = drop_oldest
        self.cache = cache
        self.dead_letters = dead_letters

    async def dead_letter_refused(
        self,
        queue: str,
        exchange: str,
        routing_key: str,
        properties: commands.Basic.Properties,
        body: bytes,
    ) -> None:
        """A reject-publish-dlx queue refused the message: dead-letter it (reason maxlen).
        A failure is logged: the publisher gets its nack anyway, as on RabbitMQ."""
        record = self.cache.queue(self.vhost, queue)
        if record is None:
            return
        try:
            await self.dead_letters.dead_letter_refused(
                record, exchange, routing_key, properties, body
            )
        except (BackendUnavailable, BackendError, MetadataUnavailable) as e:
            log.warning("could not dead-letter a message queue %r refused: %s", queue, e)

    async def refusing(self, limits: dict[str, LengthLimit], size: int) -> set[str]:
        return await self.lengths.refusing(self.vhost, self.namespace, limits, size)

    def published(self, limits: dict[str, LengthLimit]) -> None:
        for queue, limit in limits.items():
            if limit.overflow == DROP_HEAD and self.lengths.over_limit(self.vhost, queue, limit):
                self.lengths.trim_soon(
                    self.spawn, self.vhost, self.namespace, queue, limit, self.drop_oldest
                )


def _average(seen: _Seen) -> float:
    depth = seen.estimate
    return depth.bytes / depth.messages if depth.messages else 0.0
