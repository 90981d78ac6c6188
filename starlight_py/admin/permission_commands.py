"""`permissions set|clear|list`: RabbitMQ's configure/write/read patterns per principal and
vhost (the principal is a token's subject or a certificate's name)."""

from __future__ import annotations

import argparse

from starlight_py.admin.context import AdminContext
from starlight_py.admin.errors import UsageError
from starlight_py.admin.output import Report, Table
from starlight_py.admin.parsing import Subcommands, add_command, add_group
from starlight_py.metadata.permissions import PermissionStore
from starlight_py.model.permissions import Permission


def register(commands: Subcommands) -> None:
    group = add_group(
        commands, "permissions", "configure/write/read regexes of principals per vhost"
    )
    set_cmd = add_command(
        group,
        "set",
        "give a principal permissions in a vhost (as rabbitmqctl set_permissions)",
        set_permissions,
    )
    set_cmd.add_argument("principal")
    set_cmd.add_argument("configure", help="regex of queues/exchanges it may declare/delete")
    set_cmd.add_argument("write", help="regex of exchanges it may publish to, queues it may bind")
    set_cmd.add_argument("read", help="regex of queues it may consume from, exchanges to bind")
    set_cmd.add_argument("--vhost", default="/", help="virtual host (default: /)")
    clear = add_command(
        group, "clear", "remove a principal's permissions in a vhost", clear_permissions
    )
    clear.add_argument("principal")
    clear.add_argument("--vhost", default="/", help="virtual host (default: /)")
    listing = add_command(group, "list", "list permissions", list_permissions)
    listing.add_argument("--vhost", help="only this vhost (default: every vhost)")


def store(ctx: AdminContext) -> PermissionStore:
    return PermissionStore(ctx.zk, ctx.paths)


def set_permissions(ctx: AdminContext, args: argparse.Namespace) -> Report:
    try:
        permission = Permission(args.configure, args.write, args.read)
    except ValueError as e:
        raise UsageError(str(e)) from e
    store(ctx).set(args.vhost, args.principal, permission)
    return Report(
        f"set permissions of '{args.principal}' in vhost '{args.vhost}': "
        f"configure={args.configure!r} write={args.write!r} read={args.read!r}",
        {"vhost": args.vhost, "principal": args.principal, **permission.to_json()},
    )


def clear_permissions(ctx: AdminContext, args: argparse.Namespace) -> Report:
    cleared = store(ctx).clear(args.vhost, args.principal)
    text = (
        f"cleared permissions of '{args.principal}' in vhost '{args.vhost}'"
        if cleared
        else f"'{args.principal}' had no permissions in vhost '{args.vhost}'"
    )
    return Report(text, {"vhost": args.vhost, "principal": args.principal, "cleared": cleared})


def list_permissions(ctx: AdminContext, args: argparse.Namespace) -> Table:
    rows = [
        (vhost, principal, p.configure, p.write, p.read)
        for vhost, principal, p in store(ctx).list(args.vhost)
    ]
    return Table(("vhost", "principal", "configure", "write", "read"), rows)
