"""How the proxy's costs grow with the topology, next to RabbitMQ.

``python -m starlight_py.bench.scale``.

Starts ZooKeeper + Pulsar standalone, the proxy and a private RabbitMQ node (``infra``),
then runs each case (``scale_report.plan``) against the proxy, then against RabbitMQ:

- ``topic N``: N queues, each bound to one topic exchange with ``t.<i>.*``; messages are
  published round robin with routing keys ``t.<i>.x``, so each goes to exactly one queue;
- ``default N``: N queues, messages published to the default exchange round robin with the
  queue names as routing keys;
- ``fanout N``: N queues bound to one fanout exchange (each message goes to every queue).

Each case is one run of the Java load generator (``scale_load``, ``java/ScaleLoad.java``,
run and measured by ``scale_runs``):
setup (declare, bind, one consumer per queue, from ``--connections`` connections at once),
an idle window (consumers attached, nothing published), traffic at ``--rate`` deliveries/s
in total (256 B persistent messages, publisher confirms, manual acks; a warm-up, then the
measured window), a drain that waits for every confirmed message, and the delete. The
servers' CPU is read from /proc (``cpu``) when the generator announces each window's edges,
RSS when the idle window ends. Then, with ``--idle-connections``, that many connections
(heartbeat 60 s) are opened to each system and left idle.

See docs/performance.md, "Scale with the topology".
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from starlight_py.bench.infra import (
    BenchError,
    GroupProcess,
    add_pulsar_set,
    pulsar_settings,
    say,
    start_proxy,
    start_pulsar,
    start_rabbitmq,
    wait_rabbitmq,
)
from starlight_py.bench.report import machine_info, write_json
from starlight_py.bench.scale_load import ensure_load_generator
from starlight_py.bench.scale_report import (
    KINDS,
    SYSTEMS,
    Case,
    CaseResult,
    ConnectionsResult,
    full_report,
    plan,
)
from starlight_py.bench.scale_runs import (
    HEARTBEAT_S,
    Servers,
    run_case,
    run_connections,
    say_outcome,
)
from starlight_py.local import PULSAR_VERSION

DEFAULT_SIZES = (1, 10, 100, 1000, 10000)
DEFAULT_FANOUT_SIZES = (10, 100)


def _counts(text: str) -> list[int]:
    try:
        values = [int(item.replace("_", "")) for item in text.split(",") if item.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"numbers like 1,10,100: {e}") from e
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"positive numbers like 1,10,100, not {text!r}")
    return values


def _choices(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items or any(item not in allowed for item in items):
            raise argparse.ArgumentTypeError(f"choose from {','.join(allowed)}, not {text!r}")
        return items

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m starlight_py.bench.scale",
        description=(
            "Setup and delete times, idle CPU, RSS, CPU per delivery, rate, latency and "
            "losses of the proxy (with its Pulsar and ZooKeeper) and of a private RabbitMQ "
            "node, as the number of queues, bindings and consumers grows; and the cost of "
            "idle connections. Starts every server itself and stops them at the end."
        ),
        epilog=(
            "Cases: topic N (N queues bound to a topic exchange with t.<i>.*, routing keys "
            "t.<i>.x round robin), default N (the default exchange, queue names as keys, "
            "round robin), fanout N. One consumer per queue, manual acks, publisher "
            "confirms, persistent messages. The load generator is Java (com.rabbitmq:"
            "amqp-client, fetched once with Maven into the cache folder; needs a JDK)."
        ),
    )
    parser.add_argument(
        "--sizes",
        type=_counts,
        default=list(DEFAULT_SIZES),
        help="queue counts of the topic and default-exchange cases (default: 1,10,100,1000,10000)",
    )
    parser.add_argument(
        "--fanout-sizes",
        type=_counts,
        default=list(DEFAULT_FANOUT_SIZES),
        help="queue counts of the fanout cases (default: 10,100)",
    )
    parser.add_argument(
        "--kinds",
        type=_choices(KINDS),
        default=list(KINDS),
        help="exchange kinds to run (default: topic,default,fanout)",
    )
    parser.add_argument(
        "--targets",
        type=_choices(SYSTEMS),
        default=list(SYSTEMS),
        help="systems to run against (default: proxy,rabbitmq)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=500.0,
        help="deliveries/s offered in total (default: 500); a fanout to N queues publishes "
        "rate/N msg/s, so that every case delivers the same",
    )
    parser.add_argument("--size", type=int, default=256, help="body bytes (default: 256)")
    parser.add_argument(
        "--prefetch", type=int, default=100, help="basic.qos of each consumer (default: 100)"
    )
    parser.add_argument(
        "--connections",
        type=int,
        default=8,
        help="client connections the queues and consumers are spread over, each set up by a "
        "thread of its own (default: 8)",
    )
    parser.add_argument(
        "--idle", type=float, default=15.0, help="seconds of the idle window (default: 15)"
    )
    parser.add_argument(
        "--warmup", type=float, default=5.0, help="seconds of unmeasured traffic (default: 5)"
    )
    parser.add_argument(
        "--first-wait",
        type=float,
        default=120.0,
        help="seconds the warm-up may go on past --warmup until every queue has delivered "
        "its first message, which is reported on its own (default: 120)",
    )
    parser.add_argument(
        "--duration", type=float, default=30.0, help="seconds of measured traffic (default: 30)"
    )
    parser.add_argument(
        "--drain",
        type=float,
        default=30.0,
        help="seconds to wait for every confirm and delivery after publishing stops; what "
        "has not come by then is lost (default: 30)",
    )
    parser.add_argument(
        "--setup-timeout",
        type=float,
        default=1800.0,
        help="seconds a case's setup, and again its delete, may take before the case is "
        "stopped (default: 1800)",
    )
    parser.add_argument(
        "--rpc-timeout",
        type=float,
        default=120.0,
        help="seconds one declare, bind, consume, cancel or delete may wait for its answer "
        "before the case fails (default: 120)",
    )
    parser.add_argument(
        "--idle-connections",
        type=int,
        default=5000,
        metavar="N",
        help="after the cases, open N connections to each system (heartbeat 60 s) and leave "
        "them idle for --idle seconds; 0 = skip (default: 5000)",
    )
    parser.add_argument(
        "--prime",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="before the cases, unrecorded traffic through a topic exchange to one queue on "
        "each system for this long: a Pulsar started a minute before answers its first "
        "topics and namespaces slowly, which would fall on the first case (default: 10; "
        "0 = no priming)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: sizes 1,10,100, fanout 10, 3 s idle, 2 s warm-up, 5 s measured, "
        "500 idle connections (explicit options win)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write every figure here")
    parser.add_argument(
        "--proxy-set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="extra --set for the proxy (repeatable)",
    )
    parser.add_argument(
        "--proxy-code",
        type=Path,
        metavar="DIR",
        help="run the proxy from another checkout (its top folder, holding starlight_py/), "
        "e.g. a `git worktree` of an older commit: a before and an after on one machine",
    )
    add_pulsar_set(parser)
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="where servers keep data and logs (default: a temporary folder, removed at the "
        "end unless --keep)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder and logs")
    return parser


_QUICK = {
    "sizes": [1, 10, 100],
    "fanout_sizes": [10],
    "idle": 3.0,
    "warmup": 2.0,
    "duration": 5.0,
    "drain": 15.0,
    "idle_connections": 500,
}


def parse_options(argv: Sequence[str] | None) -> argparse.Namespace:
    """The options, ``--quick`` applied under the explicit ones. Exits 2 (argparse) on a
    bad one."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        defaults = parser.parse_args([])
        for key, value in _QUICK.items():
            if getattr(args, key) == getattr(defaults, key):
                setattr(args, key, value)
    problems = [
        name
        for name, bad in (
            ("--rate", args.rate <= 0),
            ("--size", args.size < 24),
            ("--prefetch", args.prefetch < 0),
            ("--connections", args.connections < 1),
            ("--idle", args.idle <= 0),
            ("--warmup", args.warmup < 0),
            ("--first-wait", args.first_wait < 0),
            ("--duration", args.duration <= 0),
            ("--drain", args.drain < 0),
            ("--setup-timeout", args.setup_timeout <= 0),
            ("--rpc-timeout", args.rpc_timeout <= 0),
            ("--idle-connections", args.idle_connections < 0),
            ("--prime", args.prime < 0),
        )
        if bad
    ]
    if problems:
        parser.error(f"out of range: {', '.join(problems)} (--size needs 24 bytes or more)")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns 0 when the run finished (failed cases are in the tables), 1
    when nothing could be run, 2 for bad arguments."""
    args = parse_options(argv)
    # SIGTERM stops a run as Ctrl-C does: the figures so far are printed, servers stopped.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return _main(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(args: argparse.Namespace) -> int:
    with ExitStack() as stack:
        if args.work_dir is not None:
            work_dir: Path = args.work_dir.resolve()
            work_dir.mkdir(parents=True, exist_ok=True)
        else:
            work_dir = Path(tempfile.mkdtemp(prefix="starlight-scale-"))
        if args.keep or args.work_dir is not None:
            say(f"logs and data stay in {work_dir}")
        else:
            stack.callback(shutil.rmtree, work_dir, True)
        try:
            return _run(args, stack, work_dir)
        except BenchError as e:
            say(f"cannot run: {e}")
            return 1
        except KeyboardInterrupt:
            say("interrupted: everything started is being stopped")
            return 130


def _raise_open_files_limit() -> None:
    # Thousands of connections need as many descriptors in the servers we start (they
    # inherit this limit) and in the load generator.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _start_servers(args: argparse.Namespace, stack: ExitStack, work_dir: Path) -> Servers:
    urls: dict[str, str] = {}
    roots: dict[str, dict[str, int]] = {}
    alive: dict[str, Callable[[], bool]] = {}
    rabbit: GroupProcess | None = None
    if "rabbitmq" in args.targets:
        rabbit, urls["rabbitmq"] = start_rabbitmq(stack, work_dir)
    if "proxy" in args.targets:
        endpoints = start_pulsar(stack, work_dir, pulsar_settings=pulsar_settings(args.pulsar_set))
        proxy, urls["proxy"] = start_proxy(
            stack, work_dir, endpoints, args.proxy_set, code=args.proxy_code
        )
        say(f"proxy ready at {urls['proxy']}")
        roots["proxy"] = {"proxy": proxy.pid}
        if endpoints.pulsar_pid is not None:
            roots["proxy"]["pulsar"] = endpoints.pulsar_pid
        if endpoints.zookeeper_pid is not None:
            roots["proxy"]["zookeeper"] = endpoints.zookeeper_pid
        alive["proxy"] = proxy.alive
    version = None
    if rabbit is not None:
        version = wait_rabbitmq(rabbit, urls["rabbitmq"])
        say(f"RabbitMQ ready: {version}")
        roots["rabbitmq"] = {"rabbitmq": rabbit.pid}
        alive["rabbitmq"] = rabbit.alive
    return Servers(urls, version, roots, alive)


def _run(args: argparse.Namespace, stack: ExitStack, work_dir: Path) -> int:
    _raise_open_files_limit()
    # Fetched and compiled before any server starts: a failure should not cost their start.
    command = ensure_load_generator(log=say)
    servers = _start_servers(args, stack, work_dir)
    machine = machine_info(
        servers.rabbitmq_version, PULSAR_VERSION if "proxy" in servers.urls else None
    )
    say(
        f"machine: {machine['nproc']} CPUs ({machine['cpu']}), {machine['ram_gib']} GiB, "
        f"load {machine['loadavg_at_start']}"
    )
    run_id = f"{os.getpid()}-{int(time.time())}"
    if args.prime > 0:
        _prime(args, servers, command, work_dir, run_id)
    cases = plan(args.kinds, args.sizes, args.fanout_sizes)
    results: list[CaseResult] = []
    began = time.monotonic()
    total = len(cases) * len(args.targets)
    connections: list[ConnectionsResult] = []
    interrupted = False
    try:
        for index, case in enumerate(cases):
            result = CaseResult(case)
            results.append(result)
            for offset, system in enumerate(s for s in SYSTEMS if s in args.targets):
                number = index * len(args.targets) + offset + 1
                say(
                    f"[{number}/{total}] {case.label} against {system} "
                    f"({time.monotonic() - began:.0f} s so far)"
                )
                outcome = run_case(args, servers, system, case, command, work_dir, run_id, number)
                say_outcome(outcome)
                result.systems[system] = outcome
        if args.idle_connections > 0:
            for system in (s for s in SYSTEMS if s in args.targets):
                say(f"{args.idle_connections:,} idle connections against {system}")
                connections.append(run_connections(args, servers, system, command, work_dir))
    except KeyboardInterrupt:
        # A run of an hour stopped by hand still prints (and keeps) what it measured.
        interrupted = True
        say("interrupted: the figures so far follow; everything started is being stopped")
    if not interrupted:
        say(f"all cases done in {time.monotonic() - began:.0f} s")
    print()
    print(full_report(results, connections, HEARTBEAT_S))
    if args.json:
        document: dict[str, Any] = {
            "machine": machine,
            "settings": {
                k: str(v) if isinstance(v, Path) else v
                for k, v in vars(args).items()
                if k not in {"json", "work_dir"}
            },
            "cases": [r.to_json() for r in results],
            "idle_connections": [c.to_json() for c in connections],
            "interrupted": interrupted,
        }
        write_json(args.json, document)
        say(f"results written to {args.json}")
    return 130 if interrupted else 0


def _prime(
    args: argparse.Namespace,
    servers: Servers,
    command: Sequence[str],
    work_dir: Path,
    run_id: str,
) -> None:
    """One queue behind a topic exchange on each system, traffic for ``--prime`` s, not
    recorded; a failure is reported and the run goes on."""
    primed = argparse.Namespace(**vars(args))
    primed.idle, primed.warmup, primed.duration = 1.0, 1.0, args.prime
    for system in (s for s in SYSTEMS if s in args.targets):
        say(f"priming {system} for {args.prime:g} s (not recorded)")
        outcome = run_case(primed, servers, system, Case("topic", 1), command, work_dir, run_id, 0)
        if outcome.status != "ok" or outcome.detail:
            say(f"  priming {system}: {outcome.status} {outcome.detail}")


if __name__ == "__main__":
    sys.exit(main())
