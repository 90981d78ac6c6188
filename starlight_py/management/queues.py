"""/api/queues[/{vhost}[/{name}]]: list, show, declare (PUT), delete, purge (DELETE
.../contents), and a queue's bindings. Counts are exact, as on AMQP (TopologyService):
`messages_ready` from the queue's subscriptions less what is delivered and unacked,
`messages_unacknowledged` what every proxy holds delivered, `consumers` the registrations."""

from __future__ import annotations

from starlight_py.admin import inventory
from starlight_py.admin.context import ADMIN_OWNER
from starlight_py.management.api import CREATED, NO_CONTENT, Answer, ApiCall
from starlight_py.management.errors import BadRequest, ObjectNotFound
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


def _shaped(call: ApiCall, record: VhostRecord, queue: Queue) -> dict[str, object]:
    topology = call.context.services.topology
    counts, flow = topology.queue_overview(record.name, record.namespace, queue.name)
    ready = counts.message_count
    unacked = topology.held_messages(record.name, queue.name)
    rates = call.context.rates.observe(
        (record.name, queue.name),
        {"messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked},
    )
    policy = call.context.services.cache.policy_of(record.name, "queues", queue.name)
    shaped = queue_json(record.name, queue, ready, unacked, counts.consumer_count, rates, policy)
    shaped["message_stats"] = flow.message_stats()
    return shaped


def list_queues(call: ApiCall) -> Answer:
    items = []
    for record in visible_vhosts(call, call.params.get("vhost")):
        for queue in inventory.queues(call.context.admin, record.name):
            items.append(_shaped(call, record, queue))
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
    shaped = _shaped(call, record, queue)
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
