"""`policy set|list|clear`: RabbitMQ's policies (as `rabbitmqctl set_policy`), stored in
ZooKeeper and applied by every proxy to matching queues and exchanges (model/policies.py)."""

from __future__ import annotations

import argparse
import json

from starlight_py.admin import inventory
from starlight_py.admin.context import AdminContext
from starlight_py.admin.errors import AdminError, UsageError
from starlight_py.admin.output import Report, Table
from starlight_py.admin.parsing import Subcommands, add_command, add_group, add_vhost_option
from starlight_py.metadata.policies import PolicyStore
from starlight_py.model.policies import APPLY_TO, PolicyInvalid, parse_policy


def register(commands: Subcommands) -> None:
    group = add_group(
        commands, "policy", "policies: settings for the queues and exchanges a regex matches"
    )
    set_cmd = add_command(
        group,
        "set",
        "set a policy (as rabbitmqctl set_policy); replaces one of the same name",
        set_policy,
    )
    set_cmd.add_argument("name")
    set_cmd.add_argument("pattern", help="regex searched in queue/exchange names, e.g. '^orders'")
    set_cmd.add_argument(
        "definition",
        help='JSON object, e.g. \'{"message-ttl": 60000, "dead-letter-exchange": "dlx"}\'',
    )
    set_cmd.add_argument("--apply-to", choices=APPLY_TO, default="all")
    set_cmd.add_argument(
        "--priority", type=int, default=0, help="the highest priority among matches applies"
    )
    add_vhost_option(set_cmd)
    clear = add_command(group, "clear", "remove a policy", clear_policy)
    clear.add_argument("name")
    add_vhost_option(clear)
    listing = add_command(group, "list", "list policies", list_policies)
    listing.add_argument("--vhost", help="only this vhost (default: every vhost)")
    listing.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON"
    )


def _store(ctx: AdminContext) -> PolicyStore:
    return PolicyStore(ctx.zk, ctx.paths)


def set_policy(ctx: AdminContext, args: argparse.Namespace) -> Report:
    try:
        definition = json.loads(args.definition)
    except ValueError as e:
        raise UsageError(f"the definition is not JSON: {e}") from e
    ctx.vhost(args.vhost)
    body = {
        "pattern": args.pattern,
        "definition": definition,
        "apply-to": args.apply_to,
        "priority": args.priority,
    }
    try:
        policy = parse_policy(args.vhost, args.name, body)
    except PolicyInvalid as e:
        raise UsageError(f"policy '{args.name}' refused: {' '.join(str(e).split())}") from e
    created = _store(ctx).set(policy)
    verb = "set" if created else "replaced"
    return Report(
        f"{verb} policy '{policy.name}' in vhost '{policy.vhost}': pattern {policy.pattern!r} "
        f"apply-to {policy.apply_to} priority {policy.priority} "
        f"definition {json.dumps(policy.definition, sort_keys=True)}",
        {**policy.to_json(), "created": created},
    )


def clear_policy(ctx: AdminContext, args: argparse.Namespace) -> Report:
    if not _store(ctx).clear(args.vhost, args.name):
        raise AdminError(f"no policy '{args.name}' in vhost '{args.vhost}'")
    return Report(
        f"cleared policy '{args.name}' in vhost '{args.vhost}'",
        {"vhost": args.vhost, "name": args.name, "cleared": True},
    )


def list_policies(ctx: AdminContext, args: argparse.Namespace) -> Table:
    if args.vhost is not None:
        vhosts = [ctx.vhost(args.vhost).name]
    else:
        vhosts = [record.name for record in inventory.vhosts(ctx)]
    rows = [
        (p.vhost, p.name, p.pattern, p.apply_to, p.definition, p.priority)
        for p in _store(ctx).list(vhosts)
    ]
    return Table(("vhost", "name", "pattern", "apply-to", "definition", "priority"), rows)
