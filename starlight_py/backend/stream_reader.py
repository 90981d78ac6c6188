"""Reading a stream queue's topic from a position: a Pulsar reader (a non-durable cursor of
its own) per AMQP consumer and topic, so that consumers read independently and nothing they
do removes a message (docs/mapping.md#stream-queues).

A `StreamReaderHandle` is a `ConsumerHandle` to the rest of the gateway (pause, resume,
close, batches handed to a listener from a thread of its own); acknowledging through it does
nothing, because a reader has nothing to acknowledge. It hands over `StreamMessage`s, which
carry their index in the topic (backend/stream_index.py): read from the broker for the first
message of each ledger, counted for the others (model/streams.py's `IndexCounter`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pulsar

from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdminError
from starlight_py.backend.pulsar_client import (
    READ_BATCH,
    BackendError,
    ConsumerHandle,
    Listener,
    PulsarBackend,
    ReceivedMessage,
)
from starlight_py.backend.stream_index import NoStreamIndex
from starlight_py.model.naming import TopicName
from starlight_py.model.positions import MessageIdRecord
from starlight_py.model.streams import EntryIndex, IndexCounter, StreamStart

# Reads one entry's index from the broker: (ledger, entry) -> EntryIndex. Raises
# NoStreamIndex, PulsarAdminError, BackendUnavailable.
EntryProbe = Callable[[int, int], EntryIndex]
# A failed read of an entry's index is tried again this many times, this long apart.
PROBE_ATTEMPTS = 5
PROBE_RETRY_WAIT = 0.2


class StreamMessage(ReceivedMessage):
    """A message read from a stream's topic, with its index in the topic (None: unknown,
    the broker gave its entry none)."""

    __slots__ = ("index",)

    def __init__(self, raw: Any, handle: ConsumerHandle, index: int | None) -> None:
        super().__init__(raw, handle)
        self.index = index


log = logging.getLogger("starlight.backend")

# How long a reader thread blocks for the first message of a batch (then it looks whether
# it was closed), and for each further one.
FIRST_WAIT_MS = 200
NEXT_WAIT_MS = 1


class StreamReaderHandle(ConsumerHandle):
    """A Pulsar reader on one topic of a stream queue (`subscription` names the binding
    subscription it stands for, as the gateway keys consumers by it)."""

    def acknowledge(self, message: ReceivedMessage) -> None:
        """Nothing to acknowledge: the stream keeps every message."""

    def acknowledge_all(self, messages: list[ReceivedMessage]) -> None:
        """Nothing to acknowledge: the stream keeps every message."""

    def negative_acknowledge(self, message: ReceivedMessage) -> None:
        """Nothing goes back: the reader has moved on, as a RabbitMQ stream consumer."""

    _THREAD_NAME = b"starlight-strm"

    def __init__(self, topic: TopicName, subscription: str, probe: EntryProbe) -> None:
        super().__init__(topic, subscription)
        self._probe = probe
        self._counter = IndexCounter()
        # The entry (ledger, entry) whose index could not be read: its other messages are
        # not asked for again; and a ledger whose entries have no index.
        self._failed = (-1, -1)
        self._unindexed_ledger = -1

    def _received(self, batch: list[Any]) -> list[ReceivedMessage]:
        received: list[ReceivedMessage] = []
        for raw in batch:
            message = StreamMessage(raw, self, None)
            message.index = self._index_of(message.position)
            received.append(message)
        return received

    def _index_of(self, position: MessageIdRecord) -> int | None:
        index = self._counter.index(position)
        if index is not None:
            return index
        where = (position.ledger_id, position.entry_id)
        if where == self._failed or position.ledger_id == self._unindexed_ledger:
            return None
        for attempt in range(PROBE_ATTEMPTS):
            try:
                entry = self._probe(*where)
            except NoStreamIndex as e:
                if self._unindexed_ledger == -1:
                    log.error("stream offsets unknown (x-stream-offset -1): %s", e)
                self._unindexed_ledger = position.ledger_id
                return None
            except (PulsarAdminError, BackendUnavailable) as e:
                if attempt == PROBE_ATTEMPTS - 1:
                    log.warning("cannot read the index of %s in %s: %s", position, self.topic, e)
                    self._failed = where
                    return None
                time.sleep(PROBE_RETRY_WAIT)
                continue
            return self._counter.anchor(position, entry)
        return None

    def _next_batch(self) -> list[Any]:
        reader = self._consumer
        try:
            batch = [reader.read_next(FIRST_WAIT_MS)]
        except pulsar.Timeout:
            return []  # then the loop looks whether it was closed
        while len(batch) < READ_BATCH:
            try:
                batch.append(reader.read_next(NEXT_WAIT_MS))
            except pulsar.Timeout:
                break
        return batch


def _start_id(start: StreamStart) -> tuple[Any, bool]:
    """The reader's start message id and whether it is inclusive."""
    if start.kind == "at" and start.position is not None:
        # The whole entry: the gateway drops what is before the start in a batch
        # (StreamStart.admits).
        position = start.position
        return pulsar.MessageId(-1, position.ledger_id, position.entry_id, -1), True
    if start.kind == "last":
        return pulsar.MessageId.latest, True
    if start.kind == "next":
        return pulsar.MessageId.latest, False
    return pulsar.MessageId.earliest, True  # first, and time (then a seek)


def open_stream_reader(
    backend: PulsarBackend,
    topic: TopicName,
    subscription: str,
    start: StreamStart,
    reader_name: str,
    receiver_queue_size: int,
    listener: Listener,
    probe: EntryProbe,
) -> StreamReaderHandle:
    """Blocking: a reader of `topic` from `start`, handing batches of StreamMessages to
    `listener` from a thread of its own (`probe` reads an entry's index from the broker).
    Raises BackendUnavailable or BackendError."""
    handle = StreamReaderHandle(topic, subscription, probe)
    start_id, inclusive = _start_id(start)
    try:
        wrapper = backend._client.create_reader(
            str(topic),
            start_id,
            receiver_queue_size=max(1, receiver_queue_size),
            reader_name=reader_name,
            start_message_id_inclusive=inclusive,
        )
        if start.kind == "time":
            wrapper.seek(start.time_ms)
    except (pulsar.Timeout, pulsar.ConnectError, pulsar.AuthenticationError) as e:
        raise backend._unusable(f"cannot read {topic}", e) from e
    except pulsar.PulsarException as e:
        raise BackendError(f"cannot read {topic}: {e}") from e
    handle._wrapper = wrapper
    handle._consumer = wrapper._reader
    handle.start_reading(listener)
    return handle
