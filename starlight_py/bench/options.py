"""The command line of ``python -m starlight_py.bench``, and the options whose meaning
depends on the suite (``--duration``, ``--warmup``, ``--scenarios``)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from starlight_py.bench.infra import add_pulsar_set
from starlight_py.bench.load_result import SCENARIOS as JAVA_SCENARIOS

CLIENTS = ("java", "python")
SCENARIOS = ("1x1", "4x4")
MODES = ("each", "pipelined")
TARGETS = ("proxy", "rabbitmq", "pulsar")
DEFAULT_SIZES = (100, 1024, 16 * 1024)
# --clients java: measured window and warm-up in seconds; --quick for smoke runs.
JAVA_DURATION, JAVA_WARMUP = 30, 10
QUICK_DURATION, QUICK_WARMUP = 5, 2
# Before the first case, each target is primed this long (s): see --prime.
JAVA_PRIME, PYTHON_PRIME = 20.0, 6.0
# --clients python: producers' time cap in seconds, unmeasured messages per producer.
PYTHON_DURATION, PYTHON_WARMUP = 4.0, 20


def _size(text: str) -> int:
    value = text.strip().lower().removesuffix("b")
    for suffix, factor in (("ki", 1024), ("k", 1024), ("mi", 1024 * 1024), ("m", 1024 * 1024)):
        if value.endswith(suffix):
            return int(float(value.removesuffix(suffix)) * factor)
    return int(value)


def _choices(allowed: Sequence[str]) -> Any:
    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        bad = [item for item in items if item not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"choose from {', '.join(allowed)} (comma-separated), not {text!r}"
            )
        return items

    return parse


def _sizes(text: str) -> list[int]:
    try:
        return [_size(item) for item in text.split(",") if item.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"sizes like 100,1KiB,16KiB: {e}") from e


def build_parser() -> argparse.ArgumentParser:
    """The parser; ``resolve_suite_options`` completes what it parsed."""
    parser = argparse.ArgumentParser(
        prog="python -m starlight_py.bench",
        description=(
            "Throughput, latency and CPU per message of the proxy, RabbitMQ and Pulsar, in "
            "one run. Starts ZooKeeper + Pulsar standalone (or uses STARLIGHT_PULSAR_URL / "
            "STARLIGHT_PULSAR_WEB_URL / STARLIGHT_ZOOKEEPER), the proxy as a subprocess and a "
            "private RabbitMQ node, and stops them all at the end."
        ),
        epilog=(
            "--clients java (default): RabbitMQ PerfTest (fetched once with Maven into the "
            "cache folder) against the proxy and RabbitMQ, pulsar-perf against Pulsar; 1 KiB "
            "persistent messages, confirm window 100, multi-ack every 50, prefetch 200 unless "
            "a scenario says otherwise. Scenarios: 1p1c = 1 producer, 1 consumer, 1 queue; "
            "4p4c = 4 of each on 4 queues, one producer and one consumer per queue; 1p1c-300 = "
            "1p1c at 300 msg/s; 1p1c-fanout = 1p1c through a fanout exchange PerfTest declares "
            "just before it publishes; 1p4c-work = a work queue, 1 producer and 4 consumers on "
            "1 queue, prefetch 10; 1p10c-fanout = 1 producer, a fanout exchange bound to 10 "
            "queues, 1 consumer per queue (msg/s counts deliveries). pulsar-perf has no "
            "counterpart of 1p4c-work and 1p10c-fanout here: their pulsar rows are skipped. "
            "--clients python: NxN = N producers and N consumers on N queues (one producer "
            "and one consumer per queue). Confirm modes: 'each' = pika BlockingConnection, "
            "every publish waits for its confirm (direct: producer.send()); 'pipelined' = "
            "aio-pika, --window publishes then await all their confirms (direct: send_async, "
            "same batches). Consumers: manual ack of every message, prefetch --prefetch. "
            "Needs pika and aio-pika: pip install -e '.[test]'. Options marked (python) "
            "apply to --clients python and --soak only."
        ),
    )
    parser.add_argument(
        "--clients",
        choices=CLIENTS,
        default="java",
        help="java = PerfTest and pulsar-perf, the targets table (default); python = pika, "
        "aio-pika and pulsar-client workers, by body size and confirm mode",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"(java) a smoke run: measure {QUICK_DURATION} s after {QUICK_WARMUP} s of "
        "warm-up (explicit --duration / --warmup win)",
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=10000,
        help="(python) measured messages per case, split among the producers (default: 10000)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        help=f"(java) seconds measured per case (default: {JAVA_DURATION}; pulsar-perf "
        "rounds up to its 10 s reports). (python) producers stop after this many seconds "
        f"even if --messages are not all sent; 0 = no cap (default: {PYTHON_DURATION:g})",
    )
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=list(DEFAULT_SIZES),
        help="(python) body sizes (default: 100,1KiB,16KiB)",
    )
    parser.add_argument(
        "--scenarios",
        type=_choices((*JAVA_SCENARIOS, *SCENARIOS)),
        help=f"(java) {','.join(JAVA_SCENARIOS)} (the default); (python) "
        f"{','.join(SCENARIOS)} (the default)",
    )
    parser.add_argument(
        "--modes",
        type=_choices(MODES),
        default=list(MODES),
        help="(python) publisher confirm modes (default: each,pipelined)",
    )
    parser.add_argument(
        "--targets",
        type=_choices(TARGETS),
        default=list(TARGETS),
        help="default: proxy,rabbitmq,pulsar",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=100,
        help="(python) pipelined mode: confirms awaited per batch of this many (default: 100)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="(python) each producer publishes at most this many msg/s (0 = as fast as confirms "
        "allow, the default). At a fixed rate the proxy's CPU per message compares two "
        "builds more steadily than throughput does (docs/performance.md)",
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        default=200,
        help="(python) consumer prefetch (basic.qos) / Pulsar receiver queue (default: 200)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        help=f"(java) seconds of unmeasured traffic before the window (default: {JAVA_WARMUP}; "
        "pulsar-perf rounds up to its 10 s reports). (python) unmeasured messages each "
        f"producer sends first (default: {PYTHON_WARMUP})",
    )
    parser.add_argument(
        "--prime",
        type=float,
        metavar="SECONDS",
        help="before the measured cases, send unrecorded traffic to each target for this long "
        "(one producer, one consumer, 1 KiB): warms Pulsar's JIT, which otherwise penalises "
        f"whichever target runs first (default: {JAVA_PRIME} with --clients java, pulsar-perf "
        f"rounding up to its 10 s reports; {PYTHON_PRIME} with python; 0 = no priming)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="(java) run every case N times, round after round, and judge the median round "
        "of each (default: 1). This machine's speed drifts between runs of the same build; "
        "every round is printed and kept in --json",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="(python) seconds after which a case is stopped and reported as timeout (default: 60)",
    )
    parser.add_argument(
        "--direct-logger",
        choices=("file", "python"),
        default="file",
        help="(python) logger of the direct pulsar-client baseline: 'file' = pulsar.FileLogger at "
        "Warn (filtered in C++, the fast setup; default) or 'python' = a logging.Logger at "
        "WARNING, as the proxy passes one (every client DEBUG line then takes the GIL)",
    )
    parser.add_argument(
        "--direct-batching",
        choices=("off", "on"),
        default="off",
        help="(python) producer batching of the direct pulsar-client baseline: 'off' = the proxy's "
        "own producer settings and pulsar-client's default (default), 'on' = batches of up "
        "to 1 ms",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write all results here")
    parser.add_argument(
        "--rabbitmq-url",
        metavar="URL",
        help="use this RabbitMQ (amqp://...) instead of starting a private node",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="run the proxy and pulsar-perf against a local Pulsar cluster of 2 brokers and "
        "3 bookies (ensemble 3, write and ack quorum 2) instead of Pulsar standalone; "
        "Pulsar's CPU is every broker's and bookie's",
    )
    parser.add_argument(
        "--proxy-workers",
        type=int,
        default=1,
        metavar="N",
        help="run the proxy as `serve --workers N` (default: 1); CPU counts every worker, "
        "RSS is worker 0's",
    )
    parser.add_argument(
        "--proxy-code",
        type=Path,
        metavar="DIR",
        help="run the proxy from another checkout (its top folder, holding starlight_py/): "
        "compare two builds on the same machine, e.g. a `git worktree` of an older commit",
    )
    parser.add_argument(
        "--proxy-set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="extra --set for the proxy (repeatable), e.g. logLevel=WARNING",
    )
    add_pulsar_set(
        parser,
        ", e.g. managedLedgerNewEntriesCheckDelayInMillis=10: compare broker settings in one "
        "run's conditions",
    )
    parser.add_argument(
        "--profile",
        choices=("cprofile", "py-spy"),
        help="profile the proxy: run it under cProfile (main thread), or attach py-spy "
        "(every thread, needs py-spy on PATH); a summary is printed at the end",
    )
    parser.add_argument(
        "--profile-out",
        type=Path,
        default=Path("bench-profile"),
        help="folder for the profile files (default: ./bench-profile)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="where servers keep data and logs (default: a temporary folder, removed at "
        "the end unless --keep)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder and logs")
    soak = parser.add_argument_group("soak (memory flatness of the proxy)")
    soak.add_argument(
        "--soak",
        type=float,
        metavar="SECONDS",
        help="instead of the cases: 1 producer -> 1 consumer through the proxy at "
        "--soak-rate for SECONDS, printing the proxy's RSS every 10 s and the slope",
    )
    soak.add_argument("--soak-rate", type=float, default=100.0, help="msg/s (default: 100)")
    soak.add_argument("--soak-size", type=_size, default=1024, help="body size (default: 1KiB)")
    soak.add_argument("--soak-mode", choices=MODES, default="each", help="default: each")
    soak.add_argument(
        "--soak-churn",
        type=float,
        default=0.0,
        metavar="PER_SECOND",
        help="also open and close this many short-lived connections per second during the "
        "soak (each: a publish with confirm, a basic.get and ack; every tenth also a reply "
        "through an exclusive queue), counting messages that do not come back (default: 0)",
    )
    return parser


def resolve_suite_options(args: argparse.Namespace) -> str | None:
    """Fill in the options whose meaning depends on the suite; returns what is wrong with
    them, or None."""
    java = args.clients == "java" and args.soak is None
    allowed = JAVA_SCENARIOS if java else SCENARIOS
    if args.scenarios is None:
        args.scenarios = list(allowed)
    wrong = [s for s in args.scenarios if s not in allowed]
    if wrong:
        suite = "--clients java" if java else "--clients python and --soak"
        return f"{suite} takes --scenarios from {','.join(allowed)}, not {','.join(wrong)}"
    if not java:
        args.duration = PYTHON_DURATION if args.duration is None else args.duration
        args.warmup = PYTHON_WARMUP if args.warmup is None else int(args.warmup)
        args.prime = PYTHON_PRIME if args.prime is None else args.prime
        return None
    if args.prime is None:
        args.prime = 0.0 if args.quick else JAVA_PRIME
    if args.repeat < 1:
        return "--repeat needs 1 or more"
    if args.duration is None:
        args.duration = QUICK_DURATION if args.quick else JAVA_DURATION
    if args.warmup is None:
        args.warmup = QUICK_WARMUP if args.quick else JAVA_WARMUP
    if args.duration < 1 or args.warmup < 1:
        return "--clients java needs --duration and --warmup of 1 second or more"
    # The load generators count whole seconds.
    args.duration, args.warmup = math.ceil(args.duration), math.ceil(args.warmup)
    return None
