"""Stream queues (`x-queue-type: stream`): RabbitMQ's rules for declaring and consuming
them, and the numbers their offsets are made of.

A stream is an append-only log that consumers read from a position without taking anything
away. In the proxy a stream queue is stored like any queue (its bindings' topics, one
subscription per binding that nothing acknowledges, so Pulsar keeps every message), and each
AMQP consumer reads those topics from its own position (docs/mapping.md#stream-queues).

Offsets: RabbitMQ numbers a stream's messages 0, 1, 2...; the proxy numbers them from
their Pulsar message id, so that every proxy computes the same number and a client can
resume from it anywhere. The number is increasing along a topic but not dense (see
`offset_of`).
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlight_py.amqp.errors import NotImplementedMethod, PreconditionFailed
from starlight_py.model.positions import MessageIdRecord

STREAM_QUEUE_TYPE = "stream"
# What RabbitMQ calls the type in its reply texts.
STREAM_TYPE_NAME = "rabbit_stream_queue"
OFFSET_ARGUMENT = "x-stream-offset"
OFFSET_HEADER = "x-stream-offset"

# The queue arguments of a stream (RabbitMQ 3.10's rabbit_stream_queue:capabilities); any
# other x-argument RabbitMQ knows is refused "of queue type rabbit_stream_queue".
STREAM_ARGUMENTS = (
    "x-queue-type",
    "x-max-length-bytes",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
    "x-queue-leader-locator",
)
CLASSIC_ONLY_ARGUMENTS = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-single-active-consumer",
    "x-delivery-limit",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-quorum-initial-group-size",
)

# x-max-age and interval offsets: a positive integer and one unit (RabbitMQ's units).
_DURATION = re.compile(r"^([0-9]+)([YMDhms])$")
_UNIT_SECONDS = {
    "Y": 365 * 24 * 3600,
    "M": 30 * 24 * 3600,
    "D": 24 * 3600,
    "h": 3600,
    "m": 60,
    "s": 1,
}


def _text(value: Any) -> str | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def is_stream(arguments: Mapping[str, Any]) -> bool:
    """Whether queue arguments declare a stream queue."""
    return _text(arguments.get("x-queue-type")) == STREAM_QUEUE_TYPE


def duration_seconds(text: str) -> int | None:
    """Seconds of a RabbitMQ duration (`7D`, `1h`, `30m`: Y, M, D, h, m, s; a month is 30
    days, a year 365); None when it is not one or is zero."""
    match = _DURATION.match(text)
    if match is None:
        return None
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    return seconds or None


def check_stream_declare(
    name: str, vhost: str, durable: bool, exclusive: bool, auto_delete: bool, arguments: Any
) -> None:
    """The checks RabbitMQ makes of a stream queue after its arguments are validated one by
    one: arguments of other queue types, then the properties a stream cannot have. Raises
    PreconditionFailed with RabbitMQ 3.10's texts."""
    for key in CLASSIC_ONLY_ARGUMENTS:
        if key in arguments:
            raise PreconditionFailed(
                f"invalid arg '{key}' for queue '{name}' in vhost '{vhost}' of queue type "
                f"{STREAM_TYPE_NAME}",
                (50, 10),
            )
    for refused, prop in ((exclusive, "exclusive-owner"), (auto_delete, "auto-delete")):
        if refused:
            raise PreconditionFailed(
                f"invalid property '{prop}' for queue '{name}' in vhost '{vhost}'", (50, 10)
            )
    if not durable:
        raise PreconditionFailed(
            f"invalid property 'non-durable' for queue '{name}' in vhost '{vhost}'", (50, 10)
        )


def server_named_refused() -> PreconditionFailed:
    return PreconditionFailed(
        f"Cannot declare a server-named queue for type {STREAM_TYPE_NAME}", (50, 10)
    )


def _queue_text(name: str, vhost: str) -> str:
    return f"queue '{name}' in vhost '{vhost}'"


def get_refused(name: str, vhost: str) -> NotImplementedMethod:
    """basic.get on a stream: RabbitMQ closes the connection with 540."""
    return NotImplementedMethod(
        f"basic.get not supported by stream queues {_queue_text(name, vhost)}", (60, 70)
    )


def purge_refused(name: str, vhost: str) -> NotImplementedMethod:
    return NotImplementedMethod(
        f"queue.purge not supported by stream queues {_queue_text(name, vhost)}", (50, 30)
    )


def settle_refused(name: str, vhost: str, method: tuple[int, int]) -> NotImplementedMethod:
    """basic.nack or basic.reject of a stream's delivery (540, as RabbitMQ)."""
    return NotImplementedMethod(
        f"basic.nack and basic.reject not supported by stream queues {_queue_text(name, vhost)}",
        method,
    )


def check_stream_consume(name: str, vhost: str, prefetch: int, no_ack: bool) -> None:
    """RabbitMQ's conditions on a stream consumer, in its order: a per-consumer prefetch
    (406, a channel error), then manual acknowledgement (540, a connection error)."""
    if prefetch <= 0:
        raise PreconditionFailed(
            f"consumer prefetch count is not set for '{_queue_text(name, vhost)}'", (60, 20)
        )
    if no_ack:
        raise NotImplementedMethod(
            f"automatic acknowledgement not supported by stream queues {_queue_text(name, vhost)}",
            (60, 20),
        )


# ---- retention ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamRetention:
    """What a stream keeps: messages younger than `max_age_seconds` (x-max-age) and at most
    `max_bytes` of them (x-max-length-bytes, Pulsar's stored sizes); None: no bound."""

    max_age_seconds: int | None
    max_bytes: int | None

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> StreamRetention | None:
        """The retention of a stream's validated arguments; None for other queues and for
        a stream that keeps everything."""
        if not is_stream(arguments):
            return None
        age_text = _text(arguments.get("x-max-age"))
        age = duration_seconds(age_text) if age_text is not None else None
        size = arguments.get("x-max-length-bytes")
        max_bytes = size if isinstance(size, int) and not isinstance(size, bool) else None
        if age is None and max_bytes is None:
            return None
        return cls(age, max_bytes)

    def messages_over(self, backlog: int, backlog_bytes: int) -> int:
        """How many of the oldest messages to let go so that the rest fit in `max_bytes`
        (sizes taken as the backlog's average)."""
        if self.max_bytes is None or backlog <= 0 or backlog_bytes <= self.max_bytes:
            return 0
        average = backlog_bytes / backlog
        return min(backlog, math.ceil((backlog_bytes - self.max_bytes) / average))


# ---- where a consumer starts -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamStart:
    """Where a stream consumer starts reading.

    `kind` is "first", "last", "next", "offset" (from `offset` on) or "time" (messages
    published at `time_ms`, epoch milliseconds, or later)."""

    kind: str
    offset: int = 0
    time_ms: int = 0

    def admits(self, offset: int, publish_time_ms: int) -> bool:
        """Whether a message read from the start position is the consumer's: the reader may
        start a little before (the whole Pulsar batch of a numeric offset, the broker's
        seek by time), never after."""
        if self.kind == "offset":
            return offset >= self.offset
        if self.kind == "time":
            return publish_time_ms >= self.time_ms
        return True


def stream_start(value: Any, name: str, vhost: str, now_ms: int) -> StreamStart:
    """The start a consumer's `x-stream-offset` argument asks for (absent: `next`, as in
    RabbitMQ). A negative number is the first message. Raises PreconditionFailed with
    RabbitMQ's text for a value it refuses."""
    if value is None:
        return StreamStart("next")
    if isinstance(value, bool):
        raise _invalid_offset(name, vhost, "bool", str(value).lower())
    if isinstance(value, int):
        return StreamStart("offset", offset=max(0, value))
    if isinstance(value, datetime.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        return StreamStart("time", time_ms=int(moment.timestamp() * 1000))
    text = _text(value)
    if text is None:
        raise _invalid_offset(name, vhost, type(value).__name__, str(value))
    if text in ("first", "last", "next"):
        return StreamStart(text)
    seconds = duration_seconds(text)
    if seconds is None:
        raise _invalid_offset(name, vhost, "longstr", f'<<"{text}">>')
    return StreamStart("time", time_ms=now_ms - seconds * 1000)


def _invalid_offset(name: str, vhost: str, kind: str, shown: str) -> PreconditionFailed:
    return PreconditionFailed(
        f"invalid arg '{OFFSET_ARGUMENT}' for {_queue_text(name, vhost)}: "
        f"{{invalid_stream_offset_arg,{{{kind},{shown}}}}}",
        (60, 20),
    )


# ---- offsets <-> Pulsar message ids -----------------------------------------------------------

# An offset packs a message id into a positive signed 64-bit integer (the AMQP `long` of the
# x-stream-offset header): ledger id (31 bits) | entry id (20 bits) | index in a batch (12).
ENTRY_BITS = 20
BATCH_BITS = 12
MAX_LEDGER = (1 << 31) - 1
MAX_ENTRY = (1 << ENTRY_BITS) - 1
MAX_BATCH_INDEX = (1 << BATCH_BITS) - 1


def offset_of(position: MessageIdRecord) -> int:
    """The stream offset of the message at `position` in its topic: every proxy computes the
    same number, later messages of a topic have larger ones. Fields past their bits
    (ledger ids above 2^31, more than 2^20 entries in a ledger, batches of more than 4096
    messages: see docs/mapping.md) saturate, which keeps the order but not uniqueness."""
    ledger = min(max(position.ledger_id, 0), MAX_LEDGER)
    entry = min(max(position.entry_id, 0), MAX_ENTRY)
    batch = min(max(position.batch_index, 0), MAX_BATCH_INDEX)
    return (ledger << (ENTRY_BITS + BATCH_BITS)) | (entry << BATCH_BITS) | batch


def position_of(offset: int) -> MessageIdRecord:
    """The Pulsar position of a stream offset (the inverse of `offset_of`); a reader started
    there reads the offset's message (or the next one) first."""
    offset = max(0, offset)
    ledger = offset >> (ENTRY_BITS + BATCH_BITS)
    entry = (offset >> BATCH_BITS) & MAX_ENTRY
    batch = offset & MAX_BATCH_INDEX
    return MessageIdRecord(ledger, entry, batch)
