"""The pure parts of the Spark jobs: which topics they read, and how one Pulsar message
becomes a row (no Spark needed; tests/integration/test_spark_jobs.py runs the real thing)."""

from __future__ import annotations

import datetime
import decimal
import json
import re

import pulsar
import pytest
from pamqp import commands

from starlight_py.backend import message_codec
from starlight_py.metadata.records import BindingEntry, BindingSet
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import binding_topic
from starlight_py.model.positions import MessageIdRecord
from starlight_py.model.topology import Exchange
from starlight_py.spark import rows
from starlight_py.spark.topics import SelectionError, exchange_selection, queue_selection

NS = NamespaceName("public", "default")


def serialized(ledger: int, entry: int) -> bytes:
    return bytes(pulsar.MessageId(-1, ledger, entry, -1).serialize())


def row_dict(row: rows.AmqpRow | None) -> dict[str, object]:
    assert row is not None
    return dict(zip(rows.AMQP_COLUMNS, row, strict=True))


def test_a_fanout_exchange_is_one_topic() -> None:
    selection = exchange_selection("/", NS, Exchange("orders eu", "fanout"))
    assert selection.connector_options() == {"topic": "persistent://public/default/orders~20eu"}


@pytest.mark.parametrize("kind", ["topic", "headers"])
def test_a_topic_or_headers_exchange_is_its_topic_and_its_binding_topics(kind: str) -> None:
    selection = exchange_selection("/", NS, Exchange("orders eu", kind))
    pattern = selection.connector_options()["topicsPattern"]
    assert pattern == "persistent://public/default/\\Qorders~20eu\\E(~~.*)?"
    local = re.compile(pattern.split("/", 4)[4].replace("\\Q", "").replace("\\E", ""))
    assert local.fullmatch("orders~20eu")
    assert local.fullmatch(binding_topic(NS, "orders eu", "q", "0123456789ab").local)
    assert not local.fullmatch("orders~20eu2")
    assert not selection.is_queue


def test_an_exchange_read_whole_keeps_only_the_first_copy_of_a_message() -> None:
    first = {message_codec.EXCHANGE_KEY: "t", message_codec.ROUTING_KEY_KEY: "k"}
    further = {**first, message_codec.FURTHER_COPY_KEY: "1"}
    topic = str(binding_topic(NS, "t", "q", "0123456789ab"))
    row = row_dict(rows.amqp_row(topic, first, b"m", serialized(3, 4)))
    assert (row["exchange"], row["routing_key"]) == ("t", "k")
    assert rows.amqp_row(topic, further, b"m", serialized(3, 5)) is None


def test_a_direct_exchange_is_every_topic_with_its_prefix() -> None:
    selection = exchange_selection("/", NS, Exchange("a.b~c", "direct"))
    assert selection.connector_options() == {
        "topicsPattern": "persistent://public/default/\\Qa.b~7Ec~~\\E.*"
    }


def test_the_default_exchange_is_every_amq_default_topic() -> None:
    selection = exchange_selection("/", NS, Exchange("", "direct"))
    assert selection.pattern == "persistent://public/default/\\Qamq.default~~\\E.*"


def test_a_delayed_exchange_is_named_by_its_delayed_type() -> None:
    exchange = Exchange("later", "x-delayed-message", arguments={"x-delayed-type": "fanout"})
    assert exchange_selection("/", NS, exchange).topics == ("persistent://public/default/later",)


def binding_set(topic: str, exchange_type: str, *entries: BindingEntry) -> BindingSet:
    return BindingSet("q", "x", topic, f"q~~{'0' * 12}", entries, exchange_type=exchange_type)


def test_a_queue_reads_the_topics_of_its_bindings() -> None:
    sets = [
        binding_set("x~~a", "direct", BindingEntry("a")),
        binding_set("x~~b", "direct", BindingEntry("b")),
    ]
    selection = queue_selection("/", NS, "q", sets)
    assert selection.connector_options() == {
        "topics": "persistent://public/default/x~~a,persistent://public/default/x~~b"
    }
    assert selection.is_queue
    with pytest.raises(SelectionError, match="no binding"):
        queue_selection("/", NS, "q", [])


def test_a_row_has_every_property_the_client_sent() -> None:
    properties = commands.Basic.Properties(
        content_type="application/json",
        content_encoding="gzip",
        headers={"n": 7, "ok": True, "price": decimal.Decimal("1.50"), "tags": ["a", 1]},
        delivery_mode=2,
        priority=5,
        correlation_id="c",
        reply_to="r",
        expiration="1000",
        message_id="m",
        timestamp=datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        message_type="t",
        user_id="u",
        app_id="app",
    )
    encoded = message_codec.encode_properties("x", "k.1", properties)
    row = row_dict(rows.amqp_row("persistent://public/default/x", encoded, b"{}", serialized(3, 4)))
    assert row == {
        "exchange": "x",
        "routing_key": "k.1",
        "content_type": "application/json",
        "content_encoding": "gzip",
        "headers": {"n": "7", "ok": "true", "price": "1.50", "tags": "['a', 1]"},
        "headers_json": row["headers_json"],
        "delivery_mode": 2,
        "priority": 5,
        "correlation_id": "c",
        "reply_to": "r",
        "expiration": "1000",
        "message_id": "m",
        "timestamp": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        "type": "t",
        "user_id": "u",
        "app_id": "app",
        "cluster_id": None,
        "body": b"{}",
        "pulsar_position": "3:4:-1:-1",
    }
    assert json.loads(str(row["headers_json"])) == {
        "n": 7,
        "ok": True,
        "price": {"$decimal": "1.50"},
        "tags": ["a", 1],
    }


def test_a_pulsar_native_message_gets_the_codecs_defaults() -> None:
    topic = str(naming.exchange_topic(NS, "", "direct", "tasks"))
    row = row_dict(rows.amqp_row(topic, {"content-type": "text/plain", "region": "eu"}, b"x", None))
    assert (row["exchange"], row["routing_key"]) == ("", "tasks")
    assert row["content_type"] == "text/plain"
    assert row["headers"] == {"content-type": "text/plain", "region": "eu"}
    assert row["pulsar_position"] is None


def test_a_message_on_a_foreign_topic_does_not_fail() -> None:
    row = row_dict(rows.amqp_row("persistent://t/n/not~valid", None, None, b"\xff"))
    assert (row["exchange"], row["routing_key"], row["body"]) == ("", "", b"")


def test_a_queue_keeps_only_what_its_bindings_routed() -> None:
    start = MessageIdRecord(5, 1)
    routes = rows.QueueRoutes(
        [binding_set("x", "topic", BindingEntry("eu.*", start=start))],
    )
    encoded = message_codec.encode_properties("x", "eu.created", commands.Basic.Properties())
    other = message_codec.encode_properties("x", "us.created", commands.Basic.Properties())
    topic = "persistent://public/default/x"
    assert rows.amqp_row(topic, encoded, b"", serialized(5, 2), routes) is not None
    assert rows.amqp_row(topic, other, b"", serialized(5, 2), routes) is None
    # Published before the binding was made: the queue never got it.
    assert rows.amqp_row(topic, encoded, b"", serialized(5, 1), routes) is None
    # Another topic of the same exchange name: not one of the queue's.
    assert rows.amqp_row("persistent://public/default/y", encoded, b"", None, routes) is None


def test_local_name() -> None:
    assert rows.local_name("persistent://public/default/a~~b") == "a~~b"
    assert rows.local_name("orders") == "orders"
