"""RabbitMQ's `definitions.json` (as `rabbitmqctl export_definitions` writes it), to and from
the topology in ZooKeeper.

What maps: users (their RabbitMQ `password_hash` unchanged, so they log in with the same
password; limits are dropped), vhosts, exchanges, queues, bindings of exchanges to queues
and to exchanges, permissions, policies. What does not, and is reported instead of silently
dropped (the import then fails unless told to skip it): policies with keys starlight-py
cannot apply (`ha-mode`, ...), parameters (federation, shovels, operator policies), global
parameters, topic permissions.
The predeclared `amq.*` exchanges and the default exchange's implicit bindings are not
listed, as in RabbitMQ's export. A vhost's Pulsar namespace travels in its `metadata` as
`starlight_namespace`, which RabbitMQ ignores, so export -> import keeps explicit mappings.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlight_py import __version__
from starlight_py.admin import inventory
from starlight_py.admin.context import ADMIN_OWNER, AdminContext
from starlight_py.amqp.errors import AMQPError
from starlight_py.metadata.permissions import PermissionStore
from starlight_py.metadata.policies import PolicyStore
from starlight_py.metadata.records import ExchangeBinding, VhostRecord
from starlight_py.metadata.users import UserStore
from starlight_py.model.namespaces import InvalidVhostName, NamespaceName
from starlight_py.model.permissions import Permission
from starlight_py.model.policies import PolicyInvalid, parse_policy, unsupported_keys
from starlight_py.model.topology import DEFAULT_EXCHANGE, EXCHANGE_TYPES, Exchange, Queue
from starlight_py.model.users import User

NAMESPACE_KEY = "starlight_namespace"
VhostLookup = Callable[[dict[str, Any]], VhostRecord]


class DefinitionsError(ValueError):
    """The file is not a definitions document this version can read."""


def json_value(value: Any) -> Any:
    """An AMQP field value as plain JSON (what RabbitMQ's export shows)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    return value


# ---- export -------------------------------------------------------------------------------


def export_definitions(ctx: AdminContext) -> dict[str, Any]:
    vhosts = inventory.vhosts(ctx)
    document: dict[str, Any] = {
        "rabbit_version": "3.10.8",
        "rabbitmq_version": "3.10.8",
        "product_name": "starlight-py",
        "product_version": __version__,
        "users": [],
        "vhosts": [],
        "permissions": [],
        "topic_permissions": [],
        "parameters": [],
        "global_parameters": [],
        "policies": [],
        "queues": [],
        "exchanges": [],
        "bindings": [],
    }
    for record in vhosts:
        metadata: dict[str, Any] = {"description": "", "tags": []}
        if record.explicit:
            metadata[NAMESPACE_KEY] = str(record.namespace)
        document["vhosts"].append({"name": record.name, "limits": [], "metadata": metadata})
        for exchange in inventory.user_exchanges(ctx, record.name):
            document["exchanges"].append(
                {
                    "name": exchange.name,
                    "vhost": record.name,
                    "type": exchange.type,
                    "durable": exchange.durable,
                    "auto_delete": exchange.auto_delete,
                    "internal": exchange.internal,
                    "arguments": json_value(exchange.arguments),
                }
            )
        for queue in inventory.queues(ctx, record.name):
            if queue.exclusive:
                continue  # RabbitMQ does not export exclusive queues either
            document["queues"].append(
                {
                    "name": queue.name,
                    "vhost": record.name,
                    "durable": queue.durable,
                    "auto_delete": queue.auto_delete,
                    "arguments": json_value(queue.arguments),
                }
            )
        exported_queues = {q["name"] for q in document["queues"] if q["vhost"] == record.name}
        for binding in inventory.bindings(ctx, record.name, include_default=False):
            if binding.destination not in exported_queues:
                continue
            document["bindings"].append(
                {
                    "source": binding.source,
                    "vhost": record.name,
                    "destination": binding.destination,
                    "destination_type": "queue",
                    "routing_key": binding.routing_key,
                    "arguments": json_value(binding.arguments),
                }
            )
        for e2e in inventory.exchange_bindings(ctx, record.name):
            document["bindings"].append(
                {
                    "source": e2e.source,
                    "vhost": record.name,
                    "destination": e2e.destination,
                    "destination_type": "exchange",
                    "routing_key": e2e.routing_key,
                    "arguments": json_value(e2e.arguments),
                }
            )
    document["users"] = [user.to_json() for user in UserStore(ctx.zk, ctx.paths).list()]
    for vhost, principal, permission in PermissionStore(ctx.zk, ctx.paths).list():
        document["permissions"].append({"user": principal, "vhost": vhost, **permission.to_json()})
    policies = PolicyStore(ctx.zk, ctx.paths).list([record.name for record in vhosts])
    document["policies"] = [policy.to_json() for policy in policies]
    return document


# ---- import -------------------------------------------------------------------------------


@dataclass
class ImportReport:
    """What an import did, per kind: created, already there, or not applied (and why)."""

    created: dict[str, list[str]] = field(default_factory=dict)
    existing: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # not applicable here: unsupported
    failed: list[str] = field(default_factory=list)  # refused (conflict, invalid)

    def add_created(self, kind: str, what: str) -> None:
        self.created.setdefault(kind, []).append(what)

    def add_existing(self, kind: str) -> None:
        self.existing[kind] = self.existing.get(kind, 0) + 1

    def as_json(self) -> dict[str, Any]:
        return {
            "created": self.created,
            "existing": self.existing,
            "skipped": self.skipped,
            "failed": self.failed,
        }

    def text(self) -> str:
        lines = []
        for kind in (
            "users",
            "vhosts",
            "exchanges",
            "queues",
            "bindings",
            "permissions",
            "policies",
        ):
            made = self.created.get(kind, [])
            lines.append(
                f"{kind}: {len(made)} created, {self.existing.get(kind, 0)} already present"
            )
            lines += [f"  + {what}" for what in made]
        lines += [f"unsupported: {reason}" for reason in self.skipped]
        lines += [f"FAILED: {reason}" for reason in self.failed]
        return "\n".join(lines)


def _items(document: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = document.get(key) or []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise DefinitionsError(f"'{key}' is not a list of objects")
    return items


def import_definitions(ctx: AdminContext, document: Any) -> ImportReport:
    """Create what the document defines and is missing; idempotent. Raises
    DefinitionsError for a document of the wrong shape; refusals of single items are
    reported in `failed`."""
    if not isinstance(document, dict):
        raise DefinitionsError("a definitions file is a JSON object")
    report = ImportReport()
    try:
        _import(ctx, document, report)
    except (KeyError, TypeError) as e:
        raise DefinitionsError(f"malformed definitions: missing or wrong field {e}") from e
    return report


def _import(ctx: AdminContext, document: dict[str, Any], report: ImportReport) -> None:
    users = UserStore(ctx.zk, ctx.paths)
    for item in _items(document, "users"):
        _attempt(report, f"user '{item.get('name')}'", _user, users, item, report)
    for key in ("parameters", "global_parameters", "topic_permissions"):
        items = document.get(key) or []
        if items:
            names = ", ".join(_parameter_name(item) for item in items)
            report.skipped.append(f"{len(items)} {key.replace('_', ' ')} not supported: {names}")
    records: dict[str, VhostRecord] = {}
    for item in _items(document, "vhosts"):
        _attempt(report, f"vhost '{item['name']}'", _vhost, ctx, item, records, report)

    def vhost_of(item: dict[str, Any]) -> VhostRecord:
        name = str(item.get("vhost", "/"))
        if name not in records:
            record, created = ctx.usable_vhost(name)
            records[name] = record
            if created:
                report.add_created("vhosts", f"{name} -> {record.namespace}")
        return records[name]

    for item in _items(document, "exchanges"):
        what = f"exchange '{item['name']}' in vhost '{item.get('vhost', '/')}'"
        _attempt(report, what, _exchange, ctx, vhost_of, item, report)
    for item in _items(document, "queues"):
        what = f"queue '{item['name']}' in vhost '{item.get('vhost', '/')}'"
        _attempt(report, what, _queue, ctx, vhost_of, item, report)
    for item in _items(document, "bindings"):
        what = (
            f"binding '{item['source']}' -> '{item['destination']}' "
            f"(key '{item.get('routing_key', '')}') in vhost '{item.get('vhost', '/')}'"
        )
        destination_type = item.get("destination_type", "queue")
        if destination_type == "exchange":
            _attempt(report, what, _exchange_binding, ctx, vhost_of, item, what, report)
        elif destination_type == "queue":
            _attempt(report, what, _binding, ctx, vhost_of, item, what, report)
        else:
            report.failed.append(f"{what}: unknown destination_type '{destination_type}'")
    store = PermissionStore(ctx.zk, ctx.paths)
    for item in _items(document, "permissions"):
        what = f"permissions of '{item['user']}' in vhost '{item['vhost']}'"
        _attempt(report, what, _permission, store, item, what, report)
    policies = PolicyStore(ctx.zk, ctx.paths)
    for item in _items(document, "policies"):
        what = f"policy '{item['name']}' in vhost '{item.get('vhost', '/')}'"
        _attempt(report, what, _policy, policies, vhost_of, item, what, report)


def _parameter_name(item: Any) -> str:
    """How a parameters entry is named in the report: `component/name` (an operator
    policy is component `operator_policy`), or the global parameter's name."""
    if not isinstance(item, dict):
        return "?"
    name = str(item.get("name", "?"))
    return f"{item['component']}/{name}" if "component" in item else name


def _user(users: UserStore, item: dict[str, Any], report: ImportReport) -> None:
    """As RabbitMQ's import: a user of the file replaces one of the same name."""
    user = User.from_json(item)
    if users.get(user.name) == user:
        report.add_existing("users")
        return
    created = users.put(user)
    report.add_created("users", user.name if created else f"{user.name} (replaced)")


def _attempt(report: ImportReport, what: str, action: Callable[..., object], *args: Any) -> None:
    try:
        action(*args)
    except AMQPError as e:
        report.failed.append(f"{what}: {e.text}")
    except (ValueError, InvalidVhostName) as e:
        report.failed.append(f"{what}: {e}")


def _vhost(
    ctx: AdminContext,
    item: dict[str, Any],
    records: dict[str, VhostRecord],
    report: ImportReport,
) -> None:
    name = str(item["name"])
    metadata = item.get("metadata") or {}
    mapped = metadata.get(NAMESPACE_KEY) if isinstance(metadata, dict) else None
    namespace = NamespaceName.parse(mapped) if mapped else ctx.namespace_by_rule(name)
    existing = ctx.topology.get_vhost(name)
    if existing is not None:
        records[name] = existing
        if existing.namespace != namespace and mapped:
            report.failed.append(
                f"vhost '{name}': maps to {existing.namespace} here, not {namespace}"
            )
        else:
            report.add_existing("vhosts")
        return
    ctx.ensure_namespace(namespace)
    records[name] = ctx.topology.ensure_vhost(name, namespace, explicit=bool(mapped))
    report.add_created("vhosts", f"{name} -> {namespace}")


def _exchange(
    ctx: AdminContext, vhost_of: VhostLookup, item: dict[str, Any], report: ImportReport
) -> None:
    record = vhost_of(item)
    name = str(item["name"])
    if name == DEFAULT_EXCHANGE or name.startswith("amq."):
        return  # predeclared in every vhost
    kind = str(item.get("type", "direct"))
    if kind not in EXCHANGE_TYPES:
        raise ValueError(f"exchange type '{kind}' is not supported ({', '.join(EXCHANGE_TYPES)})")
    exchange = Exchange(
        name,
        kind,
        durable=bool(item.get("durable", True)),
        auto_delete=bool(item.get("auto_delete", False)),
        internal=bool(item.get("internal", False)),
        arguments=dict(item.get("arguments") or {}),
    )
    existed = ctx.topology.get_exchange(record.name, name) is not None
    ctx.topology.declare_exchange(record.name, exchange, passive=False)
    if existed:
        report.add_existing("exchanges")
    else:
        report.add_created("exchanges", f"{record.name} {name} ({exchange.type})")


def _queue(
    ctx: AdminContext, vhost_of: VhostLookup, item: dict[str, Any], report: ImportReport
) -> None:
    record = vhost_of(item)
    queue = Queue(
        str(item["name"]),
        durable=bool(item.get("durable", True)),
        auto_delete=bool(item.get("auto_delete", False)),
        arguments=dict(item.get("arguments") or {}),
    )
    existed = ctx.topology.get_queue(record.name, queue.name) is not None
    ctx.topology.declare_queue(record.name, record.namespace, queue, False, ADMIN_OWNER)
    if existed:
        report.add_existing("queues")
    else:
        report.add_created("queues", f"{record.name} {queue.name}")


def _binding(
    ctx: AdminContext,
    vhost_of: VhostLookup,
    item: dict[str, Any],
    what: str,
    report: ImportReport,
) -> None:
    record = vhost_of(item)
    source, destination = str(item["source"]), str(item["destination"])
    routing_key = str(item.get("routing_key", ""))
    arguments = dict(item.get("arguments") or {})
    if source == DEFAULT_EXCHANGE:
        return  # implicit: every queue is bound to the default exchange
    present = any(
        b.source == source
        and b.destination == destination
        and b.routing_key == routing_key
        and b.arguments == arguments
        for b in inventory.bindings(ctx, record.name, include_default=False)
    )
    ctx.topology.bind(
        record.name, record.namespace, destination, source, routing_key, arguments, ADMIN_OWNER
    )
    if present:
        report.add_existing("bindings")
    else:
        report.add_created("bindings", what.removeprefix("binding "))


def _exchange_binding(
    ctx: AdminContext,
    vhost_of: VhostLookup,
    item: dict[str, Any],
    what: str,
    report: ImportReport,
) -> None:
    record = vhost_of(item)
    source, destination = str(item["source"]), str(item["destination"])
    if DEFAULT_EXCHANGE in (source, destination):
        raise ValueError("the default exchange cannot be bound to or from")
    routing_key = str(item.get("routing_key", ""))
    arguments = dict(item.get("arguments") or {})
    wanted = ExchangeBinding(source, destination, routing_key, arguments)
    present = ctx.zk.get(ctx.paths.exchange_e2e_entry(record.name, wanted)) is not None
    ctx.topology.exchange_bindings.bind(record.name, destination, source, routing_key, arguments)
    if present:
        report.add_existing("bindings")
    else:
        report.add_created("bindings", what.removeprefix("binding "))


def _permission(
    store: PermissionStore, item: dict[str, Any], what: str, report: ImportReport
) -> None:
    permission = Permission(str(item["configure"]), str(item["write"]), str(item["read"]))
    vhost, principal = str(item["vhost"]), str(item["user"])
    if store.get(vhost, principal) == permission:
        report.add_existing("permissions")
        return
    store.set(vhost, principal, permission)
    report.add_created("permissions", what.removeprefix("permissions of "))


def _policy(
    store: PolicyStore,
    vhost_of: VhostLookup,
    item: dict[str, Any],
    what: str,
    report: ImportReport,
) -> None:
    definition = item.get("definition")
    unsupported = unsupported_keys(definition) if isinstance(definition, dict) else []
    if unsupported:
        report.skipped.append(
            f"{what}: {', '.join(unsupported)} not supported by starlight-py (not applied)"
        )
        return
    record = vhost_of(item)
    try:
        policy = parse_policy(record.name, str(item["name"]), item)
    except PolicyInvalid as e:
        raise ValueError(" ".join(str(e).split())) from e
    if store.get(record.name, policy.name) == policy:
        report.add_existing("policies")
        return
    store.set(policy)
    report.add_created("policies", what.removeprefix("policy "))
