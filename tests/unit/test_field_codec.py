"""amqp/field_codec.py: the same values as pamqp's decoder for what pamqp encodes, timestamps
that pass through unchanged, and hostile tables refused without recursion or copies."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import pickle
import struct
import tracemalloc
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands, decode, encode, header
from pamqp import frame as pamqp_frame

from starlight_py.amqp.field_codec import (
    MAX_FIELD_NESTING,
    AMQPTimestamp,
    FieldDecodeError,
    decode_method_fields,
    decode_properties,
    decode_table,
    encode_method_fields,
    unvalidated,
)
from tests.unit.test_fuzz_amqp import PROPERTIES, any_method

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.text(max_size=16)
    | st.binary(max_size=16).map(bytearray)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.decimals(places=2, min_value=-(10**6), max_value=10**6).map(decimal.Decimal)
    | st.datetimes(
        min_value=datetime.datetime(1970, 1, 2),
        max_value=datetime.datetime(2100, 1, 1),
        timezones=st.just(datetime.UTC),
    ).map(lambda moment: moment.replace(microsecond=0))
)
TABLES = st.recursive(
    st.dictionaries(st.text(max_size=8), SCALARS, max_size=4),
    lambda inner: st.dictionaries(
        st.text(max_size=8), SCALARS | inner | st.lists(SCALARS | inner, max_size=3), max_size=4
    ),
    max_leaves=12,
)


@given(TABLES)
def test_tables_decode_as_pamqp_decodes_them(table: dict[str, Any]) -> None:
    data = encode.field_table(table)
    ours, end = decode_table(data)
    assert end == len(data)
    assert ours == decode.field_table(data)[1]
    assert encode.field_table(ours) == data


@given(PROPERTIES)
def test_properties_decode_as_pamqp_decodes_them(properties: commands.Basic.Properties) -> None:
    data = header.ContentHeader(0, 1, properties).marshal()
    pamqps = header.ContentHeader()
    pamqps.unmarshal(data)
    assert dict(decode_properties(data, 12)) == dict(pamqps.properties)


@given(any_method())
def test_method_fields_decode_as_pamqp_decodes_them(method: Any) -> None:
    payload = pamqp_frame.marshal(method, 1)[11:-1]
    ours = type(method).__new__(type(method))
    decode_method_fields(ours, payload)
    theirs = type(method).__new__(type(method))
    theirs.unmarshal(payload)
    assert dict(ours) == dict(theirs)


@given(any_method())
def test_method_fields_encode_as_pamqp_encodes_them(method: Any) -> None:
    assert encode_method_fields(method) == method.marshal()


@pytest.mark.parametrize("name", ["café", "orders{1}", "a b/c#*", "é" * 127])
def test_names_rabbitmq_accepts_are_made_and_encoded(name: str) -> None:
    with pytest.raises(ValueError):
        commands.Queue.DeclareOk(name, 1, 2)  # pamqp refuses them
    reply = unvalidated(commands.Queue.DeclareOk, queue=name, message_count=1, consumer_count=2)
    decoded = commands.Queue.DeclareOk.__new__(commands.Queue.DeclareOk)
    decode_method_fields(decoded, encode_method_fields(reply))
    assert (decoded.queue, decoded.message_count, decoded.consumer_count) == (name, 1, 2)
    returned = unvalidated(commands.Basic.Return, reply_code=312, exchange=name)
    defaults = commands.Basic.Return(312)
    assert (returned.reply_text, returned.routing_key) == (
        defaults.reply_text,
        defaults.routing_key,
    )
    with pytest.raises(TypeError):
        unvalidated(commands.Queue.DeclareOk, queues=name)


@pytest.mark.parametrize(
    "raw",
    [
        1_700_000_000,  # seconds
        1_700_000_000_123,  # milliseconds
        1_700_000_000_123_456,  # microseconds: pamqp fails (year 58868)
        1_700_000_000_123_456_789,  # nanoseconds
        2**64 - 1,
        0,
    ],
)
def test_timestamps_are_encoded_again_as_they_came(raw: int) -> None:
    properties = struct.pack(">H", 0x0040) + struct.pack(">Q", raw)
    decoded = decode_properties(properties)
    assert isinstance(decoded.timestamp, AMQPTimestamp)
    assert header.ContentHeader(0, 0, decoded).marshal()[12:] == properties
    table = b"\x01tT" + struct.pack(">Q", raw)
    value, _ = decode_table(struct.pack(">I", len(table)) + table)
    assert encode.field_table(value) == struct.pack(">I", len(table)) + table
    assert pickle.loads(pickle.dumps(value["t"])).raw == raw


def test_a_timestamp_reads_as_the_time_it_most_likely_means() -> None:
    moment = datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC)
    assert AMQPTimestamp.of(1_700_000_000) == moment
    assert AMQPTimestamp.of(1_700_000_000_000) == moment
    assert AMQPTimestamp.of(1_700_000_000_000_000) == moment
    assert AMQPTimestamp.of(2**64 - 1).year == 2554  # as nanoseconds


def nested(depth: int) -> bytes:
    """A field table holding `depth` - 1 tables inside each other."""
    table = b""
    for _ in range(depth - 1):
        table = b"\x01aF" + struct.pack(">I", len(table)) + table
    return struct.pack(">I", len(table)) + table


def test_tables_nest_up_to_the_limit() -> None:
    value, _ = decode_table(nested(MAX_FIELD_NESTING))
    depth = 0
    while value:
        value = value["a"]
        depth += 1
    assert depth == MAX_FIELD_NESTING - 1


def test_a_hostile_nesting_is_refused_without_holding_memory() -> None:
    data = nested(15_000)  # 105 KB
    tracemalloc.start()
    try:
        with pytest.raises(FieldDecodeError, match=f"deeper than {MAX_FIELD_NESTING}"):
            decode_table(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # pamqp copies the rest of the frame at every level: about 100 MB for this one.
    assert peak < 200_000


def test_arrays_count_as_levels() -> None:
    array = b""
    for _ in range(MAX_FIELD_NESTING):
        array = b"A" + struct.pack(">I", len(array)) + array
    table = b"\x01a" + array
    with pytest.raises(FieldDecodeError):
        decode_table(struct.pack(">I", len(table)) + table)


@pytest.mark.parametrize(
    "table",
    [
        b"\x05ab",  # key longer than the table
        b"\x01a",  # key without a value
        b"\x01aZ",  # unknown type
        b"\x01aI\x00\x00",  # value cut short
        b"\x01aS\x00\x00\x00\x09abc",  # string longer than the table
        b"\x01aF\x00\x00\x00\x09",  # inner table longer than the outer
        b"\x01\xff" + b"I\x00\x00\x00\x01",  # key not UTF-8
    ],
)
def test_malformed_tables_are_field_decode_errors(table: bytes) -> None:
    with pytest.raises(FieldDecodeError):
        decode_table(struct.pack(">I", len(table)) + table)


@given(st.binary(max_size=80))
def test_any_bytes_decode_or_raise_field_decode_error(data: bytes) -> None:
    for decoder in (decode_table, decode_properties):
        with contextlib.suppress(FieldDecodeError):
            decoder(data)
    method = commands.Queue.Declare.__new__(commands.Queue.Declare)
    with contextlib.suppress(FieldDecodeError):
        decode_method_fields(method, data)
