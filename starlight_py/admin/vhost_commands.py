"""`vhost create|list|show|delete`: the vhost-to-namespace mappings."""

from __future__ import annotations

import argparse
import contextlib

from starlight_py.admin import inventory
from starlight_py.admin.context import AdminContext
from starlight_py.admin.errors import AdminError, UsageError
from starlight_py.admin.output import Report, Table
from starlight_py.admin.parsing import Subcommands, add_command, add_group
from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdminError
from starlight_py.metadata.zookeeper import NodeMissing, NodeNotEmpty
from starlight_py.model import naming
from starlight_py.model.namespaces import InvalidVhostName, NamespaceName


def register(commands: Subcommands) -> None:
    group = add_group(commands, "vhost", "virtual hosts and the Pulsar namespaces behind them")
    create = add_command(
        group,
        "create",
        "map a vhost to a Pulsar namespace (created through the admin API when missing)",
        create_vhost,
    )
    create.add_argument("name", help="vhost name, e.g. / or orders")
    create.add_argument(
        "--namespace",
        metavar="TENANT/NS",
        help="Pulsar namespace (default: what the amqpDefault* rules give for the name)",
    )
    add_command(group, "list", "list vhosts with their namespaces", list_vhosts)
    show = add_command(group, "show", "show one vhost", show_vhost)
    show.add_argument("name")
    delete = add_command(
        group,
        "delete",
        "delete a vhost's metadata (refused while it has queues or exchanges, unless --force)",
        delete_vhost,
    )
    delete.add_argument("name")
    delete.add_argument(
        "--force",
        action="store_true",
        help="delete its queues and exchanges first (their Pulsar subscriptions too)",
    )


def create_vhost(ctx: AdminContext, args: argparse.Namespace) -> Report:
    name: str = args.name
    if args.namespace:
        try:
            namespace = NamespaceName.parse(args.namespace)
        except InvalidVhostName as e:
            raise UsageError(f"--namespace: {e}") from e
    else:
        namespace = ctx.namespace_by_rule(name)
    existing = ctx.topology.get_vhost(name)
    if existing is not None:
        if existing.namespace != namespace:
            raise AdminError(
                f"vhost '{name}' already maps to {existing.namespace}; delete it first to "
                f"map it to {namespace}"
            )
        return Report(
            f"vhost '{name}' exists (namespace {namespace})",
            {"vhost": name, "namespace": str(namespace), "created": False},
        )
    namespace_created = ctx.ensure_namespace(namespace)
    ctx.topology.ensure_vhost(name, namespace, explicit=True)
    made = " (namespace created in Pulsar)" if namespace_created else ""
    return Report(
        f"created vhost '{name}' -> {namespace}{made}",
        {
            "vhost": name,
            "namespace": str(namespace),
            "created": True,
            "namespace_created": namespace_created,
        },
    )


def _mapping(explicit: bool) -> str:
    return "explicit" if explicit else "rule"


def list_vhosts(ctx: AdminContext, args: argparse.Namespace) -> Table:
    rows = [
        (
            record.name,
            str(record.namespace),
            _mapping(record.explicit),
            len(inventory.queues(ctx, record.name)),
            len(inventory.user_exchanges(ctx, record.name)),
        )
        for record in inventory.vhosts(ctx)
    ]
    return Table(("name", "namespace", "mapping", "queues", "exchanges"), rows)


def show_vhost(ctx: AdminContext, args: argparse.Namespace) -> Report:
    record = ctx.vhost(args.name)
    namespace = record.namespace
    try:
        exists: bool | None = ctx.admin.namespace_exists(namespace.tenant, namespace.namespace)
    except (PulsarAdminError, BackendUnavailable):
        exists = None
    queues = [q.name for q in inventory.queues(ctx, record.name)]
    exchanges = [e.name for e in inventory.user_exchanges(ctx, record.name)]
    retired = inventory.retired(ctx, record.name)
    data = {
        "name": record.name,
        "namespace": str(namespace),
        "mapping": _mapping(record.explicit),
        "namespace_exists": exists,
        "queues": queues,
        "exchanges": exchanges,
        "retired_subscriptions": len(retired),
    }
    state = {True: "exists", False: "MISSING", None: "unknown (Pulsar unreachable)"}[exists]
    text = "\n".join(
        [
            f"vhost:      {record.name}",
            f"namespace:  {namespace} ({_mapping(record.explicit)} mapping; {state} in Pulsar)",
            f"queues:     {len(queues)}",
            f"exchanges:  {len(exchanges)} (besides amq.*)",
            f"retired subscriptions pending: {len(retired)}",
        ]
    )
    return Report(text, data)


def delete_vhost(ctx: AdminContext, args: argparse.Namespace) -> Report:
    name: str = args.name
    record = ctx.vhost(name)
    namespace = record.namespace
    queues = inventory.queues(ctx, name)
    exchanges = inventory.user_exchanges(ctx, name)
    if (queues or exchanges) and not args.force:
        raise AdminError(
            f"vhost '{name}' has {len(queues)} queue(s) and {len(exchanges)} exchange(s); "
            "delete them first or use --force"
        )
    for queue in queues:
        ctx.topology.delete_queue(name, namespace, queue.name, False, False, None)
    for exchange in exchanges:
        ctx.topology.delete_exchange(name, exchange.name, if_unused=False)
    # What the cleaner would delete later cannot wait: its records go with the vhost.
    for retired in inventory.retired(ctx, name):
        topic = naming.TopicName(namespace, retired.topic)
        ctx.admin.delete_subscription(topic, retired.subscription, force=True)
    _delete_tree(ctx, ctx.paths.vhost(name))
    return Report(
        f"deleted vhost '{name}' ({len(queues)} queue(s), {len(exchanges)} exchange(s)); "
        f"Pulsar namespace {namespace} kept",
        {"vhost": name, "queues_deleted": len(queues), "exchanges_deleted": len(exchanges)},
    )


def _delete_tree(ctx: AdminContext, path: str) -> None:
    for _ in range(5):
        for child in ctx.zk.children(path):
            _delete_tree(ctx, f"{path}/{child}")
        try:
            ctx.zk.delete(path)
            return
        except NodeMissing:
            return
        except NodeNotEmpty:
            continue  # something was created meanwhile (a connection): delete it too
    with contextlib.suppress(NodeMissing):
        ctx.zk.delete(path)
