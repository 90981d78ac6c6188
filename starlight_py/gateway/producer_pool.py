"""The Pulsar producers of one proxy process: one per topic, closed when idle."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from starlight_py.backend.pulsar_client import ProducerHandle, PulsarBackend
from starlight_py.model import naming

log = logging.getLogger("starlight.publish")


class ProducerPool:
    """One producer per topic for the whole proxy process; a producer unused for
    `idle_timeout` seconds is closed by `close_idle_forever` (short-lived queues, such as RPC reply
    queues, would otherwise keep one producer each for good)."""

    def __init__(
        self,
        backend: PulsarBackend,
        idle_timeout: float = 60.0,
        retired: Callable[[naming.TopicName], bool] = lambda topic: False,
    ) -> None:
        """`retired(topic)`: whether nothing will be published to `topic` any more (the
        binding topic of an unbound binding): its producer is closed at the next look,
        idle or not, so that the topic can be deleted without the producer making it
        again."""
        self.backend = backend
        self.idle_timeout = idle_timeout
        self.retired = retired
        self._producers: dict[str, ProducerHandle] = {}
        self._locks: dict[str, trio.Lock] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def peek(self, topic: naming.TopicName) -> ProducerHandle | None:
        """The topic's producer if it exists (no I/O); marks it used."""
        producer = self._producers.get(str(topic))
        if producer is not None:
            producer.last_used = trio.current_time()
        return producer

    async def get(self, topic: naming.TopicName) -> ProducerHandle:
        key = str(topic)
        producer = self._producers.get(key)
        if producer is not None:
            producer.last_used = trio.current_time()
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
        producer.last_used = trio.current_time()
        return producer

    async def large(self, producer: ProducerHandle) -> ProducerHandle:
        """`producer` with its `large` producer (made on first use)."""
        if producer.large is None and producer.topic is not None:
            topic = producer.topic
            large = await trio.to_thread.run_sync(self.backend.create_large_producer, topic)
            if producer.large is None:
                producer.large = large
            else:  # another task made one meanwhile
                await trio.to_thread.run_sync(large.close)
        return producer

    def take_idle(self) -> list[ProducerHandle]:
        """Trio thread: forget the producers unused for `idle_timeout` with no send in
        flight, and return them for closing. A publish that comes later makes a new one."""
        cutoff = trio.current_time() - self.idle_timeout
        taken = []
        for key, producer in list(self._producers.items()):
            unused = producer.last_used < cutoff or (
                producer.topic is not None and self.retired(producer.topic)
            )
            if unused and producer.idle:
                del self._producers[key]
                producer.retired = True  # routes planned through it are planned again
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
            producer.flush_blocking()

    def close(self) -> None:
        for producer in self._producers.values():
            producer.retired = True
            producer.close()
        self._producers.clear()
