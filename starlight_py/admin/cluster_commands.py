"""`proxies list` and `cleaner status`: what the running proxies announce in ZooKeeper."""

from __future__ import annotations

import argparse
import time

from starlight_py.admin import inventory
from starlight_py.admin.context import AdminContext
from starlight_py.admin.output import Report, Table
from starlight_py.admin.parsing import Subcommands, add_command, add_group
from starlight_py.cluster.election import LeaderElection
from starlight_py.cluster.registry import live_proxies, uptime


def register(commands: Subcommands) -> None:
    proxies = add_group(commands, "proxies", "the proxies registered in ZooKeeper")
    add_command(proxies, "list", "list live proxies", list_proxies)
    cleaner = add_group(commands, "cleaner", "the SubscriptionCleaner")
    add_command(
        cleaner,
        "status",
        "the proxy leading the cleaner and the retired subscriptions it has still to delete",
        cleaner_status,
    )


def list_proxies(ctx: AdminContext, args: argparse.Namespace) -> Table:
    rows = [
        (p.id, p.host, p.pid, p.version, ",".join(p.listeners), f"{uptime(p):.0f}s")
        for p in live_proxies(ctx.zk, ctx.paths)
    ]
    return Table(("id", "host", "pid", "version", "listeners", "uptime"), rows)


def cleaner_status(ctx: AdminContext, args: argparse.Namespace) -> Report:
    # Only reads the candidates: the admin never stands in the election.
    leader = LeaderElection(ctx.zk, ctx.paths.cleaner_election, "").leader_identity()
    pending = []
    for record in inventory.vhosts(ctx):
        for retired in inventory.retired(ctx, record.name):
            pending.append(
                {
                    "vhost": record.name,
                    "queue": retired.queue,
                    "topic": f"persistent://{record.namespace}/{retired.topic}",
                    "subscription": retired.subscription,
                    "state": "draining" if retired.drain else "to delete",
                    "retired_for": round(time.time() - retired.retired_at, 1),
                }
            )
    lines = [f"leader: {leader or '(none: no proxy runs the cleaner)'}"]
    lines.append(f"retired subscriptions pending: {len(pending)}")
    for item in pending:
        lines.append(
            f"  {item['vhost']}  queue '{item['queue']}'  {item['subscription']} on "
            f"{item['topic']}  ({item['state']}, retired {item['retired_for']}s ago)"
        )
    return Report("\n".join(lines), {"leader": leader, "pending": pending})
