"""Reading the messages' properties out of a Pulsar batch entry's payload."""

from __future__ import annotations

import struct

import pytest

from starlight_py.backend.batch_payload import BatchPayloadError, batch_properties

# What Pulsar 4.0.8's admin API answered for a peek of one batch entry of three messages
# sent by pulsar-client with properties {"x-exp": ..., "k": ...} (bodies m0, m1, m2).
PEEKED = (
    b"\x00\x00\x00\x1c\n\r\n\x05x-exp\x12\x043000\n\x07\n\x01k\x12\x02v0\x18\x02@\x00m0"
    b"\x00\x00\x00\x1c\n\r\n\x05x-exp\x12\x042000\n\x07\n\x01k\x12\x02v1\x18\x02@\x01m1"
    b"\x00\x00\x00\x1c\n\r\n\x05x-exp\x12\x041000\n\x07\n\x01k\x12\x02v2\x18\x02@\x02m2"
)


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, data: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(data)) + data


def message(properties: dict[str, str], body: bytes, extra: bytes = b"") -> bytes:
    metadata = b"".join(
        field(1, field(1, k.encode()) + field(2, v.encode())) for k, v in properties.items()
    )
    metadata += varint(3 << 3) + varint(len(body)) + extra
    return struct.pack(">I", len(metadata)) + metadata + body


def test_a_batch_read_from_pulsar() -> None:
    assert batch_properties(PEEKED, 3) == [
        {"x-exp": "3000", "k": "v0"},
        {"x-exp": "2000", "k": "v1"},
        {"x-exp": "1000", "k": "v2"},
    ]


def test_messages_without_properties_long_bodies_and_fields_to_skip() -> None:
    body = b"x" * 300  # a two-byte varint size
    fixed = varint(5 << 3 | 1) + b"\x00" * 8 + varint(6 << 3 | 5) + b"\x00" * 4
    payload = message({}, body, fixed) + message({"é": "ü", "": ""}, b"")
    assert batch_properties(payload, 2) == [{}, {"é": "ü", "": ""}]


@pytest.mark.parametrize(
    "payload, count",
    [
        (PEEKED, 4),  # fewer messages than the entry says
        (PEEKED[:-1], 3),  # the last body cut short
        (PEEKED[:10], 1),  # metadata cut short
        (struct.pack(">I", 2) + b"\x18\x80", 1),  # a varint that never ends
        (struct.pack(">I", 1) + b"\x0b", 1),  # wire type 3
        (struct.pack(">I", 0), 1),  # no payload size
        (message({"k": "v"}, b"").replace(b"\x01k", b"\x01\xff"), 1),  # not UTF-8
    ],
)
def test_malformed_payloads_are_refused(payload: bytes, count: int) -> None:
    with pytest.raises(BatchPayloadError):
        batch_properties(payload, count)
