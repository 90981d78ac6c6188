"""pulsar-client's threads hand over to trio without the GIL (gateway/bridge.py,
native/src/pulsar_flush.rs, native/src/pulsar_listen.rs): while the task runs, a flush's
callback and a listened consumer's batches come on the trio thread, each flush once and
each message once, in order; once the task ended, they come on other threads again (flush
callbacks on pulsar-client's, batches on the reader thread's)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pulsar
import pytest
import trio

from starlight_py.backend import listened, producer_flush
from starlight_py.backend.producer_flush import ProducerFlusher
from starlight_py.backend.pulsar_client import ConsumerHandle, PulsarBackend
from starlight_py.gateway.bridge import take_from_pulsar_threads
from starlight_py.local import ServiceEndpoints
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import TopicName
from tests.support.amqp_fixtures import unique

ROUNDS = 3
PER_ROUND = 100
MESSAGES = 2000

pytestmark = pytest.mark.skipif(
    producer_flush.compiled_flush() is None or listened.available() is not None,
    reason="the hand-over goes through the compiled module only when it is built",
)


@pytest.fixture
def backend(services: ServiceEndpoints) -> Iterator[PulsarBackend]:
    made = PulsarBackend(services.pulsar_service_url, batching=True)
    yield made
    made.close()


def _topic(kind: str) -> str:
    return f"persistent://public/default/{unique(kind, 'topic')}"


def test_flush_outcomes_come_to_the_trio_thread_while_the_task_runs(
    pulsar_client: pulsar.Client,
) -> None:
    topic = _topic("handover-flush")
    producer = pulsar_client.create_producer(
        topic, batching_enabled=True, batching_max_publish_delay_ms=10_000
    )
    flusher = ProducerFlusher(producer._producer)
    outcomes: list[tuple[int, int, int]] = []  # (round, result, thread)

    async def scenario() -> tuple[int, int]:
        trio_thread = threading.get_ident()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(take_from_pulsar_threads)
            await trio.sleep(0.05)  # the task attached its eventfd
            # A second task in the same process leaves the queues to the first one.
            with trio.fail_after(1):
                await take_from_pulsar_threads()
            for number in range(ROUNDS):
                for index in range(PER_ROUND):
                    producer.send_async(b"%d-%d" % (number, index), None)
                flusher.flush(
                    lambda result, number=number: outcomes.append(
                        (number, result, threading.get_ident())
                    )
                )
            with trio.fail_after(10):
                while len(outcomes) < ROUNDS:
                    await trio.sleep(0.01)
            await trio.sleep(0.2)  # nothing more comes
            nursery.cancel_scope.cancel()
        return trio_thread, len(outcomes)

    trio_thread, counted = trio.run(scenario)
    assert counted == ROUNDS  # one outcome per flush, none twice
    assert sorted(outcomes) == [(number, 0, trio_thread) for number in range(ROUNDS)]

    # The task ended: the next flush's callback comes on a thread of pulsar-client's.
    after = threading.Event()
    seen: list[tuple[int, int]] = []
    producer.send_async(b"last", None)
    flusher.flush(lambda result: (seen.append((result, threading.get_ident())), after.set()))
    assert after.wait(10)
    assert seen[0][0] == 0
    assert seen[0][1] != threading.get_ident()

    reader = pulsar_client.create_reader(topic, pulsar.MessageId.earliest)
    read = [reader.read_next(5000).data() for _ in range(ROUNDS * PER_ROUND + 1)]
    reader.close()
    producer.close()
    expected = [b"%d-%d" % (n, i) for n in range(ROUNDS) for i in range(PER_ROUND)]
    assert read == [*expected, b"last"]


def test_listened_batches_come_to_the_trio_thread_while_the_task_runs(
    backend: PulsarBackend, pulsar_client: pulsar.Client
) -> None:
    topic = TopicName(NamespaceName("public", "default"), unique("handover-listen", "topic"))
    lock = threading.Lock()
    got: list[tuple[int, bytes]] = []  # (thread, body)

    def deliver(handle: ConsumerHandle, batch: list[object]) -> None:
        with lock:
            got.extend((threading.get_ident(), m.body) for m in batch)  # type: ignore[attr-defined]
        handle.acknowledge_all(batch)  # type: ignore[arg-type]

    producer = pulsar_client.create_producer(
        str(topic),
        batching_enabled=True,
        batching_max_publish_delay_ms=5,
        max_pending_messages=MESSAGES,  # none refused for a full queue
    )

    async def scenario() -> tuple[int, ConsumerHandle]:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(take_from_pulsar_threads)
            await trio.sleep(0.05)
            handle = backend.subscribe(topic, "s", "c", 1000, deliver)
            for number in range(MESSAGES):
                producer.send_async(b"%d" % number, None)
            producer.flush()
            with trio.fail_after(20):
                while len(got) < MESSAGES:
                    await trio.sleep(0.01)
            await trio.sleep(0.2)  # nothing more comes
            nursery.cancel_scope.cancel()
        return threading.get_ident(), handle

    trio_thread, handle = trio.run(scenario)
    assert [body for _, body in got] == [b"%d" % n for n in range(MESSAGES)]  # once each
    assert {thread for thread, _ in got} == {trio_thread}

    # The task ended: a reader thread takes the consumer's messages again.
    producer.send(b"after")
    deadline = time.monotonic() + 20
    while len(got) == MESSAGES and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [body for _, body in got[MESSAGES:]] == [b"after"]
    assert got[-1][0] not in (trio_thread, threading.get_ident())
    handle.close()
    producer.close()
