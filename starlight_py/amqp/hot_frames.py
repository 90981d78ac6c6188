"""The frames every message passes through, sliced and packed with `struct`, no pamqp objects.

A message costs one basic.publish with its content header and body, one basic.deliver with
its header and body, a share of a basic.ack from the consumer and a share of a confirm to the
publisher. pamqp builds a Python object per frame and walks its fields generically, which
cost more than the rest of the proxy's work per message together
(docs/history/performance-log.md, "What changed in the message path").
Everything else (handshake, topology methods, basic.get-ok, basic.return) keeps using pamqp:
those are not per message, and the byte-exact equivalence of both paths is tested
(tests/unit/test_hot_frames.py).

Decoders raise `FrameError` (501, "cannot decode ...", with the method's ids) for payloads
that do not hold the fields, as the generic decoder does.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Final

from starlight_py.amqp import compiled, method_ids
from starlight_py.amqp.errors import FrameError

FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_END_BYTE: Final = b"\xce"
FRAME_OVERHEAD: Final = 8

# (class_id << 16) | method_id, as the first four bytes of a method frame's payload.
BASIC_PUBLISH: Final = (60 << 16) | 40
BASIC_DELIVER: Final = (60 << 16) | 60
BASIC_ACK: Final = (60 << 16) | 80
BASIC_REJECT: Final = (60 << 16) | 90
BASIC_NACK: Final = (60 << 16) | 120

_FRAME_HEADER = struct.Struct(">BHI")
_METHOD_HEADER = struct.Struct(">BHIHH")  # frame header + class id + method id
_TAG_AND_BITS = struct.Struct(">QB")
_CONTENT_HEADER = struct.Struct(">BHIHHQ")  # frame header + class, weight, body size
_ACK_FRAME = struct.Struct(">BHIHHQBB")  # a whole basic.ack / basic.nack frame
_SHORT = struct.Struct(">H")


class _Fields:
    __slots__: tuple[str, ...] = ()

    def __iter__(self) -> Iterator[tuple[str, object]]:
        """(name, value) of each field, as iterating a pamqp method gives them."""
        for name in type(self).__slots__:
            yield name, getattr(self, name)


class Publish(_Fields):
    """basic.publish's fields (the deprecated ticket is not kept)."""

    __slots__ = ("exchange", "immediate", "mandatory", "routing_key")
    name: Final = "Basic.Publish"  # as pamqp's methods, for error texts and method ids
    index: Final = BASIC_PUBLISH

    def __init__(self, exchange: str, routing_key: str, mandatory: bool, immediate: bool) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.immediate = immediate

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Publish) and (
            self.exchange,
            self.routing_key,
            self.mandatory,
            self.immediate,
        ) == (other.exchange, other.routing_key, other.mandatory, other.immediate)

    def __repr__(self) -> str:
        return (
            f"Publish(exchange={self.exchange!r}, routing_key={self.routing_key!r}, "
            f"mandatory={self.mandatory}, immediate={self.immediate})"
        )

    __hash__ = None  # type: ignore[assignment]


def decode_publish(payload: bytes) -> Publish:
    """basic.publish from a method frame payload (its first 4 bytes are the method id)."""
    try:
        end = 7 + payload[6]
        exchange = payload[7:end].decode("utf-8")
        key_end = end + 1 + payload[end]
        routing_key = payload[end + 1 : key_end].decode("utf-8")
        bits = payload[key_end]  # IndexError as well when a name was cut short
    except (IndexError, UnicodeDecodeError) as e:
        raise FrameError(f"cannot decode Basic.Publish: {e}", method_ids.BASIC_PUBLISH) from e
    return Publish(exchange, routing_key, bool(bits & 1), bool(bits & 2))


class Ack(_Fields):
    """basic.ack from the client."""

    __slots__ = ("delivery_tag", "multiple")
    name: Final = "Basic.Ack"
    index: Final = BASIC_ACK

    def __init__(self, delivery_tag: int, multiple: bool) -> None:
        self.delivery_tag = delivery_tag
        self.multiple = multiple


class Nack(_Fields):
    """basic.nack from the client."""

    __slots__ = ("delivery_tag", "multiple", "requeue")
    name: Final = "Basic.Nack"
    index: Final = BASIC_NACK

    def __init__(self, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        self.delivery_tag = delivery_tag
        self.multiple = multiple
        self.requeue = requeue


class Reject(_Fields):
    """basic.reject from the client."""

    __slots__ = ("delivery_tag", "requeue")
    name: Final = "Basic.Reject"
    index: Final = BASIC_REJECT

    def __init__(self, delivery_tag: int, requeue: bool) -> None:
        self.delivery_tag = delivery_tag
        self.requeue = requeue


HotMethod = Publish | Ack | Nack | Reject


def _tag_and_bits(payload: bytes, name: str, index: int) -> tuple[int, int]:
    if len(payload) < 13:
        raise FrameError(
            f"cannot decode {name}: {len(payload)} bytes", (index >> 16, index & 0xFFFF)
        )
    tag, bits = _TAG_AND_BITS.unpack_from(payload, 4)
    return tag, bits


def decode_ack(payload: bytes) -> Ack:
    tag, bits = _tag_and_bits(payload, "Basic.Ack", BASIC_ACK)
    return Ack(tag, bool(bits & 1))


def decode_nack(payload: bytes) -> Nack:
    tag, bits = _tag_and_bits(payload, "Basic.Nack", BASIC_NACK)
    return Nack(tag, bool(bits & 1), bool(bits & 2))


def decode_reject(payload: bytes) -> Reject:
    tag, bits = _tag_and_bits(payload, "Basic.Reject", BASIC_REJECT)
    return Reject(tag, bool(bits & 1))


# Method id -> decoder, for the methods decoded here rather than by pamqp.
DECODERS: Final[dict[int, Callable[[bytes], HotMethod]]] = {
    BASIC_PUBLISH: decode_publish,
    BASIC_ACK: decode_ack,
    BASIC_NACK: decode_nack,
    BASIC_REJECT: decode_reject,
}


def short_string(value: str) -> bytes:
    """An AMQP shortstr: length byte and UTF-8 bytes (names are checked to fit elsewhere)."""
    data = value.encode("utf-8")
    return bytes((len(data),)) + data


def encode_deliver_in_python(
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    raw_properties: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """basic.deliver with its content header and body frames. `consumer_tag` is already a
    shortstr (`short_string`): a consumer encodes its tag once. `encode_deliver` is this,
    compiled when it can be (native/)."""
    arguments = (
        consumer_tag
        + _TAG_AND_BITS.pack(delivery_tag, 1 if redelivered else 0)
        + short_string(exchange)
        + short_string(routing_key)
    )
    return (
        _METHOD_HEADER.pack(FRAME_METHOD, channel, 4 + len(arguments), 60, 60)
        + arguments
        + FRAME_END_BYTE
        + content_frames(channel, raw_properties, body, frame_max)
    )


# What the message core calls: the compiled encoder, byte for byte the same.
encode_deliver: Final = compiled.encode_deliver or encode_deliver_in_python


def content_frames(channel: int, raw_properties: bytes, body: bytes, frame_max: int) -> bytes:
    """The content header (properties already encoded) and the body frames of a message."""
    header = (
        _CONTENT_HEADER.pack(FRAME_HEADER, channel, 12 + len(raw_properties), 60, 0, len(body))
        + raw_properties
        + FRAME_END_BYTE
    )
    chunk = frame_max - FRAME_OVERHEAD
    if len(body) <= chunk:
        if not body:
            return header
        return header + _FRAME_HEADER.pack(FRAME_BODY, channel, len(body)) + body + FRAME_END_BYTE
    parts = [header]
    view = memoryview(body)
    for start in range(0, len(body), chunk):
        piece = view[start : start + chunk]
        parts.append(_FRAME_HEADER.pack(FRAME_BODY, channel, len(piece)))
        parts.append(piece.tobytes())
        parts.append(FRAME_END_BYTE)
    return b"".join(parts)


def encode_confirm(channel: int, delivery_tag: int, multiple: bool, ok: bool) -> bytes:
    """A publisher confirm: basic.ack, or basic.nack with requeue=false, as RabbitMQ sends."""
    method = 80 if ok else 120
    return _ACK_FRAME.pack(
        FRAME_METHOD, channel, 13, 60, method, delivery_tag, 1 if multiple else 0, 0xCE
    )
