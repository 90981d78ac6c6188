"""/api/connections, /api/channels, /api/consumers of the whole cluster and DELETE
/api/connections/{name} (320 CONNECTION_FORCED with the reason). Against our proxies, or
RabbitMQ with STARLIGHT_TEST_MANAGEMENT_URL and STARLIGHT_TEST_AMQP_URL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pika
import pika.exceptions
import pytest

from starlight_py.local.ports import free_port
from tests.integration.conftest import ProxyFactory
from tests.support.management_api import (
    NOT_FOUND,
    Management,
    closed_by_broker,
    management,
    wait_until,
)

__all__ = ["management"]  # a fixture


@pytest.fixture
def client(management: Management) -> Iterator[tuple[pika.BlockingConnection, str]]:
    """A pika connection named by its `connection_name` client property."""
    if not management.amqp_url:
        pytest.skip("STARLIGHT_TEST_AMQP_URL is needed with STARLIGHT_TEST_MANAGEMENT_URL")
    label = f"mgmt-{uuid.uuid4().hex[:10]}"
    parameters = pika.URLParameters(management.amqp_url)
    parameters.client_properties = {"connection_name": label}
    connection = pika.BlockingConnection(parameters)
    yield connection, label
    if connection.is_open:
        connection.close()


def find_connection(management: Management, label: str) -> dict[str, Any] | None:
    for item in management.call("GET", "/api/connections").body:
        if (item.get("client_properties") or {}).get("connection_name") == label:
            return dict(item)
    return None


def test_connections_channels_and_consumers_are_listed(
    management: Management, client: tuple[pika.BlockingConnection, str]
) -> None:
    connection, label = client
    channel = connection.channel()
    channel.basic_qos(prefetch_count=7)
    queue = channel.queue_declare("", exclusive=True).method.queue
    tag = channel.basic_consume(queue, lambda *_: None)

    found = wait_until(lambda: find_connection(management, label))
    assert found is not None
    assert {k: found[k] for k in ("user", "vhost", "state", "protocol", "type", "ssl")} == {
        "user": "guest",
        "vhost": "/",
        "state": "running",
        "protocol": "AMQP 0-9-1",
        "type": "network",
        "ssl": False,
    }
    name = found["name"]
    assert name == f"{found['peer_host']}:{found['peer_port']} -> {found['host']}:{found['port']}"
    shown = management.call("GET", f"/api/connections/{quote(name, safe='')}")
    assert shown.body["name"] == name

    def our_channel() -> dict[str, Any] | None:
        for item in management.call("GET", "/api/channels").body:
            if item["connection_details"]["name"] == name and item.get("consumer_count") == 1:
                return dict(item)
        return None

    channel_shown = wait_until(our_channel)
    assert channel_shown is not None
    assert (channel_shown["number"], channel_shown["prefetch_count"]) == (1, 7)
    assert channel_shown["name"] == f"{name} (1)"
    per_connection = management.call("GET", f"/api/connections/{quote(name, safe='')}/channels")
    assert [c["name"] for c in per_connection.body] == [f"{name} (1)"]

    def our_consumer() -> dict[str, Any] | None:
        for item in management.call("GET", "/api/consumers/%2F").body:
            if item["consumer_tag"] == tag:
                return dict(item)
        return None

    consumer = wait_until(our_consumer)
    assert consumer is not None
    assert consumer["queue"] == {"name": queue, "vhost": "/"}
    assert consumer["channel_details"]["connection_name"] == name
    assert (consumer["ack_required"], consumer["prefetch_count"]) == (True, 7)


def test_deleting_a_connection_closes_it_with_320_and_the_reason(
    management: Management, client: tuple[pika.BlockingConnection, str]
) -> None:
    connection, label = client
    found = wait_until(lambda: find_connection(management, label))
    assert found is not None
    path = f"/api/connections/{quote(found['name'], safe='')}"
    reply = management.call("DELETE", path, headers={"X-Reason": "maintenance by mgmt test"})
    assert reply.status == 204
    assert closed_by_broker(connection) == (320, "CONNECTION_FORCED - maintenance by mgmt test")
    gone = wait_until(lambda: True if management.call("GET", path).status == 404 else None)
    assert gone
    assert management.call("GET", path).body == NOT_FOUND


def test_connections_of_other_proxies_are_listed_and_closed(
    management: Management, start_proxy: ProxyFactory
) -> None:
    if management.is_rabbitmq:
        pytest.skip("several proxies: our cluster")
    other = start_proxy(managementListener=f"http://127.0.0.1:{free_port()}")
    label = f"mgmt-{uuid.uuid4().hex[:10]}"
    parameters = pika.URLParameters(other.amqp_url())
    parameters.client_properties = {"connection_name": label}
    connection = pika.BlockingConnection(parameters)
    try:
        found = wait_until(lambda: find_connection(management, label))
        assert found is not None and found["port"] == other.port
        path = f"/api/connections/{quote(found['name'], safe='')}"
        assert management.call("DELETE", path).status == 204
        assert closed_by_broker(connection) == (
            320,
            "CONNECTION_FORCED - Closed via management plugin",
        )
    finally:
        if connection.is_open:
            connection.close()


def test_deliveries_alone_update_the_listed_unacked_count(
    management: Management, start_proxy: ProxyFactory
) -> None:
    """A consumer's proxy re-describes its report when it only writes (deliveries, no
    input from that connection): its count of changes is bumped by output too. The
    messages are published through another proxy, whose input does not count here."""
    if management.is_rabbitmq:
        pytest.skip("several proxies: our cluster")
    other = start_proxy(managementListener=f"http://127.0.0.1:{free_port()}")
    label = f"mgmt-{uuid.uuid4().hex[:10]}"
    parameters = pika.URLParameters(other.amqp_url())
    parameters.client_properties = {"connection_name": label}
    consumer = pika.BlockingConnection(parameters)
    publisher = pika.BlockingConnection(pika.URLParameters(management.amqp_url))
    try:
        channel = consumer.channel()
        channel.basic_qos(prefetch_count=10)
        queue = f"mgmt-unacked-{uuid.uuid4().hex[:8]}"
        channel.queue_declare(queue, auto_delete=True)
        received: list[bytes] = []
        channel.basic_consume(queue, lambda _ch, _m, _p, body: received.append(body))

        def unacked() -> int | None:
            found = find_connection(management, label)
            if found is None:
                return None
            for item in management.call("GET", "/api/channels").body:
                if item["connection_details"]["name"] == found["name"]:
                    return int(item["messages_unacknowledged"])
            return None

        assert wait_until(lambda: True if unacked() == 0 else None)
        out = publisher.channel()
        out.confirm_delivery()
        for i in range(3):
            out.basic_publish("", queue, f"m{i}".encode())
        deadline = 30.0
        while len(received) < 3 and deadline > 0:
            consumer.process_data_events(time_limit=0.2)
            deadline -= 0.2
        assert len(received) == 3
        # Nothing more is sent on the consumer's connection: no acks, no other method.
        assert wait_until(lambda: True if unacked() == 3 else None), unacked()
    finally:
        for connection in (publisher, consumer):
            if connection.is_open:
                connection.close()
