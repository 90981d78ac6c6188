"""Stream queues (`x-queue-type: stream`): RabbitMQ's rules for declaring and consuming
them, and the numbers their offsets are made of.

A stream is an append-only log that consumers read from a position without taking anything
away. In the proxy a stream queue is stored like any queue (its bindings' topics, one
subscription per binding that nothing acknowledges, so Pulsar keeps every message), and each
AMQP consumer reads those topics from its own position (docs/mapping.md#stream-queues).

Offsets: RabbitMQ numbers a stream's messages 0, 1, 2...; so does the proxy, with the index
Pulsar's brokers give every message of a topic (the stream's own topic; a topic read through
an exchange binding has a lane of its own: `stream_offset`, docs/mapping.md#stream-queues).
"""

from __future__ import annotations

import datetime
import hashlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlight_py.amqp.errors import NotImplementedMethod, PreconditionFailed
from starlight_py.amqp.method_ids import BASIC_CONSUME, BASIC_GET, QUEUE_DECLARE, QUEUE_PURGE
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


def _text_or_none(value: Any) -> str | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def is_stream(arguments: Mapping[str, Any]) -> bool:
    """Whether queue arguments declare a stream queue."""
    return _text_or_none(arguments.get("x-queue-type")) == STREAM_QUEUE_TYPE


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
                QUEUE_DECLARE,
            )
    for refused, prop in ((exclusive, "exclusive-owner"), (auto_delete, "auto-delete")):
        if refused:
            raise PreconditionFailed(
                f"invalid property '{prop}' for queue '{name}' in vhost '{vhost}'", QUEUE_DECLARE
            )
    if not durable:
        raise PreconditionFailed(
            f"invalid property 'non-durable' for queue '{name}' in vhost '{vhost}'", QUEUE_DECLARE
        )


def server_named_refused() -> PreconditionFailed:
    return PreconditionFailed(
        f"Cannot declare a server-named queue for type {STREAM_TYPE_NAME}", QUEUE_DECLARE
    )


def _queue_text(name: str, vhost: str) -> str:
    return f"queue '{name}' in vhost '{vhost}'"


def get_refused(name: str, vhost: str) -> NotImplementedMethod:
    """basic.get on a stream: RabbitMQ closes the connection with 540."""
    return NotImplementedMethod(
        f"basic.get not supported by stream queues {_queue_text(name, vhost)}", BASIC_GET
    )


def purge_refused(name: str, vhost: str) -> NotImplementedMethod:
    return NotImplementedMethod(
        f"queue.purge not supported by stream queues {_queue_text(name, vhost)}", QUEUE_PURGE
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
            f"consumer prefetch count is not set for '{_queue_text(name, vhost)}'", BASIC_CONSUME
        )
    if no_ack:
        raise NotImplementedMethod(
            f"automatic acknowledgement not supported by stream queues {_queue_text(name, vhost)}",
            BASIC_CONSUME,
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
        age_text = _text_or_none(arguments.get("x-max-age"))
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

    As the consumer asks (`stream_start`): `kind` "first", "last", "next", "offset" (from the
    stream offset `offset` on) or "time" (messages published at `time_ms`, epoch
    milliseconds, or later). Resolved for one of the stream's topics (`resolve_offset`,
    gateway/consume/stream_consuming.py), "at" too: from the entry at `position` on, the messages of
    index `index` and later."""

    kind: str
    offset: int = 0
    time_ms: int = 0
    position: MessageIdRecord | None = None
    index: int = 0

    def admits(self, index: int | None, publish_time_ms: int) -> bool:
        """Whether a message read from the start position is the consumer's: the reader may
        start a little before (the whole Pulsar batch of an index, the broker's seek by
        time), never after. A message whose index is unknown (None) is admitted."""
        if self.kind == "at":
            return index is None or index >= self.index
        if self.kind == "time":
            return publish_time_ms >= self.time_ms
        return True


def stream_start(value: Any, name: str, vhost: str, now_ms: int) -> StreamStart:
    """The start a consumer's `x-stream-offset` argument asks for (absent: `next`, as in
    RabbitMQ). A number of 0 or less is the first message. Raises PreconditionFailed with
    RabbitMQ's text for a value it refuses."""
    if value is None:
        return StreamStart("next")
    if isinstance(value, bool):
        raise _invalid_offset(name, vhost, "bool", str(value).lower())
    if isinstance(value, int):
        # Offset 0 (or less) is the stream's start on every topic, as on RabbitMQ.
        return StreamStart("offset", offset=value) if value > 0 else StreamStart("first")
    if isinstance(value, datetime.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        return StreamStart("time", time_ms=int(moment.timestamp() * 1000))
    text = _text_or_none(value)
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
        BASIC_CONSUME,
    )


# ---- offsets: Pulsar's message index -----------------------------------------------------------

# Every message of a topic has an index, 0, 1, 2, ... (Pulsar's broker entry metadata,
# backend/stream_index.py). The offset of a message of the stream's own topic (the default
# exchange's, amq.default~~<E(q)>) is its index: RabbitMQ's numbers. A topic the stream
# reads through an exchange binding numbers its messages in a lane of its own, above them:
# lane << INDEX_BITS | index, the lane a digest of the topic's name (docs/mapping.md).
INDEX_BITS = 40
LANE_BITS = 22  # lane and index fill a positive signed 64-bit `long`
MAX_INDEX = (1 << INDEX_BITS) - 1
EXCHANGE_LANES = (1 << LANE_BITS) - 1  # lanes 1 .. EXCHANGE_LANES
# The x-stream-offset of a message that has no index (written by a broker without the
# index interceptor): resuming from it is resuming from `first`.
UNKNOWN_OFFSET = -1


def lane_of(topic: str, own_topic: str) -> int:
    """The lane of offsets of a stream's topic (local names): 0 for its own topic, else
    1 .. EXCHANGE_LANES from the topic's name, so every proxy computes the same."""
    if topic == own_topic:
        return 0
    digest = hashlib.blake2b(topic.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return 1 + int.from_bytes(digest, "big") % EXCHANGE_LANES


def stream_offset(lane: int, index: int | None) -> int:
    """The offset of the message of `index` in the topic of `lane` (UNKNOWN_OFFSET when
    it has no index)."""
    if index is None or index < 0:
        return UNKNOWN_OFFSET
    return (lane << INDEX_BITS) | min(index, MAX_INDEX)


def split_offset(offset: int) -> tuple[int, int]:
    """(lane, index) of a stream offset (the inverse of `stream_offset`)."""
    offset = max(0, offset)
    return offset >> INDEX_BITS, offset & MAX_INDEX


@dataclass(frozen=True, slots=True)
class EntryIndex:
    """A stored entry of a topic and the index of its last message (a batch entry holds
    `size` messages, indexes `first_index` .. `last_index`)."""

    ledger_id: int
    entry_id: int
    last_index: int
    size: int = 1
    publish_time_ms: int = 0

    @property
    def first_index(self) -> int:
        return self.last_index - max(1, self.size) + 1

    @property
    def position(self) -> MessageIdRecord:
        return MessageIdRecord(self.ledger_id, self.entry_id)


@dataclass(frozen=True, slots=True)
class IndexLookup:
    """Where a message index is in a topic: `kind` "at" (`entry` holds it), "before" (it is
    older than anything the topic still stores: `entry` is the first stored) or "past" (not
    written yet: `entry` is the last one written, None when the topic has none)."""

    kind: str
    entry: EntryIndex | None = None


def locate_index(
    ledgers: Sequence[tuple[int, int]], index: int, probe: Callable[[int, int], EntryIndex]
) -> IndexLookup:
    """Find the entry holding message `index` among `ledgers` ((ledger id, entries), oldest
    first), reading entries with `probe(ledger, entry)`: a binary search over the ledgers by
    their last entry, then a search of the entries of the one found
    (`_first_entry_reaching`). Raises what `probe` raises."""
    stored = [(ledger, entries) for ledger, entries in ledgers if entries > 0]
    if not stored:
        return IndexLookup("past")
    seen: dict[tuple[int, int], EntryIndex] = {}

    def read(ledger: int, entry: int) -> EntryIndex:
        found = seen.get((ledger, entry))
        if found is None:
            found = seen[(ledger, entry)] = probe(ledger, entry)
        return found

    low, high = 0, len(stored)
    while low < high:
        middle = (low + high) // 2
        ledger, entries = stored[middle]
        if read(ledger, entries - 1).last_index >= index:
            high = middle
        else:
            low = middle + 1
    if low == len(stored):
        ledger, entries = stored[-1]
        return IndexLookup("past", read(ledger, entries - 1))
    ledger, entries = stored[low]
    first = _first_entry_reaching(index, entries, lambda entry: read(ledger, entry).last_index)
    found = read(ledger, first)
    if low == 0 and first == 0 and found.first_index > index:
        return IndexLookup("before", found)
    return IndexLookup("at", found)


def _first_entry_reaching(index: int, entries: int, last_index: Callable[[int], int]) -> int:
    """The first of `entries` entries (the last one reaching it) whose last index is at
    least `index`. Entries usually hold alike numbers of messages, so each step guesses by
    interpolation and looks at the guess's neighbour too: two or three reads for a ledger
    of single messages; a step that narrows less falls back to halving."""
    low, high = 0, entries - 1  # last_index(low) < index <= last_index(high), once low is
    if low == high or last_index(low) >= index:
        return low
    halve = False
    while high - low > 1:
        if halve:
            guess = (low + high) // 2
        else:
            below, above = last_index(low), last_index(high)
            guess = low + (index - below) * (high - low) // max(1, above - below)
            guess = min(max(guess, low + 1), high - 1)
        before = high - low
        if last_index(guess) >= index:
            high = guess
            if guess - 1 > low and last_index(guess - 1) < index:
                low = guess - 1
        else:
            low = guess
            if guess + 1 < high and last_index(guess + 1) >= index:
                high = guess + 1
        halve = not halve and (high - low) * 2 > before
    return high


def resolve_offset(
    offset: int, own_topic: str, topics: Sequence[str], lookup: Callable[[str, int], IndexLookup]
) -> dict[str, StreamStart]:
    """Where each of a stream's topics starts for a consumer of stream offset `offset`:
    the topic of its lane exactly at its index (`lookup(topic, index)`); the others at the
    time that message was published (from their start when it is older than what its
    topic keeps, from their end when it is not written yet). An offset of no lane of the
    stream is past every topic's end: they start at their end (RabbitMQ's `next` for an
    offset past a stream's end). Raises what `lookup` raises."""
    lane, index = split_offset(offset)
    anchor = next((t for t in topics if lane_of(t, own_topic) == lane), None)
    if anchor is None:
        return {topic: StreamStart("next") for topic in topics}
    found = lookup(anchor, index)
    entry = found.entry
    if found.kind == "at" and entry is not None:
        starts = {topic: StreamStart("time", time_ms=entry.publish_time_ms) for topic in topics}
        starts[anchor] = StreamStart("at", position=entry.position, index=index)
        return starts
    if found.kind == "past":
        starts = {topic: StreamStart("next") for topic in topics}
        # From the last entry written, so that what is written meanwhile is not missed.
        starts[anchor] = (
            StreamStart("first")
            if entry is None
            else StreamStart("at", position=entry.position, index=entry.last_index + 1)
        )
        return starts
    return {topic: StreamStart("first") for topic in topics}


class IndexCounter:
    """The indexes of the messages one reader reads from a topic, in the topic's order.

    The index of the first message read in a ledger comes from the broker
    (`anchor`, with the entry read through the admin API); the next ones are counted: the
    messages of an entry are numbered by their batch index, and an entry follows the
    previous one's last message, one more per entry skipped (a large message's chunks).
    `index` answers None when it cannot count (the first message, a new ledger): then
    `anchor` it."""

    def __init__(self) -> None:
        self._ledger = -1
        self._entry = -1
        self._first = 0
        self._size = 0

    def index(self, position: MessageIdRecord) -> int | None:
        """The index of the message at `position`, or None when it needs an anchor."""
        batch = max(position.batch_index, 0)
        if position.ledger_id != self._ledger or position.entry_id < self._entry:
            return None
        if position.entry_id > self._entry:
            self._first += self._size + (position.entry_id - self._entry - 1)
            self._entry = position.entry_id
            self._size = 0
        self._size = max(self._size, batch + 1)
        return self._first + batch

    def anchor(self, position: MessageIdRecord, entry: EntryIndex) -> int:
        """The index of the message at `position`, `entry` being its entry as the broker
        stores it; counting goes on from there."""
        self._ledger, self._entry = entry.ledger_id, entry.entry_id
        self._first = entry.first_index
        self._size = max(1, entry.size)
        return self._first + max(position.batch_index, 0)
