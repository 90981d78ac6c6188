"""`starlight-proxy`: run the proxy (`serve`) or a whole local stack (`standalone`)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import trio

from starlight_py import __version__
from starlight_py.config import ConfigError, StarlightConfig, load_config
from starlight_py.gateway.server import serve
from starlight_py.local import LocalInfraError, PulsarStandalone, ZooKeeperServer
from starlight_py.local.distribution import ensure_pulsar_distribution
from starlight_py.local.ports import ensure_port_free

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
    serve_cmd.add_argument("--config", type=Path, help="conf file (see conf/starlight.conf)")
    _add_overrides(serve_cmd)

    standalone = commands.add_parser(
        "standalone",
        help="start ZooKeeper, Pulsar standalone and one proxy on this machine",
        description=(
            "Start a local ZooKeeper (starlight metadata), a Pulsar standalone broker and one "
            "proxy, print the amqp:// URL, and stop all three on Ctrl-C or SIGTERM. The "
            "first run downloads Apache Pulsar (about 245 MB) from Maven Central."
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
    standalone.add_argument("--config", type=Path, help="conf file for the proxy's other keys")
    _add_overrides(standalone)
    return parser


def _add_overrides(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one configuration key, e.g. --set amqpHeartbeatDelay=30 (repeatable)",
    )


def _overrides(pairs: Sequence[str]) -> dict[str, str]:
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(key, "--set takes KEY=VALUE")
        result[key.strip()] = value
    return result


def main(argv: list[str] | None = None) -> int:
    """Entry point of `starlight-proxy`; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        overrides = _overrides(args.set)
        if args.command == "standalone":
            return _standalone(args, overrides)
        config = load_config(args.config, os.environ, overrides)
    except ConfigError as e:
        print(f"starlight-proxy: configuration error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"starlight-proxy: {e}", file=sys.stderr)
        return 2
    _setup_logging(config)
    return _run_proxy(config)


def _setup_logging(config: StarlightConfig) -> None:
    logging.basicConfig(
        level=config.log_level,
        format="%(asctime)s %(levelname)-7s %(name)s %(message)s",
        stream=sys.stderr,
    )


def _run_proxy(config: StarlightConfig, banner: str | None = None) -> int:
    async def main_task() -> None:
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(serve, config)
            if banner:
                print(banner.format(url=urls[0]), flush=True)
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    log.info("received %s, shutting down", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    break

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


def _standalone(args: argparse.Namespace, overrides: dict[str, str]) -> int:
    data_dir: Path = args.data_dir.resolve()
    settings = {
        "configurationStoreServers": f"127.0.0.1:{args.zookeeper_port}",
        "brokerServiceURL": f"pulsar://127.0.0.1:{args.pulsar_port}",
        "brokerWebServiceURL": f"http://127.0.0.1:{args.pulsar_web_port}",
        "amqpListeners": f"amqp://127.0.0.1:{args.amqp_port}",
        "amqpAutoCreateNamespaces": "true",
    }
    settings.update(overrides)
    config = load_config(args.config, os.environ, settings)
    _setup_logging(config)

    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    zookeeper: ZooKeeperServer | None = None
    pulsar: PulsarStandalone | None = None
    try:
        for listener in config.listeners:
            ensure_port_free(listener.port, "AMQP listener")
        distribution = ensure_pulsar_distribution()
        zookeeper = ZooKeeperServer(
            data_dir / "zookeeper", args.zookeeper_port, distribution=distribution
        )
        pulsar = PulsarStandalone(
            data_dir / "pulsar",
            args.pulsar_port,
            args.pulsar_web_port,
            distribution=distribution,
        )
        log.info("starting ZooKeeper on 127.0.0.1:%s", args.zookeeper_port)
        zookeeper.start()
        log.info("starting Pulsar standalone on %s (takes ~15 s)", config.pulsar_service_url)
        pulsar.start()
        signal.signal(signal.SIGTERM, previous)
        banner = (
            "starlight-py is ready: connect AMQP clients to {url}/ "
            f"(e.g. amqp://guest:guest@127.0.0.1:{args.amqp_port}/). Ctrl-C stops everything."
        )
        return _run_proxy(config, banner)
    except LocalInfraError as e:
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
