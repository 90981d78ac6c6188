"""`user add|list|delete|change-password`: RabbitMQ's internal users (a password stored as
RabbitMQ stores it, and tags), for the `password` authentication provider."""

from __future__ import annotations

import argparse

from starlight_py.admin.context import AdminContext
from starlight_py.admin.errors import AdminError, UsageError
from starlight_py.admin.output import Report, Table
from starlight_py.admin.parsing import Subcommands, add_command, add_group
from starlight_py.metadata.permissions import PermissionStore
from starlight_py.metadata.users import NoSuchUser, UserExists, UserStore, delete_user
from starlight_py.model.users import SHA256, InvalidUser, User, parse_tags


def register(commands: Subcommands) -> None:
    group = add_group(commands, "user", "users with passwords (authenticationProviders=password)")
    add = add_command(group, "add", "create a user (as rabbitmqctl add_user)", add_user)
    add.add_argument("name")
    secret = add.add_mutually_exclusive_group(required=True)
    secret.add_argument("--password", help="its password")
    secret.add_argument(
        "--password-hash",
        help="a RabbitMQ password_hash (base64 salt + digest), e.g. from a definitions export",
    )
    add.add_argument(
        "--hashing-algorithm",
        default=SHA256,
        help=f"of --password-hash (default: {SHA256})",
    )
    add.add_argument("--tags", default="", help="comma-separated, e.g. administrator")
    add_command(group, "list", "list users and their tags", list_users)
    delete = add_command(
        group,
        "delete",
        "delete a user and its permissions (as rabbitmqctl delete_user)",
        remove_user,
    )
    delete.add_argument("name")
    change = add_command(group, "change-password", "set a user's password", change_password)
    change.add_argument("name")
    change.add_argument("--password", required=True, help="the new password")


def store(ctx: AdminContext) -> UserStore:
    return UserStore(ctx.zk, ctx.paths)


def add_user(ctx: AdminContext, args: argparse.Namespace) -> Report:
    try:
        tags = parse_tags(args.tags)
        if args.password is not None:
            user = User.with_password(args.name, args.password, tags)
        else:
            user = User(args.name, args.password_hash, args.hashing_algorithm, tags)
    except InvalidUser as e:
        raise UsageError(str(e)) from e
    try:
        store(ctx).add(user)
    except UserExists as e:
        raise AdminError(str(e)) from e
    return Report(f"added user '{user.name}'", {"name": user.name, "tags": list(user.tags)})


def list_users(ctx: AdminContext, args: argparse.Namespace) -> Table:
    return Table(("name", "tags"), [(user.name, list(user.tags)) for user in store(ctx).list()])


def remove_user(ctx: AdminContext, args: argparse.Namespace) -> Report:
    try:
        delete_user(store(ctx), PermissionStore(ctx.zk, ctx.paths), args.name)
    except NoSuchUser as e:
        raise AdminError(str(e)) from e
    return Report(f"deleted user '{args.name}'", {"name": args.name, "deleted": True})


def change_password(ctx: AdminContext, args: argparse.Namespace) -> Report:
    users = store(ctx)
    user = users.get(args.name)
    if user is None:
        raise AdminError(f"no such user '{args.name}'")
    try:
        users.replace(user.with_new_password(args.password))
    except NoSuchUser as e:
        raise AdminError(str(e)) from e
    return Report(f"changed the password of '{args.name}'", {"name": args.name})
