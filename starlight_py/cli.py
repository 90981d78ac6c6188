"""`starlight-proxy`: run the proxy (`serve`) or a whole local stack (`standalone`)."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

import trio

from starlight_py import __version__, allocator
from starlight_py.config import (
    ConfigError,
    StarlightConfig,
    env_var_for,
    load_config,
    read_conf_file,
)
from starlight_py.config_commands import check_config, effective_settings, print_settings
from starlight_py.gateway.server import serve
from starlight_py.gateway.shutdown import ShutdownRequest
from starlight_py.local import LocalInfraError, PulsarStandalone, ZooKeeperServer
from starlight_py.local.backlog_plugin import (
    NAR_FILE,
    ensure_backlog_plugin,
    plugin_broker_settings,
)
from starlight_py.local.distribution import ensure_pulsar_distribution
from starlight_py.local.ports import ensure_port_free
from starlight_py.local.supervision import ServerLost, supervise
from starlight_py.metadata.permissions import PermissionStore
from starlight_py.metadata.records import Paths
from starlight_py.metadata.users import UserStore, create_default_user
from starlight_py.metadata.zookeeper import MetadataUnavailable, ZooKeeperClient
from starlight_py.structured_logging import configure_logging
from starlight_py.workers import die_with_supervisor, run_workers

log = logging.getLogger("starlight")


class _Terminated(Exception):
    """SIGTERM arrived while no trio loop was running (e.g. during standalone startup)."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="starlight-proxy",
        description="AMQP 0-9-1 (RabbitMQ protocol) proxy that stores messages in Apache Pulsar.",
    )
    parser.add_argument("--version", action="version", version=f"starlight-py {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve_cmd = commands.add_parser(
        "serve",
        help="run the proxy against the configured Pulsar and ZooKeeper",
        description="Run the proxy. Settings: conf file < STARLIGHT_* environment < flags.",
    )
    serve_cmd.add_argument("-c", "--config", type=Path, help="conf file (see conf/starlight.conf)")
    serve_cmd.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="run N proxy processes sharing the AMQP ports (SO_REUSEPORT), to use N cores "
        "(default: 1; see docs/operations.md#workers)",
    )
    _add_overrides(serve_cmd)

    config_cmd = commands.add_parser(
        "config",
        help="print or check the configuration serve would run with",
        description="Settings: conf file < STARLIGHT_* environment < --set flags.",
    )
    config_actions = config_cmd.add_subparsers(dest="config_action", required=True)
    print_cmd = config_actions.add_parser(
        "print",
        help="print every key's effective value and its source (secrets masked)",
        description=(
            "Print every configuration key with its effective value and where it comes from "
            "(default, file, environment or command line). Secret values are masked."
        ),
    )
    print_cmd.add_argument(
        "--format", choices=("text", "json"), default="text", help="default: text"
    )
    check_cmd = config_actions.add_parser(
        "check",
        help="validate the configuration; exit 0 if it is OK, 2 naming the offending key",
        description=(
            "Validate every value and the TLS and token key files they name, as serve does "
            "before it opens a socket. Does not contact Pulsar or ZooKeeper."
        ),
    )
    for cmd in (print_cmd, check_cmd):
        cmd.add_argument("-c", "--config", type=Path, help="conf file (see conf/starlight.conf)")
        _add_overrides(cmd)

    standalone = commands.add_parser(
        "standalone",
        help="start ZooKeeper, Pulsar standalone and one proxy on this machine",
        description=(
            "Start a local ZooKeeper (starlight metadata), a Pulsar standalone broker and one "
            "proxy, print the amqp:// URL, and stop all three on Ctrl-C or SIGTERM. A "
            "ZooKeeper or Pulsar that dies is started again; one that cannot be ends the "
            "standalone with exit status 1. The first run downloads Apache Pulsar (about "
            "245 MB) from Maven Central."
        ),
    )
    standalone.add_argument("--amqp-port", type=int, default=5672, help="default: 5672")
    standalone.add_argument(
        "--data-dir",
        type=Path,
        default=Path("data/standalone"),
        help="where ZooKeeper and Pulsar keep their data (default: data/standalone)",
    )
    standalone.add_argument("--pulsar-port", type=int, default=6650, help="default: 6650")
    standalone.add_argument("--pulsar-web-port", type=int, default=8080, help="default: 8080")
    standalone.add_argument("--zookeeper-port", type=int, default=2181, help="default: 2181")
    standalone.add_argument(
        "--management-port",
        type=int,
        default=15672,
        help="management HTTP API, compatible with RabbitMQ's (default: 15672; 0: off)",
    )
    standalone.add_argument("--config", type=Path, help="conf file for the proxy's other keys")
    _add_overrides(standalone)
    standalone.add_argument(
        "--pulsar-set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="set one key of the Pulsar standalone's standalone.conf, over the distribution's "
        "and starlight-py's values, e.g. --pulsar-set journalSyncData=true (repeatable)",
    )

    plugin = commands.add_parser(
        "broker-plugin",
        help="build the Pulsar broker plugin that counts backlogs in messages",
        description=(
            "Build starlight-backlog.nar (with javac, against a Pulsar distribution's jars) "
            "into a folder, and print the broker settings that load it. Brokers need it for "
            "exact queue counts with pulsarProducerBatching (docs/operations.md). The local "
            "standalone and cluster load it by themselves."
        ),
    )
    plugin.add_argument("--output", type=Path, required=True, help="folder to write the NAR to")
    plugin.add_argument(
        "--pulsar-distribution",
        type=Path,
        help="an unpacked Apache Pulsar binary distribution to compile against (default: "
        "the one the standalone uses, downloaded on first use)",
    )
    return parser


def _add_overrides(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one configuration key, e.g. --set amqpHeartbeatDelay=30 (repeatable)",
    )


def _overrides(pairs: Sequence[str], option: str = "--set") -> dict[str, str]:
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(key, f"{option} takes KEY=VALUE")
        result[key.strip()] = value
    return result


def main(argv: list[str] | None = None) -> int:
    """Entry point of `starlight-proxy`; returns the process exit code."""
    args = build_parser().parse_args(argv)
    serves = args.command == "standalone" or (args.command == "serve" and args.workers == 1)
    if serves and argv is None:
        # A process started to serve AMQP: on jemalloc. This restarts the process once, at
        # once, with its own command line (not when main is called with other arguments).
        allocator.prefer_jemalloc()
    if args.command == "broker-plugin":
        return _broker_plugin(args)
    try:
        overrides = _overrides(args.set)
        if args.command == "standalone":
            return _standalone(args, overrides, _overrides(args.pulsar_set, "--pulsar-set"))
        if args.command == "config":
            return _config_command(args, overrides)
        config = load_config(args.config, os.environ, overrides)
    except ConfigError as e:
        print(f"starlight-proxy: configuration error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"starlight-proxy: {e}", file=sys.stderr)
        return 2
    _setup_logging(config)
    die_with_supervisor()
    if args.workers != 1:
        return _run_workers(args, config)
    return _run_proxy(config)


def _run_workers(args: argparse.Namespace, config: StarlightConfig) -> int:
    if args.workers < 1:
        print("starlight-proxy: --workers must be at least 1", file=sys.stderr)
        return 2
    if any(listener.port == 0 for listener in config.listeners):
        print(
            "starlight-proxy: --workers needs fixed listener ports (amqpListeners has port 0)",
            file=sys.stderr,
        )
        return 2
    serve_args = ["--config", str(args.config)] if args.config is not None else []
    for pair in args.set:
        serve_args += ["--set", pair]
    return run_workers(serve_args, args.workers)


def _broker_plugin(args: argparse.Namespace) -> int:
    try:
        distribution = args.pulsar_distribution or ensure_pulsar_distribution()
        built = ensure_backlog_plugin(distribution)
        args.output.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built / NAR_FILE, args.output / NAR_FILE)
    except LocalInfraError as e:
        print(f"starlight-proxy: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"starlight-proxy: cannot write {args.output / NAR_FILE}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output / NAR_FILE}; broker.conf of every broker:")
    for key, value in plugin_broker_settings(args.output.resolve()).items():
        print(f"{key}={value}")
    return 0


def _config_command(args: argparse.Namespace, overrides: dict[str, str]) -> int:
    """Raises ConfigError or OSError (reported by main)."""
    if args.config_action == "check":
        check_config(args.config, os.environ, overrides)
        print("configuration OK")
        return 0
    print_settings(effective_settings(args.config, os.environ, overrides), args.format, sys.stdout)
    return 0


def _setup_logging(config: StarlightConfig) -> None:
    configure_logging(config.log_level, config.log_format)


async def _relay_signals(
    signals: AsyncIterator[int],
    shutdown: ShutdownRequest,
    everything: trio.CancelScope,
) -> None:
    """SIGTERM/SIGINT: the first starts a graceful shutdown, the second skips the rest of
    the drain, the third stops at once."""
    async for signum in signals:
        name = signal.Signals(signum).name
        shutdown.request()
        if shutdown.count == 1:
            log.info(
                "received %s: shutting down gracefully (send it again to skip the drain)", name
            )
        elif shutdown.count == 2:
            log.info("received %s again: skipping the rest of the drain", name)
        else:
            log.warning("received %s a third time: stopping now", name)
            everything.cancel()


def _run_proxy(
    config: StarlightConfig,
    banner: str | None = None,
    alongside: Callable[[ShutdownRequest], Awaitable[None]] | None = None,
) -> int:
    """Serve until a signal (see `_relay_signals`); ``alongside`` runs next to the proxy
    once it serves, and may end it through the ShutdownRequest it is given."""

    async def serve_then_stop(
        shutdown: ShutdownRequest,
        everything: trio.CancelScope,
        *,
        task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        await serve(config, shutdown=shutdown, task_status=task_status)
        # The graceful shutdown is over: stop listening for signals too.
        everything.cancel()

    async def main_task() -> None:
        shutdown = ShutdownRequest()
        # Before serve starts: a SIGTERM during startup shuts down gracefully too.
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_relay_signals, signals, shutdown, nursery.cancel_scope)
                urls = await nursery.start(serve_then_stop, shutdown, nursery.cancel_scope)
                if banner:
                    print(banner.format(url=urls[0]), flush=True)
                if alongside is not None:
                    nursery.start_soon(alongside, shutdown)

    try:
        trio.run(main_task)
    except (ConfigError, OSError) as e:
        print(f"starlight-proxy: {e}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        # Nurseries wrap a startup failure (bad TLS files, a port in use) in a group.
        error = _single_startup_error(group)
        if error is None:
            raise
        print(f"starlight-proxy: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def _single_startup_error(error: BaseException) -> ConfigError | OSError | None:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error if isinstance(error, ConfigError | OSError) else None


STANDALONE_AUTHENTICATION = {
    "authenticationEnabled": "true",
    "authenticationProviders": "password",
}


def _configured(key: str, conf_file: Path | None, overrides: dict[str, str]) -> bool:
    """Whether `key` is set by --set, the environment or the conf file."""
    if key in overrides or env_var_for(key) in os.environ:
        return True
    return conf_file is not None and key in read_conf_file(conf_file, [])


def _create_default_user(config: StarlightConfig) -> None:
    zk = ZooKeeperClient(config.zookeeper_servers, config.zookeeper_session_timeout)
    zk.start()
    try:
        paths = Paths(config.metadata_root)
        if create_default_user(UserStore(zk, paths), PermissionStore(zk, paths)):
            log.info(
                "created user 'guest' (password 'guest', tag administrator, full permissions "
                "on vhost '/'; it may log in only from this machine)"
            )
    finally:
        zk.stop()


def _standalone(
    args: argparse.Namespace, overrides: dict[str, str], pulsar_settings: dict[str, str]
) -> int:
    data_dir: Path = args.data_dir.resolve()
    settings = {
        "configurationStoreServers": f"127.0.0.1:{args.zookeeper_port}",
        "brokerServiceURL": f"pulsar://127.0.0.1:{args.pulsar_port}",
        "brokerWebServiceURL": f"http://127.0.0.1:{args.pulsar_web_port}",
        "amqpListeners": f"amqp://127.0.0.1:{args.amqp_port}",
    }
    if args.management_port:
        settings["managementListener"] = f"http://127.0.0.1:{args.management_port}"
    # Like a fresh RabbitMQ: users with passwords (guest/guest from loopback), unless the
    # conf file, the environment or --set say otherwise.
    for key, value in STANDALONE_AUTHENTICATION.items():
        if not _configured(key, args.config, overrides):
            settings[key] = value
    settings.update(overrides)
    config = load_config(args.config, os.environ, settings)
    _setup_logging(config)

    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    zookeeper: ZooKeeperServer | None = None
    pulsar: PulsarStandalone | None = None
    try:
        for listener in config.listeners:
            ensure_port_free(listener.port, "AMQP listener")
        if config.management_listener:
            management_port = urlsplit(config.management_listener).port
            if management_port:
                ensure_port_free(management_port, "management listener")
        # The local servers say what they do through the proxy's log: each line once.
        distribution = ensure_pulsar_distribution(log=log.info)
        zookeeper = ZooKeeperServer(
            data_dir / "zookeeper", args.zookeeper_port, distribution=distribution, log=log.info
        )
        pulsar = PulsarStandalone(
            data_dir / "pulsar",
            args.pulsar_port,
            args.pulsar_web_port,
            distribution=distribution,
            log=log.info,
            extra_properties=pulsar_settings,
        )
        zookeeper.start()
        pulsar.start()
        if config.authentication_enabled and "password" in config.authentication_providers:
            _create_default_user(config)
        signal.signal(signal.SIGTERM, previous)
        banner = (
            "starlight-py is ready: connect AMQP clients to {url}/ "
            f"(e.g. amqp://guest:guest@127.0.0.1:{args.amqp_port}/). Ctrl-C stops everything."
        )
        lost: list[ServerLost] = []
        servers = (("ZooKeeper", zookeeper), ("Pulsar", pulsar))

        async def keep_servers_up(shutdown: ShutdownRequest) -> None:
            try:
                await supervise(servers, log)
            except ServerLost as e:
                lost.append(e)
                log.error("%s cannot be started again: stopping the standalone", e.server)
                # Twice: no drain, since clients cannot be served anyway; publishes already
                # received still get their confirm or nack before the connections close.
                shutdown.request()
                shutdown.request()

        code = _run_proxy(config, banner, keep_servers_up)
        if lost:
            print(f"starlight-proxy standalone: {lost[0]}", file=sys.stderr, flush=True)
            return 1
        return code
    except (LocalInfraError, MetadataUnavailable) as e:
        print(f"starlight-proxy standalone: {e}", file=sys.stderr)
        return 1
    except (_Terminated, KeyboardInterrupt):
        return 0
    finally:
        signal.signal(signal.SIGTERM, _raise_terminated)
        for name, server in (("Pulsar", pulsar), ("ZooKeeper", zookeeper)):
            if server is not None:
                log.info("stopping %s", name)
                server.stop()
        signal.signal(signal.SIGTERM, previous)
