"""AMQP field values <-> JSON (how queue and binding arguments are stored in ZooKeeper)."""

from __future__ import annotations

import datetime
import decimal
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from starlight_py.model.field_values import from_json, table_from_json, table_to_json, to_json

UTC = datetime.UTC


def through_text(value: Any) -> Any:
    """What a reader gets back: to JSON, to the znode's text, and back."""
    return from_json(json.loads(json.dumps(to_json(value))))


def assert_same(actual: Any, expected: Any) -> None:
    """Equal and of the same type all the way down (True == 1 and 1 == 1.0 in Python)."""
    if isinstance(expected, bytearray | memoryview):
        expected = bytes(expected)
    if isinstance(expected, tuple):
        expected = list(expected)
    assert type(actual) is type(expected), (actual, expected)
    if isinstance(expected, dict):
        assert list(actual) == list(expected)
        for key, value in expected.items():
            assert_same(actual[key], value)
    elif isinstance(expected, list):
        assert len(actual) == len(expected)
        for got, want in zip(actual, expected, strict=True):
            assert_same(got, want)
    else:
        assert actual == expected


# ---- each field type --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (True, True),
        (False, False),
        (0, 0),
        (-5, -5),
        (2**31, 2**31),
        (2**63 - 1, 2**63 - 1),
        (-(2**63), -(2**63)),
        (1.5, 1.5),
        (-0.25, -0.25),
        ("", ""),
        ("orders", "orders"),
        ("é日本", "é日本"),
        (None, None),
        (b"", {"$bytes": ""}),
        (b"\x00\xffab", {"$bytes": "AP9hYg=="}),
        (decimal.Decimal("1.50"), {"$decimal": "1.50"}),
        (decimal.Decimal("-0.001"), {"$decimal": "-0.001"}),
        (datetime.datetime(2024, 5, 1, 12, 30, 5, tzinfo=UTC), {"$timestamp": 1714566605}),
        (datetime.datetime(1970, 1, 1, tzinfo=UTC), {"$timestamp": 0}),
        ([], []),
        ([1, "a", None], [1, "a", None]),
        ([[1], [b"x"]], [[1], [{"$bytes": "eA=="}]]),
        ({}, {}),
        ({"a": 1, "b": {"c": [True]}}, {"a": 1, "b": {"c": [True]}}),
        ({"$x": 1}, {"$table": {"$x": 1}}),
        ({"$bytes": "not base64"}, {"$table": {"$bytes": "not base64"}}),
        ({"$table": {"a": 1}}, {"$table": {"$table": {"a": 1}}}),
        ({"$a": 1, "$b": 2}, {"$a": 1, "$b": 2}),
        ({"k": {"$decimal": "x"}}, {"k": {"$table": {"$decimal": "x"}}}),
    ],
    ids=repr,
)
def test_each_field_type_has_one_json_form_and_comes_back(value: Any, encoded: Any) -> None:
    assert to_json(value) == encoded
    assert_same(from_json(encoded), value)
    assert_same(through_text(value), value)


@pytest.mark.parametrize("value", [bytearray(b"ab"), memoryview(b"ab")], ids=repr)
def test_byte_arrays_are_bytes_and_come_back_as_bytes(value: Any) -> None:
    assert to_json(value) == {"$bytes": "YWI="}
    assert through_text(value) == b"ab"


def test_tuples_are_arrays() -> None:
    assert to_json((1, (2,))) == [1, [2]]
    assert through_text((1, (2,))) == [1, [2]]


def test_non_string_table_keys_become_strings() -> None:
    assert to_json({1: "a"}) == {"1": "a"}


def test_timestamps_are_whole_seconds_in_utc() -> None:
    aware = datetime.datetime(2024, 5, 1, 14, 30, 5, 999_999, tzinfo=UTC)
    back = through_text(aware)
    assert back == aware.replace(microsecond=0)
    assert back.tzinfo == UTC


def test_a_naive_timestamp_is_taken_as_utc() -> None:
    naive = datetime.datetime(2024, 5, 1, 12, 0, 0)
    assert to_json(naive) == {"$timestamp": 1714564800}
    assert through_text(naive) == naive.replace(tzinfo=UTC)


def test_another_timezone_is_the_same_instant_in_utc() -> None:
    plus_two = datetime.timezone(datetime.timedelta(hours=2))
    local = datetime.datetime(2024, 5, 1, 14, 0, 0, tzinfo=plus_two)
    assert to_json(local) == {"$timestamp": 1714564800}
    assert through_text(local) == local


def test_integers_keep_their_value_not_their_width() -> None:
    # A short 5 and a long 5 are both 5; equivalence checks compare values.
    assert json.dumps(to_json({"short": 5, "long": 2**40})) == '{"short": 5, "long": 1099511627776}'


@pytest.mark.parametrize(
    "value",
    [object(), {1, 2}, 1j, [1, object()], {"a": {"b": object()}}, Ellipsis],
    ids=["object", "set", "complex", "in-array", "in-table", "ellipsis"],
)
def test_a_value_that_is_not_a_field_value_is_a_type_error(value: Any) -> None:
    with pytest.raises(TypeError, match="not an AMQP field value"):
        to_json(value)


@pytest.mark.parametrize(
    "encoded",
    [
        {"$decimal": "abc"},
        {"$decimal": None},
        {"$timestamp": "soon"},
        {"$timestamp": None},
        {"$timestamp": 10**20},
        {"$bytes": 5},
        {"$bytes": "a"},
        {"$table": 5},
        {"$table": [1]},
        {"k": {"$table": {"x": {"$decimal": "nope"}}}},
    ],
    ids=repr,
)
def test_a_malformed_tagged_value_is_a_value_error(encoded: Any) -> None:
    with pytest.raises(ValueError):
        from_json(encoded)


# ---- whole tables -----------------------------------------------------------------------------


def test_tables_round_trip_with_their_keys_plain() -> None:
    table = {"x-message-ttl": 1000, "x-dead-letter-exchange": "dlx", "blob": b"\x01"}
    assert table_to_json(table) == {
        "x-message-ttl": 1000,
        "x-dead-letter-exchange": "dlx",
        "blob": {"$bytes": "AQ=="},
    }
    assert table_from_json(table_to_json(table)) == table


def test_a_table_with_a_single_dollar_key_is_stored_without_the_wrapper() -> None:
    # The top level is always a table, so it needs no $table marker.
    for table in ({"$x": 1}, {"$bytes": "eA=="}, {"$table": {"a": 1}}):
        stored = table_to_json(table)
        assert stored == {key: to_json(value) for key, value in table.items()}
        assert_same(table_from_json(json.loads(json.dumps(stored))), table)


@pytest.mark.parametrize("empty", [None, {}])
def test_no_table_is_an_empty_table(empty: dict[str, Any] | None) -> None:
    assert table_to_json(empty) == {}
    assert table_from_json(empty) == {}


# ---- any value --------------------------------------------------------------------------------

TIMESTAMPS = st.datetimes(
    min_value=datetime.datetime(1900, 1, 1),
    max_value=datetime.datetime(9999, 12, 31),
    timezones=st.just(UTC),
).map(lambda moment: moment.replace(microsecond=0))
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(),
    st.binary(),
    st.decimals(allow_nan=False, allow_infinity=False),
    TIMESTAMPS,
)
KEYS = st.one_of(st.text(), st.sampled_from(["$bytes", "$decimal", "$timestamp", "$table", "$"]))
FIELD_VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(KEYS, children, max_size=4),
    ),
    max_leaves=20,
)


@given(FIELD_VALUES)
def test_any_field_value_round_trips_through_json_text(value: Any) -> None:
    assert_same(through_text(value), value)


@given(st.dictionaries(KEYS, FIELD_VALUES, max_size=5))
def test_any_table_round_trips_through_json_text(table: dict[str, Any]) -> None:
    stored = json.loads(json.dumps(table_to_json(table)))
    assert_same(table_from_json(stored), table)
