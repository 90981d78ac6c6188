"""`starlight-admin exchange|queue|binding|topics` against real ZooKeeper + Pulsar, checked
with pika through a proxy that shares the admin's metadata root."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from starlight_py.local import ServiceEndpoints
from tests.integration.conftest import ProxyFactory
from tests.support.admin_cli import AdminCLI
from tests.support.proxy_runner import ProxyThread


@pytest.fixture
def admin(services: ServiceEndpoints) -> AdminCLI:
    return AdminCLI(services)


@pytest.fixture
def proxy(admin: AdminCLI, start_proxy: ProxyFactory) -> ProxyThread:
    return start_proxy(**admin.proxy_settings)


@pytest.fixture
def channel(proxy: ProxyThread) -> Iterator[BlockingChannel]:
    connection = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))
    yield connection.channel()
    if connection.is_open:
        connection.close()


def wait_for(check: Callable[[], Any], timeout: float = 15) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.2)


def queue_row(admin: AdminCLI, name: str) -> dict[str, Any]:
    rows = {row["name"]: row for row in admin.json("queue", "list")}
    return rows[name]


def drain(channel: BlockingChannel, queue: str, expected: int) -> list[bytes]:
    bodies: list[bytes] = []
    deadline = time.monotonic() + 10
    while len(bodies) < expected and time.monotonic() < deadline:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.05)
            continue
        bodies.append(bytes(body))
    time.sleep(0.3)
    method, _, body = channel.basic_get(queue, auto_ack=True)
    if method is not None:
        bodies.append(bytes(body))
    return bodies


def test_admin_declared_topology_routes_pika_messages(
    admin: AdminCLI, channel: BlockingChannel
) -> None:
    admin.ok("exchange", "declare", "logs", "--type", "topic")
    admin.ok("queue", "declare", "errors", "--argument", "x-max-length=100")
    admin.ok("binding", "declare", "logs", "errors", "--routing-key", "*.error")

    exchanges = {row["name"]: row for row in admin.json("exchange", "list")}
    assert exchanges["logs"]["type"] == "topic"
    assert "amq.direct" in exchanges
    assert queue_row(admin, "errors")["arguments"] == {"x-max-length": 100}
    bindings = admin.json("binding", "list")
    assert {
        "source": "logs",
        "destination": "errors",
        "destination_type": "queue",
        "routing_key": "*.error",
        "arguments": {},
    } in bindings

    channel.exchange_declare("logs", "topic", passive=True)
    channel.basic_publish("logs", "db.error", b"disk full")
    channel.basic_publish("logs", "db.info", b"all good")
    channel.basic_publish("logs", "web.error", b"500")
    assert sorted(drain(channel, "errors", 2)) == [b"500", b"disk full"]

    # A pika-declared queue is visible to the admin, and an admin unbind stops routing.
    admin.ok("binding", "delete", "logs", "errors", "--routing-key", "*.error")
    assert admin.json("binding", "list") == [
        {
            "source": "",
            "destination": "errors",
            "destination_type": "queue",
            "routing_key": "errors",
            "arguments": {},
        }
    ]
    # Exchange-to-exchange bindings are listed too.
    channel.exchange_declare("audit", "fanout")
    channel.exchange_bind("audit", "logs", "#")
    assert {
        "source": "logs",
        "destination": "audit",
        "destination_type": "exchange",
        "routing_key": "#",
        "arguments": {},
    } in admin.json("binding", "list")
    channel.exchange_delete("audit")
    channel.basic_publish("logs", "db.error", b"after unbind")
    assert drain(channel, "errors", 0) == []

    admin.ok("exchange", "delete", "logs")
    assert "logs" not in {row["name"] for row in admin.json("exchange", "list")}
    admin.ok("queue", "delete", "errors")
    assert admin.json("queue", "list") == []


def test_queue_list_counts_ready_unacked_and_consumers_and_purge_empties(
    admin: AdminCLI, channel: BlockingChannel
) -> None:
    admin.ok("queue", "declare", "jobs")
    for number in range(5):
        channel.basic_publish("", "jobs", f"job-{number}".encode())
    wait_for(lambda: queue_row(admin, "jobs")["ready"] == 5)

    channel.basic_qos(prefetch_count=2)
    received: list[int] = []
    channel.basic_consume(
        "jobs", lambda ch, method, props, body: received.append(method.delivery_tag)
    )
    deadline = time.monotonic() + 10
    while len(received) < 2 and time.monotonic() < deadline:
        channel.connection.process_data_events(time_limit=0.1)
    # Pulsar counts as unacked what it dispatched to the proxy: the 2 delivered to pika
    # plus what the proxy's receiver queue holds for it (docs/admin.md).
    row = wait_for(
        lambda: (r := queue_row(admin, "jobs"))["unacked"] >= 2 and r["consumers"] == 1 and r
    )
    assert row["ready"] + row["unacked"] == 5

    admin.ok("queue", "purge", "jobs")
    wait_for(lambda: queue_row(admin, "jobs")["ready"] == 0)
    # The purge left the delivered messages to their consumer, as RabbitMQ does.
    channel.basic_ack(received[-1], multiple=True)

    in_use = admin.run("queue", "delete", "jobs", "--if-unused")
    assert in_use.code == 1
    assert "PRECONDITION_FAILED" in in_use.err
    channel.close()
    wait_for(lambda: queue_row(admin, "jobs")["consumers"] == 0)
    admin.ok("queue", "delete", "jobs", "--if-unused")


def test_topics_names_the_pulsar_topics_and_subscriptions(
    admin: AdminCLI, channel: BlockingChannel
) -> None:
    admin.ok("exchange", "declare", "orders", "--type", "direct")
    admin.ok("exchange", "declare", "fan", "--type", "fanout")
    admin.ok("queue", "declare", "created")
    admin.ok("binding", "declare", "orders", "created", "--routing-key", "new order")

    fan = admin.json("topics", "--exchange", "fan")
    assert fan == [
        {
            "exchange": "fan",
            "routing_key": None,
            "queue": None,
            "subscription": None,
            "topic": "persistent://public/default/fan",
        }
    ]
    orders = admin.json("topics", "--exchange", "orders")
    assert [(t["topic"], t["queue"]) for t in orders] == [
        ("persistent://public/default/orders~~new~20order", "created")
    ]
    # A topic exchange's binding reads a topic of its own (docs/mapping.md).
    admin.ok("exchange", "declare", "events", "--type", "topic")
    admin.ok("binding", "declare", "events", "created", "--routing-key", "a.*")
    (events,) = admin.json("topics", "--exchange", "events")
    assert events["topic"].startswith("persistent://public/default/events~~created~~")
    assert events["subscription"].split("~~")[1] == events["topic"].rsplit("~~", 1)[1]
    admin.ok("binding", "delete", "events", "created", "--routing-key", "a.*")
    by_queue = admin.json("topics", "--queue", "created")
    assert {t["exchange"] for t in by_queue} == {"", "orders"}
    # The default exchange's subscription is made by the first publish through it.
    default = next(t for t in by_queue if t["exchange"] == "")
    assert default["topic"] == "persistent://public/default/amq.default~~created"
    assert default["subscription"] == "(made by the first publish)"
    assert all(t["subscription"].startswith("created~~") for t in by_queue if t is not default)
    channel.confirm_delivery()
    channel.basic_publish("", "created", b"first")
    by_queue = admin.json("topics", "--queue", "created")
    assert all(t["subscription"].startswith("created~~") for t in by_queue)
    table = admin.ok("topics", "--queue", "created").out
    assert table.splitlines()[0].split() == [
        "EXCHANGE",
        "ROUTING_KEY",
        "TOPIC",
        "QUEUE",
        "SUBSCRIPTION",
    ]

    # A priority queue's bands are topics of their own (docs/mapping.md#priority-queues).
    admin.ok("queue", "declare", "urgent", "--argument", "x-max-priority=2")
    bands = admin.json("topics", "--queue", "urgent")
    assert sorted(t["topic"] for t in bands if t["exchange"] is None) == [
        f"persistent://public/default/amq.priority~~urgent~~{band}" for band in (0, 1, 2)
    ]
    assert [t["exchange"] for t in bands if t["exchange"] is not None] == [""]
    admin.ok("queue", "delete", "urgent")

    missing = admin.run("topics", "--exchange", "nope")
    assert missing.code == 1
    assert "no exchange 'nope'" in missing.err
    both = admin.run("topics", "--exchange", "fan", "--queue", "created")
    assert both.code == 2


def test_admin_errors_name_what_is_wrong(admin: AdminCLI, channel: BlockingChannel) -> None:
    admin.ok("exchange", "declare", "typed", "--type", "fanout")
    conflict = admin.run("exchange", "declare", "typed", "--type", "direct")
    assert conflict.code == 1
    assert conflict.err.strip() == (
        "starlight-admin: PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'typed' "
        "in vhost '/': received 'direct' but current is 'fanout'"
    )
    no_queue = admin.run("binding", "declare", "typed", "missing")
    assert no_queue.code == 1
    assert "NOT_FOUND - no queue 'missing'" in no_queue.err
    reserved = admin.run("exchange", "declare", "amq.mine")
    assert reserved.code == 1
    assert "ACCESS_REFUSED" in reserved.err
    bad_vhost = admin.run("queue", "list", "--vhost", "never-made")
    assert bad_vhost.code == 1
    assert "no vhost 'never-made'" in bad_vhost.err


def test_admin_declares_and_lists_delayed_exchanges_and_alternates(
    admin: AdminCLI, channel: BlockingChannel
) -> None:
    admin.ok(
        "exchange",
        "declare",
        "later",
        "--type",
        "x-delayed-message",
        "--argument",
        "x-delayed-type=fanout",
        "--argument",
        "alternate-exchange=spare",
    )
    row = {row["name"]: row for row in admin.json("exchange", "list")}["later"]
    assert row["type"] == "x-delayed-message"
    assert row["arguments"] == {"x-delayed-type": "fanout", "alternate-exchange": "spare"}
    # A delayed fanout exchange has one topic, like any fanout exchange.
    assert [t["topic"] for t in admin.json("topics", "--exchange", "later")] == [
        "persistent://public/default/later"
    ]
    channel.exchange_declare(
        "later", "x-delayed-message", passive=True, arguments={"x-delayed-type": "fanout"}
    )
    untyped = admin.run("exchange", "declare", "untyped", "--type", "x-delayed-message")
    assert untyped.code == 1
    assert "'x-delayed-type' must be an existing exchange type" in untyped.err
