"""`exchange`, `queue` and `binding` commands: the same operations as AMQP clients do,
through the TopologyService, so Pulsar subscriptions follow the metadata."""

from __future__ import annotations

import argparse

from starlight_py.admin import inventory
from starlight_py.admin.context import ADMIN_OWNER, AdminContext
from starlight_py.admin.errors import UsageError
from starlight_py.admin.output import Report, Table
from starlight_py.admin.parsing import (
    Subcommands,
    add_arguments_option,
    add_command,
    add_group,
    add_vhost_option,
    parse_arguments,
)
from starlight_py.model import naming
from starlight_py.model.streams import is_stream
from starlight_py.model.text import as_text
from starlight_py.model.topology import DEFAULT_EXCHANGE, EXCHANGE_TYPES, Exchange, Queue


def register(commands: Subcommands) -> None:
    _register_exchanges(commands)
    _register_queues(commands)
    _register_bindings(commands)


def _register_exchanges(commands: Subcommands) -> None:
    group = add_group(commands, "exchange", "exchanges of a vhost")
    add_vhost_option(add_command(group, "list", "list exchanges", list_exchanges))
    declare = add_command(group, "declare", "declare an exchange", declare_exchange)
    declare.add_argument("name")
    declare.add_argument("--type", default="direct", choices=EXCHANGE_TYPES)
    declare.add_argument("--transient", action="store_true", help="not durable")
    declare.add_argument("--auto-delete", action="store_true")
    declare.add_argument("--internal", action="store_true")
    add_vhost_option(declare)
    add_arguments_option(declare)
    delete = add_command(group, "delete", "delete an exchange and its bindings", delete_exchange)
    delete.add_argument("name")
    delete.add_argument("--if-unused", action="store_true", help="refuse while it has bindings")
    add_vhost_option(delete)


def _register_queues(commands: Subcommands) -> None:
    group = add_group(commands, "queue", "queues of a vhost")
    add_vhost_option(
        add_command(
            group, "list", "list queues with ready/unacked messages and consumers", list_queues
        )
    )
    declare = add_command(group, "declare", "declare a queue", declare_queue)
    declare.add_argument("name")
    declare.add_argument("--transient", action="store_true", help="not durable")
    declare.add_argument("--auto-delete", action="store_true")
    add_vhost_option(declare)
    add_arguments_option(declare)
    delete = add_command(
        group, "delete", "delete a queue, its bindings and subscriptions", delete_queue
    )
    delete.add_argument("name")
    delete.add_argument("--if-unused", action="store_true", help="refuse while it has consumers")
    delete.add_argument("--if-empty", action="store_true", help="refuse while it has messages")
    add_vhost_option(delete)
    purge = add_command(group, "purge", "drop a queue's ready messages", purge_queue)
    purge.add_argument("name")
    add_vhost_option(purge)


def _register_bindings(commands: Subcommands) -> None:
    group = add_group(commands, "binding", "bindings of exchanges to queues")
    add_vhost_option(add_command(group, "list", "list bindings", list_bindings))
    for action, help_text, handler in (
        ("declare", "bind a queue to an exchange", declare_binding),
        ("delete", "unbind a queue from an exchange", delete_binding),
    ):
        parser = add_command(group, action, help_text, handler)
        parser.add_argument("exchange", help="source exchange")
        parser.add_argument("queue", help="destination queue")
        parser.add_argument("--routing-key", default="", help="routing key or pattern")
        add_vhost_option(parser)
        add_arguments_option(parser)


# ---- exchanges ---------------------------------------------------------------------------------


def list_exchanges(ctx: AdminContext, args: argparse.Namespace) -> Table:
    ctx.vhost(args.vhost)
    rows = [
        (e.name, e.type, e.durable, e.auto_delete, e.internal, e.arguments)
        for e in inventory.exchanges(ctx, args.vhost)
    ]
    return Table(("name", "type", "durable", "auto_delete", "internal", "arguments"), rows)


def declare_exchange(ctx: AdminContext, args: argparse.Namespace) -> Report:
    if args.name == DEFAULT_EXCHANGE:
        raise UsageError("the default exchange cannot be declared")
    ctx.usable_vhost(args.vhost)
    exchange = Exchange(
        args.name,
        args.type,
        durable=not args.transient,
        auto_delete=args.auto_delete,
        internal=args.internal,
        arguments=parse_arguments(args.arguments),
    )
    ctx.topology.declare_exchange(args.vhost, exchange, passive=False)
    return Report(
        f"declared {exchange.type} exchange '{exchange.name}' in vhost '{args.vhost}'",
        {"vhost": args.vhost, "exchange": exchange.name, "type": exchange.type},
    )


def delete_exchange(ctx: AdminContext, args: argparse.Namespace) -> Report:
    if args.name == DEFAULT_EXCHANGE:
        raise UsageError("the default exchange cannot be deleted")
    ctx.vhost(args.vhost)
    ctx.topology.delete_exchange(args.vhost, args.name, if_unused=args.if_unused)
    return Report(
        f"deleted exchange '{args.name}' in vhost '{args.vhost}'",
        {"vhost": args.vhost, "exchange": args.name},
    )


# ---- queues ------------------------------------------------------------------------------------


def list_queues(ctx: AdminContext, args: argparse.Namespace) -> Table:
    record = ctx.vhost(args.vhost)
    rows = []
    for queue in inventory.queues(ctx, args.vhost):
        ready = unacked = size = 0
        consumers: set[str] = set()
        stream = is_stream(queue.arguments)
        for binding_set, _ in ctx.topology.binding_sets(args.vhost, queue.name):
            topic = naming.TopicName(record.namespace, binding_set.subscription_topic)
            stats = ctx.admin.subscription_stats(topic, with_bytes=stream).get(
                binding_set.subscription
            )
            if stats is None:
                continue
            ready += stats.ready
            unacked += stats.unacked
            size += stats.backlog_bytes
            # basic.get's short-lived consumers are not AMQP consumers.
            consumers.update(n for n in stats.consumer_names if "/get/" not in n)
        consumer_count = len(consumers)
        if stream:
            # A stream's consumers read with readers of their own, not its subscriptions;
            # what its subscriptions hold is what it retains.
            consumer_count = ctx.topology.counts.queue_counts(
                args.vhost, record.namespace, queue.name
            ).consumer_count
        rows.append(
            (
                queue.name,
                as_text(queue.arguments.get("x-queue-type", "classic")),
                ready,
                unacked,
                consumer_count,
                queue.durable,
                queue.auto_delete,
                queue.exclusive,
                queue.arguments,
                size if stream else None,
            )
        )
    return Table(
        (
            "name",
            "type",
            "ready",
            "unacked",
            "consumers",
            "durable",
            "auto_delete",
            "exclusive",
            "arguments",
            "stream_bytes",
        ),
        rows,
    )


def declare_queue(ctx: AdminContext, args: argparse.Namespace) -> Report:
    record, _ = ctx.usable_vhost(args.vhost)
    queue = Queue(
        args.name,
        durable=not args.transient,
        auto_delete=args.auto_delete,
        arguments=parse_arguments(args.arguments),
    )
    counts = ctx.topology.declare_queue(
        args.vhost, record.namespace, queue, passive=False, owner=ADMIN_OWNER
    )
    return Report(
        f"declared queue '{queue.name}' in vhost '{args.vhost}' "
        f"({counts.message_count} messages, {counts.consumer_count} consumers)",
        {
            "vhost": args.vhost,
            "queue": queue.name,
            "messages": counts.message_count,
            "consumers": counts.consumer_count,
        },
    )


def delete_queue(ctx: AdminContext, args: argparse.Namespace) -> Report:
    record = ctx.vhost(args.vhost)
    messages = ctx.topology.delete_queue(
        args.vhost, record.namespace, args.name, args.if_unused, args.if_empty, None
    )
    return Report(
        f"deleted queue '{args.name}' in vhost '{args.vhost}' ({messages} messages dropped)",
        {"vhost": args.vhost, "queue": args.name, "messages": messages},
    )


def purge_queue(ctx: AdminContext, args: argparse.Namespace) -> Report:
    record = ctx.vhost(args.vhost)
    # With a Pulsar client the purge takes only the ready messages and leaves delivered,
    # unacknowledged ones to their consumers, as RabbitMQ does.
    ctx.topology.backend = ctx.backend
    messages = ctx.topology.purge_queue(args.vhost, record.namespace, args.name, ADMIN_OWNER)
    return Report(
        f"purged {messages} messages from queue '{args.name}' in vhost '{args.vhost}'",
        {"vhost": args.vhost, "queue": args.name, "messages": messages},
    )


# ---- bindings ----------------------------------------------------------------------------------


def list_bindings(ctx: AdminContext, args: argparse.Namespace) -> Table:
    ctx.vhost(args.vhost)
    rows = [
        (b.source, b.destination, "queue", b.routing_key, b.arguments)
        for b in inventory.bindings(ctx, args.vhost)
    ]
    rows += [
        (b.source, b.destination, "exchange", b.routing_key, b.arguments)
        for b in inventory.exchange_bindings(ctx, args.vhost)
    ]
    rows.sort(key=lambda row: (row[0], row[1], row[2], row[3]))
    return Table(("source", "destination", "destination_type", "routing_key", "arguments"), rows)


def declare_binding(ctx: AdminContext, args: argparse.Namespace) -> Report:
    if args.exchange == DEFAULT_EXCHANGE:
        raise UsageError("queues cannot be bound to the default exchange")
    record = ctx.vhost(args.vhost)
    ctx.topology.bind(
        args.vhost,
        record.namespace,
        args.queue,
        args.exchange,
        args.routing_key,
        parse_arguments(args.arguments),
        ADMIN_OWNER,
    )
    return Report(
        f"bound queue '{args.queue}' to exchange '{args.exchange}' "
        f"with key '{args.routing_key}' in vhost '{args.vhost}'",
        {"vhost": args.vhost, "exchange": args.exchange, "queue": args.queue},
    )


def delete_binding(ctx: AdminContext, args: argparse.Namespace) -> Report:
    if args.exchange == DEFAULT_EXCHANGE:
        raise UsageError("queues cannot be unbound from the default exchange")
    record = ctx.vhost(args.vhost)
    ctx.topology.unbind(
        args.vhost,
        record.namespace,
        args.queue,
        args.exchange,
        args.routing_key,
        parse_arguments(args.arguments),
        ADMIN_OWNER,
    )
    return Report(
        f"unbound queue '{args.queue}' from exchange '{args.exchange}' "
        f"(key '{args.routing_key}') in vhost '{args.vhost}'",
        {"vhost": args.vhost, "exchange": args.exchange, "queue": args.queue},
    )
