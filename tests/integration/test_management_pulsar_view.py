"""What the management API serves beyond RabbitMQ's: a queue's Pulsar view
(`/api/queues/{vhost}/{name}/pulsar`: topics, owner brokers, subscriptions with their
backlogs, the retired ones draining), and the samples the web UI charts (RabbitMQ's
`lengths_age` / `msg_rates_age`, from the readings this proxy made). Proxy-only."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from starlight_py.local import ServiceEndpoints
from tests.support.amqp_fixtures import unique
from tests.support.management_api import Management, our_management, wait_until

AGES = "lengths_age=60&lengths_incr=5&msg_rates_age=60&msg_rates_incr=5"


@pytest.fixture(scope="module")
def ours(services: ServiceEndpoints) -> Iterator[Management]:
    with our_management(services) as management:
        yield management


def set_up(ours: Management, method: str, path: str, body: Any) -> int:
    """The status of a setup call, asked again while it is 503: a Pulsar just started on a
    loaded machine may not answer its first admin calls within the proxy's timeout."""
    deadline = time.monotonic() + 90
    while True:
        status = ours.call(method, path, body).status
        if status != 503 or time.monotonic() > deadline:
            return status
        time.sleep(1)


@pytest.fixture
def bound_queue(ours: Management) -> Iterator[tuple[str, str]]:
    """A queue bound to a direct exchange with the key `k` (queue, exchange)."""
    queue, exchange = unique("q", "pview"), unique("x", "pview")
    assert set_up(ours, "PUT", f"/api/exchanges/%2F/{exchange}", {"type": "direct"}) == 201
    assert set_up(ours, "PUT", f"/api/queues/%2F/{queue}", {"durable": True}) == 201
    bind = set_up(ours, "POST", f"/api/bindings/%2F/e/{exchange}/q/{queue}", {"routing_key": "k"})
    assert bind == 201
    yield queue, exchange
    ours.call("DELETE", f"/api/queues/%2F/{queue}")
    ours.call("DELETE", f"/api/exchanges/%2F/{exchange}")


def publish(ours: Management, exchange: str, count: int) -> None:
    for i in range(count):
        reply = ours.call(
            "POST",
            f"/api/exchanges/%2F/{exchange}/publish",
            {
                "properties": {},
                "routing_key": "k",
                "payload": f"m{i}",
                "payload_encoding": "string",
            },
        )
        assert reply.body == {"routed": True}


def pulsar_view(ours: Management, queue: str) -> dict[str, Any]:
    reply = ours.call("GET", f"/api/queues/%2F/{quote(queue, safe='')}/pulsar")
    assert reply.status == 200, reply
    body: dict[str, Any] = reply.body
    return body


def test_a_queues_topics_and_subscriptions_with_backlog_and_owner(
    ours: Management, bound_queue: tuple[str, str]
) -> None:
    queue, exchange = bound_queue
    publish(ours, exchange, 3)

    def backlog_of_three() -> dict[str, Any] | None:
        view = pulsar_view(ours, queue)
        backlogs = [s.get("backlog") for s in view["subscriptions"] if s["exchange"] == exchange]
        return view if backlogs == [3] else None

    view = wait_until(backlog_of_three)
    assert view is not None, json.dumps(pulsar_view(ours, queue))
    assert (view["vhost"], view["name"], view["namespace"]) == ("/", queue, "public/default")
    # The default exchange's binding: its subscription is made by the first publish
    # through the default exchange (none yet), on a topic of its own.
    default, subscription = sorted(view["subscriptions"], key=lambda s: s["exchange"])
    assert (default["exchange"], default["routing_keys"], default["state"]) == (
        "",
        [queue],
        "unused",
    )
    assert (default["subscription"], default["exists"]) == ("", False)
    assert "backlog" not in default
    assert subscription["state"] == "active"
    assert (subscription["exchange"], subscription["routing_keys"]) == (exchange, ["k"])
    assert (subscription["ready"], subscription["unacked"]) == (3, 0)
    assert subscription["backlog_size"] > 0
    [topic] = [t for t in view["topics"] if t["topic"] == subscription["topic"]]
    assert topic["topic"].startswith("persistent://public/default/")
    assert topic["owner_broker"].startswith("pulsar://")
    assert topic["storage_size"] > 0
    assert topic["subscriptions"] >= 1
    assert len(view["topics"]) == 1  # the default exchange's is not made yet

    # The first publish through the default exchange makes its subscription.
    reply = ours.call(
        "POST",
        "/api/exchanges/%2F/amq.default/publish",
        {"properties": {}, "routing_key": queue, "payload": "d", "payload_encoding": "string"},
    )
    assert reply.body == {"routed": True}

    def default_made() -> dict[str, Any] | None:
        found = [s for s in pulsar_view(ours, queue)["subscriptions"] if s["exchange"] == ""]
        return found[0] if found and found[0].get("backlog") == 1 else None

    made = wait_until(default_made)
    assert made is not None, json.dumps(pulsar_view(ours, queue))
    assert made["state"] == "active" and made["subscription"].startswith(queue)


def test_an_unbound_subscription_is_listed_while_it_drains(
    ours: Management, bound_queue: tuple[str, str]
) -> None:
    queue, exchange = bound_queue
    publish(ours, exchange, 2)
    wait_until(
        lambda: (
            [s.get("backlog") for s in pulsar_view(ours, queue)["subscriptions"]] == [None, 2]
            or None
        )
    )
    listed = ours.call("GET", f"/api/queues/%2F/{queue}/bindings").body
    [binding] = [b for b in listed if b["source"] == exchange]
    props = quote(binding["properties_key"], safe="")
    path = f"/api/bindings/%2F/e/{exchange}/q/{queue}/{props}"
    assert ours.call("DELETE", path).status == 204

    def draining() -> dict[str, Any] | None:
        found = [s for s in pulsar_view(ours, queue)["subscriptions"] if s["state"] == "draining"]
        return found[0] if found else None

    subscription = wait_until(draining)
    assert subscription is not None, json.dumps(pulsar_view(ours, queue))
    assert (subscription["exchange"], subscription["routing_keys"]) == (exchange, ["k"])
    assert subscription["backlog"] == 2
    assert subscription["retired_at"] > 0


def test_the_pulsar_view_of_a_missing_queue_is_404(ours: Management) -> None:
    assert ours.call("GET", "/api/queues/%2F/no-such-queue-pview/pulsar").status == 404
    assert ours.call("GET", "/api/queues/no-such-vhost/q/pulsar").status == 404


def test_queue_and_overview_samples_follow_the_readings(
    ours: Management, bound_queue: tuple[str, str]
) -> None:
    queue, exchange = bound_queue
    first = ours.call("GET", f"/api/queues/%2F/{queue}?{AGES}").body
    assert first["messages_details"]["samples"][0]["sample"] == 0
    assert "samples" in first["message_stats"]["publish_details"]
    publish(ours, exchange, 4)

    def four_ready() -> dict[str, Any] | None:
        shaped = ours.call("GET", f"/api/queues/%2F/{queue}?{AGES}").body
        newest = shaped["messages_ready_details"]["samples"][0]
        return shaped if newest["sample"] == 4 else None

    shaped = wait_until(four_ready)
    assert shaped is not None
    samples = shaped["messages_ready_details"]["samples"]
    assert all(set(s) == {"sample", "timestamp"} for s in samples)
    timestamps = [s["timestamp"] for s in samples]
    assert timestamps == sorted(timestamps, reverse=True)  # newest first, as RabbitMQ
    rates = shaped["message_stats"]["publish_details"]["samples"]
    assert rates and all(set(s) == {"rate", "timestamp"} for s in rates)

    # Without ages nothing changes in the shapes RabbitMQ clients know.
    plain = ours.call("GET", f"/api/queues/%2F/{queue}").body
    assert "samples" not in plain["messages_details"]
    assert ours.call("GET", "/api/overview").body["queue_totals"] == {}

    overview = ours.call("GET", f"/api/overview?{AGES}").body
    totals = overview["queue_totals"]
    assert totals["messages_ready"] >= 4
    assert totals["messages_ready_details"]["samples"][0]["sample"] >= 4
    assert "samples" in overview["message_stats"]["ack_details"]
