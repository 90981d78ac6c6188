"""Helpers the command modules share to declare their sub-commands and read arguments."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

from starlight_py.admin.errors import UsageError

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_group(commands: Subcommands, name: str, help_text: str) -> Subcommands:
    """A command group (`vhost`, `queue`, ...) whose own sub-command is required."""
    group = commands.add_parser(name, help=help_text, description=help_text)
    actions: Subcommands = group.add_subparsers(
        dest=f"{name}_command", metavar="ACTION", required=True
    )
    return actions


def add_command(
    commands: Subcommands, name: str, help_text: str, handler: Callable[..., Any]
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=help_text, description=help_text
    )
    parser.set_defaults(handler=handler)
    return parser


def add_vhost_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vhost", default="/", help="virtual host (default: /)")


def add_arguments_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--argument",
        dest="arguments",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help='an x-argument; VALUE is read as JSON when it parses (10, true, "text"), '
        "else as a string (repeatable)",
    )


def parse_arguments(pairs: Sequence[str]) -> dict[str, Any]:
    """`["x-max-length=10", "x-queue-mode=lazy"]` -> {"x-max-length": 10, ...}; raises
    UsageError for an entry without `=`."""
    result: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--argument takes KEY=VALUE, not {pair!r}")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        if isinstance(value, float) and value.is_integer() and "." not in raw:
            value = int(value)
        result[key] = value
    return result
