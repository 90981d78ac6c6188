"""Reading a stream queue's topic from a position: a Pulsar reader (a non-durable cursor of
its own) per AMQP consumer and topic, so that consumers read independently and nothing they
do removes a message (docs/mapping.md#stream-queues).

A `StreamReaderHandle` is a `ConsumerHandle` to the rest of the gateway (pause, resume,
close, batches handed to a listener from a thread of its own); acknowledging through it does
nothing, because a reader has nothing to acknowledge.
"""

from __future__ import annotations

import logging
from typing import Any

import pulsar

from starlight_py.backend.pulsar_client import (
    READ_BATCH,
    BackendError,
    ConsumerHandle,
    Listener,
    PulsarBackend,
    ReceivedMessage,
)
from starlight_py.model.naming import TopicName
from starlight_py.model.streams import StreamStart, position_of

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
    if start.kind == "offset":
        # The whole entry of the offset's message: the gateway drops what is before it in a
        # batch (StreamStart.admits).
        position = position_of(start.offset)
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
) -> StreamReaderHandle:
    """Blocking: a reader of `topic` from `start`, handing batches to `listener` from a
    thread of its own. Raises BackendUnavailable or BackendError."""
    handle = StreamReaderHandle(topic, subscription)
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
