"""`python -m starlight_py.bench`: start what is needed, run every case, print one table.

Two suites. The default (``--clients java``, ``java_suite``): RabbitMQ PerfTest against the
proxy and RabbitMQ, ``pulsar-perf`` against Pulsar, CPU per message of each server from
/proc, and the performance targets (docs/performance.md) met or missed. ``--clients python``
(``runner``): pika / aio-pika / pulsar-client workers, by body size and confirm mode.

Cases are run scenario by scenario (and for the Python clients size by size, confirm mode
by confirm mode), and for each of those the targets one after the other, so the figures
compared in one row group were taken under the same conditions. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

from starlight_py.bench import java_report, report
from starlight_py.bench.infra import (
    BenchError,
    GroupProcess,
    PulsarEndpoints,
    RssSampler,
    amqp_handshake,
    pulsar_settings,
    say,
    start_proxy,
    start_pulsar,
    start_rabbitmq,
    wait_rabbitmq,
    worker_pids,
)
from starlight_py.bench.java_suite import (
    SuiteServers,
    SuiteSettings,
    median_rows,
    round_lines,
    run_suite,
)
from starlight_py.bench.options import TARGETS, build_parser, resolve_suite_options
from starlight_py.bench.perftest_install import ensure_perftest, perftest_command
from starlight_py.bench.profiling import profile_summary, start_py_spy
from starlight_py.bench.runner import Case, CaseResult, Settings, Target, run_case
from starlight_py.bench.soak import run_soak
from starlight_py.bench.targets import verdicts
from starlight_py.local import (
    PULSAR_VERSION,
    LocalInfraError,
    ensure_pulsar_distribution,
    find_java,
)

# Skip a target's remaining cases after this many timeouts in a row: it is hung.
MAX_CONSECUTIVE_TIMEOUTS = 2


class _Terminated(Exception):
    pass


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (0 even when some cases failed: they are in the
    table; 1 when nothing could be measured, 2 for bad arguments)."""
    args = build_parser().parse_args(argv)
    problem = resolve_suite_options(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
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


def _java_tools() -> tuple[list[str], Path]:
    """PerfTest's command line and Pulsar's distribution (for bin/pulsar-perf), fetched
    the first time. Raises BenchError."""
    try:
        command = perftest_command(ensure_perftest(log=say), find_java())
        return command, ensure_pulsar_distribution(log=say)
    except LocalInfraError as e:
        raise BenchError(str(e)) from e


@dataclass
class _Servers:
    """What `_run` started (or reached) for the targets still in the run."""

    targets: list[str]
    notes: list[str] = field(default_factory=list)
    rabbit_url: str | None = None
    rabbit_server: GroupProcess | None = None
    rabbit_version: str | None = None
    endpoints: PulsarEndpoints | None = None
    proxy: GroupProcess | None = None
    proxy_url: str = ""
    proxy_pids: dict[str, int] = field(default_factory=dict)
    sampler: RssSampler | None = None
    cprofile_out: Path | None = None

    def skip_rabbitmq(self, note: str) -> None:
        say(note)
        self.notes.append(note)
        self.targets.remove("rabbitmq")


def _run(args: argparse.Namespace, stack: ExitStack, work_dir: Path) -> int:
    servers = _Servers(["proxy"] if args.soak else list(args.targets))
    # Fetched before any server starts: a fetch that fails should not cost their start-up.
    java_tools = _java_tools() if args.clients == "java" and not args.soak else None
    _launch_rabbitmq(args, stack, work_dir, servers)
    if "proxy" in servers.targets or "pulsar" in servers.targets:
        servers.endpoints = start_pulsar(
            stack, work_dir, cluster=args.cluster, pulsar_settings=pulsar_settings(args.pulsar_set)
        )
    _await_rabbitmq(servers)
    if "proxy" in servers.targets:
        _start_proxy(args, stack, work_dir, servers)
    target_objects = _target_objects(servers)
    if not target_objects:
        say("no target could be started: nothing to measure")
        return 1
    endpoints = servers.endpoints
    machine = report.machine_info(
        servers.rabbit_version, PULSAR_VERSION if endpoints and endpoints.pulsar_pid else None
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
        "notes": servers.notes,
    }
    _measure(args, servers, target_objects, java_tools, settings, document)
    _finish(args, stack, servers, document)
    return 0


def _launch_rabbitmq(
    args: argparse.Namespace, stack: ExitStack, work_dir: Path, servers: _Servers
) -> None:
    """Start a private RabbitMQ node (not waiting for it), unless one is given by URL."""
    if "rabbitmq" not in servers.targets:
        return
    if args.rabbitmq_url:
        servers.rabbit_url = args.rabbitmq_url
        return
    try:
        servers.rabbit_server, servers.rabbit_url = start_rabbitmq(stack, work_dir)
    except BenchError as e:
        servers.skip_rabbitmq(f"RabbitMQ skipped: {e}")


def _await_rabbitmq(servers: _Servers) -> None:
    if "rabbitmq" not in servers.targets or servers.rabbit_url is None:
        return
    try:
        if servers.rabbit_server is not None:
            servers.rabbit_version = wait_rabbitmq(servers.rabbit_server, servers.rabbit_url)
        else:
            servers.rabbit_version = amqp_handshake(servers.rabbit_url)
        say(f"RabbitMQ ready: {servers.rabbit_version} at {servers.rabbit_url}")
    except Exception as e:
        servers.skip_rabbitmq(f"RabbitMQ skipped: cannot start or reach it: {e}")
        if servers.rabbit_server is not None:
            servers.rabbit_server.stop()


def _start_proxy(
    args: argparse.Namespace, stack: ExitStack, work_dir: Path, servers: _Servers
) -> None:
    assert servers.endpoints is not None
    if args.profile == "cprofile":
        args.profile_out.mkdir(parents=True, exist_ok=True)
        servers.cprofile_out = args.profile_out.resolve() / "proxy.cprofile"
    proxy, servers.proxy_url = start_proxy(
        stack,
        work_dir,
        servers.endpoints,
        args.proxy_set,
        cprofile_out=servers.cprofile_out,
        workers=args.proxy_workers,
        code=args.proxy_code,
    )
    servers.proxy = proxy
    servers.proxy_pids = {"proxy": proxy.pid}
    if args.proxy_workers > 1:
        workers = worker_pids(proxy.pid, args.proxy_workers)
        servers.proxy_pids = {f"proxy{i}": pid for i, pid in enumerate(workers)}
    say(f"proxy ready at {servers.proxy_url} (pids {sorted(servers.proxy_pids.values())})")
    servers.sampler = RssSampler(min(servers.proxy_pids.values())).start()
    stack.callback(servers.sampler.stop)
    if args.profile == "py-spy":
        start_py_spy(stack, args.profile_out, proxy.pid)


def _target_objects(servers: _Servers) -> dict[str, Target]:
    endpoints = servers.endpoints
    pulsar_processes = (
        {"pulsar": endpoints.pulsar_pid} if endpoints and endpoints.pulsar_pid else {}
    )
    found: dict[str, Target] = {}
    if servers.proxy is not None:
        found["proxy"] = Target(
            "proxy",
            "amqp",
            servers.proxy_url,
            {**servers.proxy_pids, **pulsar_processes},
            servers.proxy.alive,
        )
    if "rabbitmq" in servers.targets and servers.rabbit_url is not None:
        rabbit = servers.rabbit_server
        found["rabbitmq"] = Target(
            "rabbitmq", "amqp", servers.rabbit_url, {"rabbitmq": rabbit.pid} if rabbit else {}
        )
    if "pulsar" in servers.targets and endpoints is not None:
        found["pulsar"] = Target("pulsar", "pulsar", endpoints.service_url, pulsar_processes)
    return found


def _measure(
    args: argparse.Namespace,
    servers: _Servers,
    target_objects: dict[str, Target],
    java_tools: tuple[list[str], Path] | None,
    settings: Settings,
    document: dict[str, Any],
) -> None:
    proxy = servers.proxy
    endpoints = servers.endpoints
    if args.soak:
        assert servers.sampler is not None and proxy is not None
        document["soak"] = run_soak(args, target_objects["proxy"], settings, servers.sampler)
    elif java_tools is not None:
        suite_servers = SuiteServers(
            proxy_url=servers.proxy_url if proxy is not None else None,
            proxy_pid=proxy.pid if proxy is not None else None,
            proxy_workers=args.proxy_workers,
            proxy_alive=proxy.alive if proxy is not None else None,
            rabbitmq_url=servers.rabbit_url if "rabbitmq" in servers.targets else None,
            rabbitmq_pid=servers.rabbit_server.pid if servers.rabbit_server is not None else None,
            pulsar_service_url=endpoints.service_url if endpoints else None,
            pulsar_web_url=endpoints.web_url if endpoints else None,
            pulsar_pid=endpoints.pulsar_pid if endpoints else None,
        )
        _java_suite(args, java_tools, suite_servers, settings, document)
    else:
        results = _cases(args, target_objects, settings, servers.sampler)
        document["results"] = [r.to_json() for r in results]
        print()
        print(report.table(results))
        print()
        for line in report.problems(results):
            print(f"note: {line}")
        for note in servers.notes:
            print(f"note: {note}")


def _finish(
    args: argparse.Namespace, stack: ExitStack, servers: _Servers, document: dict[str, Any]
) -> None:
    """The proxy's memory over the run, its profile, and the JSON file."""
    sampler = servers.sampler
    if sampler is not None:
        rss = _rss_summary(sampler)
        document["proxy_rss_kib"] = rss
        print(
            f"proxy RSS: start {rss['start'] / 1024:.1f} MiB, max {rss['max'] / 1024:.1f} MiB, "
            f"end {rss['end'] / 1024:.1f} MiB ({len(sampler.samples)} samples, 1 s apart)"
        )
    if servers.proxy is not None and args.profile:
        if sampler is not None:
            sampler.stop()
        stack.close()  # stops py-spy (it writes its file), then the proxy (cProfile writes)
        document["profile"] = profile_summary(args.profile, args.profile_out, servers.cprofile_out)
    if args.json:
        report.write_json(args.json, document)
        say(f"results written to {args.json}")


def _java_suite(
    args: argparse.Namespace,
    java_tools: tuple[list[str], Path],
    servers: SuiteServers,
    settings: Settings,
    document: dict[str, Any],
) -> None:
    command, distribution = java_tools
    suite_settings = SuiteSettings(
        warmup_s=args.warmup,
        duration_s=args.duration,
        run_id=settings.run_id,
        work_dir=settings.work_dir,
        perftest_command=command,
        pulsar_distribution=distribution,
        prime_s=args.prime,
        rounds=args.repeat,
    )
    began = time.monotonic()
    results = run_suite(args.scenarios, args.targets, servers, suite_settings)
    say(f"all cases done in {time.monotonic() - began:.0f} s")
    document["results"] = [r.to_json() for r in results]
    if args.repeat > 1:
        print()
        print("each round, msg/s (CPU µs/msg of the server): the table takes the median round")
        for line in round_lines(results):
            print(f"  {line}")
        results = median_rows(results)
        document["median_results"] = [r.to_json() for r in results]
    judged = verdicts(results)
    document["targets"] = [v.to_json() for v in judged]
    java_report.print_report(results, judged, document["notes"])


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


def _rss_summary(sampler: RssSampler) -> dict[str, int]:
    values = [kib for _, kib in sampler.samples] or [0]
    return {"start": values[0], "max": max(values), "end": values[-1]}
