"""Property-based fuzzing of the sans-IO AMQP layer (issue 6, hostile input).

Two targets. `FrameDecoder` is fed arbitrary bytes in arbitrary chunks: it reports the
documented errors instead of raising, and never holds more than one partial frame. An
`AMQPConnection` is driven by arbitrary frame sequences (valid methods of every class with
random fields, content, heartbeats, garbage, before and after the handshake) through a
scripted shell that answers its events: it never raises, every close it sends carries an
AMQP reply code on the side RabbitMQ uses for that code, a closed connection stays closed,
and what it buffers or queues stays bounded.

What the connection sends is decoded with pamqp, so the checks read the wire, not our own
encoder. Set `CI` in the environment for a deterministic run, STARLIGHT_FUZZ_SCALE=20 for a
longer search.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import os
import struct
import tracemalloc
from dataclasses import dataclass, field
from enum import Enum, auto
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pamqp import commands, header, heartbeat
from pamqp import frame as pamqp_frame
from pamqp.base import Frame as PamqpMethod

from starlight_py.amqp import events as ev
from starlight_py.amqp import framing, hot_frames
from starlight_py.amqp.connection import (
    FRAME_MIN_SIZE,
    AMQPConnection,
    ConnectionState,
    ServerSettings,
    max_body_frames,
)
from starlight_py.amqp.errors import (
    AccessRefused,
    AMQPError,
    AMQPSyntaxError,
    ChannelStateError,
    CommandInvalid,
    ConnectionAccessRefused,
    ConnectionForced,
    ContentTooLarge,
    FrameError,
    InternalError,
    NotAllowed,
    NotFound,
    NotImplementedMethod,
    PreconditionFailed,
    ReplyCode,
    ResourceError,
    ResourceLocked,
    UnexpectedFrame,
)
from starlight_py.amqp.framing import FRAME_OVERHEAD, PROTOCOL_HEADER, FrameDecoder
from starlight_py.units import KIB, MIB


def fuzz_settings(max_examples: int) -> settings:
    """Budgets keep the whole file well under 40 s on a 2-core machine; for a deeper search,
    multiply them with STARLIGHT_FUZZ_SCALE (e.g. 20)."""
    return settings(
        max_examples=max_examples * int(os.environ.get("STARLIGHT_FUZZ_SCALE", "1")),
        deadline=None,
        derandomize=bool(os.environ.get("CI")),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# RabbitMQ's split (rabbit_framing_amqp_0_9_1): soft errors close the channel, hard errors
# close the connection.
SOFT_CODES = frozenset({311, 312, 313, 403, 404, 405, 406})
HARD_CODES = frozenset({320, 402, 501, 502, 503, 504, 505, 506, 530, 540, 541})
# A soft error with no open channel to close (handshake, channel 0) closes the connection.
CONNECTION_CLOSE_CODES = SOFT_CODES | HARD_CODES
DECODER_ERRORS = (FrameError, AMQPSyntaxError, CommandInvalid, UnexpectedFrame)

MAX_INPUT = 64 * KIB
SETTINGS = ServerSettings(
    channel_max=8,
    frame_max=8 * KIB,
    heartbeat=30,
    max_message_size=16 * KIB,
    server_properties={"product": "starlight-py", "capabilities": {"publisher_confirms": True}},
)
# What the connection queues on its own (not at the shell's request), per byte received: the
# costliest answers are open-ok to channel.open and a channel.close with its reply text to a
# publish over the size limit, each under twice the client's bytes; plus start and tune.
OWN_OUTPUT_PER_INPUT_BYTE = 2
OWN_OUTPUT_CONSTANT = 2 * KIB


# ---- field values and frames ---------------------------------------------------------------

SHORT_TEXT = st.text(max_size=30)  # at most 120 bytes of UTF-8: a valid shortstr
TABLE_KEYS = st.text(max_size=8)
TABLE_SCALARS = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=16)
FIELD_TABLES = st.recursive(
    st.dictionaries(TABLE_KEYS, TABLE_SCALARS, max_size=3),
    lambda inner: st.dictionaries(
        TABLE_KEYS, TABLE_SCALARS | inner | st.lists(TABLE_SCALARS, max_size=3), max_size=3
    ),
    max_leaves=8,
)
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "bit": st.booleans(),
    "octet": st.integers(0, 0xFF),
    "short": st.integers(0, 0xFFFF),
    "long": st.integers(0, 0xFFFFFFFF),
    "longlong": st.integers(0, 2**63 - 1),  # pamqp encodes it signed; raw frames go higher
    "shortstr": SHORT_TEXT,
    "longstr": st.text(max_size=60),
    "table": FIELD_TABLES,
}
METHOD_CLASSES: list[type[PamqpMethod]] = sorted(
    commands.INDEX_MAPPING.values(), key=lambda cls: cls.index
)
# Frame numbers clients really use, ones above channel_max (8), and channel 0.
CHANNELS = st.sampled_from([1, 1, 1, 2, 2, 3, 0, 9, 0xFFFF])


@cache
def _unvalidated(cls: type[PamqpMethod]) -> type[PamqpMethod]:
    # pamqp validates on marshal (exchange names, ticket == 0...) but not on unmarshal: a
    # hostile client is not bound by it, so neither are the frames we send.
    return type(cls.__name__, (cls,), {"validate": lambda self: None})


@st.composite
def any_method(draw: st.DrawFn, classes: list[type[PamqpMethod]] = METHOD_CLASSES) -> PamqpMethod:
    """A method of any class with random field values of the right wire types."""
    cls = _unvalidated(draw(st.sampled_from(classes)))
    method = cls.__new__(cls)
    for name in cls.__slots__:
        setattr(method, name, draw(FIELD_VALUES[cls.amqp_type(name)]))
    return method


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


PROPERTIES = st.builds(
    commands.Basic.Properties,
    content_type=optional(SHORT_TEXT),
    content_encoding=optional(SHORT_TEXT),
    headers=optional(FIELD_TABLES),
    delivery_mode=optional(st.sampled_from([1, 2])),
    priority=optional(st.integers(0, 0xFF)),
    correlation_id=optional(SHORT_TEXT),
    reply_to=optional(SHORT_TEXT),
    expiration=optional(SHORT_TEXT),
    message_id=optional(SHORT_TEXT),
    timestamp=optional(
        st.datetimes(
            min_value=datetime.datetime(1970, 1, 2),
            max_value=datetime.datetime(2100, 1, 1),
            timezones=st.just(datetime.UTC),
        )
    ),
    message_type=optional(SHORT_TEXT),
    user_id=optional(SHORT_TEXT),
    app_id=optional(SHORT_TEXT),
)
# Large payloads are repeated bytes: random megabytes would cost generation time, not coverage.
PAYLOADS = st.binary(max_size=64) | st.integers(0, 9000).map(lambda n: b"b" * n)


def marshal(channel: int, value: Any) -> bytes:
    data: bytes = pamqp_frame.marshal(value, channel)
    return data


def raw_frame(frame_type: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


@st.composite
def raw_frames(draw: st.DrawFn) -> bytes:
    """A frame of any type whose declared size or end byte may lie."""
    frame_type = draw(st.sampled_from([1, 2, 3, 8]) | st.integers(0, 0xFF))
    channel = draw(st.integers(0, 0xFFFF))
    payload = draw(st.binary(max_size=200))
    size = draw(st.just(len(payload)) | st.integers(0, 0xFFFFFFFF))
    end = draw(st.just(0xCE) | st.integers(0, 0xFF))
    return struct.pack(">BHI", frame_type, channel, size) + payload + bytes([end])


@st.composite
def valid_frames(draw: st.DrawFn, body_max: int = 4088) -> bytes:
    """One well-formed frame: method of any class, content header, body or heartbeat."""
    kind = draw(st.sampled_from(["method", "header", "body", "heartbeat"]))
    channel = draw(st.integers(0, 0xFFFF))
    if kind == "method":
        return marshal(channel, draw(any_method()))
    if kind == "header":
        return marshal(
            channel, header.ContentHeader(0, draw(st.integers(0, 2**64 - 1)), draw(PROPERTIES))
        )
    if kind == "body":
        return raw_frame(3, channel, draw(st.binary(max_size=body_max)))
    return marshal(0, heartbeat.Heartbeat())


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    """A valid frame with one byte changed, cut short, or with bytes inserted."""
    data = bytearray(draw(valid_frames(body_max=100)))
    where = draw(st.integers(0, len(data) - 1))
    how = draw(st.sampled_from(["flip", "cut", "insert"]))
    if how == "flip":
        data[where] = draw(st.integers(0, 0xFF))
    elif how == "cut":
        del data[where:]
    else:
        data[where:where] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


HOSTILE_STREAMS = st.lists(
    valid_frames(body_max=300) | mutated_frames() | raw_frames() | st.binary(max_size=40),
    max_size=12,
).map(b"".join)


@st.composite
def chunked(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """`data` cut at arbitrary positions (empty chunks included)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=16)))
    bounds = [0, *cuts, len(data)]
    return [data[start:end] for start, end in itertools.pairwise(bounds)]


# ---- the frame decoder ---------------------------------------------------------------------

HOT_METHODS = (hot_frames.Publish, hot_frames.Ack, hot_frames.Nack, hot_frames.Reject)
FRAME_MAXES = st.sampled_from([4096, 8192, 131072]) | st.integers(8, 600)


def check_decoded(frames: list[framing.Frame], frame_max: int) -> None:
    for frame in frames:
        assert 0 <= frame.channel <= 0xFFFF
        if isinstance(frame, framing.MethodFrame):
            assert isinstance(frame.method, (PamqpMethod, *HOT_METHODS))
        elif isinstance(frame, framing.HeaderFrame):
            assert isinstance(frame.properties, commands.Basic.Properties)
        elif isinstance(frame, framing.BodyFrame):
            assert len(frame.payload) <= frame_max - FRAME_OVERHEAD
        else:
            assert isinstance(frame, framing.HeartbeatFrame)
            assert frame.channel == 0


def feed_checked(decoder: FrameDecoder, chunks: list[bytes]) -> None:
    """Feed until the stream breaks, checking the errors and the memory held after each feed."""
    for chunk in chunks:
        frames, error = decoder.feed(chunk)
        check_decoded(frames, decoder.frame_max)
        # At most one partial frame is held, and never one larger than frame_max.
        assert decoder.buffered < max(decoder.frame_max, 7)
        if error is not None:
            assert isinstance(error, DECODER_ERRORS), repr(error)
            assert error.closes_connection
            assert error.reply_code in HARD_CODES
            assert decoder.buffered == 0
            return


@fuzz_settings(300)
@given(frame_max=FRAME_MAXES, data=st.data(), stream=st.binary(max_size=2000))
def test_decoder_survives_arbitrary_bytes(
    frame_max: int, data: st.DataObject, stream: bytes
) -> None:
    feed_checked(FrameDecoder(frame_max), data.draw(chunked(stream)))


@fuzz_settings(300)
@given(frame_max=FRAME_MAXES, data=st.data(), stream=HOSTILE_STREAMS)
def test_decoder_survives_almost_valid_frames(
    frame_max: int, data: st.DataObject, stream: bytes
) -> None:
    feed_checked(FrameDecoder(frame_max), data.draw(chunked(stream)))


def frame_key(frame: framing.Frame) -> tuple[Any, ...]:
    """A comparable form (pamqp methods have no __eq__)."""
    if isinstance(frame, framing.MethodFrame):
        return (frame.channel, frame.method.name, dict(frame.method))
    if isinstance(frame, framing.HeaderFrame):
        return (frame.channel, frame.body_size, frame.properties, frame.raw_properties)
    return (type(frame).__name__, frame.channel, getattr(frame, "payload", None))


@fuzz_settings(200)
@given(frames=st.lists(valid_frames(), max_size=12), data=st.data())
def test_valid_frames_decode_the_same_in_any_chunking(
    frames: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(frames)
    whole, error = FrameDecoder(4096).feed(stream)
    assert error is None
    assert len(whole) == len(frames)
    decoder = FrameDecoder(4096)
    pieces: list[framing.Frame] = []
    for chunk in data.draw(chunked(stream)):
        decoded, error = decoder.feed(chunk)
        assert error is None
        pieces += decoded
        assert decoder.buffered < 4096
    assert decoder.buffered == 0
    assert [frame_key(f) for f in pieces] == [frame_key(f) for f in whole]


# ---- the connection state machine ----------------------------------------------------------


class ShellReply(Enum):
    """What the scripted shell does for a method or message it is handed."""

    NOTHING = auto()
    ACK = auto()
    DELIVER = auto()
    BLOCKED = auto()
    HEARTBEAT = auto()


SHELL_ERRORS: list[type[AMQPError]] = [
    NotFound,
    AccessRefused,
    ResourceLocked,
    PreconditionFailed,
    ContentTooLarge,
    InternalError,
    NotAllowed,
    NotImplementedMethod,
    ResourceError,
    ConnectionForced,
    ChannelStateError,
]
Reaction = ShellReply | type[AMQPError]
DELIVER = commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, exchange="ex", routing_key="rk")


@dataclass(frozen=True)
class Shell:
    """How the scripted I/O shell answers: login and vhost verdicts, then one reaction per
    method or message it is handed (cycled)."""

    reactions: tuple[Reaction, ...] = ()
    refuse_login: bool = False
    refuse_vhost: bool = False


@dataclass(frozen=True)
class Script:
    """A client's bytes, already cut into reads, and the shell it talks to."""

    chunks: tuple[bytes, ...]
    shell: Shell = Shell()


def handshake(channel_max: int = 8, frame_max: int = 8 * KIB) -> tuple[bytes, ...]:
    """A well-behaved client's handshake, one read per step: it waits for start, tune and
    open-ok as real clients do (tune-ok needs the server's tune values)."""
    start_ok = commands.Connection.StartOk(
        client_properties={"product": "fuzz"},
        mechanism="PLAIN",
        response="\x00guest\x00guest",
        locale="en_US",
    )
    tune_ok = commands.Connection.TuneOk(channel_max=channel_max, frame_max=frame_max, heartbeat=0)
    return (
        PROTOCOL_HEADER + marshal(0, start_ok),
        marshal(0, tune_ok),
        marshal(0, commands.Connection.Open(virtual_host="/")),
    )


@st.composite
def connection_methods(draw: st.DrawFn) -> PamqpMethod:
    """Connection-class methods with the values that steer the handshake."""
    which = draw(st.sampled_from(["close", "close-ok", "start-ok", "tune-ok", "open", "secret"]))
    if which == "close":
        return commands.Connection.Close(
            reply_code=draw(st.sampled_from([200, 320, 541])),
            reply_text=draw(SHORT_TEXT),
            class_id=0,
            method_id=0,
        )
    if which == "close-ok":
        return commands.Connection.CloseOk()
    if which == "start-ok":
        return commands.Connection.StartOk(
            client_properties=draw(FIELD_TABLES),
            mechanism=draw(st.sampled_from(["PLAIN", "AMQPLAIN", "EXTERNAL"]) | SHORT_TEXT),
            response=draw(st.text(max_size=30)),
            locale="en_US",
        )
    if which == "tune-ok":
        return commands.Connection.TuneOk(
            channel_max=draw(st.sampled_from([0, 1, 8, 9]) | st.integers(0, 0xFFFF)),
            frame_max=draw(
                st.sampled_from([0, 4095, 4096, 8192, 8193]) | st.integers(0, 2**32 - 1)
            ),
            heartbeat=draw(st.integers(0, 0xFFFF)),
        )
    if which == "open":
        return commands.Connection.Open(virtual_host=draw(st.sampled_from(["/", "other"])))
    return commands.Connection.UpdateSecret(new_secret=draw(SHORT_TEXT), reason="fuzz")


@st.composite
def channel_methods(draw: st.DrawFn) -> PamqpMethod:
    """The methods that move a channel's state: open, close, close-ok, publish."""
    which = draw(st.sampled_from(["open", "publish", "close", "close-ok"]))
    if which == "open":
        return commands.Channel.Open()
    if which == "publish":
        return commands.Basic.Publish(exchange="ex", routing_key=draw(SHORT_TEXT))
    if which == "close":
        return commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
    return commands.Channel.CloseOk()


@st.composite
def client_frames(draw: st.DrawFn) -> bytes:
    """One frame from a client that may be buggy or hostile (garbage rarely: it ends the run)."""
    kind = draw(
        st.sampled_from(
            ["channel-method"] * 4
            + ["header"] * 2
            + ["body"] * 2
            + ["method"] * 3
            + ["connection-method", "heartbeat", "raw", "garbage"]
        )
    )
    channel = draw(CHANNELS)
    if kind == "channel-method":
        return marshal(channel, draw(channel_methods()))
    if kind == "header":
        size = draw(st.integers(0, 64) | st.integers(0, 20 * KIB))
        return marshal(channel, header.ContentHeader(0, size, draw(PROPERTIES)))
    if kind == "body":
        return raw_frame(3, channel, draw(PAYLOADS))
    if kind == "method":
        return marshal(channel, draw(any_method()))
    if kind == "connection-method":
        return marshal(draw(st.sampled_from([0, 0, 0, 1])), draw(connection_methods()))
    if kind == "heartbeat":
        return raw_frame(8, draw(st.sampled_from([0, 0, 0, channel])), b"")
    if kind == "raw":
        return draw(raw_frames())
    return draw(st.binary(min_size=1, max_size=16))


# Refusals and hard errors end a run at once: keep them rare enough for runs to get deep.
ONE_IN_EIGHT = st.tuples(st.booleans(), st.booleans(), st.booleans()).map(all)
SHELLS = st.builds(
    Shell,
    reactions=st.lists(
        st.sampled_from(
            [*ShellReply] * 4
            + [error for error in SHELL_ERRORS if not error.closes_connection] * 2
            + [error for error in SHELL_ERRORS if error.closes_connection]
        ),
        max_size=8,
    ).map(tuple),
    refuse_login=ONE_IN_EIGHT,
    refuse_vhost=ONE_IN_EIGHT,
)


@st.composite
def scripts(draw: st.DrawFn) -> Script:
    """Any frames, blind to the connection's state, after a handshake or none."""
    opening = draw(
        st.sampled_from(["handshake"] * 6 + ["header", "header-0-9", "bad-header", "none"])
    )
    prefix: tuple[bytes, ...] = {
        "handshake": handshake(),
        "header": (PROTOCOL_HEADER,),
        "header-0-9": (b"AMQP\x01\x01\x00\x09",),
        "bad-header": (draw(st.binary(min_size=1, max_size=8)),),
        "none": (),
    }[opening]
    data = b"".join(draw(st.lists(client_frames(), max_size=40)))[:MAX_INPUT]
    return Script(chunks=(*prefix, *draw(chunked(data))), shell=draw(SHELLS))


class RecordingConnection(AMQPConnection):
    """Remembers each fail() call, so each close sent can be traced to its error."""

    def __init__(self, settings: ServerSettings) -> None:
        super().__init__(settings)
        self.failures: list[tuple[int, AMQPError, ConnectionState]] = []

    def fail(self, error: AMQPError, channel: int = 0) -> None:
        self.failures.append((channel, error, self.state))
        super().fail(error, channel)


@dataclass
class ClientView:
    """What the client has received so far, and how much it has sent."""

    frames: list[tuple[int, Any]] = field(default_factory=list)
    connection_close_seen: bool = False
    close_ok_seen: int = 0
    was_closed: bool = False
    fed: int = 0
    own_output: int = 0  # bytes the connection queued on its own, not at the shell's request


def decode_output(data: bytes) -> list[tuple[int, Any]]:
    frames = []
    while data:
        used, channel, value = pamqp_frame.unmarshal(data)
        frames.append((channel, value))
        data = data[used:]
    return frames


class ConnectionHarness:
    """An AMQPConnection, a scripted shell, and the invariants checked after every read."""

    def __init__(self, shell: Shell = Shell(), settings: ServerSettings = SETTINGS) -> None:
        self.shell = shell
        self.settings = settings
        self.conn = RecordingConnection(settings)
        self.view = ClientView()
        self._reactions = itertools.cycle(shell.reactions or (ShellReply.NOTHING,))

    def play(self, chunks: tuple[bytes, ...]) -> ClientView:
        for chunk in chunks:
            self.feed(chunk)
        return self.finish()

    def feed(self, chunk: bytes) -> None:
        """One read from the socket, the shell's answers, then every check."""
        conn = self.conn
        failures_before = len(conn.failures)
        closed_before = conn.closed
        self.view.fed += len(chunk)
        events = conn.receive_data(chunk)  # must never raise
        if closed_before:
            assert events == []
        for received in events:
            if isinstance(received, ev.ErrorRaised):
                check_error_class(received.error)
        self.check_input_bounded()
        # Output was drained after the previous read, so all that is pending is this read's.
        shell_output = sum(self.answer(event) for event in events)
        self.view.own_output += conn.pending_output - shell_output
        self.check_output(conn.failures[failures_before:])

    def finish(self) -> ClientView:
        """A shell that keeps talking to a connection that may be going away."""
        conn = self.conn
        failures_before = len(conn.failures)
        conn.send_method(0, commands.Connection.Blocked(reason="late"))
        for channel in (1, 2, 3):
            conn.send_method(channel, commands.Basic.Ack(delivery_tag=9))
            conn.send_content(channel, DELIVER, commands.Basic.Properties(), b"x")
        conn.send_heartbeat()
        shell_output = conn.pending_output
        conn.fail(InternalError("late failure"), 1)
        self.view.own_output += conn.pending_output - shell_output
        self.check_output(conn.failures[failures_before:])
        return self.view

    def answer(self, event: ev.Event) -> int:
        """The shell's reply to one event; returns the bytes it queued on its own account."""
        conn = self.conn
        if isinstance(event, ev.LoginRequested):
            if self.shell.refuse_login:
                conn.fail(ConnectionAccessRefused("login refused", (10, 11)))
            else:
                conn.accept_login()
        elif isinstance(event, ev.OpenRequested):
            if self.shell.refuse_vhost:
                conn.fail(NotAllowed(f"vhost '{event.virtual_host}' not found", (10, 40)))
            else:
                conn.accept_open()
        elif isinstance(event, ev.ChannelCloseRequested):
            conn.finish_channel_close(event.channel)
        elif isinstance(event, ev.ConnectionCloseRequested):
            conn.finish_connection_close()
        elif isinstance(event, (ev.MethodReceived, ev.ContentReceived)):
            return self.react(next(self._reactions), event.channel)
        return 0

    def react(self, reaction: Reaction, channel: int) -> int:
        conn = self.conn
        before = conn.pending_output
        if reaction is ShellReply.ACK:
            conn.send_method(channel, commands.Basic.Ack(delivery_tag=1))
        elif reaction is ShellReply.DELIVER:
            conn.send_content(channel, DELIVER, commands.Basic.Properties(), b"m" * 10)
        elif reaction is ShellReply.BLOCKED:
            conn.send_method(0, commands.Connection.Blocked(reason="fuzz"))
        elif reaction is ShellReply.HEARTBEAT:
            conn.send_heartbeat()
        elif isinstance(reaction, type):
            conn.fail(reaction("from the shell", (60, 40)), channel)
            return 0  # a close is the connection's own answer, bounded like the others
        return conn.pending_output - before

    # ---- invariants ---------------------------------------------------------------------

    def check_input_bounded(self) -> None:
        conn = self.conn
        if conn.state in (
            ConnectionState.AWAITING_HEADER,
            ConnectionState.AWAITING_START_OK,
            ConnectionState.AUTHENTICATING,
            ConnectionState.AWAITING_TUNE_OK,
        ):
            assert conn.buffered_input < FRAME_MIN_SIZE
        # One partial frame, plus at most one partial message per channel.
        limit = conn.frame_max + conn.channel_max * self.settings.max_message_size
        assert conn.buffered_input < limit

    def check_output(self, failures: list[tuple[int, AMQPError, ConnectionState]]) -> None:
        conn, view = self.conn, self.view
        pending = conn.pending_output
        data = conn.data_to_send()
        assert len(data) == pending
        own_limit = OWN_OUTPUT_PER_INPUT_BYTE * view.fed + OWN_OUTPUT_CONSTANT
        assert view.own_output <= own_limit, (view.own_output, view.fed)
        if view.was_closed:
            assert conn.closed
            assert data == b""
        if data.startswith(b"AMQP"):
            # The answer to a wrong protocol header: ours, then the socket closes.
            assert data == PROTOCOL_HEADER
            assert conn.closed
            view.was_closed = True
            return
        self.check_closes(decode_output(data), failures)
        if view.connection_close_seen:
            assert conn.state in (ConnectionState.CLOSING, ConnectionState.CLOSED)
            assert not conn.is_open
            assert conn.open_channels == []
        for channel, error, state in failures:
            if state in (ConnectionState.CLOSING, ConnectionState.CLOSED):
                continue
            if error.closes_connection or channel == 0 or state is not ConnectionState.OPEN:
                assert view.connection_close_seen, (channel, error, state)
        view.was_closed = conn.closed

    def check_closes(
        self,
        frames: list[tuple[int, Any]],
        failures: list[tuple[int, AMQPError, ConnectionState]],
    ) -> None:
        view = self.view
        codes = {error.reply_code for _, error, _ in failures}
        soft = {(ch, error.reply_code) for ch, error, _ in failures if not error.closes_connection}
        for channel, value in frames:
            view.frames.append((channel, value))
            if view.connection_close_seen:
                # Once connection.close is out, only close-ok (to the client's crossing close)
                # and heartbeats may follow.
                assert isinstance(value, (commands.Connection.CloseOk, heartbeat.Heartbeat)), value
            if isinstance(value, commands.Connection.Close):
                assert channel == 0
                assert value.reply_code in CONNECTION_CLOSE_CODES
                assert value.reply_code in codes
                view.connection_close_seen = True
            elif isinstance(value, commands.Channel.Close):
                assert channel != 0
                assert value.reply_code in SOFT_CODES
                assert (channel, value.reply_code) in soft
            elif isinstance(value, commands.Connection.CloseOk):
                view.close_ok_seen += 1
                assert view.close_ok_seen == 1


def check_error_class(error: AMQPError) -> None:
    """Errors the connection finds itself carry an AMQP code, on RabbitMQ's side of it."""
    assert error.reply_code in CONNECTION_CLOSE_CODES, repr(error)
    assert error.closes_connection == (error.reply_code in HARD_CODES), repr(error)


def record_depth(harness: ConnectionHarness) -> None:
    """How deep the run got, for `pytest --hypothesis-show-statistics`."""
    event(f"final state {harness.conn.state.name}")
    for name in {getattr(value, "name", type(value).__name__) for _, value in harness.view.frames}:
        event(f"sent {name}")


@fuzz_settings(200)
@given(script=scripts())
def test_connection_survives_arbitrary_frame_sequences(script: Script) -> None:
    harness = ConnectionHarness(script.shell)
    for chunk in script.chunks:
        harness.feed(chunk)
    record_depth(harness)
    harness.finish()


# Methods a client may send on an open channel that do not change the channel's state.
OPEN_CHANNEL_METHODS = [
    cls
    for cls in METHOD_CLASSES
    if cls.index >> 16 != commands.Connection.frame_id
    and cls.name not in ("Channel.Open", "Channel.Close", "Channel.CloseOk", "Basic.Publish")
]


@dataclass
class PoliteClient:
    """A client that mostly follows the protocol, so runs reach deep states: it opens a
    channel before using it, answers the server's closes, and waits for close-ok before
    reusing a channel number. Now and then it sends any frame at all."""

    open: set[int] = field(default_factory=set)
    closing: set[int] = field(default_factory=set)  # sent channel.close, awaiting close-ok
    closed_by_server: set[int] = field(default_factory=set)  # owes the server a close-ok
    seen: int = 0

    def read(self, view: ClientView) -> None:
        for channel, value in view.frames[self.seen :]:
            if isinstance(value, commands.Channel.Close):
                self.open.discard(channel)
                self.closed_by_server.add(channel)
            elif isinstance(value, commands.Channel.CloseOk):
                self.closing.discard(channel)
        self.seen = len(view.frames)


@st.composite
def polite_frames(draw: st.DrawFn, client: PoliteClient, view: ClientView) -> bytes:
    if view.connection_close_seen:
        return marshal(0, commands.Connection.CloseOk())
    channel = draw(st.sampled_from([1, 2, 3]))
    if channel in client.closed_by_server:
        client.closed_by_server.discard(channel)
        return marshal(channel, commands.Channel.CloseOk())
    if channel in client.closing:
        return marshal(0, heartbeat.Heartbeat())
    if channel not in client.open:
        client.open.add(channel)
        return marshal(channel, commands.Channel.Open())
    which = draw(st.sampled_from(["publish"] * 3 + ["method"] * 3 + ["close"]))
    if which == "method":
        return marshal(channel, draw(any_method(OPEN_CHANNEL_METHODS)))
    if which == "close":
        client.open.discard(channel)
        client.closing.add(channel)
        close = commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
        return marshal(channel, close)
    size = draw(st.integers(0, 100) | st.integers(0, 17 * KIB))
    publish = commands.Basic.Publish(exchange="ex", routing_key=draw(SHORT_TEXT))
    bodies = [
        raw_frame(3, channel, b"p" * min(4088, size - start)) for start in range(0, size, 4088)
    ]
    # Properties are costly to generate and the blind test covers them: often use none.
    properties = draw(st.just(commands.Basic.Properties()) | PROPERTIES)
    content_header = header.ContentHeader(0, size, properties)
    return marshal(channel, publish) + marshal(channel, content_header) + b"".join(bodies)


@fuzz_settings(120)
@given(shell=SHELLS, data=st.data())
def test_connection_survives_a_mostly_polite_client(shell: Shell, data: st.DataObject) -> None:
    harness = ConnectionHarness(shell)
    for chunk in handshake():
        harness.feed(chunk)
    client = PoliteClient()
    for _ in range(30):
        if harness.conn.closed or harness.view.fed > MAX_INPUT:
            break
        client.read(harness.view)
        one_frame = st.sampled_from(["polite"] * 24 + ["any"]).flatmap(
            lambda kind: (
                polite_frames(client, harness.view) if kind == "polite" else client_frames()
            )
        )
        frames = data.draw(st.lists(one_frame, min_size=1, max_size=4))
        for chunk in data.draw(chunked(b"".join(frames))):
            harness.feed(chunk)
    record_depth(harness)
    harness.finish()


# ---- regressions, each with RabbitMQ's answer ----------------------------------------------


def opened(*frames: bytes) -> Script:
    """The client logs in, opens channel 1, then sends `frames` in one read."""
    return Script(chunks=(*handshake(), marshal(1, commands.Channel.Open()), b"".join(frames)))


def publish(channel: int, declared: int) -> bytes:
    return marshal(channel, commands.Basic.Publish(exchange="ex", routing_key="rk")) + marshal(
        channel, header.ContentHeader(0, declared, commands.Basic.Properties())
    )


def first_close(view: ClientView) -> tuple[str, int, int]:
    """(name, channel, reply_code) of the first close the server sent."""
    closes = [
        (value.name, channel, value.reply_code)
        for channel, value in view.frames
        if isinstance(value, (commands.Connection.Close, commands.Channel.Close))
    ]
    assert closes, "no close was sent"
    return closes[0]


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        pytest.param(
            opened(marshal(1, header.ContentHeader(0, 5, commands.Basic.Properties()))),
            ("Connection.Close", 0, ReplyCode.UNEXPECTED_FRAME),
            id="content-header-without-publish",
        ),
        pytest.param(
            # RabbitMQ's assembler does not notice (the remaining size goes negative and it
            # waits on); we close as for any content frame out of place.
            opened(publish(1, 4), raw_frame(3, 1, b"12345")),
            ("Connection.Close", 0, ReplyCode.UNEXPECTED_FRAME),
            id="body-frame-larger-than-declared",
        ),
        pytest.param(
            # RabbitMQ's assembler is back to expecting a method once the body is complete:
            # "expected method frame, got non method frame instead".
            opened(publish(1, 4), raw_frame(3, 1, b"1234"), raw_frame(3, 1, b"5")),
            ("Connection.Close", 0, ReplyCode.UNEXPECTED_FRAME),
            id="more-body-frames-than-declared",
        ),
        pytest.param(
            # RabbitMQ answers any method on channel 0 it does not expect with 504 CHANNEL_ERROR
            # "unexpected method in connection state running" (rabbit_reader:handle_method0).
            opened(marshal(0, commands.Queue.Declare(queue="q"))),
            ("Connection.Close", 0, ReplyCode.CHANNEL_ERROR),
            id="queue-method-on-channel-0",
        ),
        pytest.param(
            opened(marshal(0, commands.Basic.Publish())),
            ("Connection.Close", 0, ReplyCode.CHANNEL_ERROR),
            id="publish-on-channel-0",
        ),
        pytest.param(
            opened(raw_frame(9, 0, b"")),
            ("Connection.Close", 0, ReplyCode.FRAME_ERROR),
            id="unknown-frame-type",
        ),
        pytest.param(
            opened(marshal(1, commands.Basic.Ack(delivery_tag=1))[:-1] + b"\x00"),
            ("Connection.Close", 0, ReplyCode.FRAME_ERROR),
            id="wrong-frame-end-byte",
        ),
        pytest.param(
            opened(raw_frame(3, 1, b"x" * (8 * KIB))),
            ("Connection.Close", 0, ReplyCode.FRAME_ERROR),
            id="frame-over-frame-max",
        ),
        pytest.param(
            opened(raw_frame(1, 1, struct.pack(">HH", 60, 999))),
            ("Connection.Close", 0, ReplyCode.COMMAND_INVALID),
            id="unknown-method",
        ),
        pytest.param(
            opened(raw_frame(8, 1, b"")),
            ("Connection.Close", 0, ReplyCode.UNEXPECTED_FRAME),
            id="heartbeat-on-a-channel",
        ),
        pytest.param(
            opened(marshal(2, commands.Basic.Qos(prefetch_count=1))),
            ("Connection.Close", 0, ReplyCode.CHANNEL_ERROR),
            id="method-on-a-channel-never-opened",
        ),
        pytest.param(
            opened(b"".join(marshal(n, commands.Channel.Open()) for n in range(2, 10))),
            ("Connection.Close", 0, ReplyCode.NOT_ALLOWED),
            id="more-channels-than-channel-max",
        ),
        pytest.param(
            opened(publish(1, 16 * KIB + 1)),
            ("Channel.Close", 1, ReplyCode.PRECONDITION_FAILED),
            id="message-over-max-size-closes-only-the-channel",
        ),
        pytest.param(
            Script(chunks=(PROTOCOL_HEADER, marshal(1, commands.Channel.Open()))),
            ("Connection.Close", 0, ReplyCode.UNEXPECTED_FRAME),
            id="channel-frame-before-the-handshake",
        ),
    ],
)
def test_hostile_sequence_is_closed_with_rabbitmqs_code(
    script: Script, expected: tuple[str, int, int]
) -> None:
    assert first_close(ConnectionHarness(script.shell).play(script.chunks)) == expected


# ---- memory held for a partial message ------------------------------------------------------


@pytest.mark.parametrize("frame_size", [0, 1, 5])
def test_small_body_frames_cost_no_more_memory_than_their_bytes(frame_size: int) -> None:
    """A message sent in tiny (or empty) body frames must not make the proxy hold more than
    the bytes received (empty frames used to grow a list forever without completing), and
    past max_body_frames the connection is closed with 506 RESOURCE_ERROR."""
    harness = ConnectionHarness()
    size = 16 * KIB
    for chunk in (*handshake(), marshal(1, commands.Channel.Open()), publish(1, size)):
        harness.feed(chunk)
    conn = harness.conn
    assert conn.channel_is_open(1)
    allowed = max_body_frames(size)
    assert allowed * frame_size < size  # the message never completes
    frames = raw_frame(3, 1, b"z" * frame_size) * allowed
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        assert conn.receive_data(frames) == []
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    received = allowed * frame_size
    assert conn.buffered_input == received
    assert grown <= 2 * received + 16 * KIB, (grown, received)
    assert conn.failures == []
    events = conn.receive_data(raw_frame(3, 1, b"z" * frame_size))
    assert [type(e) for e in events] == [ev.ErrorRaised]
    [(channel, error, _)] = conn.failures
    assert channel == 1
    assert isinstance(error, ResourceError)
    assert error.reply_code == 506 and error.closes_connection
    assert conn.state is ConnectionState.CLOSING
    assert f"too many body frames ({allowed + 1})" in error.text


def test_a_message_in_frames_of_the_smallest_frame_max_is_accepted() -> None:
    """What real clients send: frames of frame_max - 8 bytes, frame_max at its minimum."""
    harness = ConnectionHarness(settings=dataclasses.replace(SETTINGS, max_message_size=MIB))
    size = MIB
    for chunk in (*handshake(), marshal(1, commands.Channel.Open()), publish(1, size)):
        harness.feed(chunk)
    conn = harness.conn
    chunk = 4096 - 8
    frames = b"".join(
        raw_frame(3, 1, b"z" * min(chunk, size - offset)) for offset in range(0, size, chunk)
    )
    events = conn.receive_data(frames)
    assert conn.failures == []
    assert [type(e) for e in events] == [ev.ContentReceived]
