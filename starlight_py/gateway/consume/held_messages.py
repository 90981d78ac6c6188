"""Deliveries unacked in this proxy, by queue, published to ZooKeeper for exact counts.

RabbitMQ's `message_count` counts the ready messages of a queue: those not delivered to a
consumer and waiting for an ack. Pulsar's subscription stats count as unacked everything it
dispatched to a Pulsar consumer, which includes what the proxy read ahead and has not
delivered (its receiver queues, a consumer's messages past its prefetch). So the counts
subtract, instead of Pulsar's unacked, the AMQP deliveries still unacked, which only the
proxies know: each channel's core keeps them by queue (`Channel.held`), and this task
writes, at most every `FLUSH_INTERVAL`, one ephemeral znode per queue and proxy with this
proxy's number (`<root>/v1/held/<vhost>/<queue>/<proxy id>`, outside the topology cache).
A count reads this proxy's numbers directly and the other proxies' from ZooKeeper
(QueueCounting.held_messages); a proxy that dies takes its znodes with it, as Pulsar
hands its deliveries back to the queue.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import trio

from starlight_py.core.held import HeldCounts
from starlight_py.metadata.ephemeral import EphemeralNodes
from starlight_py.metadata.records import Paths
from starlight_py.metadata.zookeeper import (
    MetadataUnavailable,
    NodeAlreadyExists,
    NodeMissing,
    ZooKeeperClient,
)

log = logging.getLogger("starlight.counts")

# s: the longest a count on another proxy lags behind a delivery (each write is a
# ZooKeeper round trip per changed queue; under load counts change all the time)
FLUSH_INTERVAL = 0.25
# s: how long a settled delivery may still count in Pulsar beyond pulsar-client's
# acknowledgement grouping time (pulsarAckGroupingTimeMillis): the broker's round trip
SETTLING_MARGIN = 0.1


def settling_time(ack_grouping_ms: int) -> float:
    """s: how long a delivery this proxy settled may still count in Pulsar's backlog."""
    return ack_grouping_ms / 1000 + SETTLING_MARGIN


DEFAULT_SETTLING = settling_time(100)


class HeldMessages:
    """This process's unacked deliveries by vhost and queue."""

    def __init__(
        self,
        zookeeper: ZooKeeperClient,
        paths: Paths,
        ephemerals: EphemeralNodes | None,
        settling: float | Callable[[], float] = DEFAULT_SETTLING,
    ) -> None:
        """`settling`: how long a settled delivery may still count in Pulsar
        (`settling_time`), or what tells it now (the grouping time of the consumers made
        next follows how many a process holds)."""
        self.zk = zookeeper
        self._settling = settling
        self.paths = paths
        self.ephemerals = ephemerals
        self.proxy_id = ephemerals.owner_id if ephemerals is not None else ""
        self._by_vhost: dict[str, HeldCounts] = {}
        self._written: dict[tuple[str, str], int] = {}

    @property
    def settling_time(self) -> float:
        settling = self._settling
        return settling() if callable(settling) else settling

    def of(self, vhost: str) -> HeldCounts:
        """The (live, shared) counts of a vhost's queues, for its channels' cores."""
        found = self._by_vhost.get(vhost)
        if found is None:
            found = self._by_vhost[vhost] = HeldCounts()
        return found

    def local(self, vhost: str, queue: str) -> int:
        """This process's unacked deliveries of the queue (any thread)."""
        held = self._by_vhost.get(vhost)
        return 0 if held is None else held.counts.get(queue, 0)

    def settling(self, vhost: str, queue: str) -> int:
        """Deliveries of the queue this process settled within the settling time (any
        thread)."""
        held = self._by_vhost.get(vhost)
        if held is None:
            return 0
        return held.settled_since(queue, time.monotonic() - self.settling_time)

    def changes(self) -> dict[tuple[str, str], int]:
        """What differs from ZooKeeper: the number to write (0: delete the znode)."""
        changed: dict[tuple[str, str], int] = {}
        for vhost, held in list(self._by_vhost.items()):
            for queue, count in list(held.counts.items()):
                if self._written.get((vhost, queue), 0) != count:
                    changed[(vhost, queue)] = count
        for key in self._written:
            if key not in changed and self.local(*key) == 0:
                changed[key] = 0
        return changed

    async def publish_forever(self) -> None:
        """Write the changes every FLUSH_INTERVAL; a ZooKeeper outage only delays them."""
        while True:
            await trio.sleep(FLUSH_INTERVAL)
            forget = time.monotonic() - self.settling_time
            for held in self._by_vhost.values():
                held.forget_settled(forget)
            changed = self.changes()
            if not changed:
                continue
            try:
                # Abandoned on cancel: a shutdown does not wait for an absent ZooKeeper.
                await trio.to_thread.run_sync(self.write, changed, abandon_on_cancel=True)
            except MetadataUnavailable as e:
                log.debug("unacked counts not written yet: %s", e)

    def write(self, changed: dict[tuple[str, str], int]) -> None:
        """Blocking. Raises MetadataUnavailable (what was written stays recorded)."""
        for (vhost, queue), count in changed.items():
            path = self.paths.held_by(vhost, queue, self.proxy_id)
            if count:
                self._set(path, str(count).encode())
                self._written[(vhost, queue)] = count
            else:
                with contextlib.suppress(NodeMissing):
                    self.zk.delete(path)
                if self.ephemerals is not None:
                    self.ephemerals.forget(path)
                self._written.pop((vhost, queue), None)

    def _set(self, path: str, data: bytes) -> None:
        try:
            self.zk.set(path, data)
        except NodeMissing:
            try:
                self.zk.create(path, data, ephemeral=True)
            except NodeMissing:
                self.zk.ensure_path(path.rsplit("/", 1)[0])
                self.zk.create(path, data, ephemeral=True)
            except NodeAlreadyExists:
                self.zk.set(path, data)
        if self.ephemerals is not None:
            self.ephemerals.remember(path, data)
