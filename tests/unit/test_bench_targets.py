"""The performance targets (docs/performance.md): the ratios they are stated in, and the
verdicts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from starlight_py.bench import java_report, java_suite
from starlight_py.bench.java_suite import TARGETS, SuiteServers, SuiteSettings, plan, run_suite
from starlight_py.bench.load_result import MATCHED, SCENARIOS, LoadResult, Scenario
from starlight_py.bench.targets import (
    ADDED_LATENCY,
    PROXY_CPU,
    PROXY_CPU_VS_RABBITMQ,
    PULSAR_CPU,
    PULSAR_CPU_MATCHED,
    TAIL_LATENCY,
    THROUGHPUT,
    figures,
    goal_for,
    ratio,
    verdicts,
)
from starlight_py.bench.window import IntervalFigures


def row(
    scenario: str,
    target: str,
    rate: float,
    p50: float,
    p99: float,
    cpu: dict[str, float],
    status: str = "ok",
) -> LoadResult:
    tool = "pulsar-perf" if target in ("pulsar", MATCHED) else "PerfTest"
    return LoadResult(
        scenario,
        target,
        tool,
        status=status,
        received_per_s=rate,
        received=int(rate * 30),
        p50_ms=p50,
        p99_ms=p99,
        cpu_us_per_msg=cpu,
    )


RESULTS = [
    row("1p1c", "proxy", 12_000, 3.0, 20.0, {"proxy": 30.0, "pulsar": 45.0}),
    row("1p1c", "rabbitmq", 10_000, 2.0, 8.0, {"rabbitmq": 40.0}),
    row("1p1c", "pulsar", 50_000, 9.0, 16.0, {"pulsar": 20.0}),
    row("1p1c", MATCHED, 12_000, 8.0, 14.0, {"pulsar": 36.0}),
    row("4p4c", "proxy", 5_000, 50.0, 200.0, {"proxy": 80.0, "pulsar": 60.0}),
    row("4p4c", "rabbitmq", 18_000, 8.0, 120.0, {"rabbitmq": 42.0}),
    row("4p4c", "pulsar", 0, 0, 0, {}, status="error"),
    row("1p1c-300", "proxy", 300, 9.5, 24.0, {"proxy": 700.0, "pulsar": 720.0}),
    row("1p1c-300", "rabbitmq", 300, 0.4, 8.0, {"rabbitmq": 490.0}),
    row("1p1c-300", "pulsar", 300, 9.0, 21.0, {"pulsar": 530.0}),
]


def test_ratio() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(1.0, 3.0) == 0.333
    assert ratio(None, 2.0) is None
    assert ratio(1.0, 0.0) is None
    assert ratio(1.0, None) is None


def test_figures_of_a_saturated_scenario() -> None:
    assert figures("1p1c", RESULTS) == {
        THROUGHPUT: 1.2,
        PROXY_CPU: 30.0,
        PROXY_CPU_VS_RABBITMQ: 0.75,  # 30 µs against RabbitMQ's 40
        PULSAR_CPU: 2.25,  # 45 µs behind the proxy, 20 behind pulsar-perf
        PULSAR_CPU_MATCHED: 1.25,  # 36 behind pulsar-perf at the proxy's 12,000 msg/s
        TAIL_LATENCY: 2.5,
        ADDED_LATENCY: -6.0,
    }


def test_a_failed_row_counts_as_missing() -> None:
    values = figures("4p4c", RESULTS)
    assert values[PULSAR_CPU] is None
    assert values[ADDED_LATENCY] is None
    assert values[THROUGHPUT] == 0.278


def test_no_proxy_row_no_figures() -> None:
    assert set(figures("1p1c", RESULTS[1:3]).values()) == {None}


def test_verdicts() -> None:
    judged = {(v.goal.figure, v.goal.scenario): v for v in verdicts(RESULTS)}
    assert judged[THROUGHPUT, "1p1c"].met is True  # 1.2 >= 1.2
    assert judged[THROUGHPUT, "4p4c"].met is False
    assert judged[PROXY_CPU, "1p1c"].met is True  # 30 <= 35
    assert judged[PROXY_CPU, "4p4c"].met is False
    assert judged[PROXY_CPU, "1p1c-300"].met is False  # 700 > 150
    assert judged[PULSAR_CPU, "1p1c"].met is False  # 2.25 > 1.5
    assert judged[PULSAR_CPU, "4p4c"].met is None
    assert judged[PULSAR_CPU_MATCHED, "1p1c"].met is False  # 1.25 > 1.2
    assert judged[PULSAR_CPU_MATCHED, "4p4c"].met is None  # no row at the proxy's rate
    assert (PULSAR_CPU_MATCHED, "1p1c-300") not in judged  # the pulsar row is at that rate
    assert judged[PULSAR_CPU, "4p4c"].label() == "not measured"
    assert judged[PULSAR_CPU, "1p1c-300"].value == 1.358
    assert judged[PULSAR_CPU, "1p1c-300"].met is True
    assert judged[TAIL_LATENCY, "1p1c-300"].value == 3.0
    assert judged[TAIL_LATENCY, "1p1c-300"].met is False
    assert judged[ADDED_LATENCY, "1p1c-300"].value == 0.5
    assert judged[ADDED_LATENCY, "1p1c-300"].met is True
    assert judged[PROXY_CPU_VS_RABBITMQ, "1p1c-300"].value == 1.429  # 700 µs against 490
    assert judged[PROXY_CPU_VS_RABBITMQ, "1p1c-300"].met is False
    assert (PROXY_CPU_VS_RABBITMQ, "1p1c") not in judged  # stated at 300 msg/s only
    # the tail latency target is stated at the same rate only
    assert (TAIL_LATENCY, "1p1c") not in judged


def test_only_scenarios_that_ran_are_judged() -> None:
    judged = verdicts([r for r in RESULTS if r.scenario == "1p1c-300"])
    assert {v.goal.scenario for v in judged} == {"1p1c-300"}


def test_limits_are_inclusive() -> None:
    goal = goal_for(PROXY_CPU, "1p1c")
    assert goal is not None
    assert goal.met_by(35.0) is True
    assert goal.met_by(35.1) is False
    throughput = goal_for(THROUGHPUT, "4p4c")
    assert throughput is not None and throughput.met_by(1.2) is True
    assert throughput.met_by(1.19) is False
    assert goal_for(TAIL_LATENCY, "4p4c") is None


def test_the_table_marks_targets_on_the_proxy_rows() -> None:
    text = java_report.table(RESULTS)
    lines = text.splitlines()
    assert lines[0].startswith("| case ")
    proxy_1p1c = next(line for line in lines if "1p1c " in line and "proxy (PerfTest)" in line)
    cells = [cell.strip() for cell in proxy_1p1c.strip("|").split("|")]
    assert cells[2] == "12,000"
    assert cells[6] == "30.0 ✓"  # proxy µs/msg
    assert cells[9] == "1.20x ✓"  # proxy ÷ RabbitMQ
    assert cells[10] == "2.25x ✗"  # Pulsar behind the proxy ÷ pulsar-perf
    assert cells[11] == "1.25x ✗"  # the same at the proxy's msg/s
    assert cells[12] == "2.50x"  # p99 ratio: no target at saturation
    assert cells[14] == "0.75x"  # proxy ÷ RabbitMQ µs/msg: judged at 300 msg/s only
    proxy_300 = next(line for line in lines if "1p1c-300 " in line and "proxy (" in line)
    assert proxy_300.rstrip(" |").endswith("1.43x ✗")
    matched = next(line for line in lines if "Pulsar at the proxy's msg/s (pulsar-perf)" in line)
    assert matched.startswith("| 1p1c ")
    assert lines.index(matched) == lines.index(proxy_1p1c) + 3  # after the pulsar row
    failed = next(line for line in lines if "4p4c " in line and "pulsar-perf" in line)
    assert "| error " in failed


def test_verdict_lines_say_met_or_missed() -> None:
    lines = java_report.verdict_lines(verdicts(RESULTS))
    assert any(line.startswith("1p1c ") and line.endswith("met") for line in lines)
    assert any("not measured" in line for line in lines)
    assert any(line.endswith("missed") for line in lines)


def test_workers_and_threads_lines() -> None:
    proxy = row("1p1c", "proxy", 9000, 3.0, 9.0, {"proxy": 40.0})
    proxy.proxy_workers = 3
    proxy.proxy_threads_us_per_msg = {"python3": 30.0, "pulsar-io": 10.0}
    assert java_report.worker_lines([proxy]) == [
        "1p1c      3 workers: 9,000 msg/s, 3,000 msg/s per worker"
    ]
    assert java_report.thread_lines([proxy]) == ["1p1c      python3 30 | pulsar-io 10"]
    assert "proxy 3 workers (PerfTest)" in java_report.table([proxy])


def test_long_failure_details_are_cut() -> None:
    failed = row("1p1c", "pulsar", 0, 0, 0, {}, status="error")
    failed.detail = "pulsar-perf produce exited early:\n" + "\n".join(f"l{i}" for i in range(30))
    (entry,) = java_report.problem_lines([failed], detail_lines=3)
    assert entry.splitlines() == [
        "1p1c pulsar: error: pulsar-perf produce exited early:",
        "...",
        "l27",
        "l28",
        "l29",
    ]


def test_pulsar_perf_runs_again_at_the_proxys_rate_in_saturated_scenarios() -> None:
    cases = [(scenario.name, target) for scenario, target in plan(["1p1c", "1p1c-300"], TARGETS)]
    assert cases == [
        ("1p1c", "proxy"),
        ("1p1c", "rabbitmq"),
        ("1p1c", "pulsar"),
        ("1p1c", MATCHED),
        ("1p1c-300", "proxy"),
        ("1p1c-300", "rabbitmq"),
        ("1p1c-300", "pulsar"),
    ]
    assert (SCENARIOS["1p1c"], MATCHED) not in plan(["1p1c"], ("proxy", "rabbitmq"))
    assert (SCENARIOS["1p1c"], MATCHED) not in plan(["1p1c"], ("pulsar",))


def test_without_a_proxy_rate_the_matched_row_is_skipped(tmp_path: Path) -> None:
    settings = SuiteSettings(1, 1, "run", tmp_path, ["false"], tmp_path)
    results = run_suite(["1p1c"], ("proxy", "pulsar"), SuiteServers(), settings)
    assert [(r.target, r.status) for r in results] == [
        ("proxy", "skipped"),
        ("pulsar", "skipped"),
        (MATCHED, "skipped"),
    ]
    assert results[2].detail == "the proxy row has no rate to match"


def _recording_tools(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, int, int]]:
    """Replaces both load generators: each run is recorded as (case name, target, warm-up s,
    measured s) and fails, so that the cases end as errors."""
    runs: list[tuple[str, str, int, int]] = []

    def perftest(scenario, target, servers, settings, name, meter, log_dir):  # type: ignore[no-untyped-def]
        runs.append((name, target, settings.warmup_s, settings.duration_s))
        return java_suite._ToolOutcome([], "not run", {})

    def pulsar_perf(scenario, servers, settings, name, meter, log_dir):  # type: ignore[no-untyped-def]
        runs.append((name, "pulsar-perf", settings.warmup_s, settings.duration_s))
        return java_suite._ToolOutcome([], "not run", {})

    monkeypatch.setattr(java_suite, "_perftest", perftest)
    monkeypatch.setattr(java_suite, "_pulsar_perf", pulsar_perf)
    return runs


_RUNNING = SuiteServers(
    rabbitmq_url="amqp://r",
    pulsar_service_url="pulsar://p",
    pulsar_web_url="http://p",
)


def test_each_running_target_is_primed_once_before_the_first_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _recording_tools(monkeypatch)
    settings = SuiteSettings(10, 30, "run", tmp_path, ["false"], tmp_path, prime_s=20)
    results = run_suite(["1p1c"], ("proxy", "rabbitmq", "pulsar"), _RUNNING, settings)
    assert runs == [
        # the proxy is not running: not primed; pulsar-perf counts in 10 s reports
        ("00-prime-rabbitmq", "rabbitmq", 1, 19),
        ("00-prime-pulsar", "pulsar-perf", 10, 10),
        ("02-1p1c-rabbitmq", "rabbitmq", 10, 30),
        ("03-1p1c-pulsar", "pulsar-perf", 10, 30),
    ]
    # priming records nothing: the rows are the cases'
    assert [(r.target, r.status) for r in results] == [
        ("proxy", "skipped"),
        ("rabbitmq", "error"),
        ("pulsar", "error"),
        (MATCHED, "skipped"),
    ]


def test_no_priming_when_it_is_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _recording_tools(monkeypatch)
    settings = SuiteSettings(10, 30, "run", tmp_path, ["false"], tmp_path, prime_s=0)
    run_suite(["1p1c"], ("rabbitmq",), _RUNNING, settings)
    assert [name for name, *_ in runs] == ["01-1p1c-rabbitmq"]


def _row(scenario: str, target: str, number: int, per_s: float | None, cpu: float) -> LoadResult:
    server = target if target in ("proxy", "rabbitmq") else "pulsar"
    row = LoadResult(scenario, target, "PerfTest", round=number, received_per_s=per_s)
    row.cpu_us_per_msg = {server: cpu}
    if per_s is None:
        row.status = "error"
    return row


def test_the_median_round_of_each_target_is_the_row_judged() -> None:
    results = [
        _row("4p4c", "proxy", 1, 28_000.0, 32.0),
        _row("4p4c", "rabbitmq", 1, 27_000.0, 49.0),
        _row("4p4c", "proxy", 2, 23_000.0, 39.0),
        _row("4p4c", "rabbitmq", 2, 28_000.0, 48.0),
        _row("4p4c", "proxy", 3, 25_000.0, 36.0),
        _row("4p4c", "rabbitmq", 3, None, 0.0),  # failed: not a candidate
    ]
    chosen = java_suite.median_rows(results)
    assert [(r.target, r.round) for r in chosen] == [("proxy", 3), ("rabbitmq", 1)]
    assert java_suite.round_lines(results) == [
        "4p4c        proxy           28,000 (32 µs) | 23,000 (39 µs) | 25,000 (36 µs)",
        "4p4c        rabbitmq        27,000 (49 µs) | 28,000 (48 µs) | error",
    ]


def test_a_case_no_round_measured_keeps_its_first_row() -> None:
    failed = [_row("1p1c", "proxy", 1, None, 0.0), _row("1p1c", "proxy", 2, None, 0.0)]
    assert java_suite.median_rows(failed) == [failed[0]]


def test_each_round_runs_every_case_and_matches_its_own_proxy_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rates = iter([20_000.0, 25_000.0])
    matched: list[float | None] = []

    def perftest(scenario, target, servers, settings, name, meter, log_dir):  # type: ignore[no-untyped-def]
        rate = next(rates)
        interval = IntervalFigures(1.0, rate, rate, 1.0, 2.0)
        return java_suite._ToolOutcome([interval], None, {})

    def pulsar_perf(scenario, servers, settings, name, meter, log_dir):  # type: ignore[no-untyped-def]
        matched.append(scenario.rate)
        return java_suite._ToolOutcome([], "not run", {})

    monkeypatch.setattr(java_suite, "_perftest", perftest)
    monkeypatch.setattr(java_suite, "_pulsar_perf", pulsar_perf)
    servers = SuiteServers(
        proxy_url="amqp://p", pulsar_service_url="pulsar://p", pulsar_web_url="http://p"
    )
    settings = SuiteSettings(1, 1, "run", tmp_path, ["false"], tmp_path, rounds=2)
    results = run_suite(["1p1c"], ("proxy", "pulsar"), servers, settings)
    assert [(r.target, r.round) for r in results] == [
        ("proxy", 1),
        ("pulsar", 1),
        (MATCHED, 1),
        ("proxy", 2),
        ("pulsar", 2),
        (MATCHED, 2),
    ]
    assert matched == [None, 20_000.0, None, 25_000.0]


def _delivered(scenario: str, target: str, sent: float, delivered: float) -> LoadResult:
    result = row(scenario, target, delivered, 5.0, 20.0, {target: 40.0})
    result.sent_per_s = sent
    return result


def test_competing_consumers_and_a_fanout_are_judged_on_what_was_delivered() -> None:
    results = [
        _delivered("1p4c-work", "proxy", 9_000, 9_000),
        _delivered("1p4c-work", "rabbitmq", 10_000, 10_000),
        # one publish, ten deliveries: PerfTest's received counts every consumer's
        _delivered("1p10c-fanout", "proxy", 2_200, 22_000),
        _delivered("1p10c-fanout", "rabbitmq", 2_000, 20_000),
    ]
    judged = {(v.goal.figure, v.goal.scenario): v for v in verdicts(results)}
    assert judged[THROUGHPUT, "1p4c-work"].value == 0.9
    assert judged[THROUGHPUT, "1p4c-work"].met is False  # >= 1.0
    assert judged[THROUGHPUT, "1p10c-fanout"].value == 1.1
    assert judged[THROUGHPUT, "1p10c-fanout"].met is True
    assert "deliveries" in judged[THROUGHPUT, "1p10c-fanout"].goal.description
    # no pulsar-perf row in these scenarios: no Pulsar targets either
    assert {figure for figure, _ in judged} == {THROUGHPUT}


@pytest.mark.parametrize(
    ("figure", "scenario", "limit", "at_least"),
    [
        (THROUGHPUT, "1p1c", 1.2, True),
        (THROUGHPUT, "4p4c", 1.2, True),
        (THROUGHPUT, "1p4c-work", 1.0, True),
        (THROUGHPUT, "1p10c-fanout", 1.0, True),
        (PULSAR_CPU_MATCHED, "1p1c", 1.2, False),
        (PULSAR_CPU_MATCHED, "4p4c", 1.2, False),
        (PULSAR_CPU, "1p1c", 1.5, False),
        (PROXY_CPU_VS_RABBITMQ, "1p1c-300", 1.0, False),
        (PROXY_CPU, "1p1c-300", 150.0, False),
        (TAIL_LATENCY, "1p1c-300", 2.0, False),
    ],
)
def test_the_stated_limits(figure: str, scenario: str, limit: float, at_least: bool) -> None:
    goal = goal_for(figure, scenario)
    assert goal is not None
    assert (goal.limit, goal.at_least) == (limit, at_least)


def test_proxy_cpu_against_rabbitmqs_is_a_ratio_of_the_same_run() -> None:
    proxy = row("1p1c-300", "proxy", 300, 9.5, 24.0, {"proxy": 450.0, "pulsar": 720.0})
    rabbit = row("1p1c-300", "rabbitmq", 300, 0.4, 8.0, {"rabbitmq": 500.0})
    values = figures("1p1c-300", [proxy, rabbit])
    assert values[PROXY_CPU_VS_RABBITMQ] == 0.9  # the Pulsar behind the proxy is not counted
    goal = goal_for(PROXY_CPU_VS_RABBITMQ, "1p1c-300")
    assert goal is not None and goal.met_by(0.9) is True and goal.met_by(1.0) is True
    assert goal.met_by(1.001) is False
    rabbit.cpu_us_per_msg = {}  # RabbitMQ's CPU not read: not measured
    assert figures("1p1c-300", [proxy, rabbit])[PROXY_CPU_VS_RABBITMQ] is None


def test_pulsar_perf_skips_the_shapes_it_has_no_equivalent_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _recording_tools(monkeypatch)
    servers = replace(_RUNNING, proxy_url="amqp://p")
    settings = SuiteSettings(10, 30, "run", tmp_path, ["false"], tmp_path)
    results = run_suite(["1p4c-work", "1p10c-fanout"], TARGETS, servers, settings)
    assert [(r.scenario, r.target, r.status) for r in results] == [
        ("1p4c-work", "proxy", "error"),
        ("1p4c-work", "rabbitmq", "error"),
        ("1p4c-work", "pulsar", "skipped"),
        ("1p4c-work", MATCHED, "skipped"),
        ("1p10c-fanout", "proxy", "error"),
        ("1p10c-fanout", "rabbitmq", "error"),
        ("1p10c-fanout", "pulsar", "skipped"),
        ("1p10c-fanout", MATCHED, "skipped"),
    ]
    assert [target for _, target, *_ in runs] == ["proxy", "rabbitmq"] * 2  # no pulsar-perf
    assert results[2].detail == (
        "pulsar-perf has no equivalent of 1 producer, 4 consumers, 1 queue in this bench "
        "(it runs one producer and one consumer per topic)"
    )
    assert results[7].detail == (
        "pulsar-perf has no equivalent of 1 producer, 10 consumers, 10 queues in this bench "
        "(it runs one producer and one consumer per topic)"
    )
    assert "1p4c-work pulsar: skipped: pulsar-perf has no equivalent" in "\n".join(
        java_report.problem_lines(results)
    )


def test_each_case_runs_its_scenario_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenario a case runs keeps its consumers, queues, prefetch and exchange."""
    seen: list[Scenario] = []

    def perftest(scenario, target, servers, settings, name, meter, log_dir):  # type: ignore[no-untyped-def]
        seen.append(scenario)
        return java_suite._ToolOutcome([], "not run", {})

    monkeypatch.setattr(java_suite, "_perftest", perftest)
    settings = SuiteSettings(10, 30, "run", tmp_path, ["false"], tmp_path)
    names = ["1p1c-fanout", "1p4c-work", "1p10c-fanout"]
    run_suite(names, ("rabbitmq",), _RUNNING, settings)
    assert seen == [SCENARIOS[name] for name in names]


def test_scenario_shapes() -> None:
    assert [(s.name, s.pairs) for s in SCENARIOS.values()] == [
        ("1p1c", 1),
        ("4p4c", 4),
        ("1p1c-300", 1),
        ("1p1c-fanout", 1),
        ("1p4c-work", None),
        ("1p10c-fanout", None),
    ]
    assert SCENARIOS["4p4c"].shape() == "4 producers, 4 consumers, 4 queues"
