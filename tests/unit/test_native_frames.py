"""The compiled frame work (native/, `starlight_py.amqp._native`) against the Python code it
stands in for.

- `encode_deliver` writes the same bytes as `hot_frames.encode_deliver_in_python`.
- `FrameDecoder.feed_joined` joins whole, regular publishes into one item, and leaves
  everything else as frames. An `AMQPConnection` fed a stream through the compiled scanner
  gives the same events, the same output and the same state as one fed the same stream
  frame by frame in Python, whatever the stream holds (regular publishes, publishes split
  over reads or over body frames, on closed channels, with a body of the wrong size, names
  that are not UTF-8, properties that do not decode, garbage) and however it is cut.

These import the compiled module directly: they fail where it was not built, so a build
that lost it cannot pass unnoticed.
"""

from __future__ import annotations

import functools
import itertools
import os
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from starlight_py.amqp import _native, compiled, framing, hot_frames
from starlight_py.amqp import events as ev
from starlight_py.amqp.connection import AMQPConnection, ServerSettings
from starlight_py.amqp.framing import PROTOCOL_HEADER, FrameDecoder
from starlight_py.units import KIB

HYPOTHESIS = settings(
    max_examples=300,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FRAME_MAX = 4 * KIB
SETTINGS = ServerSettings(
    channel_max=8, frame_max=FRAME_MAX, heartbeat=30, max_message_size=6 * KIB
)
_FRAME = struct.Struct(">BHI")


def frame(kind: int, channel: int, payload: bytes) -> bytes:
    return _FRAME.pack(kind, channel, len(payload)) + payload + b"\xce"


def method(channel: int, value: Any) -> bytes:
    return framing.encode_method(channel, value)


def publish_method(channel: int, exchange: bytes, routing_key: bytes, bits: int) -> bytes:
    payload = (
        struct.pack(">HHH", 60, 40, 0)
        + bytes((len(exchange),))
        + exchange
        + bytes((len(routing_key),))
        + routing_key
        + bytes((bits,))
    )
    return frame(1, channel, payload)


def content_header(
    channel: int, body_size: int, raw_properties: bytes, class_id: int = 60
) -> bytes:
    return frame(2, channel, struct.pack(">HHQ", class_id, 0, body_size) + raw_properties)


PROPERTIES = [
    framing.encode_raw_properties(commands.Basic.Properties()),
    framing.encode_raw_properties(
        commands.Basic.Properties(
            content_type="application/json", delivery_mode=2, headers={"a": 1, "b": "x"}
        )
    ),
    framing.encode_raw_properties(commands.Basic.Properties(priority=3, message_id="m-1")),
    b"\x10\x00",  # says a delivery mode follows, and none does: does not decode
]


REGULAR_NAMES = st.sampled_from([b"", b"ex", b"amq.topic", "caf\u00e9".encode(), b"a" * 255])
# What may be irregular about one publish; most have nothing (None).
FLAWS = st.sampled_from(
    [None] * 12
    + [
        "unopened channel",
        "other channel",
        "name not UTF-8",
        "short body",
        "long body",
        "header of another class",
        "header on another channel",
        "body in small frames",
        "properties that do not decode",
    ]
)


@st.composite
def publishes(draw: st.DrawFn) -> bytes:
    """One basic.publish with its content: regular, or with one flaw."""
    flaw = draw(FLAWS)
    channel = {"unopened channel": 3, "other channel": 2}.get(flaw or "", 1)
    if draw(st.booleans()):
        body = draw(st.binary(max_size=64))
    else:
        body = b"b" * draw(st.sampled_from([0, 1, 4 * KIB - 8, 5 * KIB, 7 * KIB]))
    declared = len(body) + {"short body": 1, "long body": -1}.get(flaw or "", 0)
    raw = (
        PROPERTIES[3]
        if flaw == "properties that do not decode"
        else draw(st.sampled_from(PROPERTIES[:3]))
    )
    exchange = b"\xff\xfe" if flaw == "name not UTF-8" else draw(REGULAR_NAMES)
    parts = [
        publish_method(channel, exchange, draw(REGULAR_NAMES), draw(st.integers(0, 255))),
        content_header(
            2 if flaw == "header on another channel" else channel,
            max(0, declared),
            raw,
            50 if flaw == "header of another class" else 60,
        ),
    ]
    step = 100 if flaw == "body in small frames" else FRAME_MAX - 8
    for start in range(0, len(body), step):
        parts.append(frame(3, channel, body[start : start + step]))
    return b"".join(parts)


OTHER_FRAMES = st.sampled_from(
    [
        method(1, commands.Basic.Ack(delivery_tag=1)),
        method(
            2, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
        ),
        method(2, commands.Channel.Open()),
        frame(3, 1, b"stray body"),
        frame(8, 0, b""),  # heartbeat
        method(1, commands.Basic.Qos(prefetch_count=10)),
        method(
            0, commands.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0)
        ),
    ]
)
GARBAGE = st.sampled_from(
    [b"\x09\x00\x01\x00\x00\x00\x00\xce", b"\x01\x00\x01\x00\x00\x00\x01x\x00"]
)


@st.composite
def streams(draw: st.DrawFn) -> list[bytes]:
    """Frames after the handshake, cut into reads anywhere."""
    pieces = draw(st.lists(publishes() | publishes() | OTHER_FRAMES, min_size=1, max_size=12))
    if draw(st.integers(0, 19)) == 0:
        pieces.append(draw(GARBAGE))
    data = b"".join(pieces)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@contextmanager
def scanner(native: bool) -> Iterator[None]:
    saved = compiled.scan
    compiled.scan = _native.scan if native else None
    try:
        yield
    finally:
        compiled.scan = saved


def scanning(test: Callable[[], None]) -> Callable[[], None]:
    """Runs a test of `FrameDecoder.feed_joined` with the compiled scanner, even under
    STARLIGHT_NATIVE=0."""

    @functools.wraps(test)
    def wrapped() -> None:
        with scanner(True):
            test()

    return wrapped


def opened(native: bool) -> AMQPConnection:
    with scanner(native):
        conn = AMQPConnection(SETTINGS)
        tune = commands.Connection.TuneOk(channel_max=8, frame_max=FRAME_MAX, heartbeat=30)
        start = commands.Connection.StartOk(
            client_properties={}, mechanism="PLAIN", response="\x00u\x00p", locale="en_US"
        )
        conn.receive_data(PROTOCOL_HEADER + method(0, start))
        conn.accept_login()
        conn.receive_data(method(0, tune) + method(0, commands.Connection.Open(virtual_host="/")))
        conn.accept_open()
        conn.receive_data(method(1, commands.Channel.Open()) + method(2, commands.Channel.Open()))
        conn.data_to_send()
    return conn


def described(event: ev.Event) -> Any:
    """What a test compares of an event: every field, errors by type, code and text."""
    if isinstance(event, ev.ErrorRaised):
        return ("error", event.channel, type(event.error).__name__, str(event.error))
    if isinstance(event, ev.ContentReceived):
        return (
            "content",
            event.channel,
            repr(event.method),
            dict(event.properties),
            event.body,
            event.raw_properties,
        )
    if isinstance(event, ev.MethodReceived):
        return ("method", event.channel, event.method.name, dict(event.method))
    return repr(event)


def run(native: bool, reads: list[bytes]) -> tuple[list[Any], bytes, str, int]:
    conn = opened(native)
    events: list[Any] = []
    with scanner(native):
        for data in reads:
            events += [described(e) for e in conn.receive_data(data)]
    return events, conn.data_to_send(), conn.state.name, conn.buffered_input


def regular_publish(channel: int = 1, declared: int = 2) -> bytes:
    return (
        publish_method(channel, b"", b"k", 0)
        + content_header(channel, declared, PROPERTIES[0])
        + frame(3, channel, b"ab")
    )


CLIENT_CLOSE = method(
    0, commands.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0)
)
# The cases each check of the joined path is there for, whatever the search finds.
SURE_CASES = {
    "content still expected on the channel": regular_publish(declared=3) + regular_publish(),
    "the client closed the connection": CLIENT_CLOSE + regular_publish(),
    "the channel is closing": publish_method(1, b"", b"k", 0)
    + content_header(1, 7 * KIB, PROPERTIES[0])
    + regular_publish(),
    "the client is closing the channel": method(
        1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0)
    )
    + regular_publish(),
    "a channel never opened": regular_publish(channel=3) + regular_publish(),
    "properties that do not decode": publish_method(1, b"", b"k", 0)
    + content_header(1, 0, PROPERTIES[3]),
}


@pytest.mark.parametrize("data", SURE_CASES.values(), ids=SURE_CASES.keys())
def test_a_connection_makes_the_same_of_each_irregular_publish_with_the_compiled_scanner(
    data: bytes,
) -> None:
    native = run(True, [data])
    assert native == run(False, [data])
    assert native[0], "the case makes events"


@HYPOTHESIS
@given(streams())
def test_a_connection_makes_the_same_of_any_stream_with_the_compiled_scanner(
    reads: list[bytes],
) -> None:
    assert run(True, reads) == run(False, reads)


@scanning
def test_a_regular_publish_is_one_item_and_its_frames_come_back_unjoined() -> None:
    raw = PROPERTIES[1]
    data = publish_method(1, b"ex", b"rk", 1) + content_header(1, 3, raw) + frame(3, 1, b"abc")
    items, error = FrameDecoder(FRAME_MAX).feed_joined(data, 6 * KIB)
    assert error is None
    assert items == [(framing.FRAME_MESSAGE, 1, "ex", "rk", 1, raw, 3, b"abc")]
    raw_frames, _ = FrameDecoder(FRAME_MAX).feed_raw(data)
    assert framing.unjoin(items[0]) == raw_frames


@scanning
def test_what_is_not_a_whole_regular_publish_stays_frames() -> None:
    raw = PROPERTIES[0]
    whole = publish_method(1, b"ex", b"rk", 0) + content_header(1, 3, raw) + frame(3, 1, b"abc")
    cases = {
        "cut short": whole[:-1],
        "body in two frames": publish_method(1, b"", b"k", 0)
        + content_header(1, 3, raw)
        + frame(3, 1, b"a")
        + frame(3, 1, b"bc"),
        "another channel between": publish_method(1, b"", b"k", 0)
        + method(2, commands.Basic.Ack(delivery_tag=1))
        + content_header(1, 3, raw)
        + frame(3, 1, b"abc"),
        "name not UTF-8": publish_method(1, b"\xff", b"k", 0)
        + content_header(1, 3, raw)
        + frame(3, 1, b"abc"),
        "over the size limit": publish_method(1, b"", b"k", 0) + content_header(1, 7 * KIB, raw),
    }
    for name, data in cases.items():
        items, _ = FrameDecoder(FRAME_MAX).feed_joined(data, 6 * KIB)
        assert items == FrameDecoder(FRAME_MAX).feed_raw(data)[0], name
    # What stopped the scanner is judged in Python, in the usual words.
    items, error = FrameDecoder(FRAME_MAX).feed_joined(whole + b"\x07" + bytes(7), 6 * KIB)
    assert [item[0] for item in items] == [framing.FRAME_MESSAGE]
    assert str(error) == "unknown frame type 7"


def test_the_connection_uses_the_compiled_frame_work_when_it_was_built() -> None:
    expected = os.environ.get("STARLIGHT_NATIVE", "1") != "0"
    assert compiled.loaded() is expected
    assert (hot_frames.encode_deliver is _native.encode_deliver) is expected


@HYPOTHESIS
@given(
    channel=st.integers(1, 65535),
    tag=st.text(max_size=40),
    delivery_tag=st.integers(0, 2**64 - 1),
    redelivered=st.booleans(),
    exchange=st.text(max_size=60),
    routing_key=st.text(max_size=60),
    raw=st.sampled_from(PROPERTIES),
    body=st.binary(max_size=300) | st.sampled_from([b"x" * 4088, b"y" * 9000]),
    frame_max=st.sampled_from([4096, 4097, 131072]),
)
def test_encode_deliver_writes_what_the_python_encoder_writes(
    channel: int,
    tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    raw: bytes,
    body: bytes,
    frame_max: int,
) -> None:
    args = (
        channel,
        hot_frames.short_string(tag),
        delivery_tag,
        redelivered,
        exchange,
        routing_key,
        raw,
        body,
        frame_max,
    )
    assert _native.encode_deliver(*args) == hot_frames.encode_deliver_in_python(*args)


def test_encode_deliver_refuses_a_name_longer_than_a_shortstr() -> None:
    with pytest.raises(ValueError):
        _native.encode_deliver(1, b"\x00", 1, False, "e" * 256, "", b"\x00\x00", b"", 4096)
