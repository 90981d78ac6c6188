"""The messages of a Pulsar batch entry, read from its raw payload (pure).

The admin API's peek (`.../subscription/<s>/position/N`) answers a batch entry with the
entry's metadata in headers (`X-Pulsar-num-batch-message`; `X-Pulsar-PROPERTY` is then
empty) and its uncompressed payload as the body: for each message, a 4-byte big-endian size,
a `SingleMessageMetadata` protobuf of that size (properties, payload size, ...), then the
message's payload. The proxy's producers never compress, so that is what it reads.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

_PROPERTIES = 1  # SingleMessageMetadata.properties: repeated KeyValue
_PAYLOAD_SIZE = 3  # SingleMessageMetadata.payload_size
_KEY, _VALUE = 1, 2  # KeyValue.key, KeyValue.value


class BatchPayloadError(ValueError):
    """The payload is not a well-formed batch of `count` messages."""


def batch_properties(payload: bytes, count: int) -> list[dict[str, str]]:
    """The properties of each of the `count` messages of a batch entry's payload, in order.

    Raises BatchPayloadError when the payload is cut short or malformed."""
    view = memoryview(payload)
    messages: list[dict[str, str]] = []
    at = 0
    for _ in range(count):
        if at + 4 > len(view):
            raise BatchPayloadError(f"batch payload ends after {len(messages)} messages")
        (size,) = struct.unpack_from(">I", view, at)
        at += 4
        if at + size > len(view):
            raise BatchPayloadError("a message's metadata runs past the payload")
        properties: dict[str, str] = {}
        payload_size = None
        for number, value in _fields(view[at : at + size]):
            if number == _PROPERTIES and isinstance(value, memoryview):
                key, text = _key_value(value)
                properties[key] = text
            elif number == _PAYLOAD_SIZE and isinstance(value, int):
                payload_size = value
        at += size
        if payload_size is None or payload_size < 0 or at + payload_size > len(view):
            raise BatchPayloadError("a message's payload size is missing or runs past the payload")
        at += payload_size
        messages.append(properties)
    return messages


def _key_value(data: memoryview) -> tuple[str, str]:
    key = value = ""
    for number, field in _fields(data):
        if isinstance(field, memoryview):
            if number == _KEY:
                key = _utf8(field)
            elif number == _VALUE:
                value = _utf8(field)
    return key, value


def _utf8(data: memoryview) -> str:
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise BatchPayloadError("a property is not UTF-8") from e


def _fields(data: memoryview) -> Iterator[tuple[int, int | memoryview]]:
    """(field number, value) of a protobuf message: varints as ints, length-delimited fields
    as views; fixed 32/64-bit fields are skipped (yielded as 0)."""
    at = 0
    while at < len(data):
        tag, at = _varint(data, at)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            value, at = _varint(data, at)
            yield number, value
        elif wire_type == 2:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise BatchPayloadError("a field runs past its message")
            yield number, data[at : at + length]
            at += length
        elif wire_type in (1, 5):
            at += 8 if wire_type == 1 else 4
            if at > len(data):
                raise BatchPayloadError("a fixed-size field runs past its message")
            yield number, 0
        else:
            raise BatchPayloadError(f"unexpected protobuf wire type {wire_type}")


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise BatchPayloadError("a varint runs past its message")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
