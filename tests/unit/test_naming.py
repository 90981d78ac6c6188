"""The AMQP -> Pulsar name format: examples for each rule, then properties for any name."""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import (
    DEFAULT_EXCHANGE_TOPIC_NAME,
    TopicName,
    binding_topic,
    escape,
    exchange_and_key_of_topic,
    exchange_topic,
    new_binding_set_id,
    parse_binding_topic,
    parse_exchange_topic,
    parse_subscription_name,
    priority_band_topic,
    quote_path_segment,
    subscription_name,
    unescape,
)

NS = NamespaceName("public", "default")
ESCAPED_ALPHABET = re.compile(r"[A-Za-z0-9_.~-]*")
# st.text() leaves out surrogates; escape must take any str, lone surrogates included.
ANY_STR = st.text(st.characters(codec=None, exclude_categories=()))
NAMES = st.one_of(
    st.text(),
    ANY_STR,
    # Dense in what the rules are about: dashes, tildes, the word partition, digits.
    st.lists(st.sampled_from(["-", "~", "~~", "partition", "-partition-", "1", "a", " "])).map(
        "".join
    ),
)
BINDING_SET_IDS = st.text("0123456789abcdef", min_size=12, max_size=12)


# ---- escape ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "escaped"),
    [
        ("", ""),
        ("orders", "orders"),
        ("Az09_.-", "Az09_.-"),
        ("ex with space", "ex~20with~20space"),
        ("a/b", "a~2Fb"),
        ("tilde~", "tilde~7E"),
        ("~~", "~7E~7E"),
        ("%", "~25"),
        ("é", "~C3~A9"),
        ("日本", "~E6~97~A5~E6~9C~AC"),
        ("\x00", "~00"),
        ("\x7f", "~7F"),
        ("a:b", "a~3Ab"),
        ("a*b#", "a~2Ab~23"),
    ],
)
def test_escape_keeps_safe_bytes_and_writes_others_as_tilde_and_uppercase_hex(
    name: str, escaped: str
) -> None:
    assert escape(name) == escaped
    assert unescape(escaped) == name


@pytest.mark.parametrize(
    ("name", "escaped"),
    [
        ("a-partition-1", "a~2Dpartition-1"),
        ("-partition-", "~2Dpartition-"),
        # Overlapping occurrences: both dashes start "-partition-".
        ("x-partition-partition-3", "x~2Dpartition~2Dpartition-3"),
        ("a--partition-1", "a-~2Dpartition-1"),
        # Only the exact lowercase substring matters to Pulsar.
        ("a-partition", "a-partition"),
        ("a-Partition-1", "a-Partition-1"),
        ("a-partitions-1", "a-partitions-1"),
    ],
)
def test_a_dash_that_starts_partition_is_escaped(name: str, escaped: str) -> None:
    assert escape(name) == escaped
    assert unescape(escaped) == name


@given(NAMES)
def test_escape_output_is_in_the_alphabet_and_never_contains_the_separator(name: str) -> None:
    escaped = escape(name)
    assert ESCAPED_ALPHABET.fullmatch(escaped)
    assert "~~" not in escaped
    assert "-partition-" not in escaped


@given(NAMES)
def test_unescape_inverts_escape(name: str) -> None:
    assert unescape(escape(name)) == name


@given(NAMES, NAMES)
def test_escape_is_injective(a: str, b: str) -> None:
    assert (escape(a) == escape(b)) == (a == b)


def test_the_longest_amqp_name_escapes_to_three_characters_a_byte() -> None:
    name = "/" * 255
    assert len(escape(name)) == 765
    assert unescape(escape(name)) == name


# ---- unescape -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "~",  # truncated escape
        "a~2",
        "~G0",  # not hex
        "~2f",  # lowercase hex is not what escape writes
        "a b",  # a character escape never writes
        "a/b",
        "é",
        "~FF",  # not UTF-8
        "~C3",  # truncated UTF-8 sequence
        "~41",  # 'A' must be written as itself
        "~2Dx",  # '-' is only escaped before "partition-"
        "a-partition-1",  # a bare "-partition-" is never produced
        "~~",
    ],
)
def test_unescape_rejects_what_escape_never_produces(text: str) -> None:
    with pytest.raises(ValueError):
        unescape(text)


# ---- topics ---------------------------------------------------------------------------------


def test_topic_name_str_and_rest_path() -> None:
    topic = TopicName(NamespaceName("tenant-1", "ns.a"), "ex~20x~~key")
    assert str(topic) == "persistent://tenant-1/ns.a/ex~20x~~key"
    assert topic.rest_path == "persistent/tenant-1/ns.a/ex~20x~~key"


def test_rest_path_percent_encodes_a_local_name_that_was_not_escaped() -> None:
    topic = TopicName(NS, "a b/c%é")
    assert topic.rest_path == "persistent/public/default/a%20b%2Fc%25%C3%A9"


@given(st.text())
def test_quote_path_segment_matches_urllib(text: str) -> None:
    assert quote_path_segment(text) == quote(text, safe="~-._")


@given(NAMES)
def test_escaped_names_need_no_percent_encoding(name: str) -> None:
    assert quote_path_segment(escape(name)) == escape(name)


def test_direct_exchange_has_one_topic_per_routing_key() -> None:
    topic = exchange_topic(NS, "orders", "direct", "eu.paid")
    assert topic == TopicName(NS, "orders~~eu.paid")
    assert str(topic) == "persistent://public/default/orders~~eu.paid"


def test_direct_exchange_names_and_keys_are_escaped() -> None:
    topic = exchange_topic(NS, "ex with space/and~tilde", "direct", "a-partition-1")
    assert topic.local == "ex~20with~20space~2Fand~7Etilde~~a~2Dpartition-1"
    assert parse_exchange_topic(topic.local) == ("ex with space/and~tilde", "a-partition-1")


def test_default_exchange_is_named_amq_default() -> None:
    assert DEFAULT_EXCHANGE_TOPIC_NAME == "amq.default"
    assert exchange_topic(NS, "", "direct", "my-queue").local == "amq.default~~my-queue"
    assert parse_exchange_topic("amq.default~~my-queue") == ("", "my-queue")


def test_the_default_exchange_is_direct_whatever_type_is_passed() -> None:
    assert exchange_topic(NS, "", "fanout", "q").local == "amq.default~~q"


def test_empty_routing_key_of_a_direct_exchange() -> None:
    assert exchange_topic(NS, "x", "direct", "").local == "x~~"
    assert parse_exchange_topic("x~~") == ("x", "")


@pytest.mark.parametrize("exchange_type", ["fanout", "topic", "headers", "x-consistent-hash"])
def test_other_exchange_types_have_one_topic_and_ignore_the_key(exchange_type: str) -> None:
    topic = exchange_topic(NS, "logs~all", exchange_type, "ignored.key")
    assert topic == exchange_topic(NS, "logs~all", exchange_type, "other")
    assert topic.local == "logs~7Eall"
    assert parse_exchange_topic(topic.local) == ("logs~all", None)


def test_exchange_type_names_are_exact() -> None:
    # AMQP type names are lowercase; anything else is some other (non-direct) type.
    assert exchange_topic(NS, "x", "Direct", "k").local == "x"


# `amq.default` names the default exchange (RabbitMQ refuses to declare any `amq.*` name), so
# its topics are the default exchange's.
EXCHANGE_NAMES = NAMES.filter(lambda name: bool(name) and name != "amq.default")


@given(EXCHANGE_NAMES, NAMES)
def test_direct_exchange_topics_parse_back(exchange: str, key: str) -> None:
    topic = exchange_topic(NS, exchange, "direct", key)
    assert parse_exchange_topic(topic.local) == (exchange, key)


@given(NAMES.filter(bool), NAMES)
def test_fanout_and_direct_topics_never_collide(a: str, b: str) -> None:
    assert exchange_topic(NS, a, "fanout", "") != exchange_topic(NS, b, "direct", "")


@given(NAMES)
def test_default_exchange_topics_parse_back(key: str) -> None:
    assert parse_exchange_topic(exchange_topic(NS, "", "direct", key).local) == ("", key)


@given(EXCHANGE_NAMES)
def test_whole_exchange_topics_parse_back(exchange: str) -> None:
    assert parse_exchange_topic(exchange_topic(NS, exchange, "topic", "k").local) == (
        exchange,
        None,
    )


@pytest.mark.parametrize("local", ["", "~~key", "a b", "x~~a b", "x~~~~", "x~~~7E~"])
def test_parse_exchange_topic_rejects_foreign_names(local: str) -> None:
    with pytest.raises(ValueError):
        parse_exchange_topic(local)


# ---- subscriptions --------------------------------------------------------------------------


def test_subscription_name_is_escaped_queue_and_binding_set_id() -> None:
    assert subscription_name("q 1", "0123456789ab") == "q~201~~0123456789ab"
    assert parse_subscription_name("q~201~~0123456789ab") == ("q 1", "0123456789ab")


def test_new_binding_set_ids_are_12_random_lowercase_hex() -> None:
    ids = {new_binding_set_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"[0-9a-f]{12}", i) for i in ids)


@pytest.mark.parametrize("binding_set_id", ["", "0123456789a", "0123456789abc", "0123456789AB"])
def test_subscription_name_rejects_bad_binding_set_ids(binding_set_id: str) -> None:
    with pytest.raises(ValueError):
        subscription_name("q", binding_set_id)


@pytest.mark.parametrize(
    "name",
    [
        "__compaction",
        "my-sub",
        "q~~",
        "q~~0123456789a",
        "q~~0123456789abc",
        "q~~0123456789AB",
        "q~~0123456789ab~~0123456789ab",
        "a b~~0123456789ab",
    ],
)
def test_parse_subscription_name_rejects_foreign_names(name: str) -> None:
    with pytest.raises(ValueError):
        parse_subscription_name(name)


@given(NAMES, BINDING_SET_IDS)
def test_subscription_names_parse_back(queue: str, binding_set_id: str) -> None:
    name = subscription_name(queue, binding_set_id)
    assert ESCAPED_ALPHABET.fullmatch(name)
    assert parse_subscription_name(name) == (queue, binding_set_id)


def test_name_caches_are_bounded_and_a_rejected_name_is_rejected_every_time() -> None:
    # escape/unescape are cached because every message carries the same names; many
    # distinct routing keys must not grow the caches without end.
    for cached in (escape, unescape, parse_exchange_topic):
        assert cached.cache_info().maxsize is not None
    for _ in range(2):
        with pytest.raises(ValueError):
            unescape("a b")
    many = [escape(f"key-{i}") for i in range(10_000)]
    assert many[-1] == "key-9999"
    maxsize = escape.cache_info().maxsize
    assert maxsize is not None and escape.cache_info().currsize <= maxsize


# ---- binding topics (topic and headers exchanges) ----------------------------------------


def test_a_binding_topic_joins_exchange_queue_and_binding_set_id() -> None:
    topic = binding_topic(NS, "events x", "q/1", "0123456789ab")
    assert str(topic) == "persistent://public/default/events~20x~~q~2F1~~0123456789ab"
    assert parse_binding_topic(topic.local) == ("events x", "q/1", "0123456789ab")
    assert exchange_and_key_of_topic(topic.local) == ("events x", None)
    with pytest.raises(ValueError):
        binding_topic(NS, "x", "q", "not-an-id")


@given(st.text(max_size=30), st.text(max_size=30), st.text(max_size=30))
def test_binding_topics_parse_back_and_never_look_like_other_topics(
    exchange: str, queue: str, key: str
) -> None:
    topic = binding_topic(NS, exchange, queue, "abcdef012345")
    if exchange:
        assert parse_binding_topic(topic.local) == (exchange, queue, "abcdef012345")
    # Direct exchange topics, the default exchange's and priority bands are not binding topics.
    assert parse_binding_topic(exchange_topic(NS, exchange or "x", "direct", key).local) is None
    assert parse_binding_topic(exchange_topic(NS, "", "direct", key).local) is None
    assert parse_binding_topic(priority_band_topic(NS, queue, 3).local) is None
