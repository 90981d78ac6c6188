"""FrameDecoder edge cases and the encoders, checked against pamqp's own codec."""

from __future__ import annotations

import struct

import pytest
from pamqp import body, commands, frame, header, heartbeat

from starlight_py.amqp import framing
from starlight_py.amqp.errors import (
    CommandInvalid,
    FrameError,
    ReplyCode,
    UnexpectedFrame,
)
from starlight_py.amqp.field_codec import MAX_FIELD_NESTING
from starlight_py.amqp.framing import (
    BodyFrame,
    FrameDecoder,
    HeaderFrame,
    HeartbeatFrame,
    MethodFrame,
)

PROPS = commands.Basic.Properties(
    content_type="application/octet-stream",
    delivery_mode=2,
    headers={"x-attempt": 3, "nested": {"a": "b"}},
    correlation_id="c-1",
)


def raw_frame(frame_type: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


def sample_stream() -> bytes:
    return b"".join(
        [
            frame.marshal(commands.Queue.Declare(queue="orders", durable=True), 1),
            frame.marshal(commands.Basic.Publish(exchange="ex", routing_key="rk"), 2),
            frame.marshal(header.ContentHeader(0, 11, PROPS), 2),
            frame.marshal(body.ContentBody(b"hello "), 2),
            frame.marshal(body.ContentBody(b"world"), 2),
            frame.marshal(heartbeat.Heartbeat(), 0),
        ]
    )


def check_sample(frames: list[framing.Frame]) -> None:
    assert [type(f) for f in frames] == [
        MethodFrame,
        MethodFrame,
        HeaderFrame,
        BodyFrame,
        BodyFrame,
        HeartbeatFrame,
    ]
    declare, publish, content_header, body1, body2, beat = frames
    assert isinstance(declare, MethodFrame)
    assert declare.channel == 1
    assert declare.method.name == "Queue.Declare"
    assert (declare.method.queue, declare.method.durable) == ("orders", True)
    assert isinstance(publish, MethodFrame)
    assert (publish.channel, publish.method.name, publish.method.routing_key) == (
        2,
        "Basic.Publish",
        "rk",
    )
    assert content_header == HeaderFrame(2, 11, PROPS)
    assert body1 == BodyFrame(2, b"hello ")
    assert body2 == BodyFrame(2, b"world")
    assert beat == HeartbeatFrame(0)


def test_whole_stream_in_one_chunk() -> None:
    decoder = FrameDecoder(4096)
    frames, error = decoder.feed(sample_stream())
    assert error is None
    check_sample(frames)
    assert decoder.buffered == 0


def test_byte_at_a_time() -> None:
    decoder = FrameDecoder(4096)
    frames: list[framing.Frame] = []
    data = sample_stream()
    for i in range(len(data)):
        got, error = decoder.feed(data[i : i + 1])
        assert error is None
        frames += got
    check_sample(frames)
    assert decoder.buffered == 0


def test_frame_is_held_until_its_end_byte_arrives() -> None:
    decoder = FrameDecoder(4096)
    data = frame.marshal(commands.Basic.Ack(delivery_tag=5), 1)
    assert decoder.feed(data[:-1]) == ([], None)
    assert decoder.buffered == len(data) - 1
    frames, error = decoder.feed(data[-1:])
    assert error is None
    assert len(frames) == 1
    assert decoder.buffered == 0


def test_chunk_ending_mid_frame_keeps_the_rest() -> None:
    decoder = FrameDecoder(4096)
    data = sample_stream()
    frames, error = decoder.feed(data[:40])
    assert error is None
    more, error = decoder.feed(data[40:])
    assert error is None
    check_sample(frames + more)


def test_accepts_bytearray_and_empty_input() -> None:
    decoder = FrameDecoder(4096)
    assert decoder.feed(b"") == ([], None)
    frames, error = decoder.feed(bytearray(frame.marshal(heartbeat.Heartbeat(), 0)))
    assert (frames, error) == ([HeartbeatFrame(0)], None)


def test_frame_of_exactly_frame_max_is_accepted() -> None:
    decoder = FrameDecoder(4096)
    data = raw_frame(3, 1, b"x" * (4096 - 8))
    assert len(data) == 4096
    frames, error = decoder.feed(data)
    assert error is None
    assert frames == [BodyFrame(1, b"x" * 4088)]


def test_frame_one_byte_over_frame_max_is_refused_at_its_header() -> None:
    decoder = FrameDecoder(4096)
    data = raw_frame(3, 1, b"x" * (4096 - 8 + 1))
    # The 7-byte header alone is enough to refuse it: no payload is waited for.
    frames, error = decoder.feed(data[:7])
    assert frames == []
    assert isinstance(error, FrameError)
    assert error.reply_code == ReplyCode.FRAME_ERROR == 501
    assert "4097" in error.text
    assert decoder.buffered == 0


def test_lowered_frame_max_applies_to_the_next_frames() -> None:
    decoder = FrameDecoder(131072)
    big = raw_frame(3, 1, b"y" * 5000)
    assert decoder.feed(big)[1] is None
    decoder.frame_max = 4096
    frames, error = decoder.feed(big)
    assert frames == []
    assert isinstance(error, FrameError)


def test_bad_end_byte_is_a_frame_error() -> None:
    decoder = FrameDecoder(4096)
    data = frame.marshal(commands.Basic.Ack(delivery_tag=1), 1)
    frames, error = decoder.feed(data[:-1] + b"\x00")
    assert frames == []
    assert isinstance(error, FrameError)
    assert "0x00" in error.text
    assert decoder.buffered == 0


@pytest.mark.parametrize("frame_type", [0, 4, 7, 9, 65, 255])
def test_unknown_frame_type_is_a_frame_error(frame_type: int) -> None:
    decoder = FrameDecoder(4096)
    frames, error = decoder.feed(raw_frame(frame_type, 0, b""))
    assert frames == []
    assert isinstance(error, FrameError)


def test_heartbeat_on_a_channel_is_unexpected_like_rabbitmq() -> None:
    frames, error = FrameDecoder(4096).feed(raw_frame(8, 3, b""))
    assert frames == []
    assert isinstance(error, UnexpectedFrame)


def test_frames_before_an_error_are_returned_and_the_buffer_is_dropped() -> None:
    decoder = FrameDecoder(4096)
    good = frame.marshal(commands.Connection.Close(reply_code=200, class_id=0, method_id=0), 0)
    frames, error = decoder.feed(good + b"\x09garbage and then some more")
    assert len(frames) == 1
    assert isinstance(frames[0], MethodFrame)
    assert frames[0].method.name == "Connection.Close"
    assert isinstance(error, FrameError)
    assert decoder.buffered == 0


@pytest.mark.parametrize("cut", [0, 1, 2, 3])
def test_method_frame_shorter_than_its_index_is_501(cut: int) -> None:
    payload = struct.pack(">HH", 60, 80)[:cut]
    frames, error = FrameDecoder(4096).feed(raw_frame(1, 1, payload))
    assert frames == []
    assert isinstance(error, FrameError)
    assert error.reply_code == 501


def test_truncated_method_fields_are_501() -> None:
    full = frame.marshal(
        commands.Queue.Declare(queue="abcdef", durable=True, arguments={"x-max-length": 10}), 1
    )[7:-1]
    for cut in range(4, len(full)):
        frames, error = FrameDecoder(4096).feed(raw_frame(1, 1, full[:cut]))
        assert frames == [], cut
        assert isinstance(error, FrameError), cut
        assert error.reply_code == 501
        assert "Queue.Declare" in error.text


def test_deeply_nested_field_table_is_501_not_a_crash() -> None:
    table = b""
    for _ in range(5000):
        table = b"\x01aF" + struct.pack(">I", len(table)) + table
    payload = (
        struct.pack(">HH", 50, 10)
        + b"\x00\x00"  # ticket
        + b"\x01q"
        + b"\x00"  # bits
        + struct.pack(">I", len(table))
        + table
    )
    frames, error = FrameDecoder(10 * 1024 * 1024).feed(raw_frame(1, 1, payload))
    assert frames == []
    assert isinstance(error, FrameError)


@pytest.mark.parametrize(("class_id", "method_id"), [(99, 1), (60, 999), (0, 0)])
def test_unknown_method_index_is_503(class_id: int, method_id: int) -> None:
    payload = struct.pack(">HH", class_id, method_id) + b"\x00" * 8
    frames, error = FrameDecoder(4096).feed(raw_frame(1, 1, payload))
    assert frames == []
    assert isinstance(error, CommandInvalid)
    assert error.reply_code == 503
    assert error.reply_text == f"COMMAND_INVALID - unknown method {class_id}.{method_id}"


def test_content_header_for_another_class_is_505() -> None:
    good = frame.marshal(header.ContentHeader(0, 3, commands.Basic.Properties()), 1)[7:-1]
    payload = struct.pack(">H", 50) + good[2:]
    frames, error = FrameDecoder(4096).feed(raw_frame(2, 1, payload))
    assert frames == []
    assert isinstance(error, UnexpectedFrame)


def test_truncated_content_header_is_501() -> None:
    # The last property set is an octet: pamqp does not notice a short trailing string.
    props = commands.Basic.Properties(
        content_type="text/plain", headers={"k": "v", "n": 5}, delivery_mode=2, priority=5
    )
    full = frame.marshal(header.ContentHeader(0, 3, props), 1)[7:-1]
    for cut in range(len(full)):
        frames, error = FrameDecoder(4096).feed(raw_frame(2, 1, full[:cut]))
        assert frames == [], cut
        assert isinstance(error, FrameError), cut


def test_empty_body_frame() -> None:
    assert FrameDecoder(4096).feed(raw_frame(3, 7, b"")) == ([BodyFrame(7, b"")], None)


# ---- encoders ------------------------------------------------------------------------------


def unmarshal_all(data: bytes) -> list[tuple[int, object]]:
    out = []
    while data:
        used, channel, value = frame.unmarshal(data)
        out.append((channel, value))
        data = data[used:]
    return out


@pytest.mark.parametrize(
    ("size", "frame_max", "expected_bodies"),
    [
        (0, 4096, []),
        (1, 4096, [1]),
        (4088, 4096, [4088]),
        (4089, 4096, [4088, 1]),
        (10000, 4096, [4088, 4088, 1824]),
        (300000, 131072, [131064, 131064, 37872]),
    ],
)
def test_encode_content_round_trips_through_pamqp(
    size: int, frame_max: int, expected_bodies: list[int]
) -> None:
    payload = bytes(i % 251 for i in range(size))
    deliver = commands.Basic.Deliver(
        consumer_tag="ctag", delivery_tag=42, redelivered=True, exchange="ex", routing_key="rk"
    )
    data = framing.encode_content(5, deliver, PROPS, payload, frame_max)
    decoded = unmarshal_all(data)
    channel, method = decoded[0]
    assert channel == 5
    assert isinstance(method, commands.Basic.Deliver)
    assert dict(method) == dict(deliver)
    channel, content_header = decoded[1]
    assert channel == 5
    assert isinstance(content_header, header.ContentHeader)
    assert content_header.body_size == size
    assert content_header.properties == PROPS
    bodies = decoded[2:]
    assert all(ch == 5 and isinstance(v, body.ContentBody) for ch, v in bodies)
    assert [len(v.value) for _, v in bodies] == expected_bodies
    assert b"".join(v.value for _, v in bodies) == payload
    # And our own decoder reads it back at the same frame_max.
    frames, error = FrameDecoder(frame_max).feed(data)
    assert error is None
    assert b"".join(f.payload for f in frames if isinstance(f, BodyFrame)) == payload


def test_encode_method_matches_pamqp() -> None:
    method = commands.Basic.Ack(delivery_tag=7, multiple=True)
    assert framing.encode_method(3, method) == frame.marshal(method, 3)


def test_encode_heartbeat_is_a_channel_0_heartbeat() -> None:
    data = framing.encode_heartbeat()
    used, channel, value = frame.unmarshal(data)
    assert (used, channel) == (len(data), 0)
    assert isinstance(value, heartbeat.Heartbeat)
    assert FrameDecoder(4096).feed(data) == ([HeartbeatFrame(0)], None)


@pytest.mark.parametrize(
    ("method", "ids"),
    [
        (commands.Basic.Publish(), (60, 40)),
        (commands.Queue.Declare(), (50, 10)),
        (commands.Connection.TuneOk(), (10, 31)),
        (commands.Channel.Open(), (20, 10)),
    ],
)
def test_method_ids(method: object, ids: tuple[int, int]) -> None:
    assert framing.method_ids(method) == ids  # type: ignore[arg-type]


def nested_table(depth: int) -> bytes:
    """A field table nesting `depth` tables (depth 1: a table holding an empty table)."""
    table = b""
    for _ in range(depth):
        table = b"\x01aF" + struct.pack(">I", len(table)) + table
    return table


def declare_payload(table: bytes) -> bytes:
    return (
        struct.pack(">HH", 50, 10)
        + b"\x00\x00"  # ticket
        + b"\x01q"
        + b"\x00"  # bits
        + struct.pack(">I", len(table))
        + table
    )


def test_field_tables_nested_up_to_the_limit_decode() -> None:
    # The arguments table itself is one level; MAX_FIELD_NESTING - 1 more fit.
    payload = declare_payload(nested_table(MAX_FIELD_NESTING - 1))
    frames, error = FrameDecoder(1024 * 1024).feed(raw_frame(1, 1, payload))
    assert error is None
    assert len(frames) == 1


def test_field_tables_nested_past_the_limit_are_501_with_the_method_ids() -> None:
    payload = declare_payload(nested_table(MAX_FIELD_NESTING))
    frames, error = FrameDecoder(1024 * 1024).feed(raw_frame(1, 1, payload))
    assert frames == []
    assert isinstance(error, FrameError)
    assert error.reply_code == 501
    assert f"nested deeper than {MAX_FIELD_NESTING}" in error.text
    assert error.method == (50, 10)


def test_headers_nested_past_the_limit_are_501() -> None:
    headers: dict[str, object] = {}
    for _ in range(MAX_FIELD_NESTING):
        headers = {"a": headers}
    properties = commands.Basic.Properties(headers=headers)
    content = header.ContentHeader(0, 3, properties)
    frames, error = FrameDecoder(1024 * 1024).feed(frame.marshal(content, 1))
    assert frames == []
    assert isinstance(error, FrameError)
    assert f"nested deeper than {MAX_FIELD_NESTING}" in error.text
