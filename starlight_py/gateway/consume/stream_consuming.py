"""What a consumer of a stream queue does differently (docs/mapping.md#stream-queues): it
must have a prefetch and acknowledge manually (RabbitMQ's errors otherwise), it starts where
its `x-stream-offset` argument says, reads through readers of its own (nothing is taken
from the queue), and each delivery carries its offset in the `x-stream-offset` header."""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from typing import Any

import trio

from starlight_py.amqp.errors import PreconditionFailed
from starlight_py.amqp.framing import encode_raw_properties
from starlight_py.amqp.method_ids import BASIC_CONSUME
from starlight_py.backend.message_codec import DecodedMessage
from starlight_py.backend.pulsar_admin import PulsarAdmin
from starlight_py.backend.pulsar_client import Listener, PulsarBackend
from starlight_py.backend.stream_index import NoStreamIndex, entry_index, locate
from starlight_py.backend.stream_reader import (
    StreamMessage,
    StreamReaderHandle,
    open_stream_reader,
)
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import TopicName, exchange_topic
from starlight_py.model.positions import MessageIdRecord
from starlight_py.model.streams import (
    OFFSET_ARGUMENT,
    OFFSET_HEADER,
    EntryIndex,
    IndexLookup,
    StreamStart,
    check_stream_consume,
    is_stream,
    lane_of,
    resolve_offset,
    stream_offset,
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


async def topic_starts(
    admin: PulsarAdmin, namespace: NamespaceName, queue: str, topics: list[str], start: StreamStart
) -> dict[str, StreamStart]:
    """Where a new consumer of stream `queue` starts on each of its `topics` (local names):
    a numeric offset is looked up in its topic's index (model/streams.py's
    `resolve_offset`); any other start is the same on every topic. Raises
    PreconditionFailed when the brokers give the topic's messages no index, BackendError,
    BackendUnavailable, PulsarAdminError."""
    if start.kind != "offset":
        return {topic: start for topic in topics}

    def lookup(topic: str, index: int) -> IndexLookup:
        return locate(admin, TopicName(namespace, topic), index)

    own = exchange_topic(namespace, "", "direct", queue).local
    try:
        return await trio.to_thread.run_sync(resolve_offset, start.offset, own, topics, lookup)
    except NoStreamIndex as e:
        raise PreconditionFailed(
            f"cannot start queue '{queue}' at x-stream-offset {start.offset}: {e}", BASIC_CONSUME
        ) from e


async def open_stream_handle(
    backend: PulsarBackend,
    admin: PulsarAdmin,
    topic: TopicName,
    subscription: str,
    start: StreamStart,
    reader_name: str,
    receiver_queue_size: int,
    listener: Listener,
    floors: dict[str, MessageIdRecord],
) -> StreamReaderHandle:
    """A reader of one of a stream's topics (`subscription`: the stream's binding
    subscription on it), from `start` (resolved for the topic: `topic_starts`) but never
    before what the stream still retains: the first message its subscription has not let
    go of (x-max-age, x-max-length-bytes), whose position goes into `floors`. Raises
    BackendUnavailable, BackendError, PulsarAdminError."""
    mark = await trio.to_thread.run_sync(admin.cursor_position, topic, subscription)
    floor = None if mark is None else MessageIdRecord(mark.ledger_id, mark.entry_id + 1)
    if floor is not None:
        floors[subscription] = floor
    if start.kind == "last":
        last = await trio.to_thread.run_sync(admin.last_message_id, topic)
        # From the start of the last entry (a Pulsar batch, like RabbitMQ's last chunk).
        start = (
            StreamStart("first")
            if last is None
            else StreamStart("at", position=MessageIdRecord(last.ledger_id, last.entry_id))
        )
    if floor is not None and (
        start.kind == "first"
        or (start.kind == "at" and start.position is not None and start.position < floor)
    ):
        start = StreamStart("at", position=floor, index=start.index)

    def probe(ledger: int, entry: int) -> EntryIndex:
        return entry_index(admin, topic, ledger, entry)

    return await trio.to_thread.run_sync(
        open_stream_reader,
        backend,
        topic,
        subscription,
        start,
        reader_name,
        receiver_queue_size,
        listener,
        probe,
    )


def delivered_offset(own_topic: str, message: StreamMessage) -> int:
    """The x-stream-offset of a message read from one of a stream's topics."""
    return stream_offset(lane_of(message.handle.topic.local, own_topic), message.index)


def with_offset_header(decoded: DecodedMessage, offset: int) -> bytes:
    """The message's property bytes with `x-stream-offset: offset` among its headers."""
    properties = copy.copy(decoded.decoded_properties)  # decoded once already
    headers = dict(properties.headers or {})
    headers[OFFSET_HEADER] = offset
    properties.headers = headers
    return encode_raw_properties(properties)
