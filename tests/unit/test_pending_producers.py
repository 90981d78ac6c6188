"""A topic's first publish does not wait for Pulsar to make its producer: the pool hands
out a pending handle, which keeps what is sent to it, in order, until the producer exists,
or fails it all if the producer cannot be made (backend/pulsar_client.py ProducerHandle,
gateway/publish/producer_pool.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import trio

from starlight_py.backend.pulsar_admin import BackendUnavailable
from starlight_py.backend.pulsar_client import ProducerHandle
from starlight_py.gateway.publish.producer_pool import ProducerPool
from starlight_py.gateway.publish.publishing import PublishOutcome
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from tests.unit.test_publish_plans import RawProducer, Setup, Wrapper, in_trio

TOPIC = naming.TopicName(NamespaceName("public", "default"), "orders")


def made_handle() -> tuple[ProducerHandle, RawProducer]:
    wrapper = Wrapper()
    return ProducerHandle(wrapper, 1000, TOPIC, flusher=wrapper._producer), wrapper._producer


def bodies(raw: RawProducer) -> list[bytes]:
    return [bytes(message.data()) for message in raw.sent]


def test_what_waits_is_sent_in_order_once_the_producer_is_made() -> None:
    pending = ProducerHandle.pending(1000, TOPIC, batching=False)
    flushes: list[tuple[int, bool, str]] = []
    tracked: list[tuple[bool, str]] = []
    pending.send(b"one", {})
    pending.send_tracked(b"two", {}, lambda ok, error: tracked.append((ok, error)))
    pending.send(b"three", {})
    pending.flush(lambda covered, ok, error: flushes.append((covered, ok, error)))
    assert not pending.made and pending.in_flight == 3 and not pending.idle
    assert flushes == [] and tracked == []

    made, raw = made_handle()
    pending.adopt(made)
    assert pending.made
    assert bodies(raw) == [b"one", b"two", b"three"]
    assert raw.tracked == [False, True, False]
    assert flushes == [(2, True, "")]  # the two untracked sends
    pending.flushed(2)
    pending.tracked_done()
    assert pending.in_flight == 0
    # From now on it is the producer itself.
    pending.send(b"four", {})
    assert bodies(raw)[-1] == b"four"


def test_a_producer_that_cannot_be_made_fails_what_waited_and_what_comes_later() -> None:
    pending = ProducerHandle.pending(1000, TOPIC, batching=False)
    flushes: list[tuple[int, bool, str]] = []
    tracked: list[tuple[bool, str]] = []
    pending.send(b"one", {})
    pending.send_tracked(b"two", {}, lambda ok, error: tracked.append((ok, error)))
    pending.flush(lambda covered, ok, error: flushes.append((covered, ok, error)))
    pending.fail("Pulsar is not reachable")
    assert tracked == [(False, "Pulsar is not reachable")]
    assert flushes == [(1, False, "Pulsar is not reachable")]
    pending.send(b"three", {})
    pending.flush(lambda covered, ok, error: flushes.append((covered, ok, error)))
    assert flushes[-1] == (1, False, "Pulsar is not reachable")
    pending.flushed(1)
    pending.flushed(1)
    pending.tracked_done()
    assert pending.in_flight == 0


def test_flush_blocking_waits_for_the_producer() -> None:
    pending = ProducerHandle.pending(1000, TOPIC, batching=False)
    done = threading.Event()

    def flush() -> None:
        pending.flush_blocking()
        done.set()

    threading.Thread(target=flush, daemon=True).start()
    assert not done.wait(0.2)
    pending.fail("closed")
    assert done.wait(10)


def test_closing_a_pending_handle_fails_what_waited() -> None:
    pending = ProducerHandle.pending(1000, TOPIC, batching=False)
    flushes: list[bool] = []
    pending.send(b"one", {})
    pending.flush(lambda covered, ok, error: flushes.append(ok))
    pending.close()
    assert flushes == [False] and pending.made


class SlowBackend:
    """Makes producers slowly (on the worker thread), or not at all."""

    batching = False
    producer_capacity = 1000

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.made: list[ProducerHandle] = []
        self.raw: list[RawProducer] = []

    def create_producer(self, topic: Any) -> ProducerHandle:
        time.sleep(0.2)
        if self.fail:
            raise BackendUnavailable("cannot create a producer: Pulsar is away")
        handle, raw = made_handle()
        self.made.append(handle)
        self.raw.append(raw)
        return handle


async def until_made(handle: ProducerHandle) -> None:
    """Wait (at most 10 s) until the pool made the handle's producer, or gave up on it."""
    with trio.fail_after(10):
        while not handle.made:
            await trio.sleep(0.01)


async def started(nursery: trio.Nursery, pool: ProducerPool) -> None:
    nursery.start_soon(pool.close_idle_forever)
    while pool._nursery is None:
        await trio.sleep(0)


def test_the_pool_answers_at_once_and_makes_the_producer_meanwhile() -> None:
    backend = SlowBackend()
    pool = ProducerPool(backend)  # type: ignore[arg-type]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await started(nursery, pool)
            handle = await pool.get(TOPIC)
            assert not handle.made  # it did not wait for Pulsar
            assert await pool.get(TOPIC) is handle  # one per topic
            assert pool.peek(TOPIC) is handle
            handle.send(b"early", {})
            await until_made(handle)
            assert bodies(backend.raw[0]) == [b"early"]
            assert len(backend.made) == 1
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_the_pool_forgets_a_producer_that_cannot_be_made() -> None:
    pool = ProducerPool(SlowBackend(fail=True))  # type: ignore[arg-type]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await started(nursery, pool)
            handle = await pool.get(TOPIC)
            outcomes: list[bool] = []
            handle.send(b"lost?", {})
            handle.flush(lambda covered, ok, error: outcomes.append(ok))
            await until_made(handle)
            assert outcomes == [False]  # nacked, not lost silently
            assert pool.peek(TOPIC) is None  # the next publish tries again
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_discarded_handle_succeeds_without_writing() -> None:
    """A binding topic whose binding went away before its first message was written:
    what was sent there is confirmed (it was routed when published) and goes nowhere."""
    pending = ProducerHandle.pending(1000, TOPIC, batching=False)
    flushes: list[tuple[int, bool, str]] = []
    tracked: list[tuple[bool, str]] = []
    pending.send(b"one", {})
    pending.send_tracked(b"two", {}, lambda ok, error: tracked.append((ok, error)))
    pending.flush(lambda covered, ok, error: flushes.append((covered, ok, error)))
    pending.discard()
    assert pending.made
    assert tracked == [(True, "")] and flushes == [(1, True, "")]
    pending.send(b"three", {})
    pending.flush(lambda covered, ok, error: flushes.append((covered, ok, error)))
    assert flushes[-1] == (1, True, "")


def test_the_pool_does_what_comes_before_a_topic_s_first_producer() -> None:
    backend = SlowBackend()
    pool = ProducerPool(backend)  # type: ignore[arg-type]
    asked: list[int] = []
    made_before: list[int] = []

    async def before() -> bool:
        asked.append(len(backend.made))
        await trio.sleep(0.1)
        made_before.append(len(backend.made))
        return True

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await started(nursery, pool)
            handle = await pool.get(TOPIC, before)
            assert not handle.made  # neither waited for
            assert await pool.get(TOPIC, before) is handle  # asked once per producer
            handle.send(b"after", {})
            await until_made(handle)
            assert asked == [0] and made_before == [0]  # before any producer was made
            assert bodies(backend.raw[0]) == [b"after"]
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_topic_that_takes_nothing_gets_no_producer() -> None:
    backend = SlowBackend()
    pool = ProducerPool(backend)  # type: ignore[arg-type]

    async def gone() -> bool:
        return False

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await started(nursery, pool)
            handle = await pool.get(TOPIC, gone)
            outcomes: list[bool] = []
            handle.send(b"to nobody", {})
            handle.flush(lambda covered, ok, error: outcomes.append(ok))
            await until_made(handle)
            assert outcomes == [True] and backend.made == []
            assert pool.peek(TOPIC) is None
            nursery.cancel_scope.cancel()
        # Without the pool's task the get waits, with the same outcome.
        waited = await ProducerPool(backend).get(TOPIC, gone)  # type: ignore[arg-type]
        assert waited.made and backend.made == []

    trio.run(main)


def test_what_comes_before_failing_fails_what_was_sent() -> None:
    pool = ProducerPool(SlowBackend())  # type: ignore[arg-type]

    async def unreachable() -> bool:
        raise BackendUnavailable("Pulsar is away")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await started(nursery, pool)
            handle = await pool.get(TOPIC, unreachable)
            outcomes: list[bool] = []
            handle.send(b"lost?", {})
            handle.flush(lambda covered, ok, error: outcomes.append(ok))
            await until_made(handle)
            assert outcomes == [False] and isinstance(handle.creation_error, BackendUnavailable)
            assert pool.peek(TOPIC) is None
            nursery.cancel_scope.cancel()

    trio.run(main)


class Recorded:
    """An OutcomeTarget that records what is settled."""

    def __init__(self) -> None:
        self.settled: list[tuple[int, bool]] = []

    def reserve_publish(self) -> int:
        return len(self.settled) + 1

    def settle_publishes(self, outcomes: list[tuple[int, bool]]) -> None:
        self.settled += outcomes


@in_trio
def test_a_producer_that_cannot_be_made_closes_the_publishing_connection(setup: Setup) -> None:
    """As when a publish waited for its producer: the connection closes with the reason
    (541, gateway/errors.py), its publishes are not nacked one by one; without the hook
    they are nacked."""
    publisher = setup[0]
    pending = ProducerHandle.pending(1000, TOPIC, batching=False)
    target = Recorded()
    outcome = PublishOutcome(target, 1, 1, False)
    publisher._send(pending, b"never stored", {}, outcome, 0)
    flushed: list[Any] = []
    publisher._flushed.put = flushed.append  # type: ignore[method-assign]
    publisher.flush()
    refused = BackendUnavailable("cannot create a producer: Pulsar refused the credentials")
    pending.fail(str(refused), refused)
    closed_with: list[Exception] = []
    publisher.on_backend_failure = closed_with.append
    publisher._on_flushed(list(flushed))
    assert closed_with == [refused] and target.settled == []
    assert pending.in_flight == 0

    # Without the hook (a publisher outside a connection): a nack.
    publisher.on_backend_failure = None
    again = PublishOutcome(target, 2, 1, False)
    publisher._send(pending, b"nacked", {}, again, 0)
    flushed.clear()
    publisher.flush()
    publisher._on_flushed(list(flushed))
    assert target.settled == [(2, False)]
