"""Policies as RabbitMQ 3.10 has them: set through the management API (the proxy's, or
RabbitMQ's when STARLIGHT_TEST_MANAGEMENT_URL and STARLIGHT_TEST_AMQP_URL are set, so one
test body serves both), applied to queues and exchanges that already exist, combined with
declared arguments by RabbitMQ's precedence; and `starlight-admin policy` (proxy only).

A policy reaches every proxy through its topology cache's watch, and RabbitMQ's queues through a
message to the queue process; each test first waits until GET /api/queues (or exchanges)
names the policy, as an operator would.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from starlight_py.local import ServiceEndpoints
from tests.support.admin_cli import AdminCLI
from tests.support.amqp_fixtures import (
    Created,
    confirming_channel,
    delete_created,
    drain,
    get_one,
    unique,
    wait_for_count,
)
from tests.support.management_api import NOT_FOUND, Management, management, wait_until

__all__ = ["management"]  # a fixture

NAME_PREFIX = "policy"
TRIMMED = 10.0  # seconds a drop-head trim may take to show (not a bound on speed)
TTL_MS = 200
PolicySetter = Callable[..., str]


@pytest.fixture
def names(management: Management) -> Iterator[Created]:
    created = Created(NAME_PREFIX)
    yield created
    delete_created(management.amqp_url, created)


@pytest.fixture
def channel(management: Management) -> Iterator[BlockingChannel]:
    connection = pika.BlockingConnection(pika.URLParameters(management.amqp_url))
    yield confirming_channel(connection)
    connection.close()


@pytest.fixture
def set_policy(management: Management) -> Iterator[PolicySetter]:
    """Sets a policy in vhost `/` with PUT /api/policies; returns its name. The test's
    policies are cleared when it ends."""
    made: list[str] = []

    def put(
        pattern: str, definition: dict[str, Any], apply_to: str = "all", priority: int = 0
    ) -> str:
        name = unique("p", NAME_PREFIX)
        body = {
            "pattern": pattern,
            "definition": definition,
            "apply-to": apply_to,
            "priority": priority,
        }
        reply = management.call("PUT", f"/api/policies/%2F/{name}", body)
        assert reply.status == 201, reply
        made.append(name)
        return name

    yield put
    for name in made:
        management.call("DELETE", f"/api/policies/%2F/{name}")


def applied(management: Management, kind: str, name: str, policy: str | None) -> None:
    """Wait until GET /api/{kind}/%2F/{name} names `policy` (None: no policy)."""

    def current() -> bool | None:
        body = management.call("GET", f"/api/{kind}/%2F/{quote(name, safe='')}").body
        return True if body.get("policy", "absent") == policy else None

    assert wait_until(current) is not None, f"{kind} {name} never showed policy {policy}"


def publish(channel: BlockingChannel, exchange: str, key: str, *bodies: bytes) -> None:
    for body in bodies:
        channel.basic_publish(exchange, key, body, pika.BasicProperties(delivery_mode=2))


# ---- behaviour (both brokers) -----------------------------------------------------------------


def test_a_policy_message_ttl_expires_messages_of_an_existing_queue_on_every_proxy(
    management: Management,
    connection: BlockingConnection,
    names: Created,
    set_policy: PolicySetter,
) -> None:
    # `connection` is to another proxy than the management API's (the same RabbitMQ).
    channel = confirming_channel(connection)
    queue, control = names.queue(), names.queue("control")
    for each in (queue, control):
        channel.queue_declare(each, durable=True)
    policy = set_policy(f"^{queue}$", {"message-ttl": TTL_MS}, "queues")
    applied(management, "queues", queue, policy)
    applied(management, "queues", control, None)
    publish(channel, "", queue, b"short-lived")
    publish(channel, "", control, b"kept")
    time.sleep(5 * TTL_MS / 1000)
    assert drain(channel, control, 1) == [b"kept"]
    assert drain(channel, queue, 0) == []


def test_the_smaller_message_ttl_wins_either_way(
    management: Management, channel: BlockingChannel, names: Created, set_policy: PolicySetter
) -> None:
    stem = unique("ttl", NAME_PREFIX)
    by_policy, by_argument = f"{stem}-policy", f"{stem}-argument"
    names.queues += [by_policy, by_argument]
    channel.queue_declare(by_policy, durable=True, arguments={"x-message-ttl": 600_000})
    channel.queue_declare(by_argument, durable=True, arguments={"x-message-ttl": TTL_MS})
    policy = set_policy(f"^{stem}-", {"message-ttl": TTL_MS})
    for each in (by_policy, by_argument):
        applied(management, "queues", each, policy)
    publish(channel, "", by_policy, b"expires by the policy")
    time.sleep(5 * TTL_MS / 1000)
    assert drain(channel, by_policy, 0) == []
    assert management.call("DELETE", f"/api/policies/%2F/{policy}").status == 204
    longer = set_policy(f"^{stem}-", {"message-ttl": 600_000})
    applied(management, "queues", by_argument, longer)
    publish(channel, "", by_argument, b"expires by the argument")
    time.sleep(5 * TTL_MS / 1000)
    assert drain(channel, by_argument, 0) == []


def test_a_policy_dead_letter_exchange_takes_rejected_messages(
    management: Management, channel: BlockingChannel, names: Created, set_policy: PolicySetter
) -> None:
    queue, dead = names.queue(), names.queue("dead")
    for each in (queue, dead):
        channel.queue_declare(each, durable=True)
    definition = {"dead-letter-exchange": "", "dead-letter-routing-key": dead}
    policy = set_policy(f"^{queue}$", definition)
    applied(management, "queues", queue, policy)
    publish(channel, "", queue, b"refused")
    method, _, _ = get_one(channel, queue)
    channel.basic_reject(method.delivery_tag, requeue=False)
    _, properties, body = get_one(channel, dead, timeout=10)
    assert body == b"refused"
    death = properties.headers["x-death"][0]
    assert (death["queue"], death["reason"]) == (queue, "rejected")


def test_a_policy_max_length_drops_the_head(
    management: Management, channel: BlockingChannel, names: Created, set_policy: PolicySetter
) -> None:
    queue = names.queue()
    channel.queue_declare(queue, durable=True)
    policy = set_policy(f"^{queue}$", {"max-length": 2})
    applied(management, "queues", queue, policy)
    bodies = [f"m{i}".encode() for i in range(4)]
    publish(channel, "", queue, *bodies)
    assert wait_for_count(channel, queue, 2, timeout=TRIMMED) == 2
    assert drain(channel, queue, 2) == bodies[-2:]


def test_the_smaller_limit_wins_and_a_declared_dead_letter_key_wins(
    management: Management, channel: BlockingChannel, names: Created, set_policy: PolicySetter
) -> None:
    stem = unique("both", NAME_PREFIX)
    roomy, tight = f"{stem}-roomy", f"{stem}-tight"
    names.queues += [roomy, tight]
    by_argument, by_policy = names.queue("dead-arg"), names.queue("dead-policy")
    for each in (by_argument, by_policy):
        channel.queue_declare(each, durable=True)
    channel.queue_declare(
        roomy,
        durable=True,
        arguments={
            "x-max-length": 5,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": by_argument,
        },
    )
    channel.queue_declare(tight, durable=True, arguments={"x-max-length": 1})
    definition = {
        "max-length": 2,
        "dead-letter-exchange": "",
        "dead-letter-routing-key": by_policy,
    }
    policy = set_policy(f"^{stem}-", definition, "queues")
    for each in (roomy, tight):
        applied(management, "queues", each, policy)
    bodies = [f"m{i}".encode() for i in range(4)]
    publish(channel, "", roomy, *bodies)
    publish(channel, "", tight, *bodies)
    # roomy: the policy's 2 is smaller than its 5; its own dead-letter routing key wins.
    assert wait_for_count(channel, roomy, 2, timeout=TRIMMED) == 2
    # Sorted: the proxy's drop-head trim, with a dead-letter exchange, has once been seen
    # to give the two survivors back in the other order (a trim's read-ahead going back
    # to Pulsar); test_flow_length_limits.py checks the order of drop-head itself.
    assert sorted(drain(channel, roomy, 2)) == bodies[2:]
    assert sorted(drain(channel, by_argument, 2, timeout=TRIMMED)) == bodies[:2]
    # tight: its own 1 is smaller than the policy's 2; dead letters follow the policy.
    assert wait_for_count(channel, tight, 1, timeout=TRIMMED) == 1
    assert drain(channel, tight, 1) == bodies[3:]
    assert sorted(drain(channel, by_policy, 3, timeout=TRIMMED)) == bodies[:3]


def test_exclusive_server_named_queues_get_policies_too(
    management: Management, channel: BlockingChannel, set_policy: PolicySetter
) -> None:
    queue = channel.queue_declare("", exclusive=True).method.queue
    policy = set_policy(f"^{re.escape(queue)}$", {"max-length": 1}, "queues")
    applied(management, "queues", queue, policy)
    publish(channel, "", queue, b"a", b"b", b"c")
    assert wait_for_count(channel, queue, 1, timeout=TRIMMED) == 1
    assert drain(channel, queue, 1) == [b"c"]


def test_only_the_highest_priority_policy_applies(
    management: Management, channel: BlockingChannel, names: Created, set_policy: PolicySetter
) -> None:
    queue = names.queue()
    channel.queue_declare(queue, durable=True)
    set_policy(f"^{queue}$", {"max-length": 1, "message-ttl": 1}, "queues", priority=1)
    winner = set_policy(f"^{queue}", {"max-length": 3}, "all", priority=7)
    applied(management, "queues", queue, winner)
    bodies = [f"m{i}".encode() for i in range(5)]
    publish(channel, "", queue, *bodies)
    # Not merged: the loser's message-ttl does not apply either.
    assert wait_for_count(channel, queue, 3, timeout=TRIMMED) == 3
    time.sleep(0.3)
    assert drain(channel, queue, 3) == bodies[2:]


def test_a_cleared_policy_stops_applying(
    management: Management, channel: BlockingChannel, names: Created, set_policy: PolicySetter
) -> None:
    queue = names.queue()
    channel.queue_declare(queue, durable=True)
    policy = set_policy(f"^{queue}$", {"max-length": 1})
    applied(management, "queues", queue, policy)
    publish(channel, "", queue, b"a", b"b", b"c")
    assert wait_for_count(channel, queue, 1, timeout=TRIMMED) == 1
    assert drain(channel, queue, 1) == [b"c"]
    assert management.call("DELETE", f"/api/policies/%2F/{policy}").status == 204
    applied(management, "queues", queue, None)
    publish(channel, "", queue, b"d", b"e", b"f")
    assert wait_for_count(channel, queue, 3) == 3
    assert drain(channel, queue, 3) == [b"d", b"e", b"f"]


def test_a_policy_for_exchanges_gives_an_alternate_exchange(
    management: Management, channel: BlockingChannel, names: Created, set_policy: PolicySetter
) -> None:
    exchange, spill = names.exchange("in"), names.exchange("spill")
    channel.exchange_declare(exchange, "direct", durable=True)
    channel.exchange_declare(spill, "fanout", durable=True)
    unrouted = names.queue("unrouted")
    channel.queue_declare(unrouted, durable=True)
    channel.queue_bind(unrouted, spill)
    # A queues-only policy of higher priority does not hide it from the exchange.
    set_policy(f"^{exchange}$", {"max-length": 1}, "queues", priority=9)
    policy = set_policy(f"^{exchange}$", {"alternate-exchange": spill}, "exchanges")
    applied(management, "exchanges", exchange, policy)
    publish(channel, exchange, "nowhere", b"lost")
    assert drain(channel, unrouted, 1, timeout=10) == [b"lost"]


# ---- the API (both brokers) ---------------------------------------------------------------


def test_policies_api_shapes_and_status_codes(management: Management) -> None:
    name = unique("api", NAME_PREFIX)
    path = f"/api/policies/%2F/{name}"
    body = {"pattern": "^nothing-", "definition": {"max-length": 9}, "apply-to": "queues"}
    try:
        assert management.call("PUT", path, body).status == 201
        expected = {
            "vhost": "/",
            "name": name,
            "pattern": "^nothing-",
            "apply-to": "queues",
            "definition": {"max-length": 9},
            "priority": 0,
        }
        assert management.call("GET", path).body == expected
        assert expected in management.call("GET", "/api/policies/%2F").body
        assert expected in management.call("GET", "/api/policies").body
        replaced = {**body, "priority": 4}
        assert management.call("PUT", path, replaced).status == 204
        assert management.call("GET", path).body["priority"] == 4
        for definition, reason in (
            ({"message-ttl": -1}, "-1 is not a valid message TTL"),
            ({"overflow": "x"}, '&lt;&lt;"x"&gt;&gt; is not a valid overflow value'),
            (
                {"max-priority": 5},
                '[{&lt;&lt;"max-priority"&gt;&gt;,5}] are not recognised policy settings',
            ),
            ({}, "no policy provided"),
        ):
            refused = management.call("PUT", path, {"pattern": ".*", "definition": definition})
            assert refused.status == 400
            assert refused.body == {
                "error": "bad_request",
                "reason": f"Validation failed\n\n{reason}\n",
            }
        missing = management.call("PUT", path, {"definition": {"max-length": 1}})
        assert missing.body == {"error": "bad_request", "reason": "[{key_missing,pattern}]"}
        no_vhost = management.call("PUT", f"/api/policies/no-such-vhost-{name}/p", body)
        assert (no_vhost.status, no_vhost.body) == (
            404,
            {"error": "not_found", "reason": "vhost_not_found"},
        )
        assert management.call("DELETE", path).status == 204
    finally:
        management.call("DELETE", path)
    assert management.call("GET", path).body == NOT_FOUND
    assert management.call("DELETE", path).status == 404


# ---- starlight-admin (proxy only) ---------------------------------------------------------


def test_admin_policy_commands(
    management: Management, request: pytest.FixtureRequest, tmp_path: Any
) -> None:
    if management.is_rabbitmq:
        pytest.skip("starlight-admin talks to the proxy's ZooKeeper")
    services: ServiceEndpoints = request.getfixturevalue("services")
    admin = AdminCLI(services, root="/starlight")  # the management proxy's metadata
    name = unique("cli", NAME_PREFIX)
    try:
        made = admin.json(
            "policy", "set", name, "^cli-nothing$", '{"message-ttl": 1000}', "--priority", "3"
        )
        assert made["created"] is True
        assert management.call("GET", f"/api/policies/%2F/{name}").body == {
            "vhost": "/",
            "name": name,
            "pattern": "^cli-nothing$",
            "apply-to": "all",
            "definition": {"message-ttl": 1000},
            "priority": 3,
        }
        listed = admin.ok("policy", "list", "--vhost", "/", "--json").json()
        assert {"name": name, "priority": 3, "apply-to": "all"}.items() <= next(
            row for row in listed if row["name"] == name
        ).items()
        assert name in admin.ok("policy", "list").out

        bad = admin.run("policy", "set", name, ".*", '{"expires": 0}')
        assert bad.code == 2
        assert "0 is not a valid queue expiry" in bad.err
        assert admin.run("policy", "set", name, ".*", "{not json").code == 2
        assert admin.run("policy", "set", name, ".*", '{"ha-mode": "all"}').code == 2
        assert admin.run("policy", "set", "p", ".*", "{}", "--vhost", "no-such").code == 1

        # Definitions export carries it; import into a fresh root recreates it.
        exported = tmp_path / "defs.json"
        admin.ok("definitions", "export", str(exported))
        document = json.loads(exported.read_text())
        ours = [p for p in document["policies"] if p["name"] == name]
        assert ours == [management.call("GET", f"/api/policies/%2F/{name}").body]
        document["policies"] = [
            *ours,
            {
                "vhost": "/",
                "name": "mirrored",
                "pattern": ".*",
                "apply-to": "queues",
                "definition": {"ha-mode": "all"},
                "priority": 0,
            },
        ]
        document["global_parameters"] = [{"name": "cluster_name", "value": "rabbit@x"}]
        exported.write_text(json.dumps(document))
        fresh = AdminCLI(services)
        first = fresh.run("--json", "definitions", "import", str(exported))
        assert first.code == 1  # what it could not apply is listed and fails the import
        report = first.json()
        assert report["created"]["policies"] == [f"'{name}' in vhost '/'"]
        assert any("'mirrored'" in s and "ha-mode" in s for s in report["skipped"])
        assert any("cluster_name" in s for s in report["skipped"])
        again = fresh.run("definitions", "import", "--skip-unsupported", str(exported))
        assert again.code == 0, again.err
        assert "policies: 0 created, 1 already present" in again.out
        assert "unsupported: policy 'mirrored'" in again.out
        assert fresh.json("policy", "list")[0]["name"] == name

        assert admin.ok("policy", "clear", name).out.startswith("cleared policy")
        assert admin.run("policy", "clear", name).code == 1
    finally:
        admin.run("policy", "clear", name)


def test_a_policy_expires_deletes_an_unused_queue(
    management: Management, request: pytest.FixtureRequest
) -> None:
    """Proxy only: RabbitMQ's queue expiry is the same test with a long wait; the proxy's
    cleaner runs often here (the x-expires tests: test_cluster_lifecycle.py)."""
    if management.is_rabbitmq:
        pytest.skip("needs a proxy whose cleaner runs every 200 ms")
    services: ServiceEndpoints = request.getfixturevalue("services")
    start_proxy: Callable[..., Any] = request.getfixturevalue("start_proxy")
    admin = AdminCLI(services)
    proxy = start_proxy(
        **admin.proxy_settings,
        subscriptionCleanerIntervalMillis="200",
        subscriptionCleanerGracePeriodMillis="600",
    )
    idle, kept = unique("idle", NAME_PREFIX), unique("kept", NAME_PREFIX)
    connection = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))
    try:
        channel = connection.channel()
        for each in (idle, kept):
            channel.queue_declare(each, durable=True)
        admin.ok("policy", "set", "short", f"^{idle}$", '{"expires": 1500}')

        def listed() -> set[str]:
            return {row["name"] for row in admin.json("queue", "list")}

        deadline = time.monotonic() + 20
        while idle in listed() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert listed() >= {kept} and idle not in listed()
    finally:
        connection.close()
