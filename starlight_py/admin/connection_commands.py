"""`connection list/close`, `channel list`, `consumer list` (what every proxy reports to
ZooKeeper, cluster/connection_reports.py) and `health` (as `rabbitmq-diagnostics
check_running`: exit 0 when the cluster serves, 69 when it does not)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from starlight_py.admin.context import AdminContext
from starlight_py.admin.errors import AdminError
from starlight_py.admin.output import Report, Table
from starlight_py.admin.parsing import Subcommands, add_command, add_group
from starlight_py.cluster.connection_reports import read_reports, request_close
from starlight_py.cluster.registry import live_proxies

CLOSE_WAIT = 5.0  # seconds `connection close` waits to see the connection gone
UNAVAILABLE = 69  # EX_UNAVAILABLE, as rabbitmq-diagnostics exits when the node is down


def register(commands: Subcommands) -> None:
    connection = add_group(commands, "connection", "AMQP connections on every proxy")
    add_command(connection, "list", "list every proxy's AMQP connections", list_connections)
    close = add_command(
        connection,
        "close",
        "close a connection on whichever proxy holds it (320 CONNECTION_FORCED with the reason)",
        close_connection,
    )
    close.add_argument("name", help="as `connection list` shows it: 'client:port -> proxy:port'")
    close.add_argument("--reason", default="Closed via starlight-admin")
    channel = add_group(commands, "channel", "AMQP channels on every proxy")
    add_command(channel, "list", "list every proxy's channels", list_channels)
    consumer = add_group(commands, "consumer", "AMQP consumers on every proxy")
    add_command(consumer, "list", "list every proxy's consumers", list_consumers)
    add_command(
        commands,
        "health",
        "check that ZooKeeper, a proxy and Pulsar answer (exit 0; 69 when not)",
        health,
    )


def _reported(ctx: AdminContext) -> list[dict[str, Any]]:
    return [entry for _, report in read_reports(ctx.zk, ctx.paths) for entry in report]


def list_connections(ctx: AdminContext, args: argparse.Namespace) -> Table:
    now = time.time()
    rows = []
    for entry in _reported(ctx):
        c = entry["connection"]
        age = now - c.get("connected_at", now * 1000) / 1000
        rows.append(
            (
                c.get("name"),
                c.get("starlight_proxy"),
                c.get("vhost"),
                c.get("user"),
                c.get("channels"),
                c.get("ssl"),
                c.get("state"),
                f"{age:.0f}s",
            )
        )
    columns = ("name", "proxy", "vhost", "user", "channels", "tls", "state", "connected_for")
    return Table(columns, rows)


def list_channels(ctx: AdminContext, args: argparse.Namespace) -> Table:
    rows = [
        (
            ch.get("name"),
            ch.get("vhost"),
            ch.get("user"),
            ch.get("consumer_count"),
            ch.get("prefetch_count"),
            ch.get("messages_unacknowledged"),
            ch.get("messages_unconfirmed"),
        )
        for entry in _reported(ctx)
        for ch in entry.get("channels", [])
    ]
    columns = ("name", "vhost", "user", "consumers", "prefetch", "unacked", "unconfirmed")
    return Table(columns, rows)


def list_consumers(ctx: AdminContext, args: argparse.Namespace) -> Table:
    rows = [
        (
            c.get("queue", {}).get("vhost"),
            c.get("queue", {}).get("name"),
            c.get("consumer_tag"),
            c.get("channel_details", {}).get("name"),
            c.get("ack_required"),
            c.get("exclusive"),
            c.get("prefetch_count"),
        )
        for entry in _reported(ctx)
        for c in entry.get("consumers", [])
    ]
    columns = ("vhost", "queue", "tag", "channel", "ack_required", "exclusive", "prefetch")
    return Table(columns, rows)


def close_connection(ctx: AdminContext, args: argparse.Namespace) -> Report:
    """Raises AdminError when no proxy reports the connection, or its proxy has not taken
    the request within CLOSE_WAIT (the close itself then waits for the client's close-ok,
    at most 3 s, as RabbitMQ's)."""
    holder = _holder(ctx, args.name)
    if holder is None:
        raise AdminError(
            f"no connection named '{args.name}' (see: starlight-admin connection list)"
        )
    request_close(ctx.zk, ctx.paths, holder, args.name, args.reason)
    deadline = time.monotonic() + CLOSE_WAIT
    while ctx.zk.get(ctx.paths.close_request(holder, args.name)) is not None:
        if time.monotonic() > deadline:
            raise AdminError(
                f"asked proxy {holder} to close '{args.name}'; it has not taken the request "
                f"after {CLOSE_WAIT:g} s (is it overloaded?)"
            )
        time.sleep(0.1)
    return Report(
        f"closing '{args.name}' on proxy {holder} (320 CONNECTION_FORCED - {args.reason})",
        {"name": args.name, "proxy": holder, "reason": args.reason},
    )


def _holder(ctx: AdminContext, name: str) -> str | None:
    for proxy, report in read_reports(ctx.zk, ctx.paths):
        if any(entry["connection"].get("name") == name for entry in report):
            return proxy
    return None


def health(ctx: AdminContext, args: argparse.Namespace) -> Report:
    checks: list[tuple[str, bool, str]] = []
    try:
        proxies = live_proxies(ctx.zk, ctx.paths)
        checks.append(("zookeeper", True, ctx.config.zookeeper_servers))
        checks.append(
            ("proxies", bool(proxies), f"{len(proxies)} live" if proxies else "none registered")
        )
    except Exception as e:
        checks.append(("zookeeper", False, f"{ctx.config.zookeeper_servers}: {e}"))
    try:
        clusters = ctx.admin.clusters()
        checks.append(("pulsar", True, f"{ctx.admin.web_url} (clusters: {', '.join(clusters)})"))
    except Exception as e:
        checks.append(("pulsar", False, f"{ctx.admin.web_url}: {e}"))
    healthy = all(ok for _, ok, _ in checks)
    lines = [f"{name}: {'ok' if ok else 'FAILED'} - {detail}" for name, ok, detail in checks]
    lines.append("healthy" if healthy else "not healthy")
    data = {
        "healthy": healthy,
        "checks": [{"check": n, "ok": o, "detail": d} for n, o, d in checks],
    }
    return Report("\n".join(lines), data, 0 if healthy else UNAVAILABLE)
