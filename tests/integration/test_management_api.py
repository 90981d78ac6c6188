"""The management HTTP API (`managementListener`): RabbitMQ's paths, JSON shapes and status
codes. Runs against a proxy of its own, or against RabbitMQ's management plugin when
STARLIGHT_TEST_MANAGEMENT_URL is set (http://user:password@host:port), so that what these
tests expect is what RabbitMQ answers."""

from __future__ import annotations

import base64
import http.client
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from tests.support.amqp_fixtures import unique
from tests.support.management_api import NOT_FOUND, Management, management, wait_until

__all__ = ["management"]  # a fixture


@pytest.fixture
def queue_name(management: Management) -> Iterator[str]:
    name = unique("q", "mgmt")
    yield name
    management.call("DELETE", f"/api/queues/%2F/{quote(name)}")


@pytest.fixture
def exchange_name(management: Management) -> Iterator[str]:
    name = unique("x", "mgmt")
    yield name
    management.call("DELETE", f"/api/exchanges/%2F/{quote(name)}")


def publish(
    management: Management, routing_key: str, payload: str, exchange: str = "amq.default"
) -> Any:
    reply = management.call(
        "POST",
        f"/api/exchanges/%2F/{exchange}/publish",
        {
            "properties": {},
            "routing_key": routing_key,
            "payload": payload,
            "payload_encoding": "string",
        },
    )
    assert reply.status == 200, reply
    return reply.body


# ---- (a) the server, auth, overview, vhosts, health ------------------------------------------


def test_overview_and_whoami(management: Management) -> None:
    reply = management.call("GET", "/api/overview")
    assert reply.status == 200
    assert reply.headers["content-type"] == "application/json"
    for key in ("management_version", "rabbitmq_version", "product_name", "cluster_name", "node"):
        assert isinstance(reply.body[key], str), key
    assert {t["name"] for t in reply.body["exchange_types"]} >= {
        "direct",
        "fanout",
        "topic",
        "headers",
    }
    assert set(reply.body["object_totals"]) == {
        "channels",
        "connections",
        "consumers",
        "exchanges",
        "queues",
    }
    assert management.call("GET", "/api/whoami").body == {
        "name": "guest",
        "tags": ["administrator"],
    }


def test_requests_without_credentials_are_refused_with_401(management: Management) -> None:
    reply = management.call("GET", "/api/overview", auth=("", ""))
    assert reply.status == 401
    assert reply.headers["www-authenticate"] == 'Basic realm="RabbitMQ Management"'


def test_unknown_paths_are_404(management: Management) -> None:
    reply = management.call("GET", "/api/nonsense")
    assert (reply.status, reply.body) == (404, NOT_FOUND)


def test_vhosts_list_the_default_vhost(management: Management) -> None:
    reply = management.call("GET", "/api/vhosts")
    assert reply.status == 200
    default = next(v for v in reply.body if v["name"] == "/")
    assert {"name", "tracing", "description", "metadata", "tags"} <= set(default)
    assert management.call("GET", "/api/vhosts/%2F").body["name"] == "/"
    assert management.call("GET", "/api/vhosts/no-such-vhost").status == 404


def test_alarms_and_aliveness(management: Management) -> None:
    # A proxy just started reports its topology cache loading for a moment.
    healthy = wait_until(
        lambda: (
            True
            if management.call("GET", "/api/health/checks/alarms").body == {"status": "ok"}
            else None
        )
    )
    assert healthy
    reply = management.call("GET", "/api/aliveness-test/%2F")
    assert (reply.status, reply.body) == (200, {"status": "ok"})
    reply = management.call("GET", "/api/aliveness-test/no-such-vhost")
    assert (reply.status, reply.body) == (404, NOT_FOUND)


def test_keep_alive_serves_several_requests_on_one_connection(management: Management) -> None:
    parts = urlsplit(management.base)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    token = base64.b64encode(f"{management.user}:{management.password}".encode()).decode()
    try:
        for _ in range(3):
            connection.request("GET", "/api/whoami", headers={"authorization": f"Basic {token}"})
            answer = connection.getresponse()
            assert answer.status == 200
            assert json.loads(answer.read())["name"] == management.user
    finally:
        connection.close()


# ---- (b) queues, exchanges, bindings -----------------------------------------------------------


def test_queue_declare_show_and_inequivalent_redeclare(
    management: Management, queue_name: str
) -> None:
    path = f"/api/queues/%2F/{queue_name}"
    assert management.call("GET", path).status == 404
    assert management.call("GET", path).body == NOT_FOUND
    assert management.call("PUT", path, {"durable": True, "arguments": {}}).status == 201
    assert management.call("PUT", path, {"durable": True, "arguments": {}}).status == 204
    reply = management.call("PUT", path, {"durable": False})
    assert reply.status == 400
    assert reply.body == {
        "error": "bad_request",
        "reason": f"inequivalent arg 'durable' for queue '{queue_name}' in vhost '/': "
        "received 'false' but current is 'true'",
    }
    shown = management.call("GET", path).body
    assert {
        k: shown[k] for k in ("name", "vhost", "durable", "auto_delete", "exclusive", "arguments")
    } == {
        "name": queue_name,
        "vhost": "/",
        "durable": True,
        "auto_delete": False,
        "exclusive": False,
        "arguments": {},
    }


def test_queue_lists_filter_by_vhost_and_columns(management: Management, queue_name: str) -> None:
    management.call(
        "PUT", f"/api/queues/%2F/{queue_name}", {"durable": "true", "auto_delete": "false"}
    )
    everywhere = management.call("GET", "/api/queues").body
    assert any(q["name"] == queue_name and q["vhost"] == "/" for q in everywhere)
    in_default = management.call("GET", "/api/queues/%2F?columns=name,vhost").body
    assert {"name": queue_name, "vhost": "/"} in in_default
    assert management.call("GET", "/api/queues/no-such-vhost").status == 404


def test_queue_counts_messages_and_purge_empties_it(
    management: Management, queue_name: str
) -> None:
    path = f"/api/queues/%2F/{queue_name}"
    management.call("PUT", path, {"durable": True})
    for i in range(3):
        assert publish(management, queue_name, f"m{i}") == {"routed": True}
    shown = management.wait_for(path, "messages", 3).body
    assert (shown["messages"], shown["messages_ready"], shown["messages_unacknowledged"]) == (
        3,
        3,
        0,
    )
    assert shown["consumers"] == 0
    assert management.call("DELETE", f"{path}/contents").status == 204
    assert management.wait_for(path, "messages", 0).body["messages"] == 0
    missing = management.call("DELETE", f"/api/queues/%2F/{unique('gone', 'mgmt')}/contents")
    assert (missing.status, missing.body) == (404, NOT_FOUND)


def test_queue_message_stats_count_publishes(management: Management, queue_name: str) -> None:
    path = f"/api/queues/%2F/{queue_name}"
    management.call("PUT", path, {})
    for i in range(4):
        publish(management, queue_name, f"m{i}")
    management.wait_for(path, "messages", 4)
    taken = management.call(
        "POST", f"{path}/get", {"count": 4, "ackmode": "ack_requeue_false", "encoding": "auto"}
    )
    assert len(taken.body) == 4

    def counted() -> dict[str, Any] | None:
        stats = management.call("GET", path).body.get("message_stats", {})
        return stats if stats.get("publish") == 4 else None

    stats = wait_until(counted, 30)
    assert stats is not None, management.call("GET", path).body.get("message_stats")
    for rate in ("publish_details", "deliver_get_details", "ack_details"):
        assert isinstance(stats[rate]["rate"], (int, float)), stats


def test_queue_delete_then_404(management: Management, queue_name: str) -> None:
    path = f"/api/queues/%2F/{queue_name}"
    management.call("PUT", path, {})
    assert management.call("DELETE", path).status == 204
    reply = management.call("DELETE", path)
    assert (reply.status, reply.body) == (404, NOT_FOUND)


def test_exchange_declare_show_delete(management: Management, exchange_name: str) -> None:
    path = f"/api/exchanges/%2F/{exchange_name}"
    assert management.call("PUT", path, {"type": "topic", "durable": True}).status == 201
    assert management.call("PUT", path, {"type": "topic", "durable": True}).status == 204
    reply = management.call("PUT", path, {"type": "fanout"})
    assert reply.status == 400
    assert reply.body["reason"] == (
        f"inequivalent arg 'type' for exchange '{exchange_name}' in vhost '/': "
        "received 'fanout' but current is 'topic'"
    )
    shown = management.call("GET", path).body
    assert {
        k: shown[k]
        for k in ("name", "vhost", "type", "durable", "auto_delete", "internal", "arguments")
    } == {
        "name": exchange_name,
        "vhost": "/",
        "type": "topic",
        "durable": True,
        "auto_delete": False,
        "internal": False,
        "arguments": {},
    }
    names = {e["name"] for e in management.call("GET", "/api/exchanges/%2F").body}
    assert {"", "amq.direct", "amq.topic", exchange_name} <= names
    assert management.call("DELETE", path).status == 204
    assert management.call("DELETE", path).body == NOT_FOUND


def test_exchange_refusals(management: Management) -> None:
    bogus = management.call("PUT", f"/api/exchanges/%2F/{unique('x', 'mgmt')}", {"type": "bogus"})
    assert bogus.body == {"error": "bad_request", "reason": "unknown exchange type 'bogus'"}
    reserved = management.call("PUT", "/api/exchanges/%2F/amq.mgmt-test", {"type": "direct"})
    assert (reserved.status, reserved.body["error"]) == (401, "not_authorised")
    system = management.call("DELETE", "/api/exchanges/%2F/amq.direct")
    assert system.status == 401
    not_json = management.call("PUT", f"/api/exchanges/%2F/{unique('x', 'mgmt')}", raw=b"notjson")
    assert (not_json.status, not_json.body) == (400, {"error": "bad_request", "reason": "not_json"})


def test_bindings_create_list_show_delete(
    management: Management, queue_name: str, exchange_name: str
) -> None:
    management.call("PUT", f"/api/queues/%2F/{queue_name}", {"durable": True})
    management.call("PUT", f"/api/exchanges/%2F/{exchange_name}", {"type": "topic"})
    between = f"/api/bindings/%2F/e/{exchange_name}/q/{queue_name}"
    created = management.call("POST", between, {"routing_key": "a.*", "arguments": {}})
    assert created.status == 201
    assert created.headers["location"] == f"{queue_name}/a.%252A"
    expected = {
        "source": exchange_name,
        "vhost": "/",
        "destination": queue_name,
        "destination_type": "queue",
        "routing_key": "a.*",
        "arguments": {},
        "properties_key": "a.%2A",
    }
    assert management.call("GET", between).body == [expected]
    assert management.call("GET", f"{between}/a.%252A").body == expected
    assert expected in management.call("GET", "/api/bindings/%2F").body
    queue_bindings = management.call("GET", f"/api/queues/%2F/{queue_name}/bindings").body
    assert [b["source"] for b in queue_bindings] == ["", exchange_name]
    source = management.call("GET", f"/api/exchanges/%2F/{exchange_name}/bindings/source").body
    assert source == [expected]
    in_use = management.call("DELETE", f"/api/exchanges/%2F/{exchange_name}?if-unused=true")
    assert (in_use.status, in_use.body["error"]) == (400, "bad_request")
    assert publish(management, "a.b", "bound", exchange_name) == {"routed": True}
    assert management.call("DELETE", f"{between}/a.%252A").status == 204
    assert management.call("DELETE", f"{between}/a.%252A").body == NOT_FOUND
    assert management.call("GET", between).body == []
    assert (
        management.call(
            "POST", f"/api/bindings/%2F/e/{exchange_name}/q/nope-{queue_name}", {}
        ).status
        == 404
    )


def test_exchange_to_exchange_bindings(management: Management, exchange_name: str) -> None:
    other = unique("x", "mgmt")
    management.call("PUT", f"/api/exchanges/%2F/{exchange_name}", {"type": "direct"})
    management.call("PUT", f"/api/exchanges/%2F/{other}", {"type": "fanout"})
    try:
        between = f"/api/bindings/%2F/e/{exchange_name}/e/{other}"
        assert management.call("POST", between, {"routing_key": "k"}).status == 201
        listed = management.call("GET", between).body
        assert [(b["destination_type"], b["routing_key"]) for b in listed] == [("exchange", "k")]
        destination = management.call(
            "GET", f"/api/exchanges/%2F/{other}/bindings/destination"
        ).body
        assert [b["source"] for b in destination] == [exchange_name]
        assert management.call("DELETE", f"{between}/k").status == 204
        assert management.call("GET", between).body == []
    finally:
        management.call("DELETE", f"/api/exchanges/%2F/{other}")


# ---- (c) publish and get -----------------------------------------------------------------------


def test_publish_reports_whether_it_was_routed(management: Management, queue_name: str) -> None:
    management.call("PUT", f"/api/queues/%2F/{queue_name}", {})
    assert publish(management, queue_name, "hello") == {"routed": True}
    assert publish(management, unique("nowhere", "mgmt"), "lost") == {"routed": False}
    missing = management.call(
        "POST",
        "/api/exchanges/%2F/no-such-exchange/publish",
        {"properties": {}, "routing_key": "k", "payload": "x", "payload_encoding": "string"},
    )
    assert missing.body == {
        "error": "bad_request",
        "reason": "404 NOT_FOUND - no exchange 'no-such-exchange' in vhost '/'",
    }


def test_get_with_requeue_keeps_the_message_and_ack_takes_it(
    management: Management, queue_name: str
) -> None:
    path = f"/api/queues/%2F/{queue_name}"
    management.call("PUT", path, {})
    management.call(
        "POST",
        "/api/exchanges/%2F/amq.default/publish",
        {
            "properties": {"content_type": "text/plain", "headers": {"a": 1}, "delivery_mode": 2},
            "routing_key": queue_name,
            "payload": base64.b64encode(b"hi").decode(),
            "payload_encoding": "base64",
        },
    )
    publish(management, queue_name, "second")
    management.wait_for(path, "messages", 2)
    peek = management.call(
        "POST", f"{path}/get", {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto"}
    )
    assert peek.status == 200
    assert [m["payload"] for m in peek.body] == ["hi", "second"]
    first = peek.body[0]
    assert {
        k: first[k]
        for k in (
            "payload_bytes",
            "redelivered",
            "exchange",
            "routing_key",
            "message_count",
            "payload_encoding",
        )
    } == {
        "payload_bytes": 2,
        "redelivered": False,
        "exchange": "",
        "routing_key": queue_name,
        "message_count": 1,
        "payload_encoding": "string",
    }
    assert first["properties"] == {
        "content_type": "text/plain",
        "headers": {"a": 1},
        "delivery_mode": 2,
    }
    assert peek.body[1]["properties"] == []
    taken = management.call(
        "POST", f"{path}/get", {"count": "1", "ackmode": "ack_requeue_false", "encoding": "base64"}
    )
    assert [(m["payload"], m["payload_encoding"], m["redelivered"]) for m in taken.body] == [
        (base64.b64encode(b"hi").decode(), "base64", True)
    ]
    rest = management.call(
        "POST", f"{path}/get", {"count": 5, "ackmode": "ack_requeue_false", "encoding": "auto"}
    )
    assert [m["payload"] for m in rest.body] == ["second"]
    assert (
        management.call(
            "POST", f"{path}/get", {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"}
        ).body
        == []
    )


def test_get_from_a_missing_queue_is_404(management: Management) -> None:
    name = unique("gone", "mgmt")
    reply = management.call(
        "POST",
        f"/api/queues/%2F/{name}/get",
        {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"},
    )
    assert reply.status == 404
    assert reply.body == {
        "error": "not_found",
        "reason": f"NOT_FOUND - no queue '{name}' in vhost '/'",
    }


def test_publish_and_get_take_any_name(management: Management) -> None:
    """Names pamqp's grammar refuses (`<`, `&`, quotes) but RabbitMQ takes."""
    odd = f"{unique('odd', 'mgmt')} <b>&'\"é"
    exchange = f"/api/exchanges/%2F/{quote(odd, safe='')}"
    queue = f"/api/queues/%2F/{quote(odd, safe='')}"
    try:
        assert management.call("PUT", exchange, {"type": "direct"}).status == 201
        assert management.call("PUT", queue, {}).status == 201
        binding = f"/api/bindings/%2F/e/{quote(odd, safe='')}/q/{quote(odd, safe='')}"
        assert management.call("POST", binding, {"routing_key": odd}).status == 201
        assert publish(management, odd, "through", exchange=quote(odd, safe="")) == {"routed": True}
        management.wait_for(queue, "messages", 1)
        got = management.call(
            "POST", f"{queue}/get", {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"}
        )
        assert got.status == 200, got
        assert [(m["payload"], m["exchange"], m["routing_key"]) for m in got.body] == [
            ("through", odd, odd)
        ]
    finally:
        management.call("DELETE", queue)
        management.call("DELETE", exchange)


# ---- (d) definitions and permissions ----------------------------------------------------------


def test_definitions_export_and_import(management: Management, queue_name: str) -> None:
    document = {
        "queues": [
            {
                "name": queue_name,
                "vhost": "/",
                "durable": True,
                "auto_delete": False,
                "arguments": {},
            }
        ],
    }
    assert management.call("POST", "/api/definitions", document).status == 204
    assert management.call("GET", f"/api/queues/%2F/{queue_name}").status == 200
    exported = management.call("GET", "/api/definitions").body
    for key in (
        "rabbit_version",
        "vhosts",
        "permissions",
        "queues",
        "exchanges",
        "bindings",
        "policies",
    ):
        assert key in exported, key
    assert {
        "name": queue_name,
        "vhost": "/",
        "durable": True,
        "auto_delete": False,
        "arguments": {},
    } in exported["queues"]
    single = management.call("GET", "/api/definitions/%2F").body
    assert {"name": queue_name, "durable": True, "auto_delete": False, "arguments": {}} in single[
        "queues"
    ]


def test_permissions_set_show_clear(management: Management) -> None:
    if management.is_rabbitmq:
        user = "guest"  # RabbitMQ knows only its users; guest has permissions in /
        assert management.call("GET", "/api/permissions/%2F/guest").body == {
            "user": "guest",
            "vhost": "/",
            "configure": ".*",
            "write": ".*",
            "read": ".*",
        }
        return
    user = unique("user", "mgmt")
    path = f"/api/permissions/%2F/{user}"
    assert management.call("GET", path).body == NOT_FOUND
    assert (
        management.call("PUT", path, {"configure": "", "write": "w.*", "read": ".*"}).status == 201
    )
    shown = {"user": user, "vhost": "/", "configure": "", "write": "w.*", "read": ".*"}
    assert management.call("GET", path).body == shown
    assert shown in management.call("GET", "/api/permissions").body
    assert management.call("DELETE", path).status == 204
    assert management.call("DELETE", path).status == 404
    missing_vhost = management.call(
        "PUT",
        f"/api/permissions/no-such-vhost/{user}",
        {"configure": ".*", "write": ".*", "read": ".*"},
    )
    assert missing_vhost.body == {"error": "bad_request", "reason": "vhost_or_user_not_found"}


def test_nodes_and_policies(management: Management) -> None:
    # A proxy just started registers itself within a moment.
    nodes = wait_until(lambda: management.call("GET", "/api/nodes").body or None)
    assert nodes and all(n["running"] is True and n["type"] == "disc" for n in nodes)
    assert management.call("GET", f"/api/nodes/{quote(nodes[0]['name'], safe='')}").status == 200
    assert management.call("GET", "/api/policies").body == []
    assert management.call("GET", "/api/policies/%2F").body == []
    assert management.call("GET", "/api/policies/%2F/none").body == NOT_FOUND
    # The rest of policies: test_topology_policies.py.
    refused = management.call("PUT", "/api/policies/%2F/p", {"pattern": ".*"})
    assert refused.body == {"error": "bad_request", "reason": "[{key_missing,definition}]"}


def test_vhost_create_and_delete(management: Management) -> None:
    name = unique("vhost", "mgmt")
    path = f"/api/vhosts/{name}"
    try:
        assert management.call("PUT", path, {}).status == 201
        assert management.call("PUT", path, {}).status == 204
        assert management.call("GET", path).body["name"] == name
        assert name in {v["name"] for v in management.call("GET", "/api/vhosts").body}
    finally:
        deleted = management.call("DELETE", path)
    assert deleted.status == 204
    assert management.call("GET", path).body == NOT_FOUND
    assert management.call("DELETE", path).status == 404


def test_users_are_stored_users_and_the_principals_with_permissions(management: Management) -> None:
    if management.is_rabbitmq:
        assert "guest" in {u["name"] for u in management.call("GET", "/api/users").body}
        return
    user = unique("user", "mgmt")
    management.call(
        "PUT", f"/api/permissions/%2F/{user}", {"configure": "", "write": "", "read": ".*"}
    )
    try:
        users = management.call("GET", "/api/users").body
        assert {
            "name": user,
            "password_hash": "",
            "hashing_algorithm": "",
            "tags": [],
            "limits": {},
        } in users
        assert management.call("GET", f"/api/users/{user}").body["name"] == user
        # Storing a password makes it a user of its own (test_security_users.py).
        assert (
            management.call("PUT", f"/api/users/{user}", {"password": "x", "tags": ""}).status
            == 201
        )
        stored = management.call("GET", f"/api/users/{user}").body
        assert stored["hashing_algorithm"] == "rabbit_password_hashing_sha256"
        assert management.call("DELETE", f"/api/users/{user}").status == 204
        # Its permissions went with it, as RabbitMQ's delete_user does.
        assert management.call("GET", f"/api/permissions/%2F/{user}").body == NOT_FOUND
    finally:
        management.call("DELETE", f"/api/permissions/%2F/{user}")
    assert management.call("GET", f"/api/users/{user}").body == NOT_FOUND
