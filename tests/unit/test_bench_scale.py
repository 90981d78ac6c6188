"""bench.scale's pure parts: the cases, the generator's lines, the arithmetic of idle CPU and
CPU per delivery, the ratios, the tables and the command line. No process is started here."""

from __future__ import annotations

import pytest

from starlight_py.bench.scale import parse_options
from starlight_py.bench.scale_load import (
    SOURCE,
    LoadRun,
    generator_arguments,
    parse_event,
)
from starlight_py.bench.scale_report import (
    ALL,
    SETTLE_S,
    Case,
    CaseResult,
    ConnectionsResult,
    SystemResult,
    cell,
    format_table,
    full_report,
    notes,
    per_process_table,
    plan,
    rates_ms_per_s,
    ratio,
    ratio_cell,
    timing_table,
    us_per_delivery,
    with_total,
)
from starlight_py.bench.scale_runs import figures


def test_the_plan_runs_topic_then_default_then_fanout() -> None:
    cases = plan(["fanout", "topic", "default"], [1, 1000], [10, 100])
    assert [c.label for c in cases] == [
        "topic 1",
        "topic 1,000",
        "default 1",
        "default 1,000",
        "fanout 10",
        "fanout 100",
    ]
    assert plan(["default"], [5], [10]) == [Case("default", 5)]


def test_only_a_fanout_delivers_a_message_more_than_once() -> None:
    assert Case("fanout", 100).fanout_width == 100
    assert Case("topic", 100).fanout_width == 1
    assert Case("default", 100).fanout_width == 1


def test_idle_rates_are_cpu_ms_per_wall_clock_second() -> None:
    before = {"proxy": 10.0, "pulsar": 100.0, "gone": 1.0}
    after = {"proxy": 10.5, "pulsar": 101.0, "new": 3.0}
    assert rates_ms_per_s(before, after, 10.0) == {"proxy": 50.0, "pulsar": 100.0}
    assert rates_ms_per_s(before, after, 0.0) == {}


def test_cpu_per_delivery_subtracts_the_idle_rate_over_the_window() -> None:
    # 20 s window, 10,000 deliveries; the proxy used 3 s of which 20 ms/s x 20 s = 0.4 s idle.
    before = {"proxy": 1.0, "rabbitmq": 0.0}
    after = {"proxy": 4.0, "rabbitmq": 1.0}
    idle = {"proxy": 20.0}
    figures = us_per_delivery(before, after, 20.0, idle, 10_000)
    assert figures == {"proxy": 260.0, "rabbitmq": 100.0}
    assert us_per_delivery(before, after, 20.0, idle, 0) == {}


def test_a_noisy_idle_rate_may_leave_a_negative_cost_in_sight() -> None:
    assert us_per_delivery({"p": 0.0}, {"p": 0.1}, 10.0, {"p": 20.0}, 1000) == {"p": -100.0}


def test_totals_and_ratios() -> None:
    assert with_total({"proxy": 1.5, "pulsar": 2.25}) == {"proxy": 1.5, "pulsar": 2.25, ALL: 3.75}
    assert with_total({}) == {}
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(3.0, 0.0) is None
    assert ratio(None, 2.0) is None
    assert ratio_cell(1.5) == "1.50x"
    assert ratio_cell(None) == "-"
    assert cell(None) == "-"
    assert cell(12345.6) == "12,346"
    assert cell(1.234, 2) == "1.23"
    assert cell(500.0, 0) == "500"


def result(setup: float, idle: dict[str, float], us: dict[str, float]) -> SystemResult:
    return SystemResult(
        "x",
        setup_s=setup,
        delete_s=setup / 2,
        idle_ms_per_s=with_total(idle),
        rss_mib=with_total({k: 100.0 for k in idle}),
        us_per_delivery=with_total(us),
        delivered_per_s=500.0,
        p50_ms=2.0,
        p99_ms=8.0,
        lost=0,
    )


def case_result() -> CaseResult:
    proxy = result(4.0, {"proxy": 30.0, "pulsar": 50.0, "zookeeper": 20.0}, {"proxy": 200.0})
    rabbit = result(2.0, {"rabbitmq": 10.0}, {"rabbitmq": 100.0})
    return CaseResult(Case("topic", 1000), {"proxy": proxy, "rabbitmq": rabbit})


def test_ratios_compare_the_proxy_alone_and_with_pulsar_and_zookeeper() -> None:
    ratios = case_result().ratios()
    assert ratios["setup_s"] == 2.0
    assert ratios["delete_s"] == 2.0
    assert ratios["p99_ms"] == 1.0
    assert ratios["idle_ms_per_s.proxy"] == 3.0
    assert ratios["idle_ms_per_s.all"] == 10.0
    assert ratios["rss_mib.all"] == 3.0
    assert ratios["us_per_delivery.proxy"] == 2.0


def test_a_skipped_system_has_no_figures_and_no_ratios() -> None:
    r = case_result()
    r.systems["rabbitmq"].status = "skipped"
    assert r.figure("rabbitmq", "setup_s") is None
    assert r.ratios()["setup_s"] is None


def test_the_tables_put_the_systems_side_by_side() -> None:
    results = [case_result()]
    timing = timing_table(results).splitlines()
    assert timing[0].split()[:4] == ["case", "setup", "s", "P"]
    row = timing[2]
    assert row.startswith("topic 1,000")
    assert "4.00" in row and "2.00" in row and "2.00x" in row
    idle = per_process_table(results, "idle_ms_per_s", 2).splitlines()
    assert idle[0].split() == [
        "case", "proxy", "pulsar", "zookeeper", "P", "all", "rabbitmq", "proxy/R", "all/R",
    ]  # fmt: skip
    assert idle[2].split()[-2:] == ["3.00x", "10.00x"]


def test_format_table_aligns_columns() -> None:
    table = format_table(["a", "bb"], [["xyz", "1"], ["q", "1,000"]])
    assert table.splitlines() == ["a       bb", "---  -----", "xyz      1", "q    1,000"]


def test_the_full_report_has_every_block() -> None:
    conns = ConnectionsResult(
        "proxy",
        1000,
        open_s=1.5,
        rss_before_kib={"proxy": 100_000},
        rss_after_kib={"proxy": 150_000},
        idle_ms_per_s={"proxy": 3.0},
    )
    assert conns.kib_per_connection("proxy") == 50.0
    assert conns.kib_per_connection("pulsar") is None
    conns.opened, conns.detail = 500, "500 failed to open"
    assert conns.kib_per_connection("proxy") == 100.0
    text = full_report([case_result()], [conns], heartbeat_s=60)
    for title in ("Setup, delete", "Idle CPU", "RSS", "CPU per delivery", "Idle connections"):
        assert title in text
    assert "heartbeat 60 s" in text
    assert "500 of 1,000" in text
    assert "note: proxy: ok. 500 failed to open" in text


def test_events_are_the_prefixed_json_lines() -> None:
    event = parse_event(
        '@scale {"event":"window_end","t_ms":5,"delivered":10,"latency_us":[1,2,3]}'
    )
    assert event is not None
    assert event.name == "window_end"
    assert event.number("delivered") == 10.0
    assert event.number("latency_us") is None
    assert event.fields["latency_us"] == [1, 2, 3]
    for other in ("SLF4J: no binding", "@scale {broken", '@scale ["event"]', '@scale {"x":1}'):
        assert parse_event(other) is None


def test_generator_arguments_are_sorted_key_value_pairs() -> None:
    assert generator_arguments({"rate": 500.0, "kind": "topic", "idle": 2.5}) == [
        "idle=2.5",
        "kind=topic",
        "rate=500",
    ]


def test_the_java_source_ships_with_the_package() -> None:
    assert SOURCE.is_file()
    assert "public final class ScaleLoad" in SOURCE.read_text()


def test_quick_fills_in_what_was_not_given() -> None:
    args = parse_options(["--quick", "--duration", "9"])
    assert args.sizes == [1, 10, 100]
    assert args.duration == 9.0
    assert args.idle_connections == 500
    full = parse_options([])
    assert full.sizes == [1, 10, 100, 1000, 10000]
    assert full.fanout_sizes == [10, 100]
    assert full.rate == 500.0 and full.size == 256


@pytest.mark.parametrize(
    "argv",
    [["--sizes", "0,10"], ["--sizes", "x"], ["--kinds", "headers"], ["--size", "8"]],
)
def test_bad_options_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_options(argv)
    assert exited.value.code == 2


def test_figures_come_from_the_events_and_the_cpu_readings() -> None:
    lines = [
        '@scale {"event":"setup_done","ms":2500}',
        '@scale {"event":"first_deliveries","queues":4,"reached":3,"last_ms":7250,'
        '"latency_us":[2000,31000,40000]}',
        '@scale {"event":"window_end","seconds":10.0,"delivered":5000,'
        '"latency_us":[1500,9000,20000]}',
        '@scale {"event":"drained","published":6000,"confirmed":6000,"lost":0,"returned":2,'
        '"publish_error":""}',
        '@scale {"event":"delete_done","ms":1250}',
    ]
    run = LoadRun(events=[e for e in (parse_event(line) for line in lines) if e is not None])
    cpu = {
        "idle_begin": (0.0, {"proxy": 0.0}),
        "idle_end": (10.0, {"proxy": 0.2}),  # 20 ms/s
        "window_begin": (20.0, {"proxy": 1.0}),
        "window_end": (30.0, {"proxy": 2.2}),  # 1.2 s - 0.2 s idle = 1 s for 5000
    }
    out = SystemResult("proxy")
    figures(run, cpu, out)
    assert out.setup_s == 2.5
    assert out.delete_s == 1.25
    assert out.idle_ms_per_s == {"proxy": 20.0, ALL: 20.0}
    assert out.us_per_delivery == {"proxy": 200.0, ALL: 200.0}
    assert out.delivered_per_s == 500.0
    assert (out.p50_ms, out.p99_ms) == (1.5, 9.0)
    assert out.lost == 0
    assert out.counts["published"] == 6000
    assert (out.first_p50_ms, out.first_p99_ms, out.first_max_ms) == (2.0, 31.0, 40.0)
    assert out.first_last_s == 7.25
    assert out.detail == "1 queues had no first message; returned 2"


def test_setup_and_delete_cpu_per_queue_with_the_idle_rate_subtracted() -> None:
    lines = ['@scale {"event":"setup_done","ms":2000,"queues":100}']
    run = LoadRun(events=[e for e in (parse_event(line) for line in lines) if e is not None])
    cpu = {
        "setup_begin": (0.0, {"proxy": 0.0, "pulsar": 0.0}),
        "setup_done": (2.0, {"proxy": 1.04, "pulsar": 0.5}),
        "idle_begin": (5.0, {"proxy": 2.0, "pulsar": 1.0}),
        "idle_end": (15.0, {"proxy": 2.2, "pulsar": 1.0}),  # 20 and 0 ms/s
        "delete_begin": (50.0, {"proxy": 3.0, "pulsar": 2.0}),
        # the reading SETTLE_S after the last delete-ok, not the delete_done one
        "delete_done": (51.0, {"proxy": 3.1, "pulsar": 2.0}),
        "delete_settled": (61.0, {"proxy": 3.72, "pulsar": 3.0}),
    }
    out = SystemResult("proxy")
    figures(run, cpu, out)
    # (1.04 s - 2 s x 20 ms/s) / 100 queues
    assert out.setup_ms_per_queue == {"proxy": 10.0, "pulsar": 5.0, ALL: 15.0}
    # (0.72 s - 11 s x 20 ms/s) / 100
    assert out.delete_ms_per_queue == {"proxy": 5.0, "pulsar": 10.0, ALL: 15.0}
    text = full_report([CaseResult(Case("topic", 100), {"proxy": out})])
    assert "CPU per queue of the setup" in text
    assert f"the {SETTLE_S:g} s after its last delete-ok" in text


def test_notes_name_the_case_and_system_with_something_to_say() -> None:
    r = case_result()
    r.systems["proxy"].detail = "returned 2"
    r.systems["rabbitmq"].status, r.systems["rabbitmq"].detail = "error", "setup: refused"
    assert notes([r]) == [
        "topic 1,000 / proxy: ok. returned 2",
        "topic 1,000 / rabbitmq: error. setup: refused",
    ]
