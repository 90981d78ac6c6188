"""The Pulsar producers of one proxy process: one per topic, closed when idle."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdminError
from starlight_py.backend.pulsar_client import BackendError, ProducerHandle, PulsarBackend
from starlight_py.metadata.zookeeper import MetadataUnavailable
from starlight_py.model import naming
from starlight_py.topology.errors import TopologyConflict

log = logging.getLogger("starlight.publish")

# How long `release` waits for the topology cache to see a deletion just committed.
RELEASE_WAIT = 2.0

# Done before a topic's first producer is made; False: the topic takes nothing.
Before = Callable[[], Awaitable[bool]]


def _discarding(backend: PulsarBackend, topic: naming.TopicName) -> ProducerHandle:
    """A handle that takes messages and writes none (ProducerHandle.discard)."""
    handle = ProducerHandle.pending(backend.producer_capacity, topic, backend.batching)
    handle.discard()
    return handle


class ProducerPool:
    """One producer per topic for the whole proxy process; a producer unused for
    `idle_timeout` seconds is closed by `close_idle_forever` (short-lived queues, such as RPC reply
    queues, would otherwise keep one producer each for good).

    While `close_idle_forever` runs, a topic's first `get` does not wait for Pulsar to make
    the producer: it returns a pending handle (ProducerHandle.pending) at once and a task
    of the pool makes the producer. A connection publishing round robin over 1,000 new
    binding topics thus keeps publishing while 1,000 producers are made, instead of waiting
    for each in turn; what it sent to a topic is written, in order, once the topic's
    producer exists. If it cannot be made, what was sent to it fails: the publishing
    connections close with the reason (Publisher.on_backend_failure)."""

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
        self._nursery: trio.Nursery | None = None  # makes producers; None: `get` waits
        self._token: trio.lowlevel.TrioToken | None = None  # while close_idle_forever runs

    def __len__(self) -> int:
        return len(self._producers)

    def peek(self, topic: naming.TopicName) -> ProducerHandle | None:
        """The topic's producer if it exists (no I/O); marks it used."""
        producer = self._producers.get(str(topic))
        if producer is not None:
            producer.last_used = trio.current_time()
        return producer

    async def get(self, topic: naming.TopicName, before: Before | None = None) -> ProducerHandle:
        """The topic's producer. `before`: what must be done before anything is written to
        a topic that has no producer here yet (make a binding topic's subscription:
        gateway/publish/own_topics.py); when it answers False, the topic takes nothing and
        what is sent to the handle succeeds unwritten (ProducerHandle.discard)."""
        key = str(topic)
        producer = self._producers.get(key)
        if producer is not None:
            producer.last_used = trio.current_time()
            return producer
        if self._nursery is not None:
            producer = ProducerHandle.pending(
                self.backend.producer_capacity, topic, self.backend.batching
            )
            self._producers[key] = producer
            self._nursery.start_soon(self._make, key, producer, before)
            producer.last_used = trio.current_time()
            return producer
        lock = self._locks.setdefault(key, trio.Lock())
        try:
            async with lock:
                producer = self._producers.get(key)
                if producer is None:
                    if before is not None and not await before():
                        return _discarding(self.backend, topic)
                    producer = await trio.to_thread.run_sync(self.backend.create_producer, topic)
                    self._producers[key] = producer
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._locks.pop(key, None)
        producer.last_used = trio.current_time()
        return producer

    async def _make(self, key: str, pending: ProducerHandle, before: Before | None) -> None:
        """Make the producer of a pending handle (after `before`); if it cannot be made,
        what was sent to it fails (see the class docstring) and the next publish to the
        topic tries again."""
        assert pending.topic is not None
        try:
            if before is not None and not await before():
                if self._producers.get(key) is pending:
                    del self._producers[key]
                pending.discard()
                return
            # Abandoned on cancel: a shutdown does not wait for a Pulsar that does not answer
            # (the client's close ends what it made).
            made = await trio.to_thread.run_sync(
                self.backend.create_producer, pending.topic, abandon_on_cancel=True
            )
        except (
            BackendUnavailable,
            BackendError,
            PulsarAdminError,
            MetadataUnavailable,
            TopologyConflict,
        ) as e:
            log.warning("%s", e)
            if self._producers.get(key) is pending:
                del self._producers[key]
            pending.fail(str(e), e)
            return
        if pending.made:  # closed meanwhile (the pool, at shutdown)
            await trio.to_thread.run_sync(made.close)
            return
        pending.adopt(made)

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
        """Every tenth of `idle_timeout` (at most 10 s), close the idle producers; and,
        while this runs, make new producers without holding up their first publish."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._token = trio.lowlevel.current_trio_token()
            try:
                while True:
                    await trio.sleep(min(10.0, self.idle_timeout / 10))
                    idle = self.take_idle()
                    if idle:
                        log.debug("closing %d idle Pulsar producers", len(idle))
                        for producer in idle:
                            await trio.to_thread.run_sync(producer.close)
            finally:
                self._nursery = None
                self._token = None

    def release(self, topic: naming.TopicName) -> None:
        """Blocking, from a thread other than trio's: close this process's producer of
        `topic` now, once the topology cache sees the topic retired (at most
        RELEASE_WAIT seconds) and if no send is in flight, so that the topic can be
        deleted at once; otherwise `close_idle_forever` closes it later."""
        token = self._token
        if token is None or str(topic) not in self._producers:
            return
        try:
            producer = trio.from_thread.run(self._take_retired, topic, trio_token=token)
        except trio.RunFinishedError:
            return
        if producer is not None:
            producer.close()

    async def _take_retired(self, topic: naming.TopicName) -> ProducerHandle | None:
        # The deletion that retires the topic was committed a moment ago: its watch
        # event reaches the cache within milliseconds.
        with trio.move_on_after(RELEASE_WAIT):
            while not self.retired(topic):
                await trio.sleep(0.005)
        key = str(topic)
        producer = self._producers.get(key)
        if producer is None or not producer.idle or not self.retired(topic):
            return None
        del self._producers[key]
        producer.retired = True  # routes planned through it are planned again
        return producer

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
