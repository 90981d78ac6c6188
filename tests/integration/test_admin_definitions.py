"""`starlight-admin definitions import|export` with a definitions.json exported from a real
RabbitMQ 3.10 (tests/fixtures/make_rabbitmq_definitions.py says how it was made): the
imported topology routes the same publishes to the same queues as RabbitMQ did."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pika
import pytest

from starlight_py.local import ServiceEndpoints
from tests.integration.conftest import ProxyFactory
from tests.support.admin_cli import AdminCLI

FIXTURES = Path(__file__).parent.parent / "fixtures"
DEFINITIONS = FIXTURES / "rabbitmq_definitions.json"
ROUTES = json.loads((FIXTURES / "rabbitmq_routes.json").read_text())


@pytest.fixture
def admin(services: ServiceEndpoints) -> AdminCLI:
    return AdminCLI(services)


def topology(document: dict[str, Any]) -> dict[str, Any]:
    """What both sides must agree on (RabbitMQ adds a queue `type`, we add namespaces)."""
    return {
        "vhosts": sorted(v["name"] for v in document["vhosts"]),
        "exchanges": sorted(
            json.dumps(
                {
                    **{k: e[k] for k in ("name", "vhost", "type", "durable", "auto_delete")},
                    "internal": e.get("internal", False),  # RabbitMQ 3.10 omits it
                    "arguments": e["arguments"],
                },
                sort_keys=True,
            )
            for e in document["exchanges"]
        ),
        "queues": sorted(
            json.dumps(
                {k: q[k] for k in ("name", "vhost", "durable", "auto_delete", "arguments")},
                sort_keys=True,
            )
            for q in document["queues"]
        ),
        "bindings": sorted(json.dumps(b, sort_keys=True) for b in document["bindings"]),
        "permissions": sorted(json.dumps(p, sort_keys=True) for p in document["permissions"]),
    }


def collect(channel: Any, queue: str, expected: int) -> list[str]:
    bodies: list[str] = []
    deadline = time.monotonic() + 10
    while len(bodies) < expected and time.monotonic() < deadline:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.05)
        else:
            bodies.append(body.decode())
    time.sleep(0.3)  # anything extra would have arrived by now
    while (got := channel.basic_get(queue, auto_ack=True))[0] is not None:
        bodies.append(got[2].decode())
    return bodies


def test_rabbitmq_export_imports_idempotently_and_routes_as_on_rabbitmq(
    admin: AdminCLI, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    first = admin.run("--json", "definitions", "import", str(DEFINITIONS))
    assert first.code == 0, first.err
    report = first.json()
    assert report["failed"] == []
    assert report["skipped"] == []
    assert len(report["created"]["exchanges"]) == 5
    assert len(report["created"]["queues"]) == 10
    assert len(report["created"]["bindings"]) == 10
    assert len(report["created"]["permissions"]) == 3
    assert sorted(report["created"]["vhosts"]) == [
        "/ -> public/default",
        "adm-shop -> public/adm-shop",
    ]
    # Users keep RabbitMQ's password hashes (adm-app's password is `secret`).
    assert report["created"]["users"] == ["adm-app", "guest"]

    again = admin.json("definitions", "import", str(DEFINITIONS))
    assert again["created"] == {}
    assert again["existing"] == {
        "vhosts": 2,
        "exchanges": 5,
        "queues": 10,
        "bindings": 10,
        "permissions": 3,
        "users": 2,
    }
    text = admin.ok("definitions", "import", str(DEFINITIONS)).out
    assert "queues: 0 created, 10 already present" in text

    # What cannot be applied is listed, and fails the import unless it is skipped on purpose.
    document = json.loads(DEFINITIONS.read_text())
    document["parameters"] = [
        {"vhost": "/", "component": "operator_policy", "name": "op", "value": {}}
    ]
    document["policies"] = [
        {
            "vhost": "/",
            "name": "ha",
            "pattern": ".*",
            "apply-to": "queues",
            "priority": 0,
            "definition": {"ha-mode": "all"},
        }
    ]
    extended = tmp_path / "extended.json"
    extended.write_text(json.dumps(document))
    refused = admin.run("definitions", "import", str(extended))
    assert refused.code == 1
    assert "operator_policy/op" in refused.out + refused.err
    assert "ha-mode" in refused.out + refused.err
    skipped = admin.run("--json", "definitions", "import", "--skip-unsupported", str(extended))
    assert skipped.code == 0, skipped.err
    assert len(skipped.json()["skipped"]) == 2

    proxy = start_proxy(**admin.proxy_settings)
    channels = {}
    for vhost in ROUTES["routes"]:
        connection = pika.BlockingConnection(
            pika.URLParameters(proxy.amqp_url("%2F" if vhost == "/" else vhost))
        )
        channels[vhost] = connection.channel()
    for vhost, exchange, key, headers, body in ROUTES["publishes"]:
        channels[vhost].basic_publish(
            exchange, key, body.encode(), pika.BasicProperties(headers=headers)
        )
    for vhost, queues in ROUTES["routes"].items():
        for queue, bodies in queues.items():
            # Which messages, not their order: a queue bound with two routing keys of a
            # direct exchange reads two topics, whose messages basic.get takes one topic
            # after the other (docs/compatibility.md#message-order).
            got = collect(channels[vhost], queue, len(bodies))
            assert sorted(got) == sorted(bodies), (vhost, queue)
    for channel in channels.values():
        channel.connection.close()

    # Export -> our topology equals RabbitMQ's export for everything we support.
    exported = tmp_path / "exported.json"
    admin.ok("definitions", "export", str(exported))
    ours = json.loads(exported.read_text())
    theirs = json.loads(DEFINITIONS.read_text())
    assert topology(ours) == topology(theirs)
    assert sorted(ours["users"], key=lambda u: u["name"]) == theirs["users"]


def test_export_import_round_trip_keeps_namespace_mappings(
    admin: AdminCLI, services: ServiceEndpoints, tmp_path: Path
) -> None:
    admin.ok("vhost", "create", "mapped", "--namespace", "adm-roundtrip/ns1")
    admin.ok(
        "exchange",
        "declare",
        "h",
        "--type",
        "headers",
        "--vhost",
        "mapped",
        "--argument",
        "alternate-exchange=ae",
    )
    admin.ok(
        "queue",
        "declare",
        "q",
        "--vhost",
        "mapped",
        "--argument",
        "x-message-ttl=60000",
        "--argument",
        "x-dead-letter-exchange=dlx",
    )
    admin.ok(
        "binding",
        "declare",
        "h",
        "q",
        "--vhost",
        "mapped",
        "--argument",
        "x-match=any",
        "--argument",
        "n=7",
        "--argument",
        "flag=true",
    )
    admin.ok("permissions", "set", "alice", "^q$", "^h$", ".*", "--vhost", "mapped")
    first = tmp_path / "first.json"
    admin.ok("definitions", "export", str(first))

    other = AdminCLI(services)  # an empty metadata root: another cluster
    imported = other.run("--json", "definitions", "import", str(first)).json()
    assert imported["created"]["vhosts"] == ["mapped -> adm-roundtrip/ns1"]
    assert imported["failed"] == []
    second = tmp_path / "second.json"
    other.ok("definitions", "export", str(second))
    assert json.loads(second.read_text()) == json.loads(first.read_text())
    assert other.json("vhost", "list")[0]["mapping"] == "explicit"


def test_import_reports_what_it_cannot_apply(admin: AdminCLI, tmp_path: Path) -> None:
    document = {
        "vhosts": [{"name": "/"}],
        "exchanges": [
            {
                "name": "src",
                "vhost": "/",
                "type": "fanout",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            },
            {
                "name": "dst",
                "vhost": "/",
                "type": "direct",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            },
            {
                "name": "weird",
                "vhost": "/",
                "type": "x-consistent-hash",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            },
        ],
        "bindings": [
            {
                "source": "src",
                "vhost": "/",
                "destination": "dst",
                "destination_type": "exchange",
                "routing_key": "",
                "arguments": {},
            }
        ],
        "policies": [
            {"name": "ha", "pattern": ".*", "definition": {"ha-mode": "all"}},
            {"name": "broken", "pattern": ".*", "definition": {"max-length": -1}},
        ],
    }
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(document))
    result = admin.run("--json", "definitions", "import", str(path))
    assert result.code == 1  # something was refused: the report says what
    report = result.json()
    assert report["created"]["exchanges"] == ["/ src (fanout)", "/ dst (direct)"]
    assert report["created"]["bindings"] == ["'src' -> 'dst' (key '') in vhost '/'"]
    assert len(report["failed"]) == 2
    assert "weird" in report["failed"][0]
    assert report["failed"][1] == (
        "policy 'broken' in vhost '/': Validation failed -1 is not a valid maximum length"
    )
    # The exchange-to-exchange binding is exported again as RabbitMQ writes it.
    exported = tmp_path / "exported.json"
    admin.ok("definitions", "export", str(exported))
    assert [
        b for b in json.loads(exported.read_text())["bindings"] if b["source"] == "src"
    ] == document["bindings"]
    assert report["skipped"] == [
        "policy 'ha' in vhost '/': ha-mode not supported by starlight-py (not applied)"
    ]

    path.write_text("[1, 2]")
    not_definitions = admin.run("definitions", "import", str(path))
    assert not_definitions.code == 2
    assert "JSON object" in not_definitions.err
