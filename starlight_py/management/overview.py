"""/api/overview, /api/whoami, /api/vhosts, /api/health/checks/alarms and
/api/aliveness-test/{vhost}."""

from __future__ import annotations

import argparse
from collections.abc import Hashable
from typing import Any
from urllib.parse import urlsplit

import trio
from pamqp.commands import Basic

from starlight_py import __version__
from starlight_py.admin import vhost_commands
from starlight_py.cluster.connection_reports import read_reports
from starlight_py.management import queues
from starlight_py.management.api import CREATED, NO_CONTENT, Answer, ApiCall
from starlight_py.management.errors import ServiceUnavailable
from starlight_py.management.messages import loopback_client
from starlight_py.management.samples import Sample, SamplesAsked, samples_asked
from starlight_py.management.shapes import NODE, listed, vhost_json
from starlight_py.management.vhost_access import usable_vhost, visible_vhosts
from starlight_py.model.counts import QueueFlow
from starlight_py.model.topology import EXCHANGE_TYPES, Queue

RABBITMQ_VERSION = "3.10.8"  # the management API version whose shapes we serve
ALIVENESS_QUEUE = "aliveness-test"


def overview(call: ApiCall) -> Answer:
    services = call.context.services
    connections = channels = consumers = 0
    for _, reports in read_reports(services.zookeeper, services.topology.paths):
        for report in reports:
            connections += 1
            channels += len(report.get("channels") or [])
            consumers += len(report.get("consumers") or [])
    exchanges = queues = 0
    for record in visible_vhosts(call):
        exchanges += len(
            services.zookeeper.children(services.topology.paths.exchanges(record.name))
        )
        exchanges += 1  # the default exchange, which has no record
        queues += len(services.zookeeper.children(services.topology.paths.queues(record.name)))
    listeners: list[dict[str, Any]] = []
    for url in call.context.amqp_urls:
        parts = urlsplit(url)
        listeners.append(
            {
                "node": NODE,
                "protocol": "amqp/ssl" if parts.scheme == "amqps" else "amqp",
                "ip_address": parts.hostname,
                "port": parts.port,
            }
        )
    value: dict[str, Any] = {
        "management_version": RABBITMQ_VERSION,
        "rates_mode": "none",
        "exchange_types": [
            {"name": kind, "description": f"AMQP {kind} exchange", "enabled": True}
            for kind in EXCHANGE_TYPES
        ],
        "product_version": __version__,
        "product_name": "starlight-py",
        "rabbitmq_version": RABBITMQ_VERSION,
        "cluster_name": "starlight",
        "node": NODE,
        "disable_stats": False,
        "enable_queue_totals": False,
        "message_stats": {},
        "queue_totals": {},
        # Every proxy's, as they last reported them (within about a second).
        "object_totals": {
            "channels": channels,
            "connections": connections,
            "consumers": consumers,
            "exchanges": exchanges,
            "queues": queues,
        },
        "listeners": listeners,
        "contexts": [{"node": NODE, "description": "starlight-py management", "path": "/"}],
        "starlight_proxy_id": services.proxy_id,
    }
    asked = samples_asked(call.query)
    if asked.any:
        value.update(_queue_totals(call, asked))
    return Answer(200, value)


def _queue_totals(call: ApiCall, asked: SamplesAsked) -> dict[str, Any]:
    """RabbitMQ's `queue_totals` and `message_stats` with their samples, summed over the
    visible vhosts: asked for with `lengths_age` or `msg_rates_age`, since they read every
    queue's counts as listing the queues does."""
    at = call.context.samples.now()
    keys: list[Hashable] = []
    total = Sample()
    counts = ("messages", "messages_ready", "messages_unacknowledged")
    changes = dict.fromkeys(counts, 0.0)
    for record in visible_vhosts(call):
        for reading in queues.read_vhost_queues(call, record, at):
            total = total.plus(reading.sample)
            for name in counts:
                changes[name] += reading.shaped[f"{name}_details"]["rate"]
        keys.append(queues.vhost_key(record.name))
    totals: dict[str, Any] = {
        "messages": total.ready + total.unacked,
        "messages_ready": total.ready,
        "messages_unacknowledged": total.unacked,
    }
    for name in counts:
        totals[f"{name}_details"] = {"rate": round(changes[name], 1)}
    flow = QueueFlow(
        publish_rate=total.publish_rate,
        deliver_rate=total.deliver_rate,
        ack_rate=total.ack_rate,
    )
    stats = flow.message_stats()
    del stats["publish"]  # a count of topics an exchange's queues share: no sum
    shaped = queues.with_samples(call, {**totals, "message_stats": stats}, keys, asked)
    message_stats = shaped.pop("message_stats")
    return {"queue_totals": shaped, "message_stats": message_stats}


def whoami(call: ApiCall) -> Answer:
    return Answer(200, {"name": call.user.name, "tags": call.user.tags})


def list_vhosts(call: ApiCall) -> Answer:
    items = [vhost_json(r.name, str(r.namespace)) for r in visible_vhosts(call)]
    return Answer(200, listed(items, call.query))


def get_vhost(call: ApiCall) -> Answer:
    record = usable_vhost(call, call.params["vhost"])
    return Answer(200, vhost_json(record.name, str(record.namespace)))


def put_vhost(call: ApiCall) -> Answer:
    """Creates the vhost with its namespace by the rules (made in Pulsar when missing), as
    a first connection would; an existing one is left as it is."""
    call.user.require_administrator()
    call.body()  # RabbitMQ checks that it is JSON; description and tags are not kept
    _, created = call.context.admin.usable_vhost(call.params["vhost"])
    return CREATED if created else NO_CONTENT


def delete_vhost(call: ApiCall) -> Answer:
    """Deletes the vhost with its queues, exchanges and bindings, as `starlight-admin vhost
    delete --force` does (its Pulsar namespace is kept)."""
    call.user.require_administrator()
    usable_vhost(call, call.params["vhost"])
    vhost_commands.delete_vhost(
        call.context.admin, argparse.Namespace(name=call.params["vhost"], force=True)
    )
    return NO_CONTENT


def alarms(call: ApiCall) -> Answer:
    """RabbitMQ's alarms are about memory and disk; ours: what keeps this proxy from
    serving (ZooKeeper, Pulsar), as /readyz reports it."""
    problems = call.context.readiness()
    if problems:
        return Answer(503, {"status": "failed", "reason": "; ".join(problems), "alarms": problems})
    return Answer(200, {"status": "ok"})


async def aliveness(call: ApiCall) -> Answer:
    """Declare `aliveness-test` in the vhost, publish a message to it and get it back, as
    RabbitMQ does."""
    vhost = call.params["vhost"]
    record = await trio.to_thread.run_sync(usable_vhost, call, vhost)
    topology = call.context.services.topology
    queue = Queue(ALIVENESS_QUEUE, durable=False)
    await trio.to_thread.run_sync(
        topology.declare_queue, vhost, record.namespace, queue, False, "starlight-management"
    )
    client = await loopback_client(call, vhost)
    try:
        routed = await client.publish("", ALIVENESS_QUEUE, b"test_message", Basic.Properties())
        got = await client.get(ALIVENESS_QUEUE, 1, ack=True, requeue=False) if routed else []
    finally:
        await client.aclose()
    if not got or got[0].payload != b"test_message":
        raise ServiceUnavailable("the test message did not come back")
    return Answer(200, {"status": "ok"})
