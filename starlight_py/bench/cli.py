"""`python -m starlight_py.bench`: start what is needed, run every case, print one table.

Cases are run scenario by scenario, size by size, confirm mode by confirm mode, and for each
of those the targets one after the other, so the figures compared in one row group were
taken under the same conditions. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

from starlight_py.bench import report
from starlight_py.bench.churn import Churn
from starlight_py.bench.infra import (
    BenchError,
    GroupProcess,
    PulsarEndpoints,
    RssSampler,
    amqp_handshake,
    say,
    start_proxy,
    start_pulsar,
    start_rabbitmq,
    wait_rabbitmq,
    worker_pids,
)
from starlight_py.bench.runner import Case, CaseResult, Settings, Target, run_case, size_label
from starlight_py.local import PULSAR_VERSION

SCENARIOS = ("1x1", "4x4")
MODES = ("each", "pipelined")
TARGETS = ("proxy", "rabbitmq", "pulsar")
DEFAULT_SIZES = (100, 1024, 16 * 1024)
# Skip a target's remaining cases after this many timeouts in a row: it is hung.
MAX_CONSECUTIVE_TIMEOUTS = 2


class _Terminated(Exception):
    pass


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


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
    parser = argparse.ArgumentParser(
        prog="python -m starlight_py.bench",
        description=(
            "Throughput and publish-to-consume latency of the proxy, RabbitMQ and a direct "
            "pulsar-client baseline, in one run. Starts ZooKeeper + Pulsar standalone (or "
            "uses STARLIGHT_PULSAR_URL / STARLIGHT_PULSAR_WEB_URL / STARLIGHT_ZOOKEEPER), the "
            "proxy as a subprocess and a private RabbitMQ node, and stops them all at the end."
        ),
        epilog=(
            "Scenarios: NxN = N producers and N consumers on N queues (one producer and one "
            "consumer per queue). Confirm modes: 'each' = pika BlockingConnection, every "
            "publish waits for its confirm (direct: producer.send()); 'pipelined' = aio-pika, "
            "--window publishes then await all their confirms (direct: send_async, same "
            "batches). Consumers: manual ack of every message, prefetch --prefetch. Needs "
            "pika and aio-pika: pip install -e '.[test]'."
        ),
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=10000,
        help="measured messages per case, split among the producers (default: 10000)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=4.0,
        help="producers stop after this many seconds even if --messages are not all sent; "
        "0 = no cap (default: 4)",
    )
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=list(DEFAULT_SIZES),
        help="body sizes (default: 100,1KiB,16KiB)",
    )
    parser.add_argument(
        "--scenarios", type=_choices(SCENARIOS), default=list(SCENARIOS), help="default: 1x1,4x4"
    )
    parser.add_argument(
        "--modes",
        type=_choices(MODES),
        default=list(MODES),
        help="publisher confirm modes (default: each,pipelined)",
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
        help="pipelined mode: confirms awaited per batch of this many (default: 100)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="each producer publishes at most this many msg/s (0 = as fast as confirms "
        "allow, the default). At a fixed rate the proxy's CPU per message compares two "
        "builds more steadily than throughput does (docs/performance.md)",
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        default=200,
        help="consumer prefetch (basic.qos) / Pulsar receiver queue (default: 200)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=20,
        help="unmeasured messages each producer sends first (default: 20)",
    )
    parser.add_argument(
        "--prime",
        type=float,
        default=6.0,
        metavar="SECONDS",
        help="before the measured cases, send unrecorded traffic to each target for this "
        "long (1x1, 1KiB, pipelined): warms Pulsar's JIT, which otherwise penalises whichever "
        "target runs first (default: 6; 0 = no priming)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds after which a case is stopped and reported as timeout (default: 60)",
    )
    parser.add_argument(
        "--direct-logger",
        choices=("file", "python"),
        default="file",
        help="logger of the direct pulsar-client baseline: 'file' = pulsar.FileLogger at "
        "Warn (filtered in C++, the fast setup; default) or 'python' = a logging.Logger at "
        "WARNING, as the proxy passes one (every client DEBUG line then takes the GIL)",
    )
    parser.add_argument(
        "--direct-batching",
        choices=("off", "on"),
        default="off",
        help="producer batching of the direct pulsar-client baseline: 'off' = the proxy's "
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
        "--proxy-workers",
        type=int,
        default=1,
        metavar="N",
        help="run the proxy as `serve --workers N` (default: 1); CPU counts every worker, "
        "RSS is worker 0's",
    )
    parser.add_argument(
        "--proxy-set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="extra --set for the proxy (repeatable), e.g. logLevel=WARNING",
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


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (0 even when some cases failed: they are in the
    table; 1 when nothing could be measured, 2 for bad arguments)."""
    args = build_parser().parse_args(argv)
    if args.soak is not None and args.soak <= 0:
        print("--soak needs a positive number of seconds", file=sys.stderr)
        return 2
    if args.rate < 0:
        print("--rate needs 0 or more msg/s", file=sys.stderr)
        return 2
    if args.soak_churn < 0 or (args.soak_churn and args.soak is None):
        print("--soak-churn needs --soak and a rate of 0 or more", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _main(args)
    except (KeyboardInterrupt, _Terminated):
        say("interrupted: everything started has been stopped")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(args: argparse.Namespace) -> int:
    with ExitStack() as stack:
        if args.work_dir is not None:
            work_dir: Path = args.work_dir.resolve()
            work_dir.mkdir(parents=True, exist_ok=True)
        else:
            work_dir = Path(tempfile.mkdtemp(prefix="starlight-bench-"))
        if not args.keep and args.work_dir is None:
            stack.callback(shutil.rmtree, work_dir, True)
        else:
            say(f"logs and data stay in {work_dir}")
        try:
            return _run(args, stack, work_dir)
        except BenchError as e:
            say(f"cannot run: {e}")
            return 1


def _run(args: argparse.Namespace, stack: ExitStack, work_dir: Path) -> int:
    targets: list[str] = ["proxy"] if args.soak else list(args.targets)
    notes: list[str] = []

    rabbit_url: str | None = None
    rabbit_server: GroupProcess | None = None
    rabbit_version: str | None = None
    if "rabbitmq" in targets:
        if args.rabbitmq_url:
            rabbit_url = args.rabbitmq_url
        else:
            try:
                rabbit_server, rabbit_url = start_rabbitmq(stack, work_dir)
            except BenchError as e:
                note = f"RabbitMQ skipped: {e}"
                say(note)
                notes.append(note)
                targets.remove("rabbitmq")

    endpoints: PulsarEndpoints | None = None
    if "proxy" in targets or "pulsar" in targets:
        endpoints = start_pulsar(stack, work_dir)

    if "rabbitmq" in targets and rabbit_url is not None:
        try:
            if rabbit_server is not None:
                rabbit_version = wait_rabbitmq(rabbit_server, rabbit_url)
            else:
                rabbit_version = amqp_handshake(rabbit_url)
            say(f"RabbitMQ ready: {rabbit_version} at {rabbit_url}")
        except Exception as e:
            note = f"RabbitMQ skipped: cannot start or reach it: {e}"
            say(note)
            notes.append(note)
            targets.remove("rabbitmq")
            if rabbit_server is not None:
                rabbit_server.stop()

    proxy: GroupProcess | None = None
    proxy_url = ""
    proxy_pids: dict[str, int] = {}
    sampler: RssSampler | None = None
    cprofile_out: Path | None = None
    if "proxy" in targets:
        assert endpoints is not None
        if args.profile == "cprofile":
            args.profile_out.mkdir(parents=True, exist_ok=True)
            cprofile_out = args.profile_out.resolve() / "proxy.cprofile"
        proxy, proxy_url = start_proxy(
            stack,
            work_dir,
            endpoints,
            args.proxy_set,
            cprofile_out=cprofile_out,
            workers=args.proxy_workers,
        )
        proxy_pids = {"proxy": proxy.pid}
        if args.proxy_workers > 1:
            workers = worker_pids(proxy.pid, args.proxy_workers)
            proxy_pids = {f"proxy{i}": pid for i, pid in enumerate(workers)}
        say(f"proxy ready at {proxy_url} (pids {sorted(proxy_pids.values())})")
        sampler = RssSampler(min(proxy_pids.values())).start()
        stack.callback(sampler.stop)
        if args.profile == "py-spy":
            _start_py_spy(stack, args.profile_out, proxy.pid)

    pulsar_processes = (
        {"pulsar": endpoints.pulsar_pid} if endpoints and endpoints.pulsar_pid else {}
    )
    target_objects: dict[str, Target] = {}
    if proxy is not None:
        target_objects["proxy"] = Target(
            "proxy", "amqp", proxy_url, {**proxy_pids, **pulsar_processes}, proxy.alive
        )
    if "rabbitmq" in targets and rabbit_url is not None:
        rabbit_processes = {"rabbitmq": rabbit_server.pid} if rabbit_server else {}
        target_objects["rabbitmq"] = Target("rabbitmq", "amqp", rabbit_url, rabbit_processes)
    if "pulsar" in targets and endpoints is not None:
        target_objects["pulsar"] = Target(
            "pulsar", "pulsar", endpoints.service_url, pulsar_processes
        )
    if not target_objects:
        say("no target could be started: nothing to measure")
        return 1

    machine = report.machine_info(
        rabbit_version, PULSAR_VERSION if endpoints and endpoints.pulsar_pid else None
    )
    say(
        f"machine: {machine['nproc']} CPUs ({machine['cpu']}), {machine['ram_gib']} GiB, "
        f"Python {machine['python']}, {machine['java']}, load {machine['loadavg_at_start']}"
    )
    settings = Settings(
        messages=args.messages,
        duration=args.duration,
        warmup=args.warmup,
        window=args.window,
        prefetch=args.prefetch,
        timeout=args.timeout,
        run_id=f"{os.getpid()}-{int(time.time())}",
        work_dir=work_dir,
        rate=args.rate,
        pulsar_logger=args.direct_logger,
        pulsar_batching=args.direct_batching == "on",
    )
    document: dict[str, Any] = {
        "machine": machine,
        "settings": {
            k: v for k, v in vars(args).items() if k not in {"json", "profile_out", "work_dir"}
        },
        "notes": notes,
    }

    if args.soak:
        assert sampler is not None and proxy is not None
        document["soak"] = _soak(args, target_objects["proxy"], settings, sampler)
    else:
        results = _cases(args, target_objects, settings, sampler)
        document["results"] = [r.to_json() for r in results]
        print()
        print(report.table(results))
        print()
        for line in report.problems(results):
            print(f"note: {line}")
        for note in notes:
            print(f"note: {note}")
    if sampler is not None:
        rss = _rss_summary(sampler)
        document["proxy_rss_kib"] = rss
        print(
            f"proxy RSS: start {rss['start'] / 1024:.1f} MiB, max {rss['max'] / 1024:.1f} MiB, "
            f"end {rss['end'] / 1024:.1f} MiB ({len(sampler.samples)} samples, 1 s apart)"
        )
    if proxy is not None and args.profile:
        sampler_stop = sampler.stop if sampler is not None else None
        if sampler_stop is not None:
            sampler_stop()
        stack.close()  # stops py-spy (it writes its file), then the proxy (cProfile writes)
        document["profile"] = _profile_summary(args.profile, args.profile_out, cprofile_out)
    if args.json:
        report.write_json(args.json, document)
        say(f"results written to {args.json}")
    return 0


def _cases(
    args: argparse.Namespace,
    targets: dict[str, Target],
    settings: Settings,
    sampler: RssSampler | None,
) -> list[CaseResult]:
    cases = [
        Case(scenario, size, mode, target)
        for scenario in args.scenarios
        for size in args.sizes
        for mode in args.modes
        for target in TARGETS
        if target in targets
    ]
    results: list[CaseResult] = []
    timeouts: Counter[str] = Counter()
    began = time.monotonic()
    if args.prime > 0:
        prime = replace(settings, messages=10**7, duration=args.prime, progress_every=60.0)
        for name, target in targets.items():
            say(f"priming {name} for {args.prime:g} s (not recorded)")
            primed = run_case(Case("1x1", 1024, "pipelined", name), target, prime, 0)
            if primed.status != "ok":
                say(f"  priming {name}: {primed.status} {primed.detail}")
    for index, case in enumerate(cases, 1):
        target = targets[case.target]
        if timeouts[case.target] >= MAX_CONSECUTIVE_TIMEOUTS:
            results.append(CaseResult.of(case, "skipped", "target timed out twice in a row"))
            continue
        if target.process_alive is not None and not target.process_alive():
            results.append(CaseResult.of(case, "skipped", f"{target.name} is not running"))
            continue
        say(f"[{index}/{len(cases)}] {case.label()} ({time.monotonic() - began:.0f} s so far)")
        started = time.monotonic()
        result = run_case(case, target, settings, index)
        if sampler is not None and case.target == "proxy":
            result.proxy_rss_max_kib = sampler.max_between(started, time.monotonic())
        timeouts[case.target] = timeouts[case.target] + 1 if result.status == "timeout" else 0
        say(
            f"  -> {result.status}: {result.msgs_per_s or '-'} msg/s, p50 {result.p50_ms} ms, "
            f"p99 {result.p99_ms} ms, {result.received}/{result.sent} consumed"
            + (f" ({result.detail})" if result.detail else "")
        )
        results.append(result)
    say(f"all cases done in {time.monotonic() - began:.0f} s")
    return results


def _soak(
    args: argparse.Namespace, target: Target, settings: Settings, sampler: RssSampler
) -> dict[str, Any]:
    seconds: float = args.soak
    rate: float = args.soak_rate
    soak_settings = replace(
        settings,
        messages=int(rate * seconds) + 1,
        duration=seconds,
        rate=rate,
        timeout=seconds + 90,
        progress_every=10 * seconds,  # the soak prints its own lines
    )
    case = Case("1x1", args.soak_size, args.soak_mode, "proxy")
    say(
        f"soak: {seconds:g} s at {rate:g} msg/s, {size_label(case.size)} bodies, confirms "
        f"{case.mode}, through the proxy (pid {sampler.pid})"
    )
    marks: dict[str, float] = {"next": 0.0, "go": 0.0}

    def tick(elapsed: float, consumed: int) -> None:
        if marks["go"] == 0.0:
            marks["go"] = time.monotonic() - elapsed
        if elapsed >= marks["next"]:
            marks["next"] += 10.0
            kib = sampler.samples[-1][1] if sampler.samples else 0
            say(f"soak t={elapsed:5.0f} s  proxy RSS {kib / 1024:7.1f} MiB  consumed {consumed}")

    churn = Churn(target.url, args.soak_churn) if args.soak_churn > 0 else None
    if churn is not None:
        say(f"soak: plus {args.soak_churn:g} short-lived connections per second ({churn.queue})")
        churn.start()
    try:
        result = run_case(case, target, soak_settings, 1, tick)
    finally:
        churned = churn.stop() if churn is not None else None
    go = marks["go"] or time.monotonic()
    run = [(t - go, kib) for t, kib in sampler.samples if t >= go]
    half = [(t, kib) for t, kib in run if t >= seconds / 2]
    whole_slope = report.slope_kib_per_min(run)
    half_slope = report.slope_kib_per_min(half)
    values = [kib for _, kib in run] or [0]
    summary = {
        "seconds": seconds,
        "rate": rate,
        "size": case.size,
        "mode": case.mode,
        "result": result.to_json(),
        "rss_start_kib": values[0],
        "rss_max_kib": max(values),
        "rss_end_kib": values[-1],
        "slope_kib_per_min": whole_slope,
        "slope_second_half_kib_per_min": half_slope,
        "samples": run,
        "churn": churned.to_json() if churned is not None else None,
    }
    say(
        f"soak done: {result.status}, {result.received}/{result.sent} consumed, "
        f"{result.msgs_per_s} msg/s, p50 {result.p50_ms} ms, p99 {result.p99_ms} ms"
    )
    say(
        f"soak RSS: start {values[0] / 1024:.1f} MiB, max {max(values) / 1024:.1f} MiB, "
        f"end {values[-1] / 1024:.1f} MiB; slope {_fmt_slope(whole_slope)} over the whole "
        f"run, {_fmt_slope(half_slope)} over the second half"
    )
    if churned is not None:
        say(
            f"soak churn: {churned.cycles} connections in {churned.seconds:.0f} s "
            f"({churned.exclusive_queues} with an exclusive queue), {churned.lost} messages "
            f"lost, {churned.failures} failed cycles"
            + (f" (last: {churned.last_failure})" if churned.failures else "")
        )
    return summary


def _fmt_slope(slope: float | None) -> str:
    return "n/a" if slope is None else f"{slope:+.1f} KiB/min"


def _rss_summary(sampler: RssSampler) -> dict[str, int]:
    values = [kib for _, kib in sampler.samples] or [0]
    return {"start": values[0], "max": max(values), "end": values[-1]}


# --- profiling ---------------------------------------------------------------------------


def _start_py_spy(stack: ExitStack, out_dir: Path, pid: int) -> None:
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        raise BenchError("--profile py-spy: py-spy is not on PATH (pip install py-spy)")
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir.resolve() / "proxy.py-spy.txt"
    argv = [py_spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "200"]
    argv += ["--output", str(output), "--nonblocking"]
    spy = GroupProcess("py-spy", argv, out_dir.resolve() / "py-spy.log")
    spy.start()
    say(f"py-spy is sampling the proxy into {output}")

    def stop() -> None:
        # py-spy writes its file on SIGINT; SIGTERM would lose it.
        if spy.popen is not None and spy.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(spy.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.popen.wait(30)
        spy.stop(5)

    stack.callback(stop)


def _profile_summary(kind: str, out_dir: Path, cprofile_out: Path | None) -> list[str]:
    if kind == "cprofile":
        assert cprofile_out is not None
        return _cprofile_summary(cprofile_out)
    return _py_spy_summary(out_dir.resolve() / "proxy.py-spy.txt")


def _cprofile_summary(path: Path) -> list[str]:
    if not path.exists():
        say(f"no cProfile output at {path} (did the proxy exit cleanly?)")
        return []
    text_path = path.with_suffix(".txt")
    with text_path.open("w") as out:
        stats = pstats.Stats(str(path), stream=out)
        stats.sort_stats("cumulative").print_stats(40)
        stats.sort_stats("tottime").print_stats(40)
    rows: list[tuple[float, float, int, str]] = []
    raw: dict[Any, Any] = getattr(pstats.Stats(str(path)), "stats")  # noqa: B009
    for (filename, line, function), (_cc, calls, tottime, cumtime, _callers) in raw.items():
        where = f"{_short(filename)}:{line}({function})"
        if not _is_entry(where):
            rows.append((cumtime, tottime, calls, where))
    rows.sort(reverse=True)
    lines = [f"{'cumtime s':>10} {'tottime s':>10} {'calls':>9}  function"]
    lines += [f"{c:10.2f} {t:10.2f} {n:9d}  {w}" for c, t, n, w in rows[:25]]
    print(
        f"\nproxy cProfile (main thread; entry frames left out), top 25 by cumulative time; "
        f"full: {text_path}"
    )
    print("\n".join(lines))
    return lines


# Entry frames every sample or call passes through: they say nothing about the hot path.
_ENTRY_FRAMES = (
    "<frozen runpy>",
    "<frozen importlib",
    "builtins.exec>",
    "<string>:1(<module>)",
    "starlight_py/__main__.py",
    "starlight_py/cli.py",
    "run (trio/_core/_run.py)",
    "trio/_core/_run.py:2424(run)",
)


def _is_entry(where: str) -> bool:
    return any(marker in where for marker in _ENTRY_FRAMES)


def _short(filename: str) -> str:
    for marker in ("site-packages/", "starlight_py/", "lib/python3"):
        if marker in filename:
            return filename[filename.index(marker) :]
    return filename


def _py_spy_summary(path: Path) -> list[str]:
    if not path.exists():
        say(f"no py-spy output at {path}")
        return []
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not stack_text or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_frame(f) for f in stack_text.split(";") if f]
        for frame in set(frames):
            inclusive[frame] += count
        if frames:
            own[frames[-1]] += count
    if total == 0:
        return []
    lines = [f"py-spy: {total} samples (all threads, idle excluded)", "inclusive %  function"]
    top = [(f, n) for f, n in inclusive.most_common() if not _is_entry(f)][:25]
    lines += [f"{100 * n / total:10.1f}  {f}" for f, n in top]
    lines += ["self %       function"]
    lines += [f"{100 * n / total:10.1f}  {f}" for f, n in own.most_common(25)]
    print("\nproxy py-spy profile")
    print("\n".join(lines))
    return lines


def _frame(text: str) -> str:
    # "function (path/to/file.py:123)" -> "function (file path shortened)"; line dropped so
    # one function is one row.
    name, _, where = text.partition(" (")
    filename = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({_short(filename)})"
