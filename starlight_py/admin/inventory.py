"""Reads what ZooKeeper holds for the listing commands and definitions export."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlight_py.admin.context import AdminContext
from starlight_py.metadata.records import (
    BindingSet,
    ExchangeBinding,
    RecordError,
    RetiredSubscription,
    VhostRecord,
    decode,
)
from starlight_py.model import naming
from starlight_py.model.topology import DEFAULT_EXCHANGE, PREDECLARED_EXCHANGES, Exchange, Queue

PREDECLARED_NAMES = frozenset(name for name, _ in PREDECLARED_EXCHANGES)


@dataclass(frozen=True)
class Binding:
    """One active binding as RabbitMQ lists it (source exchange -> destination queue)."""

    vhost: str
    source: str
    destination: str
    routing_key: str
    arguments: dict[str, Any]
    topic: str
    subscription: str


def _records(ctx: AdminContext, base: str) -> list[Any]:
    found = []
    for child in sorted(ctx.zk.children(base)):
        data = ctx.zk.get(f"{base}/{child}")
        if data is None:
            continue
        try:
            found.append(decode(data[0]))
        except RecordError:
            continue
    return found


def vhosts(ctx: AdminContext) -> list[VhostRecord]:
    records = [r for r in _records(ctx, ctx.paths.vhosts) if isinstance(r, VhostRecord)]
    return sorted(records, key=lambda r: r.name)


def exchanges(ctx: AdminContext, vhost: str) -> list[Exchange]:
    found = [r for r in _records(ctx, ctx.paths.exchanges(vhost)) if isinstance(r, Exchange)]
    return sorted(found, key=lambda e: e.name)


def user_exchanges(ctx: AdminContext, vhost: str) -> list[Exchange]:
    """Exchanges an application or operator declared (not the predeclared amq.*)."""
    return [e for e in exchanges(ctx, vhost) if e.name not in PREDECLARED_NAMES]


def queues(ctx: AdminContext, vhost: str) -> list[Queue]:
    found = [r for r in _records(ctx, ctx.paths.queues(vhost)) if isinstance(r, Queue)]
    return sorted(found, key=lambda q: q.name)


def binding_sets(ctx: AdminContext, vhost: str, queue: str) -> list[BindingSet]:
    """The queue's active binding sets (not the retired ones still draining)."""
    base = ctx.paths.queue_bindings(vhost, queue)
    return [r for r in _records(ctx, base) if isinstance(r, BindingSet)]


def bindings(ctx: AdminContext, vhost: str, include_default: bool = True) -> list[Binding]:
    result = []
    namespace = None
    for queue in queues(ctx, vhost):
        sets = binding_sets(ctx, vhost, queue.name)
        if include_default and not any(b.exchange == DEFAULT_EXCHANGE for b in sets):
            # Its default-exchange binding is made by the first publish through the default
            # exchange (topology/default_bindings.py); RabbitMQ lists it all the same.
            if namespace is None:
                namespace = ctx.vhost(vhost).namespace
            topic = naming.exchange_topic(namespace, DEFAULT_EXCHANGE, "direct", queue.name)
            result.append(
                Binding(vhost, DEFAULT_EXCHANGE, queue.name, queue.name, {}, topic.local, "")
            )
        for binding_set in sets:
            if binding_set.exchange == DEFAULT_EXCHANGE and not include_default:
                continue
            for entry in binding_set.active_entries:
                result.append(
                    Binding(
                        vhost,
                        binding_set.exchange,
                        binding_set.queue,
                        entry.routing_key,
                        entry.arguments,
                        binding_set.subscription_topic,
                        binding_set.subscription,
                    )
                )
    return sorted(result, key=lambda b: (b.source, b.destination, b.routing_key))


def exchange_bindings(ctx: AdminContext, vhost: str) -> list[ExchangeBinding]:
    """Every exchange-to-exchange binding of the vhost (by source, destination, key)."""
    result = [
        r
        for exchange in exchanges(ctx, vhost)
        for r in _records(ctx, ctx.paths.exchange_e2e(vhost, exchange.name))
        if isinstance(r, ExchangeBinding)
    ]
    return sorted(result, key=lambda b: (b.source, b.destination, b.routing_key, b.key))


def retired(ctx: AdminContext, vhost: str) -> list[RetiredSubscription]:
    base = ctx.paths.retired(vhost)
    return [r for r in _records(ctx, base) if isinstance(r, RetiredSubscription)]
