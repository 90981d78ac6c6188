"""Text from what AMQP field values and client inputs hold: str, or bytes in UTF-8."""

from __future__ import annotations


def as_text(value: object) -> str:
    """`value` as text: bytes and bytearrays decoded as UTF-8 (bytes that do not decode
    replaced), anything else through str()."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)
