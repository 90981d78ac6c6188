"""`starlight-admin vhost ...` in-process against real ZooKeeper + Pulsar; effects checked
through pika against a proxy sharing the admin's metadata root."""

from __future__ import annotations

import time
import uuid

import pika
import pika.exceptions
import pytest

from starlight_py.backend.pulsar_admin import PulsarAdmin
from starlight_py.local import ServiceEndpoints
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import TopicName
from tests.integration.conftest import ProxyFactory
from tests.support.admin_cli import AdminCLI


@pytest.fixture
def admin(services: ServiceEndpoints) -> AdminCLI:
    return AdminCLI(services)


def get_body(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> bytes:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            return bytes(body)
        time.sleep(0.05)
    raise AssertionError(f"nothing arrived in {queue}")


def test_vhost_mapped_to_a_new_namespace_is_used_by_amqp_clients(
    admin: AdminCLI, start_proxy: ProxyFactory, services: ServiceEndpoints
) -> None:
    tenant = f"adm-{uuid.uuid4().hex[:8]}"
    vhost = f"orders-{uuid.uuid4().hex[:6]}"
    created = admin.json("vhost", "create", vhost, "--namespace", f"{tenant}/prod")
    assert created == {
        "vhost": vhost,
        "namespace": f"{tenant}/prod",
        "created": True,
        "namespace_created": True,
    }
    pulsar = PulsarAdmin(services.pulsar_web_url)
    assert pulsar.namespace_exists(tenant, "prod")
    # Creating it again is fine; mapping it elsewhere is refused.
    assert admin.json("vhost", "create", vhost, "--namespace", f"{tenant}/prod")["created"] is False
    moved = admin.run("vhost", "create", vhost, "--namespace", f"{tenant}/other")
    assert moved.code == 1
    assert f"already maps to {tenant}/prod" in moved.err
    assert len(moved.err.strip().splitlines()) == 1

    listed = {row["name"]: row for row in admin.json("vhost", "list")}
    assert listed[vhost]["namespace"] == f"{tenant}/prod"
    assert listed[vhost]["mapping"] == "explicit"
    shown = admin.json("vhost", "show", vhost)
    assert shown["namespace_exists"] is True

    # A proxy (with namespace auto-creation off, so the mapping alone makes it usable)
    # routes this vhost's messages into tenant/prod topics.
    proxy = start_proxy(amqpAutoCreateNamespaces="false", **admin.proxy_settings)
    connection = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url(vhost)))
    channel = connection.channel()
    channel.queue_declare("invoices")
    channel.basic_publish("", "invoices", b"invoice-1")
    assert get_body(channel, "invoices") == b"invoice-1"
    connection.close()

    topics = admin.json("topics", "--vhost", vhost, "--queue", "invoices")
    assert [t["topic"] for t in topics] == [f"persistent://{tenant}/prod/amq.default~~invoices"]
    topic = TopicName(NamespaceName(tenant, "prod"), "amq.default~~invoices")
    assert topics[0]["subscription"] in pulsar.subscription_stats(topic)
    assert pulsar.last_message_id(topic) is not None  # the message was stored in tenant/prod


def test_vhost_rules_apply_without_namespace_and_bad_names_are_usage_errors(
    admin: AdminCLI,
) -> None:
    vhost = f"short{uuid.uuid4().hex[:6]}"
    assert admin.json("vhost", "create", vhost)["namespace"] == f"public/{vhost}"
    assert admin.json("vhost", "list")[0]["mapping"] == "explicit"
    bad = admin.run("vhost", "create", "x", "--namespace", "no-slash")
    assert bad.code == 2
    assert "--namespace" in bad.err
    missing = admin.run("vhost", "show", "nope")
    assert missing.code == 1
    assert "no vhost 'nope'" in missing.err


def test_vhost_create_reports_an_unreachable_pulsar(admin: AdminCLI) -> None:
    result = admin.run("vhost", "create", "v-unreachable", brokerWebServiceURL="http://127.0.0.1:9")
    assert result.code == 1
    assert "unreachable" in result.err
    assert admin.run("vhost", "show", "v-unreachable").code == 1


def test_vhost_delete_refuses_a_non_empty_vhost_unless_forced(
    admin: AdminCLI, services: ServiceEndpoints
) -> None:
    vhost = f"gone{uuid.uuid4().hex[:6]}"
    admin.ok("vhost", "create", vhost)
    admin.ok("exchange", "declare", "events", "--type", "fanout", "--vhost", vhost)
    admin.ok("queue", "declare", "audit", "--vhost", vhost)
    admin.ok("binding", "declare", "events", "audit", "--vhost", vhost)
    topics = admin.json("topics", "--vhost", vhost, "--queue", "audit")
    assert len(topics) == 2  # the default exchange's and the fanout's

    refused = admin.run("vhost", "delete", vhost)
    assert refused.code == 1
    assert "1 queue(s) and 1 exchange(s)" in refused.err
    assert vhost in {row["name"] for row in admin.json("vhost", "list")}

    deleted = admin.json("vhost", "delete", vhost, "--force")
    assert deleted == {"vhost": vhost, "queues_deleted": 1, "exchanges_deleted": 1}
    assert vhost not in {row["name"] for row in admin.json("vhost", "list")}
    pulsar = PulsarAdmin(services.pulsar_web_url)
    namespace = NamespaceName("public", vhost)
    for row in topics:
        local = row["topic"].rsplit("/", 1)[1]
        assert row["subscription"] not in pulsar.subscription_stats(TopicName(namespace, local))

    empty = f"empty{uuid.uuid4().hex[:6]}"
    admin.ok("vhost", "create", empty)
    assert admin.run("vhost", "delete", empty).code == 0


def test_deleted_vhost_mapping_no_longer_serves_connections(
    admin: AdminCLI, start_proxy: ProxyFactory
) -> None:
    tenant = f"adm-{uuid.uuid4().hex[:8]}"
    vhost = f"temp-{uuid.uuid4().hex[:6]}"
    admin.ok("vhost", "create", vhost, "--namespace", f"{tenant}/ns")
    admin.ok("vhost", "delete", vhost)
    # Without the mapping the rules apply: `temp-...` -> public/temp-..., which does not
    # exist and may not be created: the connection is refused with the namespace named.
    proxy = start_proxy(amqpAutoCreateNamespaces="false", **admin.proxy_settings)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.URLParameters(proxy.amqp_url(vhost)))
