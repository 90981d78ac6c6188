"""`topics`: the Pulsar topics and subscriptions behind a vhost, exchange or queue, for
Spark jobs and Pulsar-native consumers (the format is in docs/mapping.md)."""

from __future__ import annotations

import argparse

from starlight_py.admin import inventory
from starlight_py.admin.context import AdminContext
from starlight_py.admin.errors import AdminError
from starlight_py.admin.output import Table
from starlight_py.admin.parsing import Subcommands, add_command, add_vhost_option
from starlight_py.model import naming
from starlight_py.model.priorities import PRIORITY_BAND_TYPE


def register(commands: Subcommands) -> None:
    parser = add_command(
        commands,
        "topics",
        "the Pulsar topics and subscriptions behind a vhost, an exchange or a queue",
        list_topics,
    )
    add_vhost_option(parser)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--exchange", help="only this exchange's topics")
    which.add_argument("--queue", help="only the subscriptions this queue reads")


COLUMNS = ("exchange", "routing_key", "topic", "queue", "subscription")
# A queue's default-exchange subscription is made by the first publish that goes there
# (docs/mapping.md#queues-and-bindings---subscriptions).
NOT_MADE_YET = "(made by the first publish)"


def list_topics(ctx: AdminContext, args: argparse.Namespace) -> Table:
    record = ctx.vhost(args.vhost)
    namespace = record.namespace
    bindings = inventory.bindings(ctx, args.vhost)
    unbound_topics: list[str] = []
    if args.exchange is not None:
        found = ctx.topology.get_exchange(args.vhost, args.exchange)
        if found is None:
            raise AdminError(f"no exchange '{args.exchange}' in vhost '{args.vhost}'")
        exchange = found[0]
        bindings = [b for b in bindings if b.source == args.exchange]
        if exchange.routing_type == "fanout" and exchange.name != "":
            # One topic for the whole exchange, listed even while nothing is bound (a topic
            # or headers exchange's bindings each read a topic of their own).
            topic = naming.exchange_topic(namespace, exchange.name, exchange.routing_type, "")
            if not any(b.topic == topic.local for b in bindings):
                unbound_topics.append(str(topic))
    if args.queue is not None:
        if ctx.topology.get_queue(args.vhost, args.queue) is None:
            raise AdminError(f"no queue '{args.queue}' in vhost '{args.vhost}'")
        bindings = [b for b in bindings if b.destination == args.queue]
    rows: list[tuple[str | None, str | None, str, str | None, str | None]] = [
        (args.exchange, None, topic, None, None) for topic in unbound_topics
    ]
    for binding in bindings:
        rows.append(
            (
                binding.source,
                binding.routing_key,
                str(naming.TopicName(namespace, binding.topic)),
                binding.destination,
                binding.subscription or NOT_MADE_YET,
            )
        )
    if args.exchange is None:
        # Priority queues' band topics (docs/mapping.md#priority-queues): no exchange's.
        queues = (
            [args.queue]
            if args.queue is not None
            else [q.name for q in inventory.queues(ctx, args.vhost)]
        )
        for queue in queues:
            for binding_set in inventory.binding_sets(ctx, args.vhost, queue):
                if binding_set.exchange_type == PRIORITY_BAND_TYPE:
                    band_topic = str(naming.TopicName(namespace, binding_set.topic))
                    rows.append((None, None, band_topic, queue, binding_set.subscription))
    return Table(COLUMNS, rows)
