"""What a consumer of a stream queue does differently (docs/mapping.md#stream-queues): it
must have a prefetch and acknowledge manually (RabbitMQ's errors otherwise), it starts where
its `x-stream-offset` argument says, reads through readers of its own (nothing is taken
from the queue), and each delivery carries its offset in the `x-stream-offset` header."""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import trio

from starlight_py.amqp.framing import encode_raw_properties
from starlight_py.backend.message_codec import DecodedMessage
from starlight_py.backend.pulsar_admin import PulsarAdmin
from starlight_py.backend.pulsar_client import Listener, PulsarBackend
from starlight_py.backend.stream_reader import StreamReaderHandle, open_stream_reader
from starlight_py.model.naming import TopicName
from starlight_py.model.streams import (
    OFFSET_ARGUMENT,
    OFFSET_HEADER,
    StreamStart,
    check_stream_consume,
    is_stream,
    offset_of,
    stream_start,
)
from starlight_py.model.topology import Queue


def stream_start_of(
    record: Queue,
    vhost: str,
    prefetch: int,
    no_ack: bool,
    arguments: Mapping[str, Any] | None,
) -> StreamStart | None:
    """Where a new consumer of `record` starts, None when it is not a stream. Raises
    PreconditionFailed (no prefetch, a bad x-stream-offset) or NotImplementedMethod
    (automatic acknowledgement), as RabbitMQ."""
    if not is_stream(record.arguments):
        return None
    check_stream_consume(record.name, vhost, prefetch, no_ack)
    value = (arguments or {}).get(OFFSET_ARGUMENT)
    return stream_start(value, record.name, vhost, int(time.time() * 1000))


async def open_stream_handle(
    backend: PulsarBackend,
    admin: PulsarAdmin,
    topic: TopicName,
    subscription: str,
    start: StreamStart,
    reader_name: str,
    receiver_queue_size: int,
    listener: Listener,
    floors: dict[str, int],
) -> StreamReaderHandle:
    """A reader of one of a stream's topics (`subscription`: the stream's binding
    subscription on it), from `start` but never before what the stream still retains: the
    first message its subscription has not let go of (x-max-age, x-max-length-bytes), whose
    offset goes into `floors`. Raises BackendUnavailable, BackendError, PulsarAdminError."""
    mark = await trio.to_thread.run_sync(admin.cursor_position, topic, subscription)
    floor = (
        0 if mark is None else offset_of(replace(mark, entry_id=mark.entry_id + 1, batch_index=0))
    )
    floors[subscription] = floor
    if start.kind == "last":
        last = await trio.to_thread.run_sync(admin.last_message_id, topic)
        # From the start of the last entry (a Pulsar batch, like RabbitMQ's last chunk).
        start = (
            StreamStart("first")
            if last is None
            else StreamStart("offset", offset=offset_of(replace(last, batch_index=0)))
        )
    if (start.kind == "first" and floor) or (start.kind == "offset" and start.offset < floor):
        start = StreamStart("offset", offset=floor)
    return await trio.to_thread.run_sync(
        open_stream_reader,
        backend,
        topic,
        subscription,
        start,
        reader_name,
        receiver_queue_size,
        listener,
    )


def with_offset_header(decoded: DecodedMessage, offset: int) -> bytes:
    """The message's property bytes with `x-stream-offset: offset` among its headers."""
    properties = copy.copy(decoded.decoded_properties)  # decoded once already
    headers = dict(properties.headers or {})
    headers[OFFSET_HEADER] = offset
    properties.headers = headers
    return encode_raw_properties(properties)
