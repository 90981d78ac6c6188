"""/api/exchanges[/{vhost}[/{name}]]: list, show, declare (PUT), delete, and an exchange's
bindings as source or destination. The default exchange is `amq.default` in paths."""

from __future__ import annotations

from starlight_py.admin import inventory
from starlight_py.management.api import CREATED, NO_CONTENT, Answer, ApiCall
from starlight_py.management.bindings import all_bindings
from starlight_py.management.errors import ObjectNotFound
from starlight_py.management.messages import exchange_name
from starlight_py.management.shapes import arguments_of, exchange_json, flag, listed
from starlight_py.management.vhost_access import usable_vhost, visible_vhosts
from starlight_py.metadata.records import VhostRecord
from starlight_py.model.permissions import Access, ResourceKind
from starlight_py.model.policies import Policy
from starlight_py.model.topology import DEFAULT_EXCHANGE, Exchange, check_exchange_deletable


def _exchanges(call: ApiCall, vhost: str) -> list[Exchange]:
    stored = inventory.exchanges(call.context.admin, vhost)
    return [Exchange(DEFAULT_EXCHANGE, "direct"), *stored]


def list_exchanges(call: ApiCall) -> Answer:
    items = [
        exchange_json(record.name, exchange, _policy(call, record.name, exchange.name))
        for record in visible_vhosts(call, call.params.get("vhost"))
        for exchange in _exchanges(call, record.name)
    ]
    return Answer(200, listed(items, call.query))


def _existing(call: ApiCall) -> tuple[VhostRecord, Exchange]:
    record = usable_vhost(call, call.params["vhost"])
    found = call.context.services.topology.get_exchange(
        record.name, exchange_name(call.params["name"])
    )
    if found is None:
        raise ObjectNotFound()
    exchange: Exchange = found[0]
    return record, exchange


def get_exchange(call: ApiCall) -> Answer:
    record, exchange = _existing(call)
    policy = _policy(call, record.name, exchange.name)
    return Answer(200, exchange_json(record.name, exchange, policy))


def put_exchange(call: ApiCall) -> Answer:
    """201 when created, 204 when an equivalent exchange was there; 400 with RabbitMQ's
    text otherwise (unknown type, not equivalent); 401 for the reserved `amq.` prefix."""
    record = usable_vhost(call, call.params["vhost"])
    name = exchange_name(call.params["name"])
    body = call.body()
    call.user.require(record.name, Access.CONFIGURE, ResourceKind.EXCHANGE, name)
    kind = body.get("type", "direct")
    wanted = Exchange(
        name,
        str(kind),
        durable=flag(body, "durable", True),
        auto_delete=flag(body, "auto_delete", False),
        internal=flag(body, "internal", False),
        arguments=arguments_of(body),
    )
    topology = call.context.services.topology
    existed = topology.get_exchange(record.name, name) is not None
    topology.declare_exchange(record.name, wanted, passive=False)
    return NO_CONTENT if existed else CREATED


def delete_exchange(call: ApiCall) -> Answer:
    record, exchange = _existing(call)
    call.user.require(record.name, Access.CONFIGURE, ResourceKind.EXCHANGE, exchange.name)
    check_exchange_deletable(exchange.name, record.name)
    call.context.services.topology.delete_exchange(
        record.name, exchange.name, if_unused=call.query.get("if-unused") == "true"
    )
    return NO_CONTENT


def source_bindings(call: ApiCall) -> Answer:
    record, exchange = _existing(call)
    items = [b for b in all_bindings(call, record.name) if b["source"] == exchange.name]
    return Answer(200, listed(items, call.query))


def destination_bindings(call: ApiCall) -> Answer:
    record, exchange = _existing(call)
    items = [
        b
        for b in all_bindings(call, record.name)
        if b["destination_type"] == "exchange" and b["destination"] == exchange.name
    ]
    return Answer(200, listed(items, call.query))


def _policy(call: ApiCall, vhost: str, name: str) -> Policy | None:
    return call.context.services.cache.policy_of(vhost, "exchanges", name)
