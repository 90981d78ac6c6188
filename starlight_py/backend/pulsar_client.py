"""The Pulsar binary-protocol adapter (pulsar-client): producers and consumers behind small
handles, pulsar exceptions translated here and nowhere else.

Blocking calls (creating producers and consumers, closing them, `receive`) are made from
worker threads by the gateway. Callbacks (`send_async` results, message listeners) run on
pulsar-client's threads and must only hand their data to the trio bridge.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import _pulsar
import pulsar

from starlight_py.amqp import compiled
from starlight_py.backend import list_acks, listened
from starlight_py.backend.broker_auth import BrokerAuthError, BrokerClientSettings
from starlight_py.backend.consumer_ack import (
    Acknowledger,
    ListedAcknowledger,
    ListenedAcknowledger,
    checked_consumer_address,
    make_acknowledger,
)
from starlight_py.backend.producer_flush import (
    Flusher,
    NativeFlushUnavailable,
    ProducerFlusher,
    result_text,
)
from starlight_py.backend.producer_send import Sender, make_sender
from starlight_py.backend.pulsar_admin import (
    BackendUnavailable,
    PulsarAuthenticationRefused,
    RefusalLog,
)
from starlight_py.backend.thread_names import name_native_thread
from starlight_py.config import ConfigError, StarlightConfig
from starlight_py.model.naming import TopicName
from starlight_py.model.positions import MessageIdRecord

log = logging.getLogger("starlight.pulsar")

_OK = pulsar.Result.Ok


class BackendError(Exception):
    """Pulsar refused an operation (producer or consumer creation, a send)."""


class ReceivedMessage:
    """What the gateway needs of a Pulsar message, taken on the thread that read it; the
    rest (position, publish time) is read from the pulsar-client message when asked for."""

    __slots__ = ("_position", "body", "handle", "properties", "raw", "redelivery_count")

    def __init__(self, raw: Any, handle: ConsumerHandle) -> None:
        self.raw = raw  # the _pulsar.Message, kept for acknowledge / negative_acknowledge
        self.handle = handle  # the consumer that read it (acknowledges it)
        self.body: bytes = raw.data()
        self.properties: dict[str, str] = raw.properties()
        self.redelivery_count: int = raw.redelivery_count()
        self._position: MessageIdRecord | None = None

    @property
    def position(self) -> MessageIdRecord:
        position = self._position
        if position is None:
            position = self._position = _position(self.raw.message_id())
        return position

    @property
    def topic_local(self) -> str:
        return self.handle.topic.local

    @property
    def publish_time_ms(self) -> int:
        """The broker's publish timestamp (epoch ms), for message TTLs."""
        value: int = self.raw.publish_timestamp()
        return value

    def __repr__(self) -> str:
        return f"ReceivedMessage({self.handle.topic.local}, {self.position})"


def _position(message_id: Any) -> MessageIdRecord:
    return MessageIdRecord(
        message_id.ledger_id(),
        message_id.entry_id(),
        message_id.batch_index(),
        message_id.partition(),
    )


Listener = Callable[["ConsumerHandle", list[ReceivedMessage]], None]
SendCallback = Callable[[bool, str], None]
# flush outcome: (untracked sends covered, ok, error)
FlushCallback = Callable[[int, bool, str], None]

# A message at least this large is sent with a callback of its own: pulsar-client drops a
# message it cannot send (over the broker's maxMessageSize without chunking, beyond its
# memory limit) without telling a flush.
TRACKED_SIZE = 512 * 1024
# s: how long `flush_blocking` waits for a producer still being made (pulsar-client gives up
# on a producer within its operation timeout, 30 s by default).
PENDING_PRODUCER_WAIT = 60.0
# A reader thread takes at most this many messages per hand-over to trio, and waits at most
# this long (ms) for more once at least one is there.
READ_BATCH = 256
READ_BATCH_WAIT_MS = 1
# ms: pulsar-client's own acknowledgement grouping time (its consumers re-arm a timer this
# often, whether or not an acknowledgement waits)
PULSAR_ACK_GROUPING_MS = 100
# With batching, each this many Pulsar consumers held add pulsar-client's grouping time to
# that of the consumers made next (up to the configured time): every consumer re-arms its
# grouping timer each grouping time, busy or not (about 2 µs of pulsar-client's I/O thread
# each), so that a process holding thousands of consumers would spend tens of ms a second
# on timers while idle.
CONSUMERS_PER_GROUPING_STEP = 100


def effective_ack_grouping_ms(configured: int, batching: bool, consumers: int = 0) -> int:
    """The acknowledgement grouping time of the next consumer of a process holding
    `consumers` Pulsar consumers. With batching, pulsar-client's own while the process
    holds fewer than CONSUMERS_PER_GROUPING_STEP, one more step of it for each step of
    consumers, and never above `configured`: a requeued message of a batch entry waits for
    the grouped acknowledgements of its entry to be sent before it goes back
    (gateway/consume/batch_requeues.py), so the grouping time is how late such a requeue is."""
    if not batching:
        return configured
    steps = 1 + max(0, consumers) // CONSUMERS_PER_GROUPING_STEP
    return min(configured, PULSAR_ACK_GROUPING_MS * steps)


def _client_version() -> str:
    try:
        return importlib.metadata.version("pulsar-client")
    except importlib.metadata.PackageNotFoundError:
        return "of unknown version"


class ProducerHandle:
    """A producer whose sends are confirmed by flushes, not one callback per message.

    pulsar-client calls a send callback from its I/O thread with the GIL, once per
    message; that hand-over cost more than the send itself (docs/history/performance-log.md,
    "What changed in the message path"). Sends here carry no callback: `flush(done)` makes
    pulsar-client write what it batched and calls `done` once, when everything sent before
    it is stored (or failed). Messages that pulsar-client would refuse without telling a
    flush (too large, or beyond its queue) are kept out of this path: large ones take
    `send_tracked`, and the gateway never sends while `has_room()` is False.

    `in_flight` counts sends without an outcome yet; it is read and changed on the trio
    thread only (the gateway reports outcomes with `flushed` / `tracked_done`).
    """

    def __init__(
        self,
        producer: Any,
        capacity: int,
        topic: TopicName | None = None,
        batching: bool = False,
        flusher: Flusher | None = None,
    ) -> None:
        """`producer` None: a producer still being made (see `pending`). Raises
        NativeFlushUnavailable (no `flusher` given, and this pulsar-client cannot be
        flushed without the GIL: producer_flush.py)."""
        self._producer = producer
        self._raw = None if producer is None else producer._producer
        # Flushes never go through the binding's flush_async (producer_flush.py says why).
        # Untracked sends go through the compiled C API path when it is there
        # (producer_send.py): built at once, handed over by `_send_pending`.
        self._sender: Sender | None = None
        if flusher is None and producer is not None:
            native = ProducerFlusher(self._raw)
            self._sender = make_sender(native.address)
            flusher = native
        self._flusher: Flusher | None = flusher
        # While the producer is being made: what was asked of it, in order, and the event
        # `flush_blocking` waits for; then the error if it could not be made.
        self._waiting: list[Callable[[], None]] | None = [] if producer is None else None
        self._made = threading.Event()
        if producer is not None:
            self._made.set()
        self._failure: str | None = None
        # What was sent to it goes nowhere, as stored (`discard`).
        self._discarded = False
        # Why the producer of a pending handle could not be made (`fail`): the publishing
        # connections close with it, as when a publish waited for the producer.
        self.creation_error: Exception | None = None
        self._capacity = capacity
        self.topic = topic
        self.batching = batching
        # With batching: a second producer on the topic, unbatched and chunking, for bodies
        # over MAX_UNCHUNKED_MESSAGE_SIZE (Pulsar cannot chunk batched messages). Made by
        # the pool when a first such message comes (ProducerPool.large).
        self.large: Any = None
        self.in_flight = 0
        self._unflushed = 0  # untracked sends since the last flush
        self.last_used = 0.0  # trio clock; the pool closes producers unused for a while
        self.retired = False  # taken out of the pool (to be closed): send nothing more

    @property
    def idle(self) -> bool:
        """No send is waiting for its outcome."""
        return self.in_flight == 0

    def has_room(self) -> bool:
        return self.in_flight < self._capacity

    @classmethod
    def pending(cls, capacity: int, topic: TopicName, batching: bool) -> ProducerHandle:
        """A handle whose producer is still being made (ProducerPool): sends, tracked sends
        and flushes are kept, in order, and done by `adopt` once it is made, or failed by
        `fail`. The publishing connection need not wait: its later sends to the topic queue
        behind these, and their outcomes come as from any producer."""
        return cls(None, capacity, topic, batching)

    @property
    def made(self) -> bool:
        """The producer exists (or could not be made): nothing waits to be sent."""
        return self._waiting is None

    def adopt(self, made: ProducerHandle) -> None:
        """The producer of a `pending` handle is made (trio thread): take it over and do
        what waited, in order. `made` is not used afterwards."""
        self._producer, self._raw = made._producer, made._raw
        self._sender, self._flusher = made._sender, made._flusher
        self._capacity, self.batching = made._capacity, made.batching
        self._run_waiting()

    def fail(self, error: str, cause: Exception | None = None) -> None:
        """The producer of a `pending` handle cannot be made (trio thread): what waited,
        and whatever is asked later, fails with `error`; `cause` becomes `creation_error`."""
        self._failure = error
        self.creation_error = cause
        self._run_waiting()

    def discard(self) -> None:
        """A `pending` handle whose topic no longer takes messages (trio thread): what
        waited, and whatever is asked later, succeeds without being written (the binding
        topic of a binding unbound before its first message was written:
        topology/binding_topics.py)."""
        self._discarded = True
        self.fail("discarded")

    def _run_waiting(self) -> None:
        waiting, self._waiting = self._waiting or [], None
        try:
            for step in waiting:
                step()
        finally:
            self._made.set()

    def send(self, body: bytes, properties: dict[str, str]) -> None:
        """Queue a message; its outcome comes with the next `flush`. The caller checked
        `has_room()` and that the message is smaller than TRACKED_SIZE."""
        if self._waiting is not None:  # the producer is being made: sent once it is
            self._waiting.append(lambda: self._send_now(body, properties))
        else:
            self._send_now(body, properties)
        self.in_flight += 1
        self._unflushed += 1

    def _send_now(self, body: bytes, properties: dict[str, str]) -> None:
        if self._raw is None:
            return  # could not be made: the flush that covers it fails
        sender = self._sender
        if sender is None or not sender.add(body, properties):
            self._send_pending()  # what the sender holds goes first
            builder = _pulsar.MessageBuilder()
            builder.content(body)
            builder.properties(properties)
            self._raw.send_async(builder.build(), None)

    def _send_pending(self) -> None:
        """Hand the compiled sender's messages to the producer: before a flush, and before
        any other send, so that the topic's order is the order of the sends."""
        if self._sender is not None:
            self._sender.send_pending()

    def send_tracked(
        self,
        body: bytes,
        properties: dict[str, str],
        done: SendCallback,
        deliver_after_ms: int = 0,
        stored: Callable[[MessageIdRecord, Any], None] | None = None,
    ) -> None:
        """Queue a message with a callback of its own (`done(ok, error)` on a pulsar
        thread); for large messages, delayed ones, dead letters and messages to pre-ack.
        `stored(position, message_id)` is called first, on the same thread, when Pulsar
        stored it. Report the outcome to `tracked_done` on the trio thread."""
        # A message whose id is acknowledged later without being received (pre-acks) goes
        # in a batch entry of its own: pulsar-client acknowledges such an id as its whole
        # entry, which would take the messages batched with it along.
        alone = self.batching and stored is not None
        if self._raw is None:
            self.in_flight += 1  # as `_send_with_callback` counts it

            def later() -> None:
                self.in_flight -= 1
                self.send_tracked(body, properties, done, deliver_after_ms, stored)

            if self._waiting is not None:
                self._waiting.append(later)
            else:
                done(self._discarded, "" if self._discarded else self._failure or "no producer")
            return
        self._send_pending()
        self._send_with_callback(self._raw, alone, body, properties, done, deliver_after_ms, stored)

    def send_large(
        self,
        body: bytes,
        properties: dict[str, str],
        done: SendCallback,
        deliver_after_ms: int = 0,
        stored: Callable[[MessageIdRecord, Any], None] | None = None,
    ) -> None:
        """`send_tracked` through the `large` producer (chunked). The caller made sure that
        what was sent before on this topic is stored (so this one cannot overtake it) and
        waits for `done` before sending more (so nothing overtakes this one)."""
        raw = self.large._producer
        self._send_pending()
        self._send_with_callback(raw, False, body, properties, done, deliver_after_ms, stored)

    def _send_with_callback(
        self,
        raw: Any,
        alone: bool,
        body: bytes,
        properties: dict[str, str],
        done: SendCallback,
        deliver_after_ms: int,
        stored: Callable[[MessageIdRecord, Any], None] | None,
    ) -> None:
        def callback(result: Any, message_id: Any) -> None:
            ok = result == _OK
            if ok and stored is not None:
                stored(_position(message_id), message_id)
            done(ok, "" if ok else str(result))

        builder = _pulsar.MessageBuilder()
        builder.content(body)
        builder.properties(properties)
        if deliver_after_ms > 0:
            builder.deliver_after(timedelta(milliseconds=deliver_after_ms))
        self.in_flight += 1
        flusher = self._flusher if alone else None
        try:
            if flusher is not None:
                flusher.flush(None)  # close the batch being filled
            raw.send_async(builder.build(), callback)
            if flusher is not None:
                flusher.flush(None)  # and this one, before anything joins it
        except pulsar.PulsarException as e:
            done(False, str(e))

    def tracked_done(self) -> None:
        self.in_flight -= 1

    def flush(self, done: FlushCallback) -> None:
        """Ask pulsar-client to write what it holds; `done(covered, ok, error)` runs on a
        pulsar thread (or at once) when every message sent so far is stored, or with the
        error that failed them; `covered` is how many untracked sends it accounts for:
        report them to `flushed` on the trio thread."""
        covered, self._unflushed = self._unflushed, 0
        if self._flusher is None or self._raw is None:

            def later() -> None:
                self._flush_now(covered, done)

            if self._waiting is not None:
                self._waiting.append(later)
            else:
                self._failed_flush(covered, done)
            return
        self._flush_now(covered, done)

    def _flush_now(self, covered: int, done: FlushCallback) -> None:
        if self._flusher is None or self._raw is None:
            self._failed_flush(covered, done)
            return
        self._send_pending()

        def callback(result: int) -> None:
            ok = result == 0
            done(covered, ok, "" if ok else result_text(result))

        self._flusher.flush(callback)

    def _failed_flush(self, covered: int, done: FlushCallback) -> None:
        """The outcome of a flush without a producer: failed, or, discarded, stored."""
        if self._discarded:
            done(covered, True, "")
        else:
            done(covered, False, self._failure or "no producer")

    def flushed(self, covered: int) -> None:
        self.in_flight -= covered

    def flush_blocking(self) -> None:
        """Block until every send so far is written (or failed); a producer still being
        made is waited for first (any thread but trio's)."""
        self._made.wait(PENDING_PRODUCER_WAIT)
        if self._producer is None:
            return
        self._send_pending()
        try:
            self._producer.flush()
        except pulsar.PulsarException as e:
            log.debug("flushing producer: %s", e)

    def close(self) -> None:
        if self._waiting is not None:
            self.fail("the producer was closed")
        self._send_pending()
        for producer in (self._producer, self.large):
            if producer is None:
                continue
            try:
                producer.close()
            except pulsar.PulsarException as e:
                log.debug("closing producer: %s", e)


class AckOnlyConsumer:
    """A consumer that acknowledges messages it never received (PulsarBackend.ack_only_consumer)."""

    def __init__(self, wrapper: Any) -> None:
        self._wrapper = wrapper
        self._consumer = wrapper._consumer
        self.last_used = 0.0  # trio clock

    def acknowledge_id(self, message_id: Any) -> None:
        try:
            self._consumer.acknowledge(message_id)
        except pulsar.PulsarException as e:
            log.debug("acknowledge failed: %s", e)

    def close(self) -> None:
        try:
            self._wrapper.close()
        except pulsar.PulsarException as e:
            log.debug("closing a consumer: %s", e)


class ConsumerHandle:
    """One Pulsar consumer on one binding subscription.

    With `start_reading`, a thread of its own takes messages from pulsar-client in batches
    (`batch_receive`: one GIL hand-over per batch, where a message listener costs one per
    message) and hands each batch to the gateway; when nothing comes within
    READ_BATCH_WAIT_MS it blocks in `receive()`, which costs nothing while the queue is
    idle. `pause()` stops the thread before its next receive: pulsar-client's receiver
    queue then fills up and the broker stops sending."""

    def __init__(self, topic: TopicName, subscription: str) -> None:
        self.topic = topic
        self.subscription = subscription
        self._consumer: Any = None  # the _pulsar.Consumer
        self._wrapper: Any = None  # the pulsar.Consumer that owns it
        # Acknowledges through the compiled C API path when it is there (consumer_ack.py).
        self._acknowledger: Acknowledger | None = None
        self.paused = False
        self._closed = False
        self._close_lock = threading.Lock()
        self._gate = threading.Event()
        self._gate.set()
        self._reader: threading.Thread | None = None
        # Listened (backend/listened.py): the C API's consumer, and its key in the reader.
        self._listened_at = 0
        self._listen_key = 0
        # What pulsar-client buffers for it, and what its listener hands over at most
        # before the proxy takes it (backend/listened.py, `budget`).
        self.receiver_queue_size = 1
        self._resume_when_made = False
        # While a listened consumer is being subscribed its listener may hand over messages
        # already (a topic with a backlog), and the client may settle them before
        # subscribe returns: what it asked is kept, in order, and done by `ready`.
        self._early: list[tuple[bool, ReceivedMessage]] | None = None
        # ms its acknowledgements are grouped for (gateway/consume/batch_requeues.py waits as long)
        self.ack_grouping_ms = PULSAR_ACK_GROUPING_MS
        # Ungrouped, acknowledging a list per call (backend/list_acks.py): the gateway
        # gathers a round's acknowledgements of it (`gather_acks`, `send_gathered_acks`).
        self.acks_in_lists = False
        self._gathered: list[ReceivedMessage] = []
        self._gathered_lock = threading.Lock()
        # Called once when it closes (the backend's count of its consumers).
        self._on_close: Callable[[], None] | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    def _kept_early(self, ack: bool, messages: list[ReceivedMessage]) -> bool:
        """Keep settlements asked before the consumer is ready (`ready` does them)."""
        if self._early is None:
            return False
        with self._close_lock:
            if self._early is None:
                return False
            self._early.extend((ack, m) for m in messages)
            return True

    def ready(self) -> None:
        """The listened consumer is subscribed and can settle messages: do what was asked
        meanwhile, in order."""
        with self._close_lock:
            early, self._early = self._early or [], None
        for ack, message in early:
            if ack:
                self.acknowledge(message)
            else:
                self.negative_acknowledge(message)

    def acknowledge(self, message: ReceivedMessage) -> None:
        if self._kept_early(True, [message]):
            return
        if self._acknowledger is not None:
            self.acknowledge_all([message])
            return
        try:
            self._consumer.acknowledge(message.raw)
        except pulsar.PulsarException as e:
            # The consumer closed meanwhile: the broker redelivers; at-least-once holds.
            log.debug("acknowledge failed: %s", e)

    def acknowledge_all(self, messages: list[ReceivedMessage]) -> None:
        """Acknowledge messages this consumer received (one release of the GIL for all of
        them on the compiled path)."""
        if self._kept_early(True, messages):
            return
        acknowledger = self._acknowledger
        if acknowledger is not None:
            try:
                acknowledger.acknowledge(messages)
                return
            except (RuntimeError, TypeError, AttributeError) as e:
                # The compiled path could not take an id (it acknowledged none of them):
                # this consumer acknowledges through the binding from now on.
                log.warning("acknowledging on %s through the binding: %s", self.topic, e)
                self._acknowledger = None
        for message in messages:
            self.acknowledge(message)

    def gather_acks(self, messages: list[ReceivedMessage]) -> bool:
        """Keep `messages` for the next `send_gathered_acks` (one command for all that a
        round gathers); True when none were gathered before (the caller arranges for the
        send then). Closing the consumer sends them first."""
        with self._gathered_lock:
            first = not self._gathered
            self._gathered.extend(messages)
        return first

    def send_gathered_acks(self) -> None:
        """Acknowledge what `gather_acks` kept, in one list."""
        with self._gathered_lock:
            messages, self._gathered = self._gathered, []
        if messages:
            self.acknowledge_all(messages)

    def negative_acknowledge(self, message: ReceivedMessage) -> None:
        if self._kept_early(False, [message]):
            return
        if self._listened_at:
            assert compiled.negative_acknowledge_listened is not None
            compiled.negative_acknowledge_listened(self._listened_at, message)
            return
        try:
            self._consumer.negative_acknowledge(message.raw)
        except pulsar.PulsarException as e:
            log.debug("negative acknowledge failed: %s", e)

    def pause(self) -> None:
        if not self.paused:
            self.paused = True
            self._gate.clear()
            if self._listened_at:
                # Messages already handed over still come; pulsar-client keeps the rest.
                self._consumer.pause_message_listener()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self._gate.set()
            if self._listened_at:
                listened.budget(self._listen_key, self.receiver_queue_size)
                self._consumer.resume_message_listener()

    def taken_from_listener(self) -> None:
        """The proxy took what pulsar-client's listener handed over of this consumer, and
        paused it if it wants no more: the listener may hand over a receiver queue's worth
        again (backend/listened.py, `budget`), and goes on if it had paused itself."""
        if self._closed:
            return  # its key is forgotten (`close`)
        if listened.budget(self._listen_key, self.receiver_queue_size) and not self.paused:
            with self._close_lock:
                consumer = self._consumer
                if consumer is None:  # still being subscribed: `made_listened` resumes it
                    self._resume_when_made = True
                    return
            consumer.resume_message_listener()

    def made_listened(self, raw: Any) -> None:
        """The listened consumer is subscribed: resumed if its listener paused itself
        meanwhile (`taken_from_listener`)."""
        with self._close_lock:
            self._consumer = raw
            resume, self._resume_when_made = self._resume_when_made, False
        if resume:
            raw.resume_message_listener()

    def start_reading(self, listener: Listener) -> None:
        """Hand every message to `listener(handle, batch)` from a thread of this handle."""
        self._reader = threading.Thread(
            target=self._read_loop, args=(listener,), name="pulsar-reader", daemon=True
        )
        self._reader.start()

    # The reader thread's name as `top` and `perf` show it.
    _THREAD_NAME = b"starlight-read"

    def _read_loop(self, listener: Listener) -> None:
        name_native_thread(self._THREAD_NAME)
        gate = self._gate
        while True:
            gate.wait()
            if self._closed:
                return
            try:
                batch = self._next_batch()
            except pulsar.AlreadyClosed:
                return
            except pulsar.PulsarException as e:
                if self._closed:
                    return
                log.debug("receiving from %s: %s", self.topic, e)
                time.sleep(0.1)
                continue
            if batch:
                listener(self, self._received(batch))

    def _received(self, batch: list[Any]) -> list[ReceivedMessage]:
        """What the listener is handed of pulsar-client's messages (on the reader thread)."""
        return [ReceivedMessage(raw, self) for raw in batch]

    def _next_batch(self) -> list[Any]:
        """Blocking: the next messages from pulsar-client (empty: look again)."""
        consumer = self._consumer
        batch: list[Any] = consumer.batch_receive()
        return batch if batch else [consumer.receive()]  # idle: wait without polling

    def receive(self, timeout: float) -> ReceivedMessage | None:
        """Blocking; None when nothing arrived within `timeout` seconds."""
        try:
            raw = self._consumer.receive(max(1, int(timeout * 1000)))
        except pulsar.Timeout:
            return None
        except pulsar.PulsarException as e:
            raise BackendError(f"receive from {self.topic}: {e}") from e
        return ReceivedMessage(raw, self)

    def sync(self) -> None:
        """Blocking: return once the broker has handled every acknowledgement this consumer
        sent so far (a request on the same connection, which the broker answers in order:
        the last message id). Errors are ignored: a closed consumer acknowledges nothing."""
        try:
            self._consumer.get_last_message_id()
        except pulsar.PulsarException as e:
            log.debug("syncing with %s: %s", self.topic, e)

    def receive_nowait(self) -> ReceivedMessage | None:
        """A message already in pulsar-client's receiver queue, or None at once."""
        try:
            raw = self._consumer.receive(0)
        except pulsar.Timeout:
            return None
        except pulsar.PulsarException as e:
            raise BackendError(f"receive from {self.topic}: {e}") from e
        return ReceivedMessage(raw, self)

    def close(self) -> None:
        """Blocking. Unacknowledged messages go back to the subscription at once. Closing
        twice (a cancel racing a server-side cancel, on two worker threads) does nothing."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        # Acknowledged before the close, so not redelivered (as on RabbitMQ).
        self.send_gathered_acks()
        self._gate.set()  # a paused reader wakes up and sees it is closed
        if self._on_close is not None:
            self._on_close()
        if self._listen_key:
            listened.READER.unregister(self._listen_key)
        try:
            self._wrapper.close()
        except pulsar.PulsarException as e:
            log.debug("closing consumer: %s", e)
        except ValueError as e:
            # pulsar-client's own bookkeeping (Client._consumers.remove) of a consumer it
            # already forgot: the consumer is closed all the same.
            log.debug("closing consumer: %s", e)


# What a timeout on the binary protocol may mean: the broker drops a connection whose
# credentials it refuses without saying why, and pulsar-client retries until it times out.
_TIMEOUT_HINT = (
    "Pulsar did not answer in time (down, or refusing the proxy's credentials or TLS: "
    "check brokerClientAuthenticationParameters and brokerClientTrustCertsFilePath)"
)


def _client_security(settings: BrokerClientSettings) -> dict[str, Any]:
    """pulsar.Client keyword arguments for TLS trust and the proxy's credentials."""
    options: dict[str, Any] = {
        "tls_allow_insecure_connection": settings.allow_insecure,
        "tls_validate_hostname": settings.validate_hostname and not settings.allow_insecure,
    }
    if settings.trust_certs_file:
        options["tls_trust_certs_file_path"] = settings.trust_certs_file
    auth = settings.auth
    if auth.method == "tls":
        options["authentication"] = pulsar.AuthenticationTLS(auth.cert_file, auth.key_file)
    elif auth.method == "token" and auth.token_file:
        options["authentication"] = pulsar.AuthenticationToken(_token_supplier(settings))
    elif auth.method == "token":
        options["authentication"] = pulsar.AuthenticationToken(auth.token)
    return options


def _token_supplier(settings: BrokerClientSettings) -> Callable[[], str]:
    """Reads the token file each time pulsar-client (re)connects, so a rotated token is
    used without a restart. Runs on a pulsar thread: it must not raise."""
    refusals = RefusalLog()

    def supply() -> str:
        try:
            return settings.auth.current_token()
        except BrokerAuthError as e:
            refusals.report(f"cannot authenticate to Pulsar: {e}")
            return ""

    return supply


class PulsarBackend:
    """One pulsar-client Client per proxy process."""

    def __init__(
        self,
        service_url: str,
        producer_max_pending: int = 5000,
        *,
        settings: BrokerClientSettings | None = None,
        batching: bool = False,
        batch_max_messages: int = 100,
        send_timeout_ms: int = 120_000,
        ack_grouping_ms: int = 1000,
    ) -> None:
        """`batching`: producers batch what one flush covers, up to `batch_max_messages`
        per Pulsar entry, and consumers acknowledge batch messages one by one (the broker
        needs acknowledgmentAtBatchIndexLevelEnabled=true; docs/operations.md).
        `ack_grouping_ms`: how long consumers group acknowledgements (with batching, at
        most pulsar-client's own; `effective_ack_grouping_ms`)."""
        self.service_url = service_url
        self.producer_max_pending = producer_max_pending
        self.batching = batching
        self.batch_max_messages = batch_max_messages
        self.send_timeout_ms = send_timeout_ms
        self._configured_ack_grouping_ms = ack_grouping_ms
        # Pulsar consumers made with a chosen grouping time and not closed yet.
        self._grouped_consumers = 0
        self._grouped_lock = threading.Lock()
        security = _client_security(settings) if settings is not None else {}
        self._refusals = RefusalLog()
        self._client = pulsar.Client(
            service_url,
            operation_timeout_seconds=10,
            io_threads=1,
            message_listener_threads=1,
            # pulsar-client's own logger at Warn: with a Python logger it takes the GIL for
            # every DEBUG line it considers, which cost a quarter to a half of the proxy's
            # CPU per message (docs/history/performance-log.md, "Reading the numbers").
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
            **security,
        )

    @property
    def list_acks(self) -> bool:
        """Whether the consumers made from now on for a listener acknowledge in lists,
        ungrouped (backend/list_acks.py)."""
        return list_acks.available() is None

    @property
    def ack_grouping_ms(self) -> int:
        """The acknowledgement grouping time of the next consumer made
        (`effective_ack_grouping_ms`; 0 with list acknowledgements)."""
        if self.list_acks:
            return 0
        return effective_ack_grouping_ms(
            self._configured_ack_grouping_ms, self.batching, self._grouped_consumers
        )

    def stop_batching(self) -> None:
        """Batching off (the brokers cannot take it): producers made from now on write one
        message per entry, and consumers group acknowledgements for the configured time."""
        self.batching = False

    def _count_consumer(self, handle: ConsumerHandle) -> None:
        """`handle` holds a consumer made with grouping time `handle.ack_grouping_ms`."""
        with self._grouped_lock:
            self._grouped_consumers += 1

        def closed() -> None:
            with self._grouped_lock:
                self._grouped_consumers -= 1

        handle._on_close = closed

    def name_threads(self, topic: TopicName) -> None:
        """Have pulsar-client start its I/O and timer threads from a thread named
        `pulsar-client`, which they inherit (they have no names of their own): the bench and
        `top -H` can then tell them apart. A lookup of `topic` in the background does it."""

        def look_up() -> None:
            name_native_thread(b"pulsar-client")
            try:
                self._client.get_topic_partitions(str(topic))
            except pulsar.PulsarException as e:
                log.debug("first lookup: %s", e)

        threading.Thread(target=look_up, name="pulsar-client", daemon=True).start()

    @classmethod
    def from_config(cls, config: StarlightConfig) -> PulsarBackend:
        """The client of the proxy's configuration (TLS URL, trust and credentials when
        configured); logs how it connects, never a secret. Raises ConfigError when the
        configured certificate files cannot be used."""
        settings = BrokerClientSettings.from_config(config)
        log.info("Pulsar connection: %s", settings.describe())
        try:
            return cls(
                settings.service_url,
                config.producer_max_pending,
                settings=settings,
                batching=config.producer_batching,
                batch_max_messages=config.producer_batch_max_messages,
                send_timeout_ms=config.producer_send_timeout_ms,
                ack_grouping_ms=config.consumer_ack_grouping_ms,
            )
        except (pulsar.PulsarException, ValueError) as e:
            raise ConfigError("brokerClientAuthenticationParameters", str(e)) from e

    def _unusable(self, what: str, e: Exception) -> BackendUnavailable:
        """The exception for a failed create/subscribe that means Pulsar cannot be used."""
        if isinstance(e, pulsar.AuthenticationError):
            message = f"Pulsar refused authentication: {what}: {e}"
            self._refusals.report(message)
            return PulsarAuthenticationRefused(message)
        if isinstance(e, pulsar.Timeout):
            return BackendUnavailable(f"{what}: {_TIMEOUT_HINT}")
        return BackendUnavailable(f"{what}: {e}")

    @property
    def producer_capacity(self) -> int:
        """Sends a producer takes without an outcome: the client's own queue is left a
        margin above it, so it never reports full."""
        return max(1, self.producer_max_pending - 1)

    def create_producer(self, topic: TopicName) -> ProducerHandle:
        """Blocking. Raises BackendUnavailable or BackendError."""
        try:
            producer = self._client.create_producer(
                str(topic),
                block_if_queue_full=False,
                max_pending_messages=self.producer_max_pending + 1,
                # Batches are cut by the proxy's flushes (one per socket read); the delay is
                # only a backstop. docs/performance.md says what batching changes.
                batching_enabled=self.batching,
                batching_max_messages=self.batch_max_messages,
                batching_max_publish_delay_ms=1,
                # Messages over the broker's maxMessageSize go in chunks (Pulsar cannot chunk
                # batched messages: with batching the proxy accepts smaller ones only).
                chunking_enabled=not self.batching,
                send_timeout_millis=self.send_timeout_ms,
            )
        except (pulsar.Timeout, pulsar.ConnectError, pulsar.AuthenticationError) as e:
            raise self._unusable(f"cannot create a producer on {topic}", e) from e
        except pulsar.PulsarException as e:
            raise BackendError(f"cannot create a producer on {topic}: {e}") from e
        try:
            return ProducerHandle(producer, self.producer_capacity, topic, batching=self.batching)
        except NativeFlushUnavailable as e:
            with contextlib.suppress(pulsar.PulsarException):
                producer.close()
            raise BackendError(
                f"cannot use a producer on {topic}: {e} (pulsar-client {_client_version()}; "
                "starlight-py needs a pulsar-client whose producers it can flush without "
                "the GIL, as 3.13 does)"
            ) from e

    def create_large_producer(self, topic: TopicName) -> Any:
        """Blocking: an unbatched producer that chunks, for the bodies a batching producer
        cannot send (ProducerHandle.large). Raises BackendUnavailable or BackendError."""
        try:
            return self._client.create_producer(
                str(topic),
                block_if_queue_full=False,
                batching_enabled=False,
                chunking_enabled=True,
                send_timeout_millis=self.send_timeout_ms,
            )
        except (pulsar.Timeout, pulsar.ConnectError, pulsar.AuthenticationError) as e:
            raise self._unusable(f"cannot create a producer on {topic}", e) from e
        except pulsar.PulsarException as e:
            raise BackendError(f"cannot create a producer on {topic}: {e}") from e

    def subscribe(
        self,
        topic: TopicName,
        subscription: str,
        consumer_name: str,
        receiver_queue_size: int,
        listener: Listener | None,
        *,
        ack_at_once: bool = False,
    ) -> ConsumerHandle:
        """Blocking: a Shared consumer on an existing binding subscription. With a
        `listener`, messages are pushed to it (on a pulsar thread); without, use receive().
        `ack_at_once` (without a listener): acknowledgements go to the broker as they are
        made, not grouped for up to 100 ms, so that counts taken right after see them.
        Raises BackendUnavailable or BackendError."""
        handle = ConsumerHandle(topic, subscription)
        size = max(1, receiver_queue_size)
        if listener is not None and listened.available() is None:
            return self._subscribe_listened(handle, consumer_name, size, listener)
        if ack_at_once and listener is None:
            made = self._subscribe_acking_at_once(handle, consumer_name, size)
            if made is not None:
                return made
        try:
            wrapper = self._client.subscribe(
                str(topic),
                subscription,
                consumer_type=pulsar.ConsumerType.Shared,
                receiver_queue_size=size,
                consumer_name=consumer_name,
                negative_ack_redelivery_delay_ms=100,
                initial_position=pulsar.InitialPosition.Latest,
                batch_index_ack_enabled=self.batching,
                batch_receive_policy=pulsar.ConsumerBatchReceivePolicy(
                    min(size, READ_BATCH), 0, READ_BATCH_WAIT_MS
                ),
            )
        except (pulsar.Timeout, pulsar.ConnectError, pulsar.AuthenticationError) as e:
            raise self._unusable(f"cannot consume from {topic}", e) from e
        except pulsar.PulsarException as e:
            raise BackendError(f"cannot consume from {topic}: {e}") from e
        handle._wrapper = wrapper
        handle._consumer = wrapper._consumer
        handle._acknowledger = make_acknowledger(wrapper._consumer)
        if listener is not None:
            handle.start_reading(listener)
        return handle

    def _shared_consumer_conf(self, consumer_name: str, size: int) -> Any:
        """The C++ binding's configuration of a Shared consumer of the proxy, as the
        binding's own `subscribe` would make it, for the paths that adjust it further."""
        conf = _pulsar.ConsumerConfiguration()
        conf.consumer_type(pulsar.ConsumerType.Shared)
        conf.receiver_queue_size(size)
        conf.consumer_name(consumer_name)
        conf.negative_ack_redelivery_delay_ms(100)
        conf.subscription_initial_position(pulsar.InitialPosition.Latest)
        conf.schema(pulsar.schema.BytesSchema().schema_info())
        conf.batch_index_ack_enabled(self.batching)
        return conf

    def _subscribe_acking_at_once(
        self, handle: ConsumerHandle, consumer_name: str, size: int
    ) -> ConsumerHandle | None:
        """`subscribe` without a listener, its acknowledgement grouping turned off through
        the C API (the binding has no such option); None when the C API cannot set it."""
        conf = self._shared_consumer_conf(consumer_name, size)
        try:
            listened.ungroup_acknowledgements(conf)
        except NativeFlushUnavailable as e:
            log.debug("acknowledgements of %s stay grouped: %s", handle.topic, e)
            return None
        try:
            raw = self._client._client.subscribe(str(handle.topic), handle.subscription, conf)
        except (pulsar.Timeout, pulsar.ConnectError, pulsar.AuthenticationError) as e:
            raise self._unusable(f"cannot consume from {handle.topic}", e) from e
        except pulsar.PulsarException as e:
            raise BackendError(f"cannot consume from {handle.topic}: {e}") from e
        wrapper = pulsar.Consumer()
        wrapper._consumer = raw
        wrapper._client = self._client
        wrapper._schema = pulsar.schema.BytesSchema()
        self._client._consumers.append(wrapper)
        handle._wrapper = wrapper
        handle._consumer = raw
        handle._acknowledger = make_acknowledger(raw)
        handle.ack_grouping_ms = 0
        return handle

    def _subscribe_listened(
        self, handle: ConsumerHandle, consumer_name: str, size: int, listener: Listener
    ) -> ConsumerHandle:
        """`subscribe`, with the consumer's messages handed over by pulsar-client's listener
        thread to the process's reader (backend/listened.py)."""
        conf = self._shared_consumer_conf(consumer_name, size)
        handle._early = []  # until `ready`: its messages may come before subscribe returns
        key = listened.READER.register(handle, listener)
        # Before the first message can come: its take refills the budget of this key.
        handle._listen_key = key
        handle.receiver_queue_size = size
        listened.budget(key, size)
        in_lists = self.list_acks
        grouping = 0 if in_lists else self.ack_grouping_ms
        try:
            if grouping != PULSAR_ACK_GROUPING_MS:
                listened.group_acknowledgements(conf, grouping)
            listened.listen(conf, key)
            raw = self._client._client.subscribe(str(handle.topic), handle.subscription, conf)
        except BaseException as e:
            listened.READER.unregister(key)
            if isinstance(e, (pulsar.Timeout, pulsar.ConnectError, pulsar.AuthenticationError)):
                raise self._unusable(f"cannot consume from {handle.topic}", e) from e
            if isinstance(e, pulsar.PulsarException):
                raise BackendError(f"cannot consume from {handle.topic}: {e}") from e
            raise
        wrapper = pulsar.Consumer()
        wrapper._consumer = raw
        wrapper._client = self._client
        wrapper._schema = pulsar.schema.BytesSchema()
        self._client._consumers.append(wrapper)
        handle._wrapper = wrapper
        handle.made_listened(raw)
        handle.ack_grouping_ms = grouping
        handle.acks_in_lists = in_lists
        if not in_lists:
            self._count_consumer(handle)
        try:
            handle._listened_at = checked_consumer_address(raw)
        except NativeFlushUnavailable as e:
            # Listened, but with no way to acknowledge: not a consumer to keep.
            handle.close()
            raise BackendError(f"cannot consume from {handle.topic}: {e}") from e
        handle._acknowledger = (
            ListedAcknowledger(handle._listened_at)
            if in_lists
            else ListenedAcknowledger(handle._listened_at)
        )
        handle.ready()
        return handle

    def ack_only_consumer(
        self, topic: TopicName, subscription: str, consumer_name: str
    ) -> AckOnlyConsumer:
        """Blocking: a Shared consumer that is never given a message (no receiver queue:
        pulsar-client asks the broker for messages only in receive(), never called) and
        acknowledges messages by id. Raises BackendUnavailable or BackendError."""
        try:
            wrapper = self._client.subscribe(
                str(topic),
                subscription,
                consumer_type=pulsar.ConsumerType.Shared,
                receiver_queue_size=0,
                consumer_name=consumer_name,
                initial_position=pulsar.InitialPosition.Latest,
                batch_index_ack_enabled=self.batching,
            )
        except (pulsar.Timeout, pulsar.ConnectError, pulsar.AuthenticationError) as e:
            raise self._unusable(f"cannot consume from {topic}", e) from e
        except pulsar.PulsarException as e:
            raise BackendError(f"cannot consume from {topic}: {e}") from e
        return AckOnlyConsumer(wrapper)

    def create_subscription(self, topic: TopicName, subscription: str) -> None:
        """Blocking: make a durable subscription at the topic's latest position, and the
        topic when the broker may auto-create it, by subscribing a consumer that is never
        given a message (`ack_only_consumer`) and closing it.

        Over the binary protocol this costs the broker about two thirds of the CPU of the
        admin API's `PUT .../subscription/<s>` (docs/performance.md, "Setup and delete"). An
        existing subscription keeps its cursor. Raises BackendUnavailable, or BackendError
        when the broker refuses (no such topic and no auto-creation, no such namespace):
        the admin API then says why."""
        self.ack_only_consumer(topic, subscription, "starlight-subscription-maker").close()

    def drain_subscription(self, topic: TopicName, subscription: str, consumer_name: str) -> int:
        """Blocking: acknowledge every message the broker will hand out on `subscription`
        (its ready messages: those delivered to other consumers are not handed out) and
        return how many. Used by queue.purge when skip_all would drop unacked ones too."""
        handle = self.subscribe(topic, subscription, consumer_name, 100, None)
        drained = 0
        try:
            while (message := handle.receive(0.2)) is not None:
                handle.acknowledge(message)
                drained += 1
        finally:
            handle.close()
        return drained

    def close(self) -> None:
        try:
            self._client.close()
        except pulsar.PulsarException as e:
            log.debug("closing the Pulsar client: %s", e)
