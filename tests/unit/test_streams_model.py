"""Stream queues' rules (model/streams.py): declare and consume checks with RabbitMQ 3.10's
texts, x-stream-offset values, and offsets made of Pulsar's message index (lanes, looking
an index up, counting indexes along a reader)."""

from __future__ import annotations

import datetime
import random
from typing import Any

import pytest
from pamqp import commands

from starlight_py.amqp.errors import NotImplementedMethod, PreconditionFailed
from starlight_py.amqp.framing import decode_raw_properties, encode_raw_properties
from starlight_py.backend.message_codec import DecodedMessage
from starlight_py.gateway.consume.stream_consuming import with_offset_header
from starlight_py.model.positions import MessageIdRecord
from starlight_py.model.queue_limits import LengthLimit
from starlight_py.model.streams import (
    EntryIndex,
    IndexCounter,
    IndexLookup,
    StreamRetention,
    StreamStart,
    check_stream_consume,
    duration_seconds,
    is_stream,
    lane_of,
    locate_index,
    resolve_offset,
    split_offset,
    stream_offset,
    stream_start,
)
from starlight_py.model.topology import Queue, validate_queue

STREAM = {"x-queue-type": "stream"}
NOW_MS = 1_700_000_000_000


def refusal(queue: Queue) -> str:
    with pytest.raises(PreconditionFailed) as info:
        validate_queue(queue, "/")
    return info.value.text


def test_a_durable_stream_is_valid() -> None:
    validate_queue(Queue("s", arguments={**STREAM, "x-max-age": "7D"}), "/")
    assert is_stream(STREAM) and is_stream({"x-queue-type": b"stream"})
    assert not is_stream({}) and not is_stream({"x-queue-type": "classic"})


@pytest.mark.parametrize(
    ("queue", "text"),
    [
        (Queue("s", exclusive=True, arguments=STREAM), "invalid property 'exclusive-owner'"),
        (Queue("s", auto_delete=True, arguments=STREAM), "invalid property 'auto-delete'"),
        (Queue("s", durable=False, arguments=STREAM), "invalid property 'non-durable'"),
        (
            Queue("s", durable=False, exclusive=True, arguments={**STREAM, "x-max-length": 5}),
            "invalid arg 'x-max-length'",
        ),
        (
            Queue("s", durable=False, arguments={**STREAM, "x-max-age": "1x"}),
            "invalid arg 'x-max-age'",
        ),
    ],
)
def test_rabbitmq_order_of_stream_refusals(queue: Queue, text: str) -> None:
    assert refusal(queue).startswith(text + " for queue 's' in vhost '/'")


def test_arguments_of_other_queue_types_name_the_stream_type() -> None:
    assert refusal(Queue("s", arguments={**STREAM, "x-message-ttl": 5})) == (
        "invalid arg 'x-message-ttl' for queue 's' in vhost '/' of queue type rabbit_stream_queue"
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7D", 7 * 86400), ("1h", 3600), ("30m", 1800), ("10s", 10), ("1Y", 365 * 86400)],
)
def test_durations(text: str, seconds: int) -> None:
    assert duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["0s", "10", "1.5h", "h", "1x", "", "-1s"])
def test_not_durations(text: str) -> None:
    assert duration_seconds(text) is None


def test_a_stream_length_in_bytes_is_no_queue_limit() -> None:
    assert LengthLimit.of({**STREAM, "x-max-length-bytes": 100}) is None
    assert LengthLimit.of({"x-max-length-bytes": 100}) is not None


def test_consume_checks_prefetch_before_auto_ack() -> None:
    with pytest.raises(PreconditionFailed) as info:
        check_stream_consume("s", "/", 0, True)
    assert info.value.text == "consumer prefetch count is not set for 'queue 's' in vhost '/''"
    with pytest.raises(NotImplementedMethod):
        check_stream_consume("s", "/", 10, True)
    check_stream_consume("s", "/", 10, False)


@pytest.mark.parametrize(
    ("value", "start"),
    [
        (None, StreamStart("next")),
        ("first", StreamStart("first")),
        (b"last", StreamStart("last")),
        ("next", StreamStart("next")),
        (42, StreamStart("offset", offset=42)),
        (0, StreamStart("first")),
        (-3, StreamStart("first")),
        ("30m", StreamStart("time", time_ms=NOW_MS - 1_800_000)),
        (
            datetime.datetime.fromtimestamp(NOW_MS / 1000, tz=datetime.UTC),
            StreamStart("time", time_ms=NOW_MS),
        ),
        (
            datetime.datetime.fromtimestamp(NOW_MS / 1000, tz=datetime.UTC).replace(tzinfo=None),
            StreamStart("time", time_ms=NOW_MS),
        ),
    ],
)
def test_offset_arguments(value: Any, start: StreamStart) -> None:
    assert stream_start(value, "s", "/", NOW_MS) == start


@pytest.mark.parametrize("value", ["0s", "5", "bogus", True, 1.5])
def test_refused_offset_arguments(value: Any) -> None:
    with pytest.raises(PreconditionFailed) as info:
        stream_start(value, "s", "/", NOW_MS)
    assert info.value.text.startswith(
        "invalid arg 'x-stream-offset' for queue 's' in vhost '/': {invalid_stream_offset_arg,"
    )


OWN = "amq.default~~s"
FANOUT = "orders"


def test_own_topic_offsets_are_the_index_and_exchange_topics_have_lanes() -> None:
    assert [stream_offset(lane_of(OWN, OWN), i) for i in range(3)] == [0, 1, 2]
    lane = lane_of(FANOUT, OWN)
    assert lane == lane_of(FANOUT, OWN) >= 1  # the same on every proxy
    assert lane != lane_of("amq.direct~~k", OWN)
    offset = stream_offset(lane, 5)
    assert 2**40 <= offset < 2**63
    assert split_offset(offset) == (lane, 5)
    assert split_offset(7) == (0, 7)
    assert stream_offset(lane, None) == stream_offset(0, -1) == -1


# Ledger 3: entries 0-4 single messages (0-4), entry 5 a batch of 7 (5-11), 6-8 (12-14);
# ledger 9: two batches of 3 (15-17, 18-20).
ENTRIES = {
    (3, 0): EntryIndex(3, 0, 0),
    (3, 1): EntryIndex(3, 1, 1),
    (3, 2): EntryIndex(3, 2, 2),
    (3, 3): EntryIndex(3, 3, 3),
    (3, 4): EntryIndex(3, 4, 4),
    (3, 5): EntryIndex(3, 5, 11, 7, 1000),
    (3, 6): EntryIndex(3, 6, 12),
    (3, 7): EntryIndex(3, 7, 13),
    (3, 8): EntryIndex(3, 8, 14),
    (9, 0): EntryIndex(9, 0, 17, 3, 2000),
    (9, 1): EntryIndex(9, 1, 20, 3, 3000),
}
LEDGERS = [(3, 9), (5, 0), (9, 2)]


def probe(ledger: int, entry: int) -> EntryIndex:
    return ENTRIES[(ledger, entry)]


@pytest.mark.parametrize(
    ("index", "kind", "entry"),
    [
        (0, "at", (3, 0)),
        (4, "at", (3, 4)),
        (5, "at", (3, 5)),
        (8, "at", (3, 5)),
        (11, "at", (3, 5)),
        (12, "at", (3, 6)),
        (15, "at", (9, 0)),
        (19, "at", (9, 1)),
        (21, "past", (9, 1)),
        (10**9, "past", (9, 1)),
    ],
)
def test_locate_an_index(index: int, kind: str, entry: tuple[int, int]) -> None:
    found = locate_index(LEDGERS, index, probe)
    assert found == IndexLookup(kind, ENTRIES[entry])


def test_locate_before_what_is_kept_and_in_an_empty_topic() -> None:
    # Ledger 3 trimmed (retention): index 2 is older than anything stored.
    assert locate_index([(9, 2)], 2, probe) == IndexLookup("before", ENTRIES[(9, 0)])
    assert locate_index([], 0, probe) == IndexLookup("past")
    assert locate_index([(4, 0)], 3, probe) == IndexLookup("past")


def test_locate_reads_few_entries() -> None:
    # A million single-message entries in 20 ledgers: the ledgers halved, then the entries
    # of one guessed by interpolation.
    ledgers = [(ledger, 50_000) for ledger in range(20)]
    reads: list[tuple[int, int]] = []

    def counted(ledger: int, entry: int) -> EntryIndex:
        reads.append((ledger, entry))
        return EntryIndex(ledger, entry, ledger * 50_000 + entry)

    for wanted in (765_432, 0, 999_999, 50_000, 49_999):
        reads.clear()
        found = locate_index(ledgers, wanted, counted)
        assert found.entry == EntryIndex(*divmod(wanted, 50_000), wanted)
        assert len(reads) <= 10


@pytest.mark.parametrize("seed", range(20))
def test_locate_finds_every_index_whatever_the_batches(seed: int) -> None:
    rng = random.Random(seed)
    entries: dict[tuple[int, int], EntryIndex] = {}
    ledgers = []
    last = -1
    for ledger in range(rng.randint(1, 4)):
        count = rng.randint(1, 300)
        ledgers.append((ledger, count))
        for entry in range(count):
            size = rng.choice([1, 1, 1, 2, 7, 100, 1000])
            last += size
            entries[(ledger, entry)] = EntryIndex(ledger, entry, last, size)
    reads = 0

    def probe(ledger: int, entry: int) -> EntryIndex:
        nonlocal reads
        reads += 1
        return entries[(ledger, entry)]

    for wanted in sorted(rng.sample(range(last + 1), min(last + 1, 60))):
        reads = 0
        found = locate_index(ledgers, wanted, probe)
        assert found.kind == "at" and found.entry is not None
        assert found.entry.first_index <= wanted <= found.entry.last_index
        assert reads <= 2 * 12 + 4  # never worse than about twice a binary search
    assert locate_index(ledgers, last + 1, probe).kind == "past"


def lookup_in(found: dict[str, IndexLookup]) -> Any:
    def lookup(topic: str, index: int) -> IndexLookup:
        return found[topic]

    return lookup


def test_a_numeric_offset_starts_its_topic_at_the_index_and_others_at_its_time() -> None:
    lookup = lookup_in({OWN: IndexLookup("at", ENTRIES[(3, 5)])})
    starts = resolve_offset(8, OWN, [OWN, FANOUT], lookup)
    assert starts == {
        OWN: StreamStart("at", position=MessageIdRecord(3, 5), index=8),
        FANOUT: StreamStart("time", time_ms=1000),
    }
    # An offset of the exchange topic's lane: the other way round.
    lookup = lookup_in({FANOUT: IndexLookup("at", ENTRIES[(9, 1)])})
    starts = resolve_offset(stream_offset(lane_of(FANOUT, OWN), 19), OWN, [OWN, FANOUT], lookup)
    assert starts == {
        OWN: StreamStart("time", time_ms=3000),
        FANOUT: StreamStart("at", position=MessageIdRecord(9, 1), index=19),
    }


def test_a_numeric_offset_past_the_end_or_before_the_start() -> None:
    past = resolve_offset(
        50, OWN, [OWN, FANOUT], lookup_in({OWN: IndexLookup("past", ENTRIES[(9, 1)])})
    )
    # From the last entry written, none of it: what comes next.
    assert past == {
        OWN: StreamStart("at", position=MessageIdRecord(9, 1), index=21),
        FANOUT: StreamStart("next"),
    }
    empty = resolve_offset(5, OWN, [OWN], lookup_in({OWN: IndexLookup("past")}))
    assert empty == {OWN: StreamStart("first")}
    before = resolve_offset(
        2, OWN, [OWN, FANOUT], lookup_in({OWN: IndexLookup("before", ENTRIES[(9, 0)])})
    )
    assert before == {OWN: StreamStart("first"), FANOUT: StreamStart("first")}
    # A lane none of the stream's topics has: past every end.
    unknown = resolve_offset(stream_offset(lane_of("gone", OWN), 1), OWN, [OWN], lookup_in({}))
    assert unknown == {OWN: StreamStart("next")}


def test_counter_counts_from_an_anchor_per_ledger() -> None:
    counter = IndexCounter()
    read = [
        MessageIdRecord(3, 4, -1),
        MessageIdRecord(3, 5, 0),
        MessageIdRecord(3, 5, 1),
        MessageIdRecord(3, 5, 6),
        MessageIdRecord(3, 6, 0),
        MessageIdRecord(3, 8, -1),  # entry 7 not read: a chunk of the large message at 8
        MessageIdRecord(9, 0, 0),
        MessageIdRecord(9, 0, 2),
        MessageIdRecord(9, 1, 0),
    ]
    indexes = []
    for position in read:
        index = counter.index(position)
        if index is None:
            index = counter.anchor(position, ENTRIES[(position.ledger_id, position.entry_id)])
            indexes.append(("anchor", index))
        else:
            indexes.append(("counted", index))
    assert indexes == [
        ("anchor", 4),
        ("counted", 5),
        ("counted", 6),
        ("counted", 11),
        ("counted", 12),
        ("counted", 14),
        ("anchor", 15),
        ("counted", 17),
        ("counted", 18),
    ]


def test_start_admits_from_its_index_or_time() -> None:
    at = StreamStart("at", position=MessageIdRecord(3, 5), index=10)
    assert at.admits(10, 0)
    assert not at.admits(9, 0)
    assert at.admits(None, 0)  # no index: delivered
    assert StreamStart("time", time_ms=NOW_MS).admits(0, NOW_MS)
    assert not StreamStart("time", time_ms=NOW_MS).admits(0, NOW_MS - 1)
    assert StreamStart("first").admits(0, 0)


def test_retention_of_stream_arguments() -> None:
    assert StreamRetention.of({"x-max-age": "1h"}) is None  # not a stream
    assert StreamRetention.of(STREAM) is None
    retention = StreamRetention.of({**STREAM, "x-max-age": "1h", "x-max-length-bytes": 1000})
    assert retention == StreamRetention(3600, 1000)
    assert retention.messages_over(10, 1000) == 0
    assert retention.messages_over(10, 2000) == 5  # 200 bytes each: 5 go
    assert retention.messages_over(10, 1050) == 1
    assert StreamRetention(3600, None).messages_over(10, 10**9) == 0


def test_offset_header_joins_the_message_headers() -> None:
    properties = commands.Basic.Properties(content_type="text/plain", headers={"k": "v"})
    raw = encode_raw_properties(properties)
    decoded = DecodedMessage("", "s", raw, b"body", decode_raw_properties(raw))
    out = decode_raw_properties(with_offset_header(decoded, 2**40 + 5))
    assert out.content_type == "text/plain"
    assert out.headers == {"k": "v", "x-stream-offset": 2**40 + 5}
