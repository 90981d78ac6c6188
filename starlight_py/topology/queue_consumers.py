"""A queue's consumers as ZooKeeper records them for every proxy: their ephemeral
registrations (exclusive use, consumer counts, auto-delete), the line of an
`x-single-active-consumer` queue, an exclusive queue's owner and an `x-expires` queue's
last use (what the SubscriptionCleaner reads to judge a queue abandoned)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlight_py.amqp.errors import AccessRefused, NotFound
from starlight_py.amqp.method_ids import BASIC_CONSUME
from starlight_py.metadata.ephemeral import EphemeralNodes
from starlight_py.metadata.records import Paths
from starlight_py.metadata.zookeeper import NodeAlreadyExists, NodeMissing, ZooKeeperClient
from starlight_py.model import naming
from starlight_py.model.topology import Queue

__all__ = ["EXCLUSIVE_MARK", "QueueConsumers", "QueueState", "expires_after", "use_stamp"]

TOUCH_INTERVAL = 1.0  # seconds

EXCLUSIVE_MARK = "!x"
"""Ends the registered name of an exclusive consumer (basic.consume with exclusive)."""
_EXCLUSIVE_SEGMENT = naming.escape(EXCLUSIVE_MARK)


@dataclass(frozen=True)
class QueueState:
    """A queue's lifecycle state in ZooKeeper."""

    queue: Queue
    consumers: int  # registered AMQP consumers, on every proxy
    has_owner: bool  # an exclusive queue's owning connection is alive
    consumed: bool  # an auto-delete queue has had a consumer
    used_at: float | None  # x-expires queues: last declare/get/consumer change


def expires_after(queue: Queue) -> float | None:
    """The queue's `x-expires` in seconds, or None."""
    value = queue.arguments.get("x-expires")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value / 1000
    return None


def use_stamp() -> bytes:
    return json.dumps({"at": time.time()}).encode()


class QueueConsumers:
    """The consumer records of the queues in `paths` (synchronous: called from worker
    threads)."""

    def __init__(
        self,
        zookeeper: ZooKeeperClient,
        paths: Paths,
        ephemerals: EphemeralNodes,
        get_queue: Callable[[str, str], tuple[Queue, int] | None],
    ) -> None:
        self.zk = zookeeper
        self.paths = paths
        self.ephemerals = ephemerals
        self._get_queue = get_queue
        self._touched: dict[tuple[str, str], float] = {}

    def register_consumer(
        self, vhost: str, queue: Queue, consumer: str, exclusive: bool = False
    ) -> None:
        """Record an AMQP consumer of `queue` (ephemeral, so a dead proxy's consumers go
        away with its session); an exclusive consumer's name ends with EXCLUSIVE_MARK.
        Raises NotFound when the queue is gone, AccessRefused when the queue is in
        exclusive use, or `exclusive` and another consumer reads it (RabbitMQ's 403)."""
        path = self.paths.queue_consumer(vhost, queue.name, consumer)
        mine = path.rsplit("/", 1)[1]
        try:
            present = self.zk.children(self.paths.queue_consumers(vhost, queue.name))
        except NodeMissing:
            present = []
        others = [c for c in present if c != mine]
        if others and (exclusive or any(c.endswith(_EXCLUSIVE_SEGMENT) for c in others)):
            raise AccessRefused(
                f"queue '{queue.name}' in vhost '{vhost}' in exclusive use", BASIC_CONSUME
            )
        data = self.ephemerals.owner_id.encode()
        for _ in range(2):
            try:
                self.zk.create(path, data, ephemeral=True)
                break
            except NodeAlreadyExists:
                break
            except NodeMissing:
                # A queue made before consumers were recorded: add the directory.
                if self._get_queue(vhost, queue.name) is None:
                    raise NotFound(
                        f"no queue '{queue.name}' in vhost '{vhost}'", BASIC_CONSUME
                    ) from None
                with contextlib.suppress(NodeAlreadyExists):
                    self.zk.create(self.paths.queue_consumers(vhost, queue.name))
        self.ephemerals.remember(path, data)
        if queue.auto_delete:
            with contextlib.suppress(NodeAlreadyExists, NodeMissing):
                self.zk.create(self.paths.queue_consumed(vhost, queue.name))
        if expires_after(queue) is not None:
            self.touch_queue(vhost, queue.name)

    def stand_in_line(self, vhost: str, queue: str, consumer: str) -> str:
        """A consumer of an `x-single-active-consumer` queue takes its place in the line
        (after every consumer there, on any proxy); returns its place, for `first_in_line`
        and `leave_line`. Raises NotFound when the queue is gone."""
        base = self.paths.queue_single_active(vhost, queue)
        data = consumer.encode()
        try:
            path = self.zk.create_sequential(f"{base}/c-", data)
        except NodeMissing:
            if self._get_queue(vhost, queue) is None:
                raise NotFound(f"no queue '{queue}' in vhost '{vhost}'", BASIC_CONSUME) from None
            with contextlib.suppress(NodeAlreadyExists):
                self.zk.create(base)
            path = self.zk.create_sequential(f"{base}/c-", data)
        self.ephemerals.remember(path, data)
        return path.rsplit("/", 1)[1]

    def first_in_line(self, vhost: str, queue: str) -> str | None:
        """The place of the queue's active consumer (the first in line), if any."""
        line = sorted(self.zk.children(self.paths.queue_single_active(vhost, queue)))
        return line[0] if line else None

    def leave_line(self, vhost: str, queue: str, place: str) -> None:
        path = f"{self.paths.queue_single_active(vhost, queue)}/{place}"
        self.ephemerals.forget(path)
        with contextlib.suppress(NodeMissing):
            self.zk.delete(path)

    def touch_queue(self, vhost: str, name: str, throttle: bool = False) -> None:
        """Mark an x-expires queue used now (declare, get, consumers coming and going).
        With `throttle`, at most once a second per queue from this process (gets)."""
        key = (vhost, name)
        moment = time.monotonic()
        if throttle and moment - self._touched.get(key, -TOUCH_INTERVAL) < TOUCH_INTERVAL:
            return
        self._touched[key] = moment
        if len(self._touched) > 10_000:
            self._touched.clear()
        path = self.paths.queue_used(vhost, name)
        try:
            self.zk.set(path, use_stamp())
        except NodeMissing:
            with contextlib.suppress(NodeAlreadyExists, NodeMissing):
                self.zk.create(path, use_stamp())

    def queue_state(self, vhost: str, name: str) -> QueueState | None:
        """What the cluster needs to judge a queue abandoned; None when it is gone."""
        found = self._get_queue(vhost, name)
        if found is None:
            return None
        queue: Queue = found[0]
        base = self.paths.queue(vhost, name)
        children = set(self.zk.children(base))
        consumers = len(self.zk.children(f"{base}/consumers")) if "consumers" in children else 0
        used_at = self.zk.modified_at(f"{base}/used") if "used" in children else None
        return QueueState(
            queue,
            consumers=consumers,
            has_owner="owner" in children,
            consumed="consumed" in children,
            used_at=used_at,
        )

    def release_owner(self, vhost: str, name: str) -> None:
        """Stop holding an exclusive queue's ownership (its connection is gone)."""
        path = self.paths.queue_owner(vhost, name)
        self.ephemerals.forget(path)
        with contextlib.suppress(NodeMissing):
            self.zk.delete(path)
