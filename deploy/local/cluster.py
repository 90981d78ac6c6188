"""Run a local starlight cluster: ZooKeeper, Pulsar, N proxies and HAProxy in front.

    python deploy/local/cluster.py up --proxies 3 [--brokers 2 --bookies 3] [--port N] [--dir D]

Prints every address, runs until Ctrl-C or SIGTERM, then stops everything; killed any
other way (even SIGKILL), it takes every part along, as each is started with a parent-death
signal (starlight_py/local/process.py). The logic lives in starlight_py/local/cluster.py;
this is only its command line.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from types import FrameType

# Runs from a checkout without `pip install`: the package sits two folders up.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from starlight_py.local.cluster import LocalCluster
from starlight_py.local.errors import LocalInfraError

_WATCH_INTERVAL = 1.0


class _Terminated(Exception):
    """SIGTERM arrived: stop like on Ctrl-C."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def _say(line: str) -> None:
    print(f"{datetime.now():%H:%M:%S} {line}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python deploy/local/cluster.py",
        description="A local starlight cluster: several proxies behind HAProxy.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser(
        "up",
        help="start ZooKeeper, Pulsar, the proxies and HAProxy; Ctrl-C stops them",
        description=(
            "Start ZooKeeper, Pulsar standalone, N proxies (separate processes) and HAProxy "
            "in front of them, print the addresses, and stop everything on Ctrl-C or "
            "SIGTERM. Ports not given are picked free ones."
        ),
    )
    up.add_argument("--proxies", type=int, default=3, help="number of proxies (default: 3)")
    up.add_argument(
        "--port",
        type=int,
        default=5672,
        help="HAProxy's AMQP port; 0 picks a free one (default: 5672)",
    )
    up.add_argument(
        "--dir",
        type=Path,
        default=Path("data/cluster"),
        help="data and logs of every part (default: data/cluster)",
    )
    up.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="Pulsar brokers; with --brokers 1 --bookies 1 (the default) Pulsar runs as one "
        "standalone JVM, otherwise as a real cluster (docs/operations.md#a-local-pulsar-cluster)",
    )
    up.add_argument(
        "--bookies",
        type=int,
        default=1,
        help="BookKeeper bookies (3: ensemble 3, write and ack quorum 2)",
    )
    up.add_argument("--zookeeper-port", type=int, default=None)
    up.add_argument("--pulsar-port", type=int, default=None)
    up.add_argument("--pulsar-web-port", type=int, default=None)
    up.add_argument(
        "--check-interval",
        type=float,
        default=0.5,
        help="seconds between HAProxy's health checks of each proxy (default: 0.5)",
    )
    up.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="configuration key for every proxy, e.g. --set amqpHeartbeatDelay=30 (repeatable)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 failure, 2 usage)."""
    parser = build_parser()
    try:
        arguments = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    settings: dict[str, str] = {}
    for pair in arguments.set:
        key, sep, value = pair.partition("=")
        if not sep:
            print(f"error: --set takes KEY=VALUE, not {pair!r}", file=sys.stderr)
            return 2
        settings[key.strip()] = value
    try:
        cluster = LocalCluster(
            arguments.dir,
            arguments.proxies,
            port=arguments.port or None,
            zookeeper_port=arguments.zookeeper_port,
            pulsar_port=arguments.pulsar_port,
            pulsar_web_port=arguments.pulsar_web_port,
            proxy_settings=settings,
            check_interval=arguments.check_interval,
            log=_say,
            brokers=arguments.brokers,
            bookies=arguments.bookies,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        cluster.start()
        print("\n".join(["", *cluster.summary(), "", "Ctrl-C stops everything."]), flush=True)
        _watch(cluster)
    except LocalInfraError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, _Terminated):
        _say("stopping")
    finally:
        # A second Ctrl-C or SIGTERM must not cut the shutdown short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            cluster.stop()
        except LocalInfraError as e:
            print(f"error: {e}", file=sys.stderr)
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _say("stopped")
    return 0


def _watch(cluster: LocalCluster) -> None:
    """Report parts that stop on their own (a crashed proxy), and their return."""
    reported: set[str] = set()
    while True:
        time.sleep(_WATCH_INTERVAL)
        down = set(cluster.not_running())
        for name in sorted(down - reported):
            _say(f"warning: {name} is not running; see its log (addresses above)")
        for name in sorted(reported - down):
            _say(f"{name} is running again")
        reported = down


if __name__ == "__main__":
    sys.exit(main())
