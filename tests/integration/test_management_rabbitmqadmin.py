"""RabbitMQ's own `rabbitmqadmin` (Debian's rabbitmq-server package) against the management
API: list, declare, delete, purge, publish, get, export, import, close. Against our proxy, or
RabbitMQ's management plugin with STARLIGHT_TEST_MANAGEMENT_URL."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pika
import pika.exceptions
import pytest

from tests.support.amqp_fixtures import unique
from tests.support.debian_packages import ensure_installed
from tests.support.management_api import Management, management, wait_until

__all__ = ["management"]  # a fixture

RABBITMQADMIN = "/usr/bin/rabbitmqadmin"  # Debian's rabbitmq-server package


@pytest.fixture(autouse=True, scope="module")
def _rabbitmqadmin() -> None:
    ensure_installed((RABBITMQADMIN,), ("rabbitmq-server",))


def admin(management: Management, *args: str) -> str:
    """rabbitmqadmin's output; fails the test with its stderr when it fails."""
    parts = urlsplit(management.base)
    command = [
        RABBITMQADMIN,
        "-H",
        parts.hostname or "127.0.0.1",
        "-P",
        str(parts.port),
        "-u",
        management.user,
        "-p",
        management.password,
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"{' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def listed(management: Management, kind: str, *columns: str) -> list[dict[str, object]]:
    return list(json.loads(admin(management, "-f", "raw_json", "list", kind, *columns)))


def test_declare_list_publish_get_purge_delete(management: Management) -> None:
    queue, exchange = unique("q", "rmqadmin"), unique("x", "rmqadmin")
    try:
        assert "queue declared" in admin(management, "declare", "queue", f"name={queue}")
        admin(management, "declare", "exchange", f"name={exchange}", "type=topic")
        admin(
            management,
            "declare",
            "binding",
            f"source={exchange}",
            f"destination={queue}",
            "routing_key=a.*",
        )
        table = admin(management, "list", "queues")
        assert queue in table
        assert {"name": exchange, "type": "topic"} in listed(
            management, "exchanges", "name", "type"
        )
        assert {"source": exchange, "destination": queue, "routing_key": "a.*"} in listed(
            management, "bindings", "source", "destination", "routing_key"
        )

        admin(management, "publish", f"exchange={exchange}", "routing_key=a.b", "payload=hello")
        peeked = json.loads(
            admin(management, "-f", "raw_json", "get", f"queue={queue}", "ackmode=ack_requeue_true")
        )
        assert [(m["payload"], m["routing_key"]) for m in peeked] == [("hello", "a.b")]
        management.wait_for(f"/api/queues/%2F/{queue}", "messages", 1)
        assert {"name": queue, "messages": 1} in listed(management, "queues", "name", "messages")

        assert "queue purged" in admin(management, "purge", "queue", f"name={queue}")
        management.wait_for(f"/api/queues/%2F/{queue}", "messages", 0)
        got = json.loads(admin(management, "-f", "raw_json", "get", f"queue={queue}"))
        assert got == []

        admin(
            management,
            "delete",
            "binding",
            f"source={exchange}",
            "destination_type=queue",
            f"destination={queue}",
            "properties_key=a.%2A",
        )
        assert not [
            b
            for b in listed(management, "bindings", "source", "destination")
            if b["source"] == exchange
        ]
        assert "exchange deleted" in admin(management, "delete", "exchange", f"name={exchange}")
        assert "queue deleted" in admin(management, "delete", "queue", f"name={queue}")
        assert queue not in admin(management, "list", "queues")
    finally:
        management.call("DELETE", f"/api/queues/%2F/{queue}")
        management.call("DELETE", f"/api/exchanges/%2F/{exchange}")


def test_export_then_import_definitions(management: Management, tmp_path: Path) -> None:
    queue = unique("q", "rmqadmin")
    exported = tmp_path / "definitions.json"
    try:
        admin(management, "declare", "queue", f"name={queue}", "durable=true")
        admin(management, "export", str(exported))
        document = json.loads(exported.read_text())
        assert queue in {q["name"] for q in document["queues"]}
        admin(management, "delete", "queue", f"name={queue}")
        assert "Uploaded definitions" in admin(management, "import", str(exported))
        assert management.call("GET", f"/api/queues/%2F/{queue}").status == 200
    finally:
        management.call("DELETE", f"/api/queues/%2F/{queue}")


def test_show_overview_and_list_vhosts(management: Management) -> None:
    overview = json.loads(admin(management, "-f", "raw_json", "show", "overview"))
    assert overview[0]["rabbitmq_version"]
    assert "/" in {v["name"] for v in listed(management, "vhosts", "name")}


def test_list_and_close_connections(management: Management) -> None:
    if not management.amqp_url:
        pytest.skip("STARLIGHT_TEST_AMQP_URL is needed with STARLIGHT_TEST_MANAGEMENT_URL")
    label = unique("conn", "rmqadmin")
    parameters = pika.URLParameters(management.amqp_url)
    parameters.client_properties = {"connection_name": label}
    connection = pika.BlockingConnection(parameters)
    try:
        connection.channel()

        def ours() -> str | None:
            for item in listed(management, "connections"):
                properties = item.get("client_properties")
                if isinstance(properties, dict) and properties.get("connection_name") == label:
                    return str(item["name"])
            return None

        name = wait_until(ours)
        assert name is not None
        assert name in admin(management, "list", "connections")
        assert f"{name} (1)" in admin(management, "list", "channels")
        assert "connection closed" in admin(management, "close", "connection", f"name={name}")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            connection.process_data_events(time_limit=15)
        assert closed.value.reply_code == 320
    finally:
        if connection.is_open:
            connection.close()


def test_declare_list_and_delete_a_policy(management: Management) -> None:
    name = unique("p", "rmqadmin")
    try:
        declared = admin(
            management,
            "declare",
            "policy",
            f"name={name}",
            "pattern=^rmqadmin-nothing$",
            'definition={"max-length": 3}',
            "apply-to=queues",
            "priority=2",
        )
        assert "policy declared" in declared
        assert {
            "name": name,
            "pattern": "^rmqadmin-nothing$",
            "apply-to": "queues",
            "definition": {"max-length": 3},
            "priority": 2,
        } in listed(management, "policies", "name", "pattern", "apply-to", "definition", "priority")
        assert name in admin(management, "list", "policies")
        assert "policy deleted" in admin(management, "delete", "policy", f"name={name}")
        assert name not in admin(management, "list", "policies")
    finally:
        management.call("DELETE", f"/api/policies/%2F/{name}")
