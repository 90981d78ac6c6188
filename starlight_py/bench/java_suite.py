"""The default suite: Java load generators against the proxy, RabbitMQ and Pulsar.

For each scenario (``load_result.SCENARIOS``) the targets run one after the other, so the
rows compared with each other were taken under the same conditions:

- proxy: RabbitMQ PerfTest against the proxy; CPU of the proxy (every worker) and of the
  Pulsar behind it, the proxy's also split by thread;
- rabbitmq: the same PerfTest command against the private RabbitMQ node; its CPU;
- pulsar: ``pulsar-perf produce`` + ``consume`` against the same Pulsar; its CPU;
- pulsar-matched (saturated scenarios, with proxy and pulsar): ``pulsar-perf`` again at the
  rate the proxy reached, since Pulsar's CPU per message falls as its rate rises.

PerfTest: 1 KiB persistent messages, confirm window 100 (``-c 100``), multi-ack every 50
(``-A 50``), the scenario's producers, consumers and queues, and its prefetch (``-q``, 200
unless the scenario says otherwise). pulsar-perf runs one producer and one consumer per
topic: scenarios of another shape (several consumers on one queue, a fanout to several
queues) have no pulsar-perf counterpart here, and their pulsar and pulsar-matched rows are
skipped. Each case warms up, then measures; CPU per message is the CPU read from /proc over
the measured window divided by the messages consumed in that window (see ``cpu``,
``window``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from starlight_py.bench.cpu import CpuMeter
from starlight_py.bench.infra import BenchError, say
from starlight_py.bench.load_result import (
    MATCHED,
    ROW_TOOLS,
    SCENARIOS,
    TARGET_TOOLS,
    LoadResult,
    Scenario,
)
from starlight_py.bench.perftest import PerfTestSpec, run_perftest
from starlight_py.bench.pulsar_perf import (
    REPORT_INTERVAL_S,
    PulsarPerfSpec,
    report_intervals,
    run_pulsar_perf,
)
from starlight_py.bench.window import IntervalFigures, summarize

TARGETS = tuple(TARGET_TOOLS)


@dataclass(frozen=True)
class SuiteServers:
    """Where the targets listen and the first process of each (a process group leader,
    see ``cpu.server_members``; None: not ours, or not running). ``proxy_alive`` tells a
    dead proxy apart from a slow one."""

    proxy_url: str | None = None
    proxy_pid: int | None = None
    proxy_workers: int = 1
    proxy_alive: Callable[[], bool] | None = None
    rabbitmq_url: str | None = None
    rabbitmq_pid: int | None = None
    pulsar_service_url: str | None = None
    pulsar_web_url: str | None = None
    pulsar_pid: int | None = None

    def available(self, target: str) -> bool:
        if target == "proxy":
            return self.proxy_url is not None
        if target == "rabbitmq":
            return self.rabbitmq_url is not None
        return self.pulsar_service_url is not None and self.pulsar_web_url is not None

    def cpu_roots(self, target: str) -> dict[str, int]:
        """The servers whose CPU a case against ``target`` is charged with."""
        roots = {
            "proxy": {"proxy": self.proxy_pid, "pulsar": self.pulsar_pid},
            "rabbitmq": {"rabbitmq": self.rabbitmq_pid},
            "pulsar": {"pulsar": self.pulsar_pid},
            MATCHED: {"pulsar": self.pulsar_pid},
        }[target]
        return {name: pid for name, pid in roots.items() if pid is not None}


@dataclass(frozen=True)
class SuiteSettings:
    warmup_s: int
    duration_s: int
    run_id: str  # makes queue and topic names unique to this run
    work_dir: Path
    perftest_command: list[str]  # java -cp ... com.rabbitmq.perf.PerfTest
    pulsar_distribution: Path  # holds bin/pulsar-perf
    size: int = 1024
    prime_s: float = 0.0  # unrecorded traffic to each target before the first case
    rounds: int = 1  # every case this many times, round after round (--repeat)


def plan(scenarios: Sequence[str], targets: Sequence[str]) -> list[tuple[Scenario, str]]:
    """The cases in the order they run: scenario by scenario, targets in table order, and
    pulsar-perf at the proxy's rate after them in saturated scenarios."""
    matched = "proxy" in targets and "pulsar" in targets
    cases = []
    for name in scenarios:
        scenario = SCENARIOS[name]
        cases += [(scenario, t) for t in TARGETS if t in targets]
        if matched and scenario.rate is None:
            cases.append((scenario, MATCHED))
    return cases


def run_suite(
    scenarios: Sequence[str],
    targets: Sequence[str],
    servers: SuiteServers,
    settings: SuiteSettings,
) -> list[LoadResult]:
    """Every case; failures are rows with status error or skipped. Raises nothing but
    KeyboardInterrupt."""
    cases = [
        (number, scenario, target)
        for number in range(1, settings.rounds + 1)
        for scenario, target in plan(scenarios, targets)
    ]
    if settings.prime_s > 0 and cases:
        prime(targets, servers, settings)
    results: list[LoadResult] = []
    for index, (number, scenario, target) in enumerate(cases, 1):
        tool = ROW_TOOLS[target]
        result = LoadResult(
            scenario.name, target, tool, proxy_workers=servers.proxy_workers, round=number
        )
        rate = _proxy_rate(scenario, number, results) if target == MATCHED else scenario.rate
        skipped = _skip_reason(scenario, target, rate, servers)
        if skipped is not None:
            result.status, result.detail = "skipped", skipped
        else:
            of_round = f" (round {number} of {settings.rounds})" if settings.rounds > 1 else ""
            say(f"[{index}/{len(cases)}] {scenario.name} against {target} with {tool}{of_round}")
            try:
                _run_case(replace(scenario, rate=rate), target, servers, settings, index, result)
            except BenchError as e:
                result.status, result.detail = "error", str(e)
        _say_result(result)
        results.append(result)
    return results


def pulsar_perf_gap(scenario: Scenario) -> str | None:
    """Why pulsar-perf does not run ``scenario``, or None when it does."""
    if scenario.pairs is not None:
        return None
    return (
        f"pulsar-perf has no equivalent of {scenario.shape()} in this bench "
        "(it runs one producer and one consumer per topic)"
    )


def _skip_reason(
    scenario: Scenario, target: str, rate: float | None, servers: SuiteServers
) -> str | None:
    """Why the case does not run, or None when it does."""
    if target in ("pulsar", MATCHED) and (gap := pulsar_perf_gap(scenario)) is not None:
        return gap
    if target == MATCHED and rate is None:
        return "the proxy row has no rate to match"
    if not servers.available(target):
        return f"{target} is not running"
    if target == "proxy" and servers.proxy_alive and not servers.proxy_alive():
        return "the proxy has exited"
    return None


def prime(targets: Sequence[str], servers: SuiteServers, settings: SuiteSettings) -> None:
    """Unrecorded traffic to each running target, one pair at full speed, so that no case
    pays for a cold server: a Pulsar started a minute before spends about 30 % of its CPU in
    its JIT compiler (docs/performance.md), which would fall on whichever case runs first.
    Every target is primed alike, RabbitMQ too. Failures are reported and do not stop the
    run."""
    seconds = max(1, round(settings.prime_s))
    primed = Scenario("prime")
    for target in TARGETS:
        if target not in targets or target == MATCHED or not servers.available(target):
            continue
        if target == "proxy" and servers.proxy_alive and not servers.proxy_alive():
            continue
        say(f"priming {target} for {seconds} s (not recorded)")
        name = f"00-prime-{target}"
        log_dir = settings.work_dir / "java-cases" / name
        try:
            if target == "pulsar":
                # pulsar-perf counts in 10 s reports: at least one of warm-up and one measured.
                halves = replace(settings, warmup_s=max(10, seconds - 10), duration_s=10)
                outcome = _pulsar_perf(primed, servers, halves, name, CpuMeter({}), log_dir)
            else:
                whole = replace(settings, warmup_s=1, duration_s=max(1, seconds - 1))
                outcome = _perftest(primed, target, servers, whole, name, CpuMeter({}), log_dir)
        except BenchError as e:
            say(f"  priming {target}: {e}")
            continue
        if outcome.error is not None:
            say(f"  priming {target}: {outcome.error}")


def _proxy_rate(scenario: Scenario, number: int, results: Sequence[LoadResult]) -> float | None:
    """What the proxy consumed per second in this scenario and round, for pulsar-perf to
    match."""
    for r in results:
        if (
            r.scenario == scenario.name
            and r.round == number
            and r.target == "proxy"
            and r.ok
            and r.received_per_s
        ):
            return r.received_per_s
    return None


def _rounds_by_case(results: Sequence[LoadResult]) -> dict[tuple[str, str], list[LoadResult]]:
    """Each (scenario, target)'s rows, round after round, in the order the cases ran."""
    rows: dict[tuple[str, str], list[LoadResult]] = {}
    for r in results:
        rows.setdefault((r.scenario, r.target), []).append(r)
    return rows


def median_rows(results: Sequence[LoadResult]) -> list[LoadResult]:
    """One row per scenario and target: of its rounds' measured rows, the one with the
    median msg/s (the lower of the middle two for an even count), so that one slow or fast
    round of a target does not decide a ratio. A case no round measured keeps its first
    row. In the order the cases ran."""
    chosen = []
    for rounds in _rounds_by_case(results).values():
        measured = sorted(
            (r for r in rounds if r.ok and r.received_per_s is not None),
            key=lambda r: r.received_per_s or 0.0,
        )
        chosen.append(measured[(len(measured) - 1) // 2] if measured else rounds[0])
    return chosen


def round_lines(results: Sequence[LoadResult]) -> list[str]:
    """Each scenario and target's rounds, msg/s and the server's CPU per message, one line
    each (printed before the table of medians when the run had several rounds)."""
    lines = []
    for (scenario, target), rounds in _rounds_by_case(results).items():
        figures = []
        for r in rounds:
            if not r.ok or r.received_per_s is None:
                figures.append(r.status)
                continue
            server = target if target in ("proxy", "rabbitmq") else "pulsar"
            cpu = r.cpu_us_per_msg.get(server)
            figures.append(
                f"{r.received_per_s:,.0f}" + (f" ({cpu:g} µs)" if cpu is not None else "")
            )
        lines.append(f"{scenario:<11} {target:<16}" + " | ".join(figures))
    return lines


@dataclass(frozen=True)
class _ToolOutcome:
    """What a load generator run left, in the terms every case is reported in."""

    intervals: list[IntervalFigures]  # the measured window's
    error: str | None
    raw: dict[str, Any]
    published: int | None = None  # pulsar-perf: published in the window (topic stats)


def _run_case(
    scenario: Scenario,
    target: str,
    servers: SuiteServers,
    settings: SuiteSettings,
    index: int,
    result: LoadResult,
) -> None:
    name = f"{index:02d}-{scenario.name}-{target}"
    log_dir = settings.work_dir / "java-cases" / name
    meter = CpuMeter(servers.cpu_roots(target), split="proxy" if target == "proxy" else None)
    if target in ("pulsar", MATCHED):
        outcome = _pulsar_perf(scenario, servers, settings, name, meter, log_dir)
    else:
        outcome = _perftest(scenario, target, servers, settings, name, meter, log_dir)
    result.raw = outcome.raw
    if outcome.error is not None:
        result.status, result.detail = "error", outcome.error
    if target == "proxy" and servers.proxy_alive and not servers.proxy_alive():
        result.status = "error"
        result.detail = ("the proxy exited during the case; " + result.detail).strip("; ")
    window = summarize(outcome.intervals)
    result.seconds = window.seconds
    result.received, result.received_per_s = window.received, window.received_per_s
    result.sent, result.sent_per_s = window.sent, window.sent_per_s
    if outcome.published is not None and window.seconds:
        result.sent = outcome.published
        result.sent_per_s = round(outcome.published / window.seconds, 1)
    result.p50_ms, result.p99_ms = window.p50_ms, window.p99_ms
    cpu = meter.window()
    if cpu is not None:
        result.cpu_us_per_msg = cpu.us_per_message(window.received)
        result.cpu_percent = cpu.percent_of_one_core()
        result.proxy_threads_us_per_msg = cpu.threads_us_per_message(window.received)
    if result.ok and window.received == 0:
        result.status, result.detail = "error", "no message was consumed in the window"


def _perftest(
    scenario: Scenario,
    target: str,
    servers: SuiteServers,
    settings: SuiteSettings,
    name: str,
    meter: CpuMeter,
    log_dir: Path,
) -> _ToolOutcome:
    url = servers.proxy_url if target == "proxy" else servers.rabbitmq_url
    assert url is not None
    spec = perftest_spec(scenario, url, f"perftest-{settings.run_id}-{name}", settings)
    say(f"  warm-up {settings.warmup_s} s, measuring {settings.duration_s} s")
    run = run_perftest(settings.perftest_command, spec, meter, log_dir / "perftest.log")
    error = run.error if run.complete else (run.error or "no measured window")
    return _ToolOutcome(run.window_intervals(), error, run.to_json())


MULTI_ACK_EVERY = 50  # PerfTest's -A: consumers acknowledge every 50th message, multiple


def perftest_spec(
    scenario: Scenario, url: str, queue_prefix: str, settings: SuiteSettings
) -> PerfTestSpec:
    """The PerfTest run of one case of ``scenario``."""
    return PerfTestSpec(
        url=url,
        queue_prefix=queue_prefix,
        warmup_s=settings.warmup_s,
        duration_s=settings.duration_s,
        producers=scenario.producers,
        consumers=scenario.consumers,
        queues=scenario.queues,
        size=settings.size,
        rate_per_producer=scenario.rate / scenario.producers if scenario.rate else None,
        prefetch=scenario.prefetch,
        # PerfTest refuses a multiple-ack batch larger than the prefetch; half of it keeps
        # credit flowing (the work queue's prefetch of 10: every 5th message).
        multi_ack_every=min(MULTI_ACK_EVERY, max(1, scenario.prefetch // 2)),
        exchange_type=scenario.exchange_type,
    )


def _pulsar_perf(
    scenario: Scenario,
    servers: SuiteServers,
    settings: SuiteSettings,
    name: str,
    meter: CpuMeter,
    log_dir: Path,
) -> _ToolOutcome:
    assert servers.pulsar_service_url is not None and servers.pulsar_web_url is not None
    assert scenario.pairs is not None  # see pulsar_perf_gap
    spec = PulsarPerfSpec(
        service_url=servers.pulsar_service_url,
        web_url=servers.pulsar_web_url,
        topic_base=f"persistent://public/default/pulsar-perf-{settings.run_id}-{name}",
        pairs=scenario.pairs,
        warmup_s=settings.warmup_s,
        duration_s=settings.duration_s,
        size=settings.size,
        rate=scenario.rate,
    )
    warmup = report_intervals(settings.warmup_s) * REPORT_INTERVAL_S
    measured = report_intervals(settings.duration_s) * REPORT_INTERVAL_S
    say(f"  pulsar-perf reports every 10 s: warm-up {warmup} s, measuring {measured} s")
    run = run_pulsar_perf(settings.pulsar_distribution, spec, meter, log_dir)
    error = run.error if run.complete else (run.error or "no measured window")
    return _ToolOutcome(run.window_intervals(), error, run.to_json(), run.published_in_window)


def _say_result(result: LoadResult) -> None:
    if not result.ok:
        say(f"  -> {result.status}: {result.detail}")
        return
    cpu = ", ".join(f"{name} {value:g}" for name, value in result.cpu_us_per_msg.items())
    say(
        f"  -> {result.received_per_s} msg/s, p50 {result.p50_ms} ms, p99 {result.p99_ms} ms, "
        f"CPU µs/msg: {cpu or '-'}"
    )
