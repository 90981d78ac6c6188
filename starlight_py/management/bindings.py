"""/api/bindings[/{vhost}] and /api/bindings/{vhost}/e/{source}/{q|e}/{destination}[/{props}]:
list, create (POST, 201 with a Location), show and delete bindings of exchanges to queues
(`q`) and to exchanges (`e`). A binding is named in paths by its `properties_key`
(shapes.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from starlight_py.admin import inventory
from starlight_py.admin.context import ADMIN_OWNER
from starlight_py.amqp.method_ids import QUEUE_BIND, QUEUE_UNBIND
from starlight_py.management.api import NO_CONTENT, Answer, ApiCall
from starlight_py.management.errors import ObjectNotFound
from starlight_py.management.messages import exchange_name
from starlight_py.management.shapes import arguments_of, binding_json, listed, properties_key
from starlight_py.management.vhost_access import usable_vhost, visible_vhosts
from starlight_py.metadata.records import VhostRecord
from starlight_py.model.permissions import Access, ResourceKind
from starlight_py.model.topology import check_not_default_exchange

DESTINATION_TYPES = {"q": "queue", "e": "exchange"}


@dataclass(frozen=True)
class ListedBinding:
    """A binding as listed (`shaped`) with its arguments as stored, which unbind compares."""

    shaped: dict[str, Any]
    arguments: dict[str, Any]


def listed_bindings(call: ApiCall, vhost: str) -> list[ListedBinding]:
    """Every binding of the vhost as RabbitMQ lists them: to queues (the default exchange's
    implicit ones included), then to exchanges."""
    admin = call.context.admin
    found = [
        ListedBinding(
            binding_json(vhost, b.source, b.destination, "queue", b.routing_key, b.arguments),
            b.arguments,
        )
        for b in inventory.bindings(admin, vhost)
    ]
    found += [
        ListedBinding(
            binding_json(vhost, b.source, b.destination, "exchange", b.routing_key, b.arguments),
            b.arguments,
        )
        for b in inventory.exchange_bindings(admin, vhost)
    ]
    return found


def all_bindings(call: ApiCall, vhost: str) -> list[dict[str, Any]]:
    return [b.shaped for b in listed_bindings(call, vhost)]


def list_bindings(call: ApiCall) -> Answer:
    items = [
        item
        for record in visible_vhosts(call, call.params.get("vhost"))
        for item in all_bindings(call, record.name)
    ]
    return Answer(200, listed(items, call.query))


def _ends(call: ApiCall) -> tuple[VhostRecord, str, str, str]:
    """vhost, source, destination type, destination; ObjectNotFound when one is missing."""
    record = usable_vhost(call, call.params["vhost"])
    kind = DESTINATION_TYPES.get(call.params["kind"])
    if kind is None:
        raise ObjectNotFound()
    source = exchange_name(call.params["source"])
    destination = call.params["destination"]
    topology = call.context.services.topology
    if topology.get_exchange(record.name, source) is None:
        raise ObjectNotFound()
    if kind == "queue":
        found = topology.get_queue(record.name, destination) is not None
    else:
        found = topology.get_exchange(record.name, exchange_name(destination)) is not None
        destination = exchange_name(destination)
    if not found:
        raise ObjectNotFound()
    return record, source, kind, destination


def _between(call: ApiCall) -> tuple[VhostRecord, list[ListedBinding]]:
    record, source, kind, destination = _ends(call)
    found = [
        b
        for b in listed_bindings(call, record.name)
        if b.shaped["source"] == source
        and b.shaped["destination"] == destination
        and b.shaped["destination_type"] == kind
    ]
    return record, found


def bindings_between(call: ApiCall) -> Answer:
    _, found = _between(call)
    return Answer(200, listed([b.shaped for b in found], call.query))


def create_binding(call: ApiCall) -> Answer:
    record, source, kind, destination = _ends(call)
    body = call.body()
    routing_key = str(body.get("routing_key", ""))
    arguments = arguments_of(body)
    check_not_default_exchange(source, QUEUE_BIND)
    resource = ResourceKind.QUEUE if kind == "queue" else ResourceKind.EXCHANGE
    call.user.require(record.name, Access.WRITE, resource, destination)
    call.user.require(record.name, Access.READ, ResourceKind.EXCHANGE, source)
    topology = call.context.services.topology
    if kind == "queue":
        topology.bind(
            record.name, record.namespace, destination, source, routing_key, arguments, ADMIN_OWNER
        )
    else:
        topology.exchange_bindings.bind(record.name, destination, source, routing_key, arguments)
    key = properties_key(routing_key, arguments)
    location = f"{quote(destination, safe='')}/{quote(key, safe='')}"
    return Answer(201, None, (("location", location),))


def _one(call: ApiCall) -> tuple[VhostRecord, ListedBinding]:
    record, found = _between(call)
    for binding in found:
        if binding.shaped["properties_key"] == call.params["props"]:
            return record, binding
    raise ObjectNotFound()


def get_binding(call: ApiCall) -> Answer:
    _, binding = _one(call)
    return Answer(200, binding.shaped)


def delete_binding(call: ApiCall) -> Answer:
    record, binding = _one(call)
    shaped = binding.shaped
    source, destination, key = shaped["source"], shaped["destination"], shaped["routing_key"]
    check_not_default_exchange(source, QUEUE_UNBIND)
    to_queue = shaped["destination_type"] == "queue"
    resource = ResourceKind.QUEUE if to_queue else ResourceKind.EXCHANGE
    call.user.require(record.name, Access.WRITE, resource, destination)
    call.user.require(record.name, Access.READ, ResourceKind.EXCHANGE, source)
    topology = call.context.services.topology
    if to_queue:
        topology.unbind(
            record.name, record.namespace, destination, source, key, binding.arguments, ADMIN_OWNER
        )
    else:
        topology.exchange_bindings.unbind(record.name, destination, source, key, binding.arguments)
    return NO_CONTENT
