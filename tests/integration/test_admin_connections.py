"""`starlight-admin connection list/close`, `channel list`, `consumer list` and `health`
against real ZooKeeper + Pulsar and a proxy that pika is connected to."""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest

from starlight_py.local import ServiceEndpoints
from starlight_py.local.ports import free_port
from tests.integration.conftest import ProxyFactory
from tests.support.admin_cli import AdminCLI
from tests.support.amqp_fixtures import unique


@pytest.fixture
def admin(services: ServiceEndpoints) -> AdminCLI:
    return AdminCLI(services)


def wait_for_rows(
    admin: AdminCLI, *command: str, count: int, **expected: object
) -> list[dict[str, object]]:
    """The rows once `count` are listed, the first with the `expected` values (proxies
    report at most once a second)."""
    deadline = time.monotonic() + 15
    while True:
        rows: list[dict[str, object]] = admin.json(*command)
        if len(rows) == count and all(rows[0].get(k) == v for k, v in expected.items()):
            return rows
        assert time.monotonic() < deadline, f"{command}: {rows}"
        time.sleep(0.2)


def test_list_connections_channels_consumers_and_close_one(
    admin: AdminCLI, start_proxy: ProxyFactory
) -> None:
    proxy = start_proxy(**admin.proxy_settings)
    assert wait_for_rows(admin, "connection", "list", count=0) == []
    connection = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=7)
    queue = unique("q", "admin-conn")
    channel.queue_declare(queue, exclusive=True)
    channel.basic_consume(queue, lambda *a: None, consumer_tag="watcher")
    connections = wait_for_rows(admin, "connection", "list", count=1, vhost="/", channels=1)
    name = str(connections[0]["name"])
    wait_for_rows(admin, "channel", "list", count=1, prefetch=7, consumers=1)
    wait_for_rows(admin, "consumer", "list", count=1, queue=queue, tag="watcher")

    closed = admin.ok("connection", "close", name, "--reason", "maintenance")
    assert "closing" in closed.out and name in closed.out
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        connection.process_data_events(time_limit=5)
    assert info.value.reply_code == 320 and "maintenance" in info.value.reply_text

    wait_for_rows(admin, "connection", "list", count=0)
    missing = admin.run("connection", "close", name)
    assert missing.code == 1 and "no connection named" in missing.err


def test_health_is_0_while_everything_answers_and_69_when_pulsar_does_not(
    admin: AdminCLI, start_proxy: ProxyFactory
) -> None:
    start_proxy(**admin.proxy_settings)
    deadline = time.monotonic() + 15
    while (healthy := admin.run("health")).code != 0:  # the proxy registers after it starts
        assert time.monotonic() < deadline, healthy.out + healthy.err
        time.sleep(0.2)
    assert "healthy" in healthy.out.splitlines()[-1]
    unhealthy = admin.run("health", brokerWebServiceURL=f"http://127.0.0.1:{free_port()}")
    assert unhealthy.code == 69
    assert "pulsar: FAILED" in unhealthy.out and "not healthy" in unhealthy.out
