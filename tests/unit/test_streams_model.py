"""Stream queues' rules (model/streams.py): declare and consume checks with RabbitMQ 3.10's
texts, x-stream-offset values, and offsets <-> Pulsar positions."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from pamqp import commands

from starlight_py.amqp.errors import NotImplementedMethod, PreconditionFailed
from starlight_py.amqp.framing import decode_raw_properties, encode_raw_properties
from starlight_py.backend.message_codec import DecodedMessage
from starlight_py.gateway.stream_consuming import with_offset_header
from starlight_py.model.positions import MessageIdRecord
from starlight_py.model.queue_limits import LengthLimit
from starlight_py.model.streams import (
    StreamRetention,
    StreamStart,
    check_stream_consume,
    duration_seconds,
    is_stream,
    offset_of,
    position_of,
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
        (-3, StreamStart("offset", offset=0)),
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


def test_offsets_follow_message_ids_and_go_back_to_them() -> None:
    ids = [
        MessageIdRecord(7, 0, -1),
        MessageIdRecord(7, 1, 0),
        MessageIdRecord(7, 1, 1),
        MessageIdRecord(7, 2, -1),
        MessageIdRecord(9, 0, -1),
        MessageIdRecord(40995, 954437, 2048),
    ]
    offsets = [offset_of(i) for i in ids]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert all(0 <= o < 2**63 for o in offsets)
    for record, offset in zip(ids, offsets, strict=True):
        back = position_of(offset)
        assert (back.ledger_id, back.entry_id) == (record.ledger_id, record.entry_id)
        assert back.batch_index == max(record.batch_index, 0)


def test_start_admits_from_its_offset_or_time() -> None:
    assert StreamStart("offset", offset=10).admits(10, 0)
    assert not StreamStart("offset", offset=10).admits(9, 0)
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
