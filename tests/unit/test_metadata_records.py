"""What is stored in ZooKeeper: the JSON records, the path layout, the name escaping."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from starlight_py.metadata import records
from starlight_py.metadata.records import (
    SCHEMA_VERSION,
    BindingEntry,
    BindingSet,
    ExchangeBinding,
    Paths,
    PermissionRecord,
    RecordError,
    RetiredSubscription,
    VhostRecord,
    decode,
    encode,
    segment,
    topic_segment,
)
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.permissions import Permission
from starlight_py.model.positions import MessageIdRecord
from starlight_py.model.topology import Exchange, Queue

NAMESPACE = NamespaceName("public", "default")
ARGUMENTS: dict[str, Any] = {
    "x-message-ttl": 60000,
    "x-max-length-bytes": 2**40,
    "x-dead-letter-exchange": "dlx",
    "blob": b"\x00\xff",
    "price": decimal.Decimal("1.50"),
    "at": datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC),
    "nested": {"list": [1, "two", None, {"$odd": True}]},
    "flag": False,
    "ratio": 0.5,
}
START = MessageIdRecord(12, 3)
END = MessageIdRecord(12, 40, batch_index=2, partition=1)

RECORDS = [
    VhostRecord("/", NAMESPACE),
    VhostRecord("tenant/ns", NamespaceName("tenant", "ns"), explicit=True),
    Exchange("orders", "direct"),
    Exchange(
        "ex x", "headers", durable=False, auto_delete=True, internal=True, arguments=ARGUMENTS
    ),
    Queue("q1"),
    Queue("q/1", durable=False, exclusive=True, auto_delete=True, arguments=ARGUMENTS, owner="p/7"),
    BindingSet("q1", "", "amq.default~~q1", "q1~~0123456789ab"),
    BindingSet(
        queue="q1",
        exchange="events",
        topic="events",
        subscription="q1~~a1b2c3d4e5f6",
        entries=(
            BindingEntry("a"),
            BindingEntry("b", {"x-match": "any", "h": 1}, start=START),
            BindingEntry("c", start=START, end=END, unbound=True),
            BindingEntry("d", end=None, unbound=True),
        ),
        created=1714564800.25,
    ),
    RetiredSubscription("orders~~k", "q1~~0123456789ab", "q1", END, True, 1714564801.5),
    RetiredSubscription("events", "q1~~a1b2c3d4e5f6", "q1", None, False, 1714564802.0),
    PermissionRecord("/", "alice", Permission("^amq\\.gen-.*", ".*", "")),
    ExchangeBinding("src", "dst x", "a.#", ARGUMENTS),
    BindingSet(
        "q2",
        "events",
        "events",
        "q2~~a1b2c3d4e5f6",
        (BindingEntry("a.*"),),
        exchange_type="topic",
        binding_topic="events~~q2~~a1b2c3d4e5f6",
        made=False,
    ),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_round_trips(record: object) -> None:
    assert decode(encode(record)) == record


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_is_json_with_schema_1_and_its_kind(record: object) -> None:
    body = json.loads(encode(record))
    assert body["schema"] == SCHEMA_VERSION == 1
    assert (
        body["kind"]
        == {
            VhostRecord: "vhost",
            Exchange: "exchange",
            Queue: "queue",
            BindingSet: "binding_set",
            RetiredSubscription: "retired_subscription",
            PermissionRecord: "permission",
            ExchangeBinding: "exchange_binding",
        }[type(record)]
    )
    # Sorted keys: the same record is always the same bytes (a no-op set changes nothing).
    assert list(body) == sorted(body)


def test_the_json_of_a_permission_record() -> None:
    record = PermissionRecord("t/n", "CN=app", Permission("^q-", "x", ""))
    assert json.loads(encode(record)) == {
        "schema": 1,
        "kind": "permission",
        "vhost": "t/n",
        "principal": "CN=app",
        "permission": {"configure": "^q-", "write": "x", "read": ""},
    }


def test_a_permission_record_with_an_invalid_pattern_is_a_record_error() -> None:
    body = {"schema": 1, "kind": "permission", "vhost": "/", "principal": "u"}
    with pytest.raises(RecordError, match="corrupt"):
        permission = {"configure": "(", "write": "", "read": ""}
        decode(json.dumps({**body, "permission": permission}).encode())
    with pytest.raises(RecordError, match="corrupt"):
        permission = {"configure": ".*", "write": ""}
        decode(json.dumps({**body, "permission": permission}).encode())


def test_the_json_of_each_record() -> None:
    assert json.loads(encode(VhostRecord("/", NAMESPACE))) == {
        "schema": 1,
        "kind": "vhost",
        "name": "/",
        "namespace": "public/default",
        "explicit": False,
    }
    assert json.loads(encode(Exchange("orders", "direct"))) == {
        "schema": 1,
        "kind": "exchange",
        "name": "orders",
        "type": "direct",
        "durable": True,
        "auto_delete": False,
        "internal": False,
        "arguments": {},
    }
    assert json.loads(encode(Queue("q1", exclusive=True, owner="proxy-1/3"))) == {
        "schema": 1,
        "kind": "queue",
        "name": "q1",
        "durable": True,
        "exclusive": True,
        "auto_delete": False,
        "arguments": {},
        "owner": "proxy-1/3",
    }
    entries = json.loads(encode(RECORDS[7]))["entries"]
    assert entries[1] == {
        "routing_key": "b",
        "arguments": {"x-match": "any", "h": 1},
        "start": {"ledger": 12, "entry": 3, "batch": -1, "partition": -1},
        "end": None,
        "unbound": False,
    }
    assert entries[2]["end"] == {"ledger": 12, "entry": 40, "batch": 2, "partition": 1}
    retired = json.loads(encode(RECORDS[9]))
    assert (
        retired.items()
        >= {
            "schema": 1,
            "kind": "retired_subscription",
            "topic": "events",
            "subscription": "q1~~a1b2c3d4e5f6",
            "queue": "q1",
            "end": None,
            "drain": False,
            "retired_at": 1714564802.0,
        }.items()
    )


def test_arguments_keep_their_amqp_types() -> None:
    stored = json.loads(encode(Queue("q", arguments=ARGUMENTS)))["arguments"]
    assert stored["blob"] == {"$bytes": "AP8="}
    assert stored["price"] == {"$decimal": "1.50"}
    queue = decode(encode(Queue("q", arguments=ARGUMENTS)))
    assert isinstance(queue, Queue)
    assert queue.arguments == ARGUMENTS
    assert type(queue.arguments["price"]) is decimal.Decimal


def test_positions_without_batch_or_partition_default_to_minus_one() -> None:
    body = json.loads(encode(RetiredSubscription("t", "s", "q", END, True, 0.0)))
    body["end"] = {"ledger": 5, "entry": 6}
    record = decode(json.dumps(body).encode())
    assert isinstance(record, RetiredSubscription)
    assert record.end == MessageIdRecord(5, 6, -1, -1)


def test_optional_fields_of_older_writers_have_defaults() -> None:
    queue = json.loads(encode(Queue("q")))
    del queue["owner"]
    assert decode(json.dumps(queue).encode()) == Queue("q")
    binding_set = json.loads(encode(RECORDS[7]))
    del binding_set["created"]
    for entry in binding_set["entries"]:
        del entry["unbound"]
    decoded = decode(json.dumps(binding_set).encode())
    assert isinstance(decoded, BindingSet)
    assert decoded.created == 0.0
    assert all(entry.active for entry in decoded.entries)


def test_a_binding_set_is_made_unless_it_says_unmade() -> None:
    """Sets written before binding topics were made by their first message had their
    subscription made at bind: no key, made. A set not made yet says so, and only it."""
    unmade = RECORDS[-1]
    assert isinstance(unmade, BindingSet) and not unmade.made
    assert json.loads(encode(unmade))["made"] is False
    made = replace(unmade, made=True)
    body = json.loads(encode(made))
    assert "made" not in body
    assert decode(json.dumps(body).encode()) == made


def test_encoding_anything_else_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="not a metadata record"):
        encode({"kind": "exchange"})
    with pytest.raises(TypeError, match="not a metadata record"):
        encode(BindingEntry("k"))


# ---- what a reader refuses --------------------------------------------------------------------


@pytest.mark.parametrize("schema", [0, 2, "1", None, 1.5])
def test_a_record_of_another_schema_is_refused(schema: Any) -> None:
    body = json.loads(encode(Exchange("x", "direct")))
    body["schema"] = schema
    with pytest.raises(RecordError, match="unsupported metadata schema"):
        decode(json.dumps(body).encode())


def test_a_record_without_a_schema_is_refused() -> None:
    body = json.loads(encode(Exchange("x", "direct")))
    del body["schema"]
    with pytest.raises(RecordError, match="unsupported metadata schema None"):
        decode(json.dumps(body).encode())


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"{",
        b"not json",
        b"\xff\xfe",
        b"[]",
        b"null",
        b"1",
        b'"text"',
        b'{"schema": 1}',
        b'{"schema": 1, "kind": "vhost", "name": "/", "namespace": 5, "explicit": false}',
        b'{"schema": 1, "kind": "vhost", "name": "/", "namespace": "nons", "explicit": false}',
        b'{"schema": 1, "kind": "queue", "name": "q", "durable": true, "exclusive": false,'
        b' "auto_delete": false, "arguments": [1]}',
        b'{"schema": 1, "kind": "exchange", "name": "x", "type": "direct", "durable": true,'
        b' "auto_delete": false, "internal": false, "arguments": {"a": {"$decimal": "zz"}}}',
        b'{"schema": 1, "kind": "binding_set", "queue": "q", "exchange": "x", "topic": "t",'
        b' "subscription": "s", "entries": [5]}',
        b'{"schema": 1, "kind": "retired_subscription", "topic": "t", "subscription": "s",'
        b' "queue": "q", "end": {"ledger": 1}, "drain": true, "retired_at": 0}',
    ],
    ids=repr,
)
def test_corrupt_data_is_a_record_error(data: bytes) -> None:
    with pytest.raises(RecordError):
        decode(data)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_a_record_missing_a_key_is_refused_unless_the_field_has_a_default(record: Any) -> None:
    fields = {f.name: f for f in dataclasses.fields(record)}
    body = json.loads(encode(record))
    refused = set()
    for key in body:
        partial = {k: v for k, v in body.items() if k != key}
        try:
            decoded = decode(json.dumps(partial).encode())
        except RecordError:
            refused.add(key)
            continue
        # Only a field with a plain default may be left out, and then it has that default.
        assert key in fields, key
        assert fields[key].default is not dataclasses.MISSING, key
        assert decoded == dataclasses.replace(record, **{key: fields[key].default})
    assert {"schema", "kind"} <= refused
    assert {f.name for f in fields.values() if f.default is dataclasses.MISSING} <= refused


def test_an_unknown_kind_is_a_record_error() -> None:
    with pytest.raises(RecordError, match="unknown metadata record kind 'consumer'"):
        decode(b'{"schema": 1, "kind": "consumer"}')


def test_record_error_is_a_value_error() -> None:
    assert issubclass(RecordError, ValueError)


# ---- path segments ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("", "~"),
        (".", "~2E"),
        ("..", "~2E~2E"),
        ("...", "..."),
        ("/", "~2F"),
        ("a/b", "a~2Fb"),
        ("~", "~7E"),
        ("q1~~0123456789ab", "q1~7E~7E0123456789ab"),
        ("orders", "orders"),
        ("amq.direct", "amq.direct"),
        ("ex x", "ex~20x"),
        ("é", "~C3~A9"),
        ("a-partition-1", "a~2Dpartition-1"),
    ],
)
def test_segment_escapes_a_name_into_one_path_segment(name: str, expected: str) -> None:
    assert segment(name) == expected


@given(st.text())
def test_a_segment_is_one_non_relative_znode_name(name: str) -> None:
    text = segment(name)
    assert text
    assert "/" not in text
    assert text not in (".", "..")
    assert re.fullmatch(r"[A-Za-z0-9_.~-]+", text)


@given(st.text(), st.text())
def test_distinct_names_have_distinct_segments(first: str, second: str) -> None:
    if first != second:
        assert segment(first) != segment(second)


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        (".", "~2E"),
        ("..", "~2E~2E"),
        ("orders~~k", "orders~~k"),
        ("amq.default~~q1", "amq.default~~q1"),
        ("events", "events"),
        ("~2E", "~2E"),
    ],
)
def test_topic_segment_keeps_topic_names_but_never_dot_or_dot_dot(
    topic: str, expected: str
) -> None:
    assert topic_segment(topic) == expected


# ---- the layout -------------------------------------------------------------------------------

PATHS = Paths("/starlight")


def test_every_path_of_the_layout() -> None:
    assert PATHS.vhosts == "/starlight/v1/vhosts"
    assert PATHS.vhost("/") == "/starlight/v1/vhosts/~2F"
    assert PATHS.vhost("") == "/starlight/v1/vhosts/~"
    assert PATHS.exchanges("/") == "/starlight/v1/vhosts/~2F/exchanges"
    assert PATHS.exchange("/", "orders") == "/starlight/v1/vhosts/~2F/exchanges/orders"
    assert PATHS.exchange("/", "") == "/starlight/v1/vhosts/~2F/exchanges/~"
    assert PATHS.exchange_bound("/", "orders") == "/starlight/v1/vhosts/~2F/exchanges/orders/bound"
    assert (
        PATHS.exchange_bound_entry("/", "orders", "q1", "orders~~k")
        == "/starlight/v1/vhosts/~2F/exchanges/orders/bound/q1~~orders~~k"
    )
    assert PATHS.queues("/") == "/starlight/v1/vhosts/~2F/queues"
    assert PATHS.queue("/", "q1") == "/starlight/v1/vhosts/~2F/queues/q1"
    assert PATHS.queue_bindings("/", "q1") == "/starlight/v1/vhosts/~2F/queues/q1/bindings"
    assert (
        PATHS.binding_set("/", "q1", "amq.default~~q1")
        == "/starlight/v1/vhosts/~2F/queues/q1/bindings/amq.default~~q1"
    )
    assert PATHS.retired("/") == "/starlight/v1/vhosts/~2F/retired"
    assert (
        PATHS.retired_subscription("/", "q1~~0123456789ab")
        == "/starlight/v1/vhosts/~2F/retired/q1~7E~7E0123456789ab"
    )


def test_names_are_escaped_in_every_segment() -> None:
    assert PATHS.exchange("a/b", "ex x") == "/starlight/v1/vhosts/a~2Fb/exchanges/ex~20x"
    assert PATHS.queue("/", "..") == "/starlight/v1/vhosts/~2F/queues/~2E~2E"
    assert (
        PATHS.exchange_bound_entry("/", ".", ".", ".")
        == "/starlight/v1/vhosts/~2F/exchanges/~2E/bound/~2E~~~2E"
    )
    assert (
        PATHS.binding_set("/", "q/1", ".") == "/starlight/v1/vhosts/~2F/queues/q~2F1/bindings/~2E"
    )


def test_another_root_moves_everything() -> None:
    assert Paths("/a/b").queue("v", "q") == "/a/b/v1/vhosts/v/queues/q"


def documented_layout() -> dict[str, str]:
    """{path template: record} from the layout block of records.py's docstring."""
    assert records.__doc__ is not None
    layout = {}
    for line in records.__doc__.splitlines():
        match = re.fullmatch(r"\s{4}(\{root\}\S+)\s+(.+)", line)
        if match:
            layout[match.group(1)] = match.group(2)
    return layout


def test_the_paths_are_the_layout_records_py_documents() -> None:
    vhost, exchange, queue = "/", "ex x", "q/1"
    topic, subscription = "ex~20x~~k", "q~2F1~~0123456789ab"
    values = {
        "root": PATHS.root,
        "vhost": segment(vhost),
        "queue": segment(queue),
        "topic": topic_segment(topic),
        "subscription": segment(subscription),
    }
    e2e = ExchangeBinding("src x", "dst", "k", {"h": 1})
    e2e_values = {
        "source": segment(e2e.source),
        "destination": segment(e2e.destination),
        "key": e2e.key,
    }
    built = {
        "{root}/v1/vhosts/{vhost}": (PATHS.vhost(vhost), {}),
        "{root}/v1/vhosts/{vhost}/exchanges/{name}": (
            PATHS.exchange(vhost, exchange),
            {"name": segment(exchange)},
        ),
        "{root}/v1/vhosts/{vhost}/exchanges/{name}/bound/{queue}~~{topic}": (
            PATHS.exchange_bound_entry(vhost, exchange, queue, topic),
            {"name": segment(exchange)},
        ),
        "{root}/v1/vhosts/{vhost}/exchanges/{source}/e2e/{destination}~~{key}": (
            PATHS.exchange_e2e_entry(vhost, e2e),
            e2e_values,
        ),
        "{root}/v1/vhosts/{vhost}/exchanges/{destination}/e2e-in/{source}~~{key}": (
            PATHS.exchange_e2e_in_entry(vhost, e2e),
            e2e_values,
        ),
        "{root}/v1/vhosts/{vhost}/queues/{name}": (
            PATHS.queue(vhost, queue),
            {"name": segment(queue)},
        ),
        "{root}/v1/vhosts/{vhost}/policies/{name}": (
            PATHS.policy(vhost, "ttl x"),
            {"name": segment("ttl x")},
        ),
        "{root}/v1/vhosts/{vhost}/queues/{name}/bindings/{topic}": (
            PATHS.binding_set(vhost, queue, topic),
            {"name": segment(queue)},
        ),
        "{root}/v1/vhosts/{vhost}/retired/{subscription}": (
            PATHS.retired_subscription(vhost, subscription),
            {},
        ),
        "{root}/v1/vhosts/{vhost}/queues/{name}/consumers/{consumer}": (
            PATHS.queue_consumer(vhost, queue, "p-1/conn-2/1/ctag"),
            {"name": segment(queue), "consumer": segment("p-1/conn-2/1/ctag")},
        ),
        "{root}/v1/vhosts/{vhost}/queues/{name}/owner": (
            PATHS.queue_owner(vhost, queue),
            {"name": segment(queue)},
        ),
        "{root}/v1/vhosts/{vhost}/queues/{name}/consumed": (
            PATHS.queue_consumed(vhost, queue),
            {"name": segment(queue)},
        ),
        "{root}/v1/vhosts/{vhost}/queues/{name}/used": (
            PATHS.queue_used(vhost, queue),
            {"name": segment(queue)},
        ),
        "{root}/v1/permissions/{vhost}": (PATHS.vhost_permissions(vhost), {}),
        "{root}/v1/permissions/{vhost}/{principal}": (
            PATHS.permission(vhost, "CN=app/1"),
            {"principal": segment("CN=app/1")},
        ),
        "{root}/v1/users/{name}": (PATHS.user("CN=app/1"), {"name": segment("CN=app/1")}),
        "{root}/v1/proxies/{proxy-id}": (PATHS.proxy("host-1-ab"), {"proxy-id": "host-1-ab"}),
        "{root}/v1/cleaner/candidate-{sequence}": (
            f"{PATHS.cleaner_election}/candidate-0000000007",
            {"sequence": "0000000007"},
        ),
    }
    layout = documented_layout()
    assert set(layout) == set(built)
    for template, (path, extra) in built.items():
        assert template.format(**values, **extra) == path
    assert layout["{root}/v1/vhosts/{vhost}"] == "VhostRecord"
    assert layout["{root}/v1/vhosts/{vhost}/retired/{subscription}"] == "RetiredSubscription"
    assert layout["{root}/v1/permissions/{vhost}/{principal}"] == "PermissionRecord"


# ---- bindings ---------------------------------------------------------------------------------


def test_active_entries_leave_out_the_unbound_ones() -> None:
    binding_set = RECORDS[7]
    assert isinstance(binding_set, BindingSet)
    assert [e.routing_key for e in binding_set.active_entries] == ["a", "b"]
    assert [e.active for e in binding_set.entries] == [True, True, False, False]
    assert BindingSet("q", "x", "t", "s").active_entries == ()


def test_with_entries_replaces_only_the_entries() -> None:
    binding_set = RECORDS[7]
    assert isinstance(binding_set, BindingSet)
    changed = binding_set.with_entries((BindingEntry("z"),))
    assert changed.entries == (BindingEntry("z"),)
    assert (changed.queue, changed.subscription, changed.created) == (
        binding_set.queue,
        binding_set.subscription,
        binding_set.created,
    )


@pytest.mark.parametrize(
    ("routing_key", "arguments", "same"),
    [
        ("k", {"x-match": "all", "a": 1}, True),
        ("k", {"a": 1, "x-match": "all"}, True),
        ("k", {"x-match": "all"}, False),
        ("k", {"x-match": "any", "a": 1}, False),
        ("K", {"x-match": "all", "a": 1}, False),
        ("", {"x-match": "all", "a": 1}, False),
    ],
)
def test_same_binding_compares_routing_key_and_arguments(
    routing_key: str, arguments: dict[str, Any], same: bool
) -> None:
    entry = BindingEntry("k", {"x-match": "all", "a": 1})
    assert entry.same_binding(routing_key, arguments) is same


def test_an_unbound_entry_is_still_the_same_binding_but_not_active() -> None:
    # Callers look for the binding among `active_entries`; the flag does not change identity.
    entry = BindingEntry("k", unbound=True, end=END)
    assert entry.same_binding("k", {})
    assert not entry.active


# ---- docs/metadata.md -------------------------------------------------------------------------

METADATA_DOC = Path(__file__).resolve().parents[2] / "docs" / "metadata.md"


def documented_records() -> list[tuple[str, str]]:
    """(path, JSON) of every record docs/metadata.md shows: a `path`: line, then a json block."""
    text = METADATA_DOC.read_text(encoding="utf-8")
    return re.findall(r"`(/starlight/v1/[^`]+)`(?::| holds:)\n\n```json\n(.*?)```", text, re.S)


def test_docs_metadata_md_shows_a_record_of_every_kind() -> None:
    kinds = {json.loads(body)["kind"] for _, body in documented_records()}
    assert kinds == {"vhost", "exchange", "queue", "binding_set", "retired_subscription"}


@pytest.mark.parametrize(
    ("path", "body"), documented_records(), ids=[path for path, _ in documented_records()]
)
def test_docs_metadata_md_shows_what_the_code_writes_where_it_writes_it(
    path: str, body: str
) -> None:
    record = decode(body.encode())
    # Exactly the keys and values the encoder writes, no more, no fewer.
    assert json.loads(encode(record)) == json.loads(body)
    expected_path = {
        VhostRecord: lambda r: PATHS.vhost(r.name),
        Exchange: lambda r: PATHS.exchange("/", r.name),
        Queue: lambda r: PATHS.queue("/", r.name),
        BindingSet: lambda r: PATHS.binding_set("/", r.queue, r.topic),
        RetiredSubscription: lambda r: PATHS.retired_subscription("/", r.subscription),
    }[type(record)](record)
    assert path == expected_path


def test_exchange_binding_znode_names_are_stable_and_distinct() -> None:
    binding = ExchangeBinding("src", "dst", "k", {"x-match": "any", "h": 1})
    same = ExchangeBinding("src", "dst", "k", {"h": 1, "x-match": "any"})
    other_key = ExchangeBinding("src", "dst", "k2", {"x-match": "any", "h": 1})
    other_arguments = ExchangeBinding("src", "dst", "k", {"x-match": "all", "h": 1})
    assert binding.entry_name == same.entry_name
    assert binding.entry_name.startswith("dst~~")
    assert binding.index_name.startswith("src~~")
    names = {binding.key, other_key.key, other_arguments.key}
    assert len(names) == 3
    paths = Paths("/starlight")
    assert paths.exchange_e2e_entry("/", binding) == (
        f"/starlight/v1/vhosts/~2F/exchanges/src/e2e/dst~~{binding.key}"
    )
    assert paths.exchange_e2e_in_entry("/", binding) == (
        f"/starlight/v1/vhosts/~2F/exchanges/dst/e2e-in/src~~{binding.key}"
    )
