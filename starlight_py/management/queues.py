"""/api/queues[/{vhost}[/{name}]]: list, show, declare (PUT), delete, purge (DELETE
.../contents), and a queue's bindings. Counts are exact, as on AMQP (TopologyService):
`messages_ready` from the queue's subscriptions less what is delivered and unacked,
`messages_unacknowledged` what every proxy holds delivered, `consumers` the registrations.
Each reading is kept for the charts (samples.py), served with RabbitMQ's `lengths_age`,
`msg_rates_age` and their `_incr`."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from starlight_py.admin import inventory
from starlight_py.admin.context import ADMIN_OWNER
from starlight_py.management.api import CREATED, NO_CONTENT, Answer, ApiCall
from starlight_py.management.errors import BadRequest, ObjectNotFound
from starlight_py.management.samples import (
    Sample,
    SamplesAsked,
    add_length_samples,
    add_rate_samples,
    samples_asked,
)
from starlight_py.management.shapes import (
    arguments_of,
    binding_json,
    flag,
    listed,
    queue_json,
)
from starlight_py.management.vhost_access import usable_vhost, visible_vhosts
from starlight_py.metadata.records import VhostRecord
from starlight_py.model.permissions import Access, ResourceKind
from starlight_py.model.topology import Queue, check_queue_name_declarable


def _shaped(call: ApiCall, record: VhostRecord, queue: Queue, at: float) -> QueueReading:
    """The queue as listed, its reading recorded (`at`) for the charts (samples.py)."""
    topology = call.context.services.topology
    counts, flow = topology.counts.queue_overview(record.name, record.namespace, queue.name)
    ready = counts.message_count
    unacked = topology.counts.held_messages(record.name, queue.name)
    rates = call.context.rates.observe(
        (record.name, queue.name),
        {"messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked},
    )
    policy = call.context.services.cache.policy_of(record.name, "queues", queue.name)
    shaped = queue_json(record.name, queue, ready, unacked, counts.consumer_count, rates, policy)
    shaped["message_stats"] = flow.message_stats()
    sample = Sample(ready, unacked, flow.publish_rate, flow.deliver_rate, flow.ack_rate)
    call.context.samples.record(queue_key(record.name, queue.name), sample, at)
    return QueueReading(shaped, sample)


@dataclass(frozen=True)
class QueueReading:
    """A queue as the API lists it, and what of it the charts keep."""

    shaped: dict[str, Any]
    sample: Sample


def queue_key(vhost: str, name: str) -> tuple[str, str, str]:
    """A queue's key in the sample history."""
    return ("queue", vhost, name)


def vhost_key(vhost: str) -> tuple[str, str]:
    """The key of a vhost's sums in the sample history."""
    return ("vhost", vhost)


def read_vhost_queues(call: ApiCall, record: VhostRecord, at: float) -> list[QueueReading]:
    """Every queue of the vhost as listed; their sums recorded for the charts."""
    readings = [
        _shaped(call, record, queue, at)
        for queue in inventory.queues(call.context.admin, record.name)
    ]
    total = Sample()
    for reading in readings:
        total = total.plus(reading.sample)
    call.context.samples.record(vhost_key(record.name), total, at)
    return readings


def with_samples(
    call: ApiCall, shaped: dict[str, Any], keys: list[Hashable], asked: SamplesAsked
) -> dict[str, Any]:
    """`shaped` (a queue, or the overview's totals) with the samples `asked` for."""
    if not asked.any:
        return shaped
    history = call.context.samples.history(keys, asked.age)
    now = call.context.samples.now()
    add_length_samples(shaped, history, asked, now)
    add_rate_samples(shaped.setdefault("message_stats", {}), history, asked, now)
    return shaped


def list_queues(call: ApiCall) -> Answer:
    at = call.context.samples.now()
    asked = samples_asked(call.query)
    items = []
    for record in visible_vhosts(call, call.params.get("vhost")):
        for reading in read_vhost_queues(call, record, at):
            key = queue_key(record.name, reading.shaped["name"])
            items.append(with_samples(call, reading.shaped, [key], asked))
    return Answer(200, listed(items, call.query))


def _existing(call: ApiCall) -> tuple[VhostRecord, Queue]:
    record = usable_vhost(call, call.params["vhost"])
    found = call.context.services.topology.get_queue(record.name, call.params["name"])
    if found is None:
        raise ObjectNotFound()
    queue: Queue = found[0]
    return record, queue


def get_queue(call: ApiCall) -> Answer:
    record, queue = _existing(call)
    reading = _shaped(call, record, queue, call.context.samples.now())
    shaped = with_samples(
        call, reading.shaped, [queue_key(record.name, queue.name)], samples_asked(call.query)
    )
    shaped["consumer_details"] = []
    return Answer(200, shaped)


def put_queue(call: ApiCall) -> Answer:
    """201 when created, 204 when an equivalent queue was there; 400 with RabbitMQ's text
    when it is not equivalent."""
    record = usable_vhost(call, call.params["vhost"])
    name = call.params["name"]
    body = call.body()
    call.user.require(record.name, Access.CONFIGURE, ResourceKind.QUEUE, name)
    if flag(body, "exclusive", False):
        raise BadRequest("exclusive queues belong to a connection and cannot be made here")
    queue = Queue(
        name,
        durable=flag(body, "durable", True),
        auto_delete=flag(body, "auto_delete", False),
        arguments=arguments_of(body),
    )
    topology = call.context.services.topology
    existed = topology.get_queue(record.name, name) is not None
    if not existed:
        check_queue_name_declarable(name)
    topology.declare_queue(record.name, record.namespace, queue, False, ADMIN_OWNER)
    return NO_CONTENT if existed else CREATED


def delete_queue(call: ApiCall) -> Answer:
    record, queue = _existing(call)
    call.user.require(record.name, Access.CONFIGURE, ResourceKind.QUEUE, queue.name)
    call.context.services.topology.delete_queue(
        record.name,
        record.namespace,
        queue.name,
        if_unused=call.query.get("if-unused") == "true",
        if_empty=call.query.get("if-empty") == "true",
        owner=None,
    )
    call.context.samples.forget(queue_key(record.name, queue.name))
    return NO_CONTENT


def purge_queue(call: ApiCall) -> Answer:
    record, queue = _existing(call)
    call.user.require(record.name, Access.READ, ResourceKind.QUEUE, queue.name)
    call.context.services.topology.purge_queue(
        record.name, record.namespace, queue.name, ADMIN_OWNER
    )
    return NO_CONTENT


def queue_bindings(call: ApiCall) -> Answer:
    record, queue = _existing(call)
    items = [
        binding_json(record.name, b.source, b.destination, "queue", b.routing_key, b.arguments)
        for b in inventory.bindings(call.context.admin, record.name)
        if b.destination == queue.name
    ]
    return Answer(200, listed(items, call.query))
