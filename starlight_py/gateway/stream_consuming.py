"""What a consumer of a stream queue does differently (docs/mapping.md#stream-queues): it
must have a prefetch and acknowledge manually (RabbitMQ's errors otherwise), it starts where
its `x-stream-offset` argument says, reads through readers of its own (nothing is taken
from the queue), and each delivery carries its offset in the `x-stream-offset` header."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from starlight_py.amqp.framing import decode_raw_properties, encode_raw_properties
from starlight_py.backend.message_codec import DecodedMessage
from starlight_py.model.streams import (
    OFFSET_ARGUMENT,
    OFFSET_HEADER,
    StreamStart,
    check_stream_consume,
    is_stream,
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


def with_offset_header(decoded: DecodedMessage, offset: int) -> bytes:
    """The message's property bytes with `x-stream-offset: offset` among its headers."""
    properties = decode_raw_properties(decoded.raw_properties)
    headers = dict(properties.headers or {})
    headers[OFFSET_HEADER] = offset
    properties.headers = headers
    return encode_raw_properties(properties)
