"""pulsar-client calls through its C API, compiled.

Untracked sends (starlight_py/backend/producer_send.py, native/src/pulsar_send.rs): what
reaches Pulsar is what was sent, in the order it was sent, whichever path each message took
(compiled, or the binding when the C API cannot carry its properties, or a tracked send with
a callback), and nothing is left behind by the pool's blocking flush. Acknowledgements
(backend/consumer_ack.py, native/src/pulsar_ack.rs) settle exactly the messages
acknowledged."""

from __future__ import annotations

import threading
import time

import pulsar

from starlight_py.backend import consumer_ack, producer_send
from starlight_py.backend.producer_flush import ProducerFlusher
from starlight_py.backend.pulsar_client import ProducerHandle
from tests.support.amqp_fixtures import unique

PROPERTIES = {
    "amqp.exchange": "",
    "amqp.routing_key": "q",
    "amqp.properties": "kAABAQ==",
    "x-header.naïve": "façade ✓",
}


def _topic() -> str:
    return f"persistent://public/default/{unique('native-send', 'topic')}"


def _producer(pulsar_client: pulsar.Client, topic: str) -> ProducerHandle:
    producer = pulsar_client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_publish_delay_ms=10_000,  # only flushes send
        block_if_queue_full=False,
        max_pending_messages=10_000,
    )
    return ProducerHandle(producer, 10_000, None, batching=True)


def _read_all(
    pulsar_client: pulsar.Client, topic: str, count: int
) -> list[tuple[bytes, dict[str, str]]]:
    reader = pulsar_client.create_reader(topic, pulsar.MessageId.earliest)
    try:
        seen = []
        for _ in range(count):
            message = reader.read_next(10_000)
            seen.append((message.data(), message.properties()))
        assert not reader.has_message_available()
        return seen
    finally:
        reader.close()


def test_this_installation_sends_through_the_compiled_path() -> None:
    """The other tests here would pass on the binding's path too: make sure they ran on
    the compiled one (CI installs the Rust module)."""
    assert producer_send.available() is None


def test_sends_on_every_path_arrive_byte_for_byte_in_the_order_they_were_sent(
    pulsar_client: pulsar.Client,
) -> None:
    topic = _topic()
    handle = _producer(pulsar_client, topic)
    expected: list[tuple[bytes, dict[str, str]]] = []
    outcomes: list[bool] = []
    done = threading.Event()

    def tracked(ok: bool, error: str) -> None:
        outcomes.append(ok)

    def flushed(covered: int, ok: bool, error: str) -> None:
        outcomes.append(ok)
        done.set()

    for number in range(300):
        body = b"\x00\xffbody %d" % number + b"x" * (number % 7) * 100
        if number % 50 == 7:
            properties = {"k": "with a NUL \x00 inside"}  # the binding sends it
        elif number % 50 == 9:
            properties = {}
        else:
            properties = {**PROPERTIES, "n": str(number)}
        if number % 40 == 13:
            handle.send_tracked(body, properties, tracked)
        else:
            handle.send(body, properties)
        expected.append((body, properties))
    handle.send(b"", {"empty": ""})
    expected.append((b"", {"empty": ""}))
    handle.flush(flushed)
    assert done.wait(10)
    assert _read_all(pulsar_client, topic, len(expected)) == expected
    handle.close()


def test_messages_waiting_in_the_compiled_sender_are_sent_by_a_blocking_flush(
    pulsar_client: pulsar.Client,
) -> None:
    topic = _topic()
    handle = _producer(pulsar_client, topic)
    for number in range(20):
        handle.send(b"%d" % number, {"n": str(number)})
    handle.flush_blocking()  # what the pool does before it closes a producer
    assert _read_all(pulsar_client, topic, 20) == [(b"%d" % n, {"n": str(n)}) for n in range(20)]
    handle.close()


class _Received:
    """What Acknowledger reads of a ReceivedMessage."""

    def __init__(self, raw: object) -> None:
        self.raw = raw


def test_compiled_acknowledgements_settle_exactly_the_messages_acknowledged(
    pulsar_client: pulsar.Client,
) -> None:
    """Batched messages, every tenth left unacknowledged: after the consumer closes, the
    subscription gives back those and nothing else (batch-index acknowledgements)."""
    topic = _topic()
    options = {
        "consumer_type": pulsar.ConsumerType.Shared,
        "batch_index_ack_enabled": True,
    }
    consumer = pulsar_client.subscribe(topic, "s", **options)
    acknowledger = consumer_ack.make_acknowledger(consumer._consumer)
    assert acknowledger is not None  # the compiled path is the one tested
    producer = pulsar_client.create_producer(
        topic, batching_enabled=True, batching_max_publish_delay_ms=5
    )
    total = 3000
    for number in range(total):
        producer.send_async(b"%d" % number, None)
        if number % 500 == 499:
            producer.flush()
    producer.flush()
    received = 0
    while received < total:
        batch = [_Received(consumer._consumer.receive(10_000)) for _ in range(100)]
        received += len(batch)
        acknowledger.acknowledge([m for m in batch if int(m.raw.data()) % 10 != 3])
    consumer.close()
    again = pulsar_client.subscribe(topic, "s", **options)
    left = []
    while True:
        try:
            message = again.receive(3000)
        except pulsar.Timeout:
            break
        left.append(int(message.data()))
        again.acknowledge(message)
    assert sorted(left) == [n for n in range(total) if n % 10 == 3]


def test_batches_handed_over_by_two_threads_keep_the_order_they_were_added_in(
    pulsar_client: pulsar.Client,
) -> None:
    """A worker thread's blocking flush (ProducerPool.flush_all) hands over what the sender
    kept while the trio thread goes on adding and handing over: the topic keeps the order of
    the adds."""
    topic = _topic()
    total = 20_000
    producer = pulsar_client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_publish_delay_ms=1,
        # A full queue makes a hand-over wait for room in the middle of its batch: the
        # other thread's batch would overtake it then.
        block_if_queue_full=True,
        max_pending_messages=200,
    )
    sender = producer_send.make_sender(ProducerFlusher(producer._producer).address)
    assert sender is not None
    stop = threading.Event()

    def hand_over() -> None:
        while not stop.is_set():
            sender.send_pending()

    worker = threading.Thread(target=hand_over)
    worker.start()
    try:
        for number in range(total):
            assert sender.add(b"%d" % number, {})
            if number % 500 == 0:
                sender.send_pending()
            elif number % 50 == 25:
                time.sleep(0)  # lets the worker take what was added so far
        sender.send_pending()
    finally:
        stop.set()
        worker.join()
    producer.flush()
    seen = [int(body) for body, _ in _read_all(pulsar_client, topic, total)]
    assert seen == list(range(total))
