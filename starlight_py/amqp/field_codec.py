"""Decoding of AMQP 0-9-1 field tables, method fields and content-header properties, and
the encoding of method frames the server sends.

The values are those pamqp's decoder gives (the rest of the proxy and pamqp's encoder work
with them), decoded differently where a hostile or unusual client would hurt:

- **No recursion, no copies.** Nested tables and arrays are walked with an explicit stack,
  reading the frame in place, and refused past `MAX_FIELD_NESTING` levels as soon as the
  decoder gets there. A 15,000-level table costs a 105 KB frame and a few microseconds,
  not a RecursionError holding ~100 MB of slices until the garbage collector runs.
- **Timestamps pass through untouched.** AMQP timestamps are 64 bits and clients send
  seconds, milliseconds or microseconds. A timestamp decodes to an `AMQPTimestamp`, a
  `datetime` that remembers the integer it came from and gives it back from `timestamp()`,
  so encoding it again (pamqp, dead-lettering, the Pulsar readable copy) writes the same
  integer. pamqp's own decoder divides large values by 1000 and fails past the year 9999.
"""

from __future__ import annotations

import datetime
import inspect
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final, TypeVar

from pamqp import commands, encode
from pamqp.base import Frame as PamqpMethod

# How deep field tables and arrays may nest; deeper ones are refused with 501 FRAME_ERROR:
# every layer that handles a message (the Pulsar codec, ZooKeeper records, re-encoding for
# delivery, pamqp's encoder) walks them recursively. No client needs more than a few levels.
MAX_FIELD_NESTING: Final = 64


class FieldDecodeError(ValueError):
    """Bytes that do not decode as the AMQP fields they should hold."""


class AMQPTimestamp(datetime.datetime):
    """An AMQP timestamp: a UTC datetime (what pamqp gives) that keeps the 64-bit integer
    the client sent. `timestamp()` returns that integer, which is what pamqp encodes."""

    __slots__ = ("raw",)
    raw: int

    @classmethod
    def of(cls, raw: int) -> AMQPTimestamp:
        moment = _moment(raw)
        value = cls(
            moment.year,
            moment.month,
            moment.day,
            moment.hour,
            moment.minute,
            moment.second,
            moment.microsecond,
            tzinfo=datetime.UTC,
        )
        value.raw = raw
        return value

    def timestamp(self) -> float:
        # An int where datetime gives a float: pamqp encodes int(value.timestamp()).
        return self.raw

    def __reduce_ex__(self, protocol: Any) -> tuple[Callable[[int], AMQPTimestamp], tuple[int]]:
        return (AMQPTimestamp.of, (self.raw,))

    def __repr__(self) -> str:
        return f"AMQPTimestamp({self.raw})"


def _moment(raw: int) -> datetime.datetime:
    """The time `raw` most likely means: seconds, else milliseconds, microseconds or
    nanoseconds, whichever is a date datetime can hold (as pamqp: above 2^32 it is not
    seconds)."""
    divisors = (1000, 1_000_000, 1_000_000_000) if raw > 0xFFFFFFFF else (1,)
    for divisor in divisors:
        try:
            return datetime.datetime.fromtimestamp(raw / divisor, datetime.UTC)
        except (OverflowError, OSError, ValueError):
            continue
    return datetime.datetime.max.replace(tzinfo=datetime.UTC)


_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_DECIMAL = struct.Struct(">Bi")

# Fixed-size field values: type byte -> (struct, how to make the value).
_FIXED: dict[int, tuple[struct.Struct, Callable[[Any], Any] | None]] = {
    ord("t"): (_U8, bool),
    ord("b"): (struct.Struct(">b"), None),
    ord("B"): (_U8, None),
    ord("s"): (struct.Struct(">h"), None),
    ord("u"): (_U16, None),
    ord("I"): (struct.Struct(">i"), None),
    ord("i"): (_U32, None),
    ord("l"): (struct.Struct(">q"), None),
    ord("L"): (struct.Struct(">q"), None),
    ord("f"): (struct.Struct(">f"), None),
    ord("d"): (struct.Struct(">d"), None),
    ord("T"): (_U64, AMQPTimestamp.of),
}
_TABLE = ord("F")
_ARRAY = ord("A")
_LONG_STRING = ord("S")
_BYTES = ord("x")
_DECIMAL_TYPE = ord("D")
_VOID = (ord("V"), 0)


def decode_table(data: bytes, offset: int = 0) -> tuple[dict[str, Any], int]:
    """The field table at `offset` (its 4-byte length first) and the offset after it.
    Raises FieldDecodeError."""
    value, end = _decode_container(data, offset, {})
    return value, end


def decode_array(data: bytes, offset: int = 0) -> tuple[list[Any], int]:
    """The field array at `offset` (its 4-byte length first) and the offset after it."""
    value, end = _decode_container(data, offset, [])
    return value, end


def _decode_container(data: bytes, offset: int, root: Any) -> tuple[Any, int]:
    size = len(data)
    root_end = _container_end(data, offset, size)
    # The containers being filled, innermost last: (table or array, where it ends).
    stack: list[tuple[Any, int]] = [(root, root_end)]
    pos = offset + 4
    while stack:
        container, end = stack[-1]
        if pos >= end:
            stack.pop()
            continue
        key = None
        if type(container) is dict:
            key, pos = _table_key(data, pos, end)
        kind = data[pos]
        pos += 1
        if kind in (_TABLE, _ARRAY):
            inner_end = _container_end(data, pos, end)
            if len(stack) >= MAX_FIELD_NESTING:
                raise FieldDecodeError(
                    f"field tables and arrays nested deeper than {MAX_FIELD_NESTING} levels"
                )
            inner: Any = {} if kind == _TABLE else []
            _put(container, key, inner)
            stack.append((inner, inner_end))
            pos += 4
            continue
        value, pos = _scalar(kind, data, pos, end)
        _put(container, key, value)
    return root, root_end


def _table_key(data: bytes, pos: int, end: int) -> tuple[str, int]:
    """A field table's key at `pos` (a short string) and where its value starts."""
    key_length = data[pos]
    pos += 1
    if pos + key_length > end:
        raise FieldDecodeError("a field table key runs past the end of its table")
    try:
        key = data[pos : pos + key_length].decode("utf-8")
    except UnicodeDecodeError as e:
        raise FieldDecodeError("a field table key is not UTF-8") from e
    pos += key_length
    if pos >= end:
        raise FieldDecodeError("a field table key has no value")
    return key, pos


def _scalar(kind: int, data: bytes, pos: int, end: int) -> tuple[Any, int]:
    """A value that is neither a table nor an array, of type `kind`, at `pos` (its
    container ends at `end`), and the offset after it."""
    fixed = _FIXED.get(kind)
    value: Any
    if fixed is not None:
        layout, make = fixed
        if pos + layout.size > end:
            raise FieldDecodeError("a field value runs past the end of its table")
        (value,) = layout.unpack_from(data, pos)
        return (value if make is None else make(value)), pos + layout.size
    if kind in (_LONG_STRING, _BYTES):
        stop = _container_end(data, pos, end)
        raw = data[pos + 4 : stop]
        if kind == _BYTES:
            return bytearray(raw), stop
        try:
            return raw.decode("utf-8"), stop
        except UnicodeDecodeError:
            return bytes(raw), stop
    if kind == _DECIMAL_TYPE:
        if pos + 5 > end:
            raise FieldDecodeError("a decimal runs past the end of its table")
        places, digits = _DECIMAL.unpack_from(data, pos)
        return Decimal(digits) * (Decimal(10) ** -places), pos + 5
    if kind in _VOID:
        return None, pos
    raise FieldDecodeError(f"unknown field value type {bytes([kind])!r}")


def _container_end(data: bytes, pos: int, limit: int) -> int:
    """Where the length-prefixed value at `pos` ends; it must end within `limit`."""
    if pos + 4 > limit:
        raise FieldDecodeError("a length runs past the end of the data")
    length: int = _U32.unpack_from(data, pos)[0]
    end = pos + 4 + length
    if end > limit:
        raise FieldDecodeError("a field value runs past the end of its table")
    return end


def _put(container: Any, key: str | None, value: Any) -> None:
    if key is None:
        container.append(value)
    else:
        container[key] = value


# ---- method fields and properties ---------------------------------------------------------


def _short_string(data: bytes, pos: int) -> tuple[str, int]:
    length = data[pos]
    end = pos + 1 + length
    if end > len(data):
        raise FieldDecodeError("a short string runs past the end of the frame")
    try:
        return data[pos + 1 : end].decode("utf-8"), end
    except UnicodeDecodeError as e:
        raise FieldDecodeError("a short string is not UTF-8") from e


def _long_string(data: bytes, pos: int) -> tuple[str | bytes, int]:
    end = _container_end(data, pos, len(data))
    raw = data[pos + 4 : end]
    try:
        return raw.decode("utf-8"), end
    except UnicodeDecodeError:
        return raw, end


def _fixed(layout: struct.Struct) -> Callable[[bytes, int], tuple[Any, int]]:
    size = layout.size

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        if pos + size > len(data):
            raise FieldDecodeError("a field runs past the end of the frame")
        return layout.unpack_from(data, pos)[0], pos + size

    return read


def _timestamp(data: bytes, pos: int) -> tuple[AMQPTimestamp, int]:
    raw, end = _fixed(_U64)(data, pos)
    return AMQPTimestamp.of(raw), end


_BY_TYPE: dict[str, Callable[[bytes, int], tuple[Any, int]]] = {
    "octet": _fixed(_U8),
    "short": _fixed(_U16),
    "long": _fixed(_U32),
    "longlong": _fixed(struct.Struct(">q")),
    "shortstr": _short_string,
    "longstr": _long_string,
    "table": decode_table,
    "timestamp": _timestamp,
}


def decode_method_fields(method: PamqpMethod, data: bytes) -> None:
    """Set `method`'s fields from its frame payload after the class and method ids, in the
    order of its slots (consecutive bits share an octet). Raises FieldDecodeError."""
    pos = 0
    bit = 0  # the next bit of the current octet; 0: no bits being read
    try:
        for name in method.__slots__:
            kind = method.amqp_type(name)
            if kind == "bit":
                if bit == 8:
                    pos += 1
                    bit = 0
                if pos >= len(data):
                    raise FieldDecodeError("a bit field runs past the end of the frame")
                setattr(method, name, bool(data[pos] & (1 << bit)))
                bit += 1
                continue
            if bit:
                pos += 1
                bit = 0
            value, pos = _BY_TYPE[kind](data, pos)
            setattr(method, name, value)
    except IndexError as e:
        raise FieldDecodeError("a field runs past the end of the frame") from e


_PROPERTY_TYPES: Final = tuple(
    (name, commands.Basic.Properties.flags[name], getattr(commands.Basic.Properties, "_" + name))
    for name in commands.Basic.Properties.__slots__
)


def decode_properties(data: bytes, pos: int = 0) -> commands.Basic.Properties:
    """The basic properties of a content header: `data[pos:]` holds the property flags and
    then the properties present. Raises FieldDecodeError."""
    flags = 0
    word = 0
    while True:
        if pos + 2 > len(data):
            raise FieldDecodeError("content header flags are truncated")
        (partial,) = _U16.unpack_from(data, pos)
        pos += 2
        flags |= partial << (16 * word)
        if not partial & 1:
            break
        word += 1
    properties = commands.Basic.Properties()
    try:
        for name, flag, kind in _PROPERTY_TYPES:
            if flags & flag:
                value, pos = _BY_TYPE[kind](data, pos)
                setattr(properties, name, value)
    except IndexError as e:
        raise FieldDecodeError("a property runs past the end of the frame") from e
    return properties


def encode_method_fields(method: PamqpMethod) -> bytes:
    """`method`'s fields as a method frame carries them after the class and method ids (what
    pamqp's `marshal` writes, without its checks of names)."""
    output: list[bytes] = []
    bits = -1  # the octet of bits being filled; -1: none
    bit = 0
    for name in method.__slots__:
        kind = method.amqp_type(name)
        value = getattr(method, name, 0)
        if kind == "bit":
            if bits < 0:
                bits, bit = 0, 0
            bits |= bool(value) << bit
            bit += 1
            if bit == 8:
                output.append(bytes([bits]))
                bits = -1
            continue
        if bits >= 0:
            output.append(bytes([bits]))
            bits = -1
        output.append(encode.by_type(value, kind))
    if bits >= 0:
        output.append(bytes([bits]))
    return b"".join(output)


_M = TypeVar("_M", bound=PamqpMethod)


def unvalidated(cls: type[_M], **fields: Any) -> _M:
    """A method of class `cls` with `fields` and the defaults of the others, made without
    pamqp's checks of names (which refuse names RabbitMQ accepts)."""
    method = cls.__new__(cls)
    for name, default in _defaults(cls).items():
        setattr(method, name, fields.pop(name, default))
    if fields:
        raise TypeError(f"{cls.__name__} has no fields {sorted(fields)}")
    return method


_DEFAULTS: dict[type[PamqpMethod], dict[str, Any]] = {}


def _defaults(cls: type[PamqpMethod]) -> dict[str, Any]:
    known = _DEFAULTS.get(cls)
    if known is None:
        parameters = inspect.signature(cls.__init__).parameters
        known = _DEFAULTS[cls] = {name: parameters[name].default for name in cls.__slots__}
    return known
