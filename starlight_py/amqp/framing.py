"""AMQP 0-9-1 frames: an incremental decoder and the encoders for what the server sends.

The decoder reads the 7-byte frame header itself, so a frame larger than the negotiated
`frame_max` is refused (501 FRAME_ERROR) before any of its payload is buffered. Body frames,
the hot path, are sliced out directly; other method frames and content headers are decoded
by amqp/field_codec.py into pamqp's classes, without recursion.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from pamqp import commands, header
from pamqp import frame as pamqp_frame
from pamqp.base import Frame as PamqpMethod

from starlight_py.amqp import compiled, hot_frames
from starlight_py.amqp.errors import AMQPError, CommandInvalid, FrameError, UnexpectedFrame
from starlight_py.amqp.field_codec import (
    FieldDecodeError,
    decode_method_fields,
    decode_properties,
    encode_method_fields,
)
from starlight_py.amqp.method_ids import MethodId

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
# RabbitMQ also accepts the AMQP 0-9 header and speaks 0-9-1 to it; so do we.
ACCEPTED_PROTOCOL_HEADERS: Final = (PROTOCOL_HEADER, b"AMQP\x01\x01\x00\x09")
FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE
FRAME_OVERHEAD: Final = 8  # 7-byte header + 1 end byte
# Not a frame type of AMQP: the item `feed_joined` makes of a whole basic.publish.
FRAME_MESSAGE: Final = 0
_HEADER = struct.Struct(">BHI")
_HEARTBEAT_BYTES: Final = _HEADER.pack(FRAME_HEARTBEAT, 0, 0) + bytes([FRAME_END])


Method = PamqpMethod | hot_frames.HotMethod


@dataclass(frozen=True, slots=True)
class MethodFrame:
    channel: int
    method: Method


@dataclass(frozen=True, slots=True)
class HeaderFrame:
    channel: int
    body_size: int
    properties: commands.Basic.Properties
    # The property flags and values exactly as the client encoded them (kept so they can be
    # stored and delivered byte for byte: key order and field type tags included).
    raw_properties: bytes = field(default=b"", compare=False)


@dataclass(frozen=True, slots=True)
class BodyFrame:
    channel: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class HeartbeatFrame:
    channel: int


Frame = MethodFrame | HeaderFrame | BodyFrame | HeartbeatFrame


class FrameDecoder:
    """Turns received bytes into frames; call `feed` with whatever arrived.

    `frame_max` can be lowered after tune-ok; it bounds the memory one connection can make
    the proxy hold for a partial frame.
    """

    def __init__(self, frame_max: int) -> None:
        self.frame_max = frame_max
        self._buffer = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes | bytearray) -> tuple[list[Frame], AMQPError | None]:
        """Decode every complete frame in the buffer.

        Returns the frames decoded and, when the stream broke, the error that broke it:
        FrameError (bad frame type, size over frame_max, missing end byte), AMQPSyntaxError
        (fields that do not decode: 501 "cannot decode", as RabbitMQ) or CommandInvalid
        (unknown method). Frames before the
        error are still returned, so a valid close that precedes garbage is honoured.
        """
        raw, error = self.feed_raw(data)
        frames: list[Frame] = []
        for frame_type, channel, payload in raw:
            try:
                frames.append(decode_frame(frame_type, channel, payload))
            except AMQPError as e:
                self.reset()
                return frames, e
        return frames, error

    def feed_raw(
        self, data: bytes | bytearray
    ) -> tuple[list[tuple[int, int, bytes]], AMQPError | None]:
        """Like `feed`, without decoding payloads: (frame type, channel, payload) of each
        complete frame (the connection decodes them itself, the hot ones with `struct`).
        A payload that does not decode breaks the stream too: call `reset()` then."""
        self._buffer += data
        frames: list[tuple[int, int, bytes]] = []
        buf = self._buffer
        offset = 0
        size_limit = self.frame_max - FRAME_OVERHEAD
        unpack = _HEADER.unpack_from
        try:
            while len(buf) - offset >= 7:
                frame_type, channel, size = unpack(buf, offset)
                if frame_type not in _FRAME_TYPES:
                    raise FrameError(f"unknown frame type {frame_type}")
                if size > size_limit:
                    raise FrameError(
                        f"frame size {size + FRAME_OVERHEAD} is larger than negotiated "
                        f"frame_max {self.frame_max}"
                    )
                end = offset + 7 + size
                if len(buf) <= end:
                    break  # wait for the rest of the frame and its end byte
                if buf[end] != FRAME_END:
                    raise FrameError(f"bad frame end byte 0x{buf[end]:02x}")
                frames.append((frame_type, channel, bytes(buf[offset + 7 : end])))
                offset = end + 1
        except AMQPError as e:
            buf.clear()
            return frames, e
        if offset:
            del buf[:offset]
        return frames, None

    def feed_joined(
        self, data: bytes | bytearray, max_message_size: int
    ) -> tuple[list[tuple[Any, ...]], AMQPError | None]:
        """Like `feed_raw`, and each whole, regular basic.publish (method, content header
        and at most one body frame, one after the other on one channel, names in UTF-8, no
        larger than `max_message_size`) is one item: `(FRAME_MESSAGE, channel, exchange,
        routing_key, bits, raw_properties, body_size, body)`, bits as in the method frame.
        `unjoin` gives its frames back. The joining is compiled (native/); without it,
        this is `feed_raw`."""
        scan = compiled.scan
        if scan is None:
            return self.feed_raw(data)
        self._buffer += data
        items, offset = scan(self._buffer, self.frame_max - FRAME_OVERHEAD, max_message_size)
        if offset:
            del self._buffer[:offset]
        if len(self._buffer) < 7:
            return items, None
        # An incomplete frame (no items), or one that breaks the stream: judged here, in
        # one wording.
        rest, error = self.feed_raw(b"")
        return (items + rest if rest else items), error

    def reset(self) -> None:
        """Forget what is buffered (the stream broke)."""
        self._buffer.clear()


_FRAME_TYPES = frozenset((FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT))


def decode_frame(frame_type: int, channel: int, payload: bytes) -> Frame:
    """One frame from its type, channel and payload. Raises what `feed` reports."""
    return _decode(frame_type, channel, payload)


def _decode(frame_type: int, channel: int, payload: bytes) -> Frame:
    if frame_type == FRAME_BODY:
        return BodyFrame(channel, payload)
    if frame_type == FRAME_HEARTBEAT:
        if channel != 0:
            # RabbitMQ answers 505 here (the spec says 501); clients see RabbitMQ's.
            raise UnexpectedFrame(f"heartbeat frame on channel {channel}")
        return HeartbeatFrame(channel)
    if frame_type == FRAME_METHOD:
        return MethodFrame(channel, _decode_method(payload))
    return _decode_header(channel, payload)


_INDEX = struct.Struct(">I")
_HOT_DECODERS = hot_frames.DECODERS


def decode_method(payload: bytes) -> Method:
    """A method frame's payload; raises FrameError, CommandInvalid."""
    return _decode_method(payload)


def decode_header(channel: int, payload: bytes) -> HeaderFrame:
    """A content header frame's payload; raises FrameError, UnexpectedFrame."""
    return _decode_header(channel, payload)


def _decode_method(payload: bytes) -> Method:
    if len(payload) < 4:
        raise FrameError("cannot decode method frame: shorter than a method id")
    (index,) = _INDEX.unpack_from(payload)
    hot = _HOT_DECODERS.get(index)
    if hot is not None:
        return hot(payload)
    method_class = commands.INDEX_MAPPING.get(index)
    if method_class is None:
        raise CommandInvalidIndex(index)
    method: PamqpMethod = method_class()
    ids = (index >> 16, index & 0xFFFF)
    try:
        decode_method_fields(method, payload[4:])
    except FieldDecodeError as e:
        # RabbitMQ: 501 FRAME_ERROR "cannot decode", with the method's ids.
        raise FrameError(f"cannot decode {method.name}: {e}", ids) from e
    return method


# The properties of recent content headers, by their bytes: decoding (and checking) them is
# most of a header's cost, and most publishers send the same ones again and again. The
# decoded objects are shared, so nothing may change them (nothing does: dead-lettering and
# the Pulsar codec make new ones). Bounded in entries and in the size of what is kept.
_PROPERTIES_BY_RAW: dict[bytes, commands.Basic.Properties] = {}
_CACHE_ENTRIES = 1024
_CACHED_SIZE = 1024


def known_properties(raw: bytes) -> commands.Basic.Properties | None:
    """The decoded properties of a content header's property bytes (shared: nothing may
    change them), or None when they do not decode (the header frame's decoder says why)."""
    known = _PROPERTIES_BY_RAW.get(raw)
    if known is not None:
        return known
    try:
        properties = decode_properties(raw)
    except FieldDecodeError:
        return None
    _remember(raw, properties)
    return properties


def _remember(raw: bytes, properties: commands.Basic.Properties) -> None:
    if len(raw) <= _CACHED_SIZE:
        if len(_PROPERTIES_BY_RAW) >= _CACHE_ENTRIES:
            _PROPERTIES_BY_RAW.clear()
        _PROPERTIES_BY_RAW[raw] = properties


_PUBLISH_PREFIX: Final = _INDEX.pack(hot_frames.BASIC_PUBLISH) + b"\x00\x00"  # and the ticket


def unjoin(item: tuple[Any, ...]) -> list[tuple[int, int, bytes]]:
    """The frames of a publish `feed_joined` joined, for the frame-by-frame checks (its
    channel is not open, say). They decode to what the client sent: only the unused
    ticket and weight fields may differ (both are 0 in every client)."""
    _, channel, exchange, routing_key, bits, raw_properties, body_size, body = item
    method = (
        _PUBLISH_PREFIX
        + hot_frames.short_string(exchange)
        + hot_frames.short_string(routing_key)
        + bytes((bits,))
    )
    frames = [
        (FRAME_METHOD, channel, method),
        (FRAME_HEADER, channel, _CONTENT_HEADER_PREFIX.pack(60, 0, body_size) + raw_properties),
    ]
    if body_size:
        frames.append((FRAME_BODY, channel, body))
    return frames


def _decode_header(channel: int, payload: bytes) -> HeaderFrame:
    if len(payload) >= 14 and payload[0:2] == b"\x00\x3c":
        raw = payload[12:]
        known = _PROPERTIES_BY_RAW.get(raw)
        if known is not None:
            (body_size,) = _BODY_SIZE.unpack_from(payload, 4)
            return HeaderFrame(channel, body_size, known, raw)
    if len(payload) < 14:
        raise FrameError("cannot decode content header: shorter than its fixed fields")
    class_id, _, body_size = _CONTENT_HEADER_PREFIX.unpack_from(payload)
    if class_id != commands.Basic.frame_id:
        raise UnexpectedFrame(f"content header for class {class_id}")
    try:
        properties = decode_properties(payload, 12)
    except FieldDecodeError as e:
        raise FrameError(f"cannot decode content header: {e}") from e
    raw = payload[12:]
    _remember(raw, properties)
    return HeaderFrame(channel, body_size, properties, raw)


_BODY_SIZE = struct.Struct(">Q")


class CommandInvalidIndex(CommandInvalid):
    """A method frame names a class/method pair that AMQP 0-9-1 does not define."""

    def __init__(self, index: int) -> None:
        super().__init__(f"unknown method {index >> 16}.{index & 0xFFFF}")


def method_ids(method: Method) -> MethodId:
    """(class_id, method_id) of a method, as channel.close / connection.close report them
    (method_ids.py names those of the commands the proxy refuses by name)."""
    index: int = method.index
    return index >> 16, index & 0xFFFF


def encode_method(channel: int, method: PamqpMethod) -> bytes:
    """One method frame."""
    payload = _INDEX.pack(method.index) + encode_method_fields(method)
    return _HEADER.pack(FRAME_METHOD, channel, len(payload)) + payload + b"\xce"


def encode_content(
    channel: int,
    method: PamqpMethod,
    properties: commands.Basic.Properties,
    body: bytes,
    frame_max: int,
) -> bytes:
    """A content-bearing method, its header frame and as many body frames as frame_max needs."""
    parts = [
        encode_method(channel, method),
        pamqp_frame.marshal(header.ContentHeader(0, len(body), properties), channel),
    ]
    parts.extend(_body_frames(channel, body, frame_max - FRAME_OVERHEAD))
    return b"".join(parts)


_CONTENT_HEADER_PREFIX = struct.Struct(">HHQ")


def encode_content_raw(
    channel: int, method: PamqpMethod, raw_properties: bytes, body: bytes, frame_max: int
) -> bytes:
    """Like encode_content, with the properties already encoded (flags and values)."""
    header_payload = _CONTENT_HEADER_PREFIX.pack(60, 0, len(body)) + raw_properties
    parts = [
        encode_method(channel, method),
        _HEADER.pack(FRAME_HEADER, channel, len(header_payload)) + header_payload + b"\xce",
    ]
    parts.extend(_body_frames(channel, body, frame_max - FRAME_OVERHEAD))
    return b"".join(parts)


def encode_raw_properties(properties: commands.Basic.Properties) -> bytes:
    """The property flags and values of a content header (what decode_raw_properties reads)."""
    payload: bytes = header.ContentHeader(0, 0, properties).marshal()
    return payload[_CONTENT_HEADER_PREFIX.size :]


def decode_raw_properties(raw_properties: bytes) -> commands.Basic.Properties:
    """Decode stored property bytes; raises FrameError when they do not decode."""
    return _decode_header(0, _CONTENT_HEADER_PREFIX.pack(60, 0, 0) + raw_properties).properties


def _body_frames(channel: int, body: bytes, chunk: int) -> Iterable[bytes]:
    view = memoryview(body)
    for start in range(0, len(body), chunk):
        piece = view[start : start + chunk]
        yield _HEADER.pack(FRAME_BODY, channel, len(piece)) + piece + b"\xce"


def encode_heartbeat() -> bytes:
    return _HEARTBEAT_BYTES
