"""Consumers whose messages pulsar-client's listener thread hands over (backend/listened.py,
native/src/pulsar_listen.rs), against a real Pulsar: what arrives is what was sent, each
message once, to the consumer that received it; acknowledgements, negative ones and pauses
keep counts exact."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pulsar
import pytest

from starlight_py.amqp import compiled
from starlight_py.backend import listened
from starlight_py.backend import pulsar_client as pulsar_client_module
from starlight_py.backend.pulsar_client import ConsumerHandle, PulsarBackend
from starlight_py.local import ServiceEndpoints
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import TopicName
from tests.support.amqp_fixtures import unique

PROPERTIES = {
    "amqp.exchange": "",
    "amqp.routing_key": "q",
    "amqp.properties": "kAABAQ==",
    "x-header.naïve": "façade ✓",
}


class Received:
    """What a listened consumer handed over, by handle, as the reader thread saw it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches: list[tuple[ConsumerHandle, list[object]]] = []

    def __call__(self, handle: ConsumerHandle, batch: list[object]) -> None:
        with self.lock:
            self.batches.append((handle, batch))

    def messages(self, handle: ConsumerHandle | None = None) -> list[object]:
        with self.lock:
            return [m for h, b in self.batches for m in b if handle is None or h is handle]

    def wait_for(self, count: int, handle: ConsumerHandle | None = None) -> list[object]:
        deadline = time.monotonic() + 20
        while len(self.messages(handle)) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.messages(handle)


@pytest.fixture
def backend(services: ServiceEndpoints) -> Iterator[PulsarBackend]:
    made = PulsarBackend(services.pulsar_service_url, batching=True)
    yield made
    made.close()


def _topic() -> TopicName:
    return TopicName(NamespaceName("public", "default"), unique("listened", "topic"))


def _send(pulsar_client: pulsar.Client, topic: TopicName, bodies: list[bytes]) -> None:
    """Batched as the proxy batches: at most 100 messages an entry."""
    producer = pulsar_client.create_producer(
        str(topic),
        batching_enabled=True,
        batching_max_publish_delay_ms=5,
        batching_max_messages=100,
        max_pending_messages=10_000,
        block_if_queue_full=True,
    )
    failed: list[object] = []
    for body in bodies:
        producer.send_async(
            body,
            lambda result, _id: failed.append(result) if result != pulsar.Result.Ok else None,
            properties=PROPERTIES,
        )
    producer.flush()
    producer.close()
    assert failed == []


def _left_on(pulsar_client: pulsar.Client, topic: TopicName, subscription: str) -> list[bytes]:
    """What the subscription gives back to a new consumer (acknowledging it)."""
    consumer = pulsar_client.subscribe(
        str(topic),
        subscription,
        consumer_type=pulsar.ConsumerType.Shared,
        batch_index_ack_enabled=True,
    )
    left = []
    try:
        while True:
            try:
                message = consumer.receive(3000)
            except pulsar.Timeout:
                return left
            left.append(message.data())
            consumer.acknowledge(message)
    finally:
        consumer.close()


def test_this_installation_listens_through_the_compiled_path() -> None:
    """The other tests here would pass with reader threads too: make sure they ran on the
    listened path (CI installs the Rust module)."""
    assert listened.available() is None


def test_messages_arrive_byte_for_byte_once_each_with_their_positions(
    backend: PulsarBackend, pulsar_client: pulsar.Client
) -> None:
    topic = _topic()
    received = Received()
    handle = backend.subscribe(topic, "s", "c", 1000, received)
    bodies = [b"%d" % n for n in range(500)] + [b"", bytes(range(256)) * 40]
    _send(pulsar_client, topic, bodies)
    messages = received.wait_for(len(bodies))
    assert [m.body for m in messages] == bodies  # type: ignore[attr-defined]
    first = messages[0]
    assert type(first).__name__ == "ListenedMessage"
    assert first.properties == PROPERTIES  # type: ignore[attr-defined]
    assert first.redelivery_count == 0  # type: ignore[attr-defined]
    assert first.handle is handle  # type: ignore[attr-defined]
    assert first.raw is first  # type: ignore[attr-defined]
    assert first.topic_local == topic.local  # type: ignore[attr-defined]
    assert abs(first.publish_time_ms - time.time() * 1000) < 60_000  # type: ignore[attr-defined]
    # Positions are those a reader of the topic sees, and distinct.
    reader = pulsar_client.create_reader(str(topic), pulsar.MessageId.earliest)
    try:
        for message in messages[:50]:
            expected = reader.read_next(10_000).message_id()
            position = message.position  # type: ignore[attr-defined]
            assert (position.ledger_id, position.entry_id, position.batch_index) == (
                expected.ledger_id(),
                expected.entry_id(),
                expected.batch_index(),
            )
    finally:
        reader.close()
    assert len({m.position for m in messages}) == len(bodies)  # type: ignore[attr-defined]
    handle.acknowledge_all(messages)  # type: ignore[arg-type]
    handle.close()
    assert _left_on(pulsar_client, topic, "s") == []


def test_acknowledged_messages_are_settled_and_only_those(
    backend: PulsarBackend, pulsar_client: pulsar.Client
) -> None:
    """Batched messages, every tenth left unacknowledged (the others acknowledged as they
    arrive, a batch at a time): the subscription gives back those and nothing else once
    the consumer closes."""
    topic = _topic()
    received = Received()

    def acknowledge_most(handle: ConsumerHandle, batch: list[object]) -> None:
        # Acknowledge, then record: the test closes the consumer once all are recorded,
        # and an acknowledgement made after close is (rightly) lost to redelivery.
        handle.acknowledge_all([m for m in batch if int(m.body) % 10 != 3])  # type: ignore[attr-defined]
        received(handle, batch)

    handle = backend.subscribe(topic, "s", "c", 200, acknowledge_most)
    total = 3000
    _send(pulsar_client, topic, [b"%d" % n for n in range(total)])
    messages = received.wait_for(total)
    assert sorted(int(m.body) for m in messages) == list(range(total))  # type: ignore[attr-defined]
    handle.close()
    del messages
    left = _left_on(pulsar_client, topic, "s")
    assert sorted(int(x) for x in left) == [n for n in range(total) if n % 10 == 3]


def test_messages_settled_before_subscribe_returns_are_settled_once_it_does(
    backend: PulsarBackend, pulsar_client: pulsar.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer subscribing to a backlog (a binding topic made by its first message
    before the queue's consumers attach) is handed messages while its subscribe is still
    on its way; settling them then used to fail on the consumer not there yet. Every
    message is settled as it arrives, the first in the listener's thread: all are
    acknowledged but the negatively acknowledged one, which comes back once."""
    topic = _topic()
    backend.create_subscription(topic, "s")
    total = 500
    _send(pulsar_client, topic, [b"%d" % n for n in range(total)])
    received = Received()
    errors: list[BaseException] = []
    subscribed = threading.Event()
    early: list[int] = []  # batches handed over before subscribe returned

    def settle(handle: ConsumerHandle, batch: list[object]) -> None:
        try:
            if not subscribed.is_set():
                early.append(len(batch))
            for message in batch:
                if message.body == b"7" and message.redelivery_count == 0:  # type: ignore[attr-defined]
                    handle.negative_acknowledge(message)  # type: ignore[arg-type]
                else:
                    handle.acknowledge(message)  # type: ignore[arg-type]
        except BaseException as e:
            errors.append(e)
        received(handle, batch)

    # The subscribing thread slowed down after the broker answered (a loaded proxy): the
    # backlog is handed over meanwhile.
    address_of = pulsar_client_module.checked_consumer_address

    def slowly(raw: object) -> int:
        time.sleep(1.0)
        return address_of(raw)

    monkeypatch.setattr(pulsar_client_module, "checked_consumer_address", slowly)
    handle = backend.subscribe(topic, "s", "c", 1000, settle)
    subscribed.set()
    assert early  # what this test is about happened
    messages = received.wait_for(total + 1)
    assert errors == []
    assert sorted(int(m.body) for m in messages) == sorted([*range(total), 7])  # type: ignore[attr-defined]
    handle.close()
    assert _left_on(pulsar_client, topic, "s") == []


def test_a_negatively_acknowledged_message_comes_back_once_with_its_count(
    backend: PulsarBackend, pulsar_client: pulsar.Client
) -> None:
    topic = _topic()
    received = Received()
    handle = backend.subscribe(topic, "s", "c", 1000, received)
    _send(pulsar_client, topic, [b"a", b"b", b"c"])
    first = received.wait_for(3)
    handle.acknowledge_all([first[0], first[2]])  # type: ignore[list-item]
    handle.negative_acknowledge(first[1])  # type: ignore[arg-type]
    again = received.wait_for(4)
    assert len(again) == 4
    assert again[3].body == b"b"  # type: ignore[attr-defined]
    assert again[3].redelivery_count == 1  # type: ignore[attr-defined]
    handle.acknowledge_all([again[3]])  # type: ignore[list-item]
    time.sleep(0.5)
    assert len(received.messages()) == 4
    handle.close()
    assert _left_on(pulsar_client, topic, "s") == []


def test_a_paused_consumer_is_handed_nothing_more_until_resumed(
    backend: PulsarBackend, pulsar_client: pulsar.Client
) -> None:
    topic = _topic()
    received = Received()
    handle = backend.subscribe(topic, "s", "c", 10, received)
    handle.pause()
    time.sleep(0.2)
    _send(pulsar_client, topic, [b"%d" % n for n in range(200)])
    time.sleep(1.0)
    assert received.messages() == []  # pulsar-client keeps them (and the broker the rest)
    handle.resume()
    messages = received.wait_for(200)
    assert sorted(int(m.body) for m in messages) == list(range(200))  # type: ignore[attr-defined]
    handle.acknowledge_all(messages)  # type: ignore[arg-type]
    handle.close()
    assert _left_on(pulsar_client, topic, "s") == []


def test_each_consumer_is_handed_its_own_messages(
    backend: PulsarBackend, pulsar_client: pulsar.Client
) -> None:
    topics = [_topic(), _topic()]
    received = Received()
    handles = [backend.subscribe(t, "s", "c", 1000, received) for t in topics]
    for index, topic in enumerate(topics):
        _send(pulsar_client, topic, [b"%d-%d" % (index, n) for n in range(300)])
    for index, handle in enumerate(handles):
        mine = received.wait_for(300, handle)
        assert [m.body for m in mine] == [b"%d-%d" % (index, n) for n in range(300)]  # type: ignore[attr-defined]
        assert all(m.handle is handle for m in mine)  # type: ignore[attr-defined]
    for _, batch in received.batches:  # a batch is one consumer's
        assert len({m.handle for m in batch}) == 1  # type: ignore[attr-defined]
    for handle in handles:
        handle.acknowledge_all(received.messages(handle))  # type: ignore[arg-type]
        handle.close()


def test_a_closed_consumer_is_handed_nothing_and_its_messages_come_back(
    backend: PulsarBackend, pulsar_client: pulsar.Client
) -> None:
    topic = _topic()
    received = Received()
    handle = backend.subscribe(topic, "s", "c", 1000, received)
    handle.close()
    assert compiled.next_batches is not None
    _send(pulsar_client, topic, [b"x", b"y"])
    time.sleep(0.5)
    assert received.messages() == []
    assert sorted(_left_on(pulsar_client, topic, "s")) == [b"x", b"y"]


EXIT_WHILE_RECEIVING = """
import sys, time
from starlight_py.backend.pulsar_client import PulsarBackend
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import TopicName

backend = PulsarBackend(sys.argv[1], batching=True)
got = []
topic = TopicName(NamespaceName("public", "default"), sys.argv[2])
backend.subscribe(topic, "s", "c", 1000, lambda handle, batch: got.extend(batch))
print("subscribed", flush=True)
deadline = time.monotonic() + 20
while len(got) < 500 and time.monotonic() < deadline:
    time.sleep(0.01)
print("received", len(got), flush=True)
"""


def test_a_process_that_exits_while_messages_arrive_exits_cleanly(
    services: ServiceEndpoints, pulsar_client: pulsar.Client
) -> None:
    """The reader thread is stopped at exit: woken while the interpreter finalizes, it
    would be ended by an exception thrown through compiled frames, which aborts the
    process ("FATAL: exception not rethrown")."""
    topic = _topic()
    producer = pulsar_client.create_producer(
        str(topic), batching_enabled=True, batching_max_publish_delay_ms=1
    )
    for attempt in range(3):
        child = subprocess.Popen(
            [sys.executable, "-c", EXIT_WHILE_RECEIVING, services.pulsar_service_url, topic.local],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert child.stdout is not None
        assert child.stdout.readline() == b"subscribed\n"
        while child.poll() is None:  # messages arrive until (and while) it exits
            for _ in range(200):
                producer.send_async(b"x" * 100, None)
            time.sleep(0.002)
        out, err = child.communicate()
        assert child.returncode == 0, (attempt, out, err)
        assert out.startswith(b"received ")
        assert b"FATAL" not in err
    producer.close()


GATHER_THEN_WAIT = """
import sys, threading, time
import _pulsar, pulsar
from starlight_py.amqp import compiled
from starlight_py.backend import listened

assert listened.available() is None
client = pulsar.Client(sys.argv[1])
topic = sys.argv[2]
conf = _pulsar.ConsumerConfiguration()
conf.consumer_type(pulsar.ConsumerType.Shared)
conf.schema(pulsar.schema.BytesSchema().schema_info())
listened.listen(conf, 7)  # no ListenedReader in this process: this script takes them
consumer = client._client.subscribe(topic, "s", conf)
producer = client.create_producer(topic, batching_enabled=False)

def send_later():
    time.sleep(0.3)
    producer.send(b"late")

threading.Thread(target=send_later).start()
# As after a take of several messages: gather for 1 ms; nothing comes in that time.
batches = compiled.next_batches({7: "the handle"}, 20_000, 1_000, 256)
print("taken:", [(handle, [m.body for m in batch]) for handle, batch in batches], flush=True)
consumer.close()
client.close()
"""


def test_a_gather_that_finds_nothing_waits_on_for_the_next_message(
    services: ServiceEndpoints,
) -> None:
    """A take that gathers and finds nothing in its 1 ms goes on waiting, as when idle,
    and returns the message that comes later, instead of returning empty-handed (an
    empty return per message at a few hundred a second, each taking the GIL). Its own
    process: the test takes the messages itself, with no reader thread competing."""
    topic = str(_topic())
    done = subprocess.run(
        [sys.executable, "-c", GATHER_THEN_WAIT, services.pulsar_service_url, topic],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # pulsar-client logs to stdout too.
    taken = [line for line in done.stdout.splitlines() if line.startswith(b"taken:")]
    assert taken == [b"taken: [('the handle', [b'late'])]"]


def test_a_consumer_whose_messages_are_not_taken_is_handed_no_more_than_its_queue(
    backend: PulsarBackend, pulsar_client: pulsar.Client
) -> None:
    """While the proxy does not take what the listener handed over of a consumer (a busy
    trio thread), the listener hands over at most the consumer's receiver queue size of
    them and then pauses it: the broker gives the rest to the subscription's other
    consumers, as RabbitMQ gives a queue's messages to the consumers with room. Nothing is
    lost or handed over twice."""
    topic = _topic()
    received = Received()
    blocked, release = threading.Event(), threading.Event()
    slow_handles: list[ConsumerHandle] = []

    def slow(handle: ConsumerHandle, batch: list[object]) -> None:
        received(handle, batch)
        blocked.set()
        release.wait(20)  # the reader is busy: nothing more is taken meanwhile

    fast = backend.subscribe(topic, "s", "fast", 100, received)
    slow_handles.append(backend.subscribe(topic, "s", "slow", 1, slow))
    producer = pulsar_client.create_producer(str(topic), batching_enabled=False)
    try:
        sent = 0
        while not blocked.is_set() and sent < 50:  # until the slow consumer got one
            producer.send(b"%d" % sent)
            sent += 1
            blocked.wait(0.1)
        assert blocked.is_set()
        for _ in range(40):
            producer.send(b"%d" % sent)
            sent += 1
        time.sleep(1.0)  # the broker hands out the 40 meanwhile
        release.set()
        messages = received.wait_for(sent)
    finally:
        release.set()
        producer.close()
    assert sorted(int(m.body) for m in messages) == list(range(sent))  # type: ignore[attr-defined]
    taken_slowly = received.messages(slow_handles[0])
    # One handed over, one more in its receiver queue (a third: a broker's lag).
    assert len(taken_slowly) <= 3, len(taken_slowly)
    fast.acknowledge_all(received.messages(fast))  # type: ignore[arg-type]
    slow_handles[0].acknowledge_all(taken_slowly)  # type: ignore[arg-type]
    for handle in (fast, *slow_handles):
        handle.close()
    assert _left_on(pulsar_client, topic, "s") == []
