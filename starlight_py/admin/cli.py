"""`starlight-admin`: the operators' CLI. Talks to ZooKeeper and the Pulsar admin REST API
directly (no proxy needs to run) with the proxy's own configuration: conf file (`--config`) <
`STARLIGHT_*` environment < `--set KEY=VALUE`.

Exit codes: 0 done; 1 the command failed (one line on stderr says why); 2 the command line
or the configuration is wrong.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from starlight_py import __version__
from starlight_py.admin import (
    cluster_commands,
    connection_commands,
    definitions_commands,
    permission_commands,
    policy_commands,
    token_commands,
    topic_commands,
    topology_commands,
    user_commands,
    vhost_commands,
)
from starlight_py.admin.context import AdminContext
from starlight_py.admin.errors import AdminError, UsageError
from starlight_py.admin.output import Report, Result, emit
from starlight_py.amqp.errors import AMQPError
from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdminError
from starlight_py.config import ConfigError, StarlightConfig, load_config
from starlight_py.metadata.zookeeper import MetadataUnavailable
from starlight_py.topology.service import TopologyConflict

PROG = "starlight-admin"
Handler = Callable[[AdminContext, argparse.Namespace], Result]


class _ArgumentError(Exception):
    def __init__(self, prog: str, message: str) -> None:
        super().__init__(f"{prog}: {message} (see {prog} --help)")


class AdminArgumentParser(argparse.ArgumentParser):
    """Reports a usage error as one line instead of the usage block plus a line, and lets
    `main` return the exit code instead of exiting the process."""

    def error(self, message: str) -> NoReturn:
        raise _ArgumentError(self.prog, message)


def build_parser() -> argparse.ArgumentParser:
    parser = AdminArgumentParser(
        prog=PROG,
        description=(
            "Manage starlight-py: vhost-to-namespace mappings, exchanges, queues, bindings, "
            "permissions, tokens, RabbitMQ definitions. Talks to ZooKeeper and the Pulsar "
            "admin API directly; reads the proxy's configuration."
        ),
        epilog="Exit codes: 0 ok, 1 the command failed, 2 bad command line or configuration.",
    )
    parser.add_argument("--version", action="version", version=f"starlight-py {__version__}")
    parser.add_argument("--config", type=Path, help="conf file (see conf/starlight.conf)")
    parser.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one configuration key, e.g. --set configurationStoreServers=zk:2181",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (
        vhost_commands,
        topology_commands,
        topic_commands,
        permission_commands,
        user_commands,
        policy_commands,
        token_commands,
        cluster_commands,
        connection_commands,
        definitions_commands,
    ):
        module.register(commands)
    return parser


def _overrides(pairs: Sequence[str]) -> dict[str, str]:
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(key, "--set takes KEY=VALUE")
        result[key.strip()] = value
    return result


def _load(args: argparse.Namespace) -> StarlightConfig:
    try:
        return load_config(args.config, os.environ, _overrides(args.set))
    except ConfigError as e:
        raise UsageError(f"configuration error: {e}") from e
    except OSError as e:
        raise UsageError(f"cannot read configuration: {e}") from e


def main(argv: list[str] | None = None) -> int:
    """Entry point of `starlight-admin`; returns the exit code."""
    if not logging.getLogger().handlers:
        # Run as a command (nobody configured logging): kazoo's connection retries would
        # print a line per attempt; our own one-line error says what failed.
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _ArgumentError as e:
        print(e, file=sys.stderr)
        return 2
    except SystemExit as e:  # --help, --version
        return e.code if isinstance(e.code, int) else 0
    context: AdminContext | None = None
    try:
        context = AdminContext(_load(args))
        handler: Handler = args.handler
        result = handler(context, args)
    except AdminError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return e.exit_code
    except AMQPError as e:
        print(f"{PROG}: {e.reply_text}", file=sys.stderr)
        return 1
    except (MetadataUnavailable, BackendUnavailable, TopologyConflict) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except PulsarAdminError as e:
        print(f"{PROG}: Pulsar refused: {e}", file=sys.stderr)
        return 1
    finally:
        if context is not None:
            context.close()
    if not (isinstance(result, Report) and result.data is None and not result.text):
        emit(result, args.json, sys.stdout)
    return result.exit_code if isinstance(result, Report) else 0


if __name__ == "__main__":
    sys.exit(main())
