"""PerfTest's output as the benchmark reads it, from lines PerfTest 2.22.1 printed here."""

# ruff: noqa: E501  (PerfTest's lines are kept verbatim)

from __future__ import annotations

from pathlib import Path

import pytest

from starlight_py.bench.java_suite import SuiteSettings, perftest_spec
from starlight_py.bench.load_result import SCENARIOS
from starlight_py.bench.perftest import (
    PerfTestInterval,
    PerfTestSpec,
    parse_interval,
    parse_summary,
    perftest_arguments,
    window_figures,
)
from starlight_py.bench.window import WindowTracker, summarize

# `-x 1 -y 1 -c 100 -A 50 -q 200 -f persistent -s 1024 -r 300 -z 8` against the proxy.
RATE_300_RUN = """\
id: test-172743-346, starting consumer #0
id: test-172743-346, starting consumer #0, channel #0
id: test-172743-346, starting producer #0
id: test-172743-346, starting producer #0, channel #0
id: test-172743-346, time 1.000 s, sent: 301 msg/s, confirmed: 301 msg/s, nacked: 0 msg/s, received: 299 msg/s, min/median/75th/95th/99th consumer latency: 4078/23250/34719/39775/40329 µs, confirm latency: 1872/14296/32016/36366/38592 µs
id: test-172743-346, time 2.000 s, sent: 301 msg/s, confirmed: 300 msg/s, nacked: 0 msg/s, received: 300 msg/s, min/median/75th/95th/99th consumer latency: 3450/8946/10659/12502/14955 µs, confirm latency: 1289/2076/2329/3920/6423 µs
id: test-172743-346, time 3.000 s, sent: 300 msg/s, confirmed: 299 msg/s, nacked: 0 msg/s, received: 301 msg/s, min/median/75th/95th/99th consumer latency: 3157/8775/10397/12141/15302 µs, confirm latency: 1762/2022/2206/3356/8293 µs
id: test-172743-346, time 4.001 s, sent: 299 msg/s, confirmed: 301 msg/s, nacked: 0 msg/s, received: 300 msg/s, min/median/75th/95th/99th consumer latency: 3738/9256/10998/13820/52604 µs, confirm latency: 1770/2140/2438/4698/18389 µs
id: test-172743-346, time 5.000 s, sent: 301 msg/s, confirmed: 300 msg/s, nacked: 0 msg/s, received: 299 msg/s, min/median/75th/95th/99th consumer latency: 3578/8982/10643/12635/16115 µs, confirm latency: 1008/2030/2212/3994/5973 µs
id: test-172743-346, time 6.000 s, sent: 300 msg/s, confirmed: 300 msg/s, nacked: 0 msg/s, received: 300 msg/s, min/median/75th/95th/99th consumer latency: 3617/9089/11002/14063/19353 µs, confirm latency: 1041/2061/2258/4798/10489 µs
id: test-172743-346, time 7.000 s, sent: 300 msg/s, confirmed: 300 msg/s, nacked: 0 msg/s, received: 301 msg/s, min/median/75th/95th/99th consumer latency: 3355/8725/10423/12148/14773 µs, confirm latency: 1769/2004/2127/2725/5248 µs
id: test-172743-346, time 8.000 s, sent: 300 msg/s, confirmed: 300 msg/s, nacked: 0 msg/s, received: 299 msg/s, min/median/75th/95th/99th consumer latency: 3211/8757/10278/12032/12870 µs, confirm latency: 975/1975/2059/2368/3845 µs
test stopped (Reached time limit)
id: test-172743-346, sending rate avg: 316 msg/s
id: test-172743-346, receiving rate avg: 316 msg/s
id: test-172743-346, consumer latency min/median/75th/95th/99th 3157/9252/11109/31724/37732 µs
id: test-172743-346, confirm latency min/median/75th/95th/99th 975/2061/2299/20749/35101 µs
"""

# `--metrics-format compact` prints a table instead; the benchmark does not use it.
COMPACT_LINE = (
    "1.000s      12901 msg/s  12871 msg/s      0 msg/s  12890 msg/s "
    "221/3103/4467/8744/11757 µs 706/4319/5215/8552/10943 µs"
)


def test_a_per_second_line_gives_rates_and_consumer_latency() -> None:
    line = RATE_300_RUN.splitlines()[7]
    assert parse_interval(line) == PerfTestInterval(
        time_s=4.001,
        sent_per_s=299,
        confirmed_per_s=301,
        received_per_s=300,
        latency_us=(3738, 9256, 10998, 13820, 52604),
    )


def test_a_saturated_4p4c_line_against_rabbitmq() -> None:
    line = (
        "id: test-171255-496, time 3.000 s, sent: 22191 msg/s, confirmed: 22191 msg/s, "
        "nacked: 0 msg/s, received: 22419 msg/s, min/median/75th/95th/99th consumer "
        "latency: 818/8599/18228/149171/191811 µs, confirm latency: "
        "1407/11632/16034/29093/58777 µs"
    )
    interval = parse_interval(line)
    assert interval is not None
    assert (interval.sent_per_s, interval.received_per_s) == (22191, 22419)
    assert interval.latency_us[4] == 191811


def test_latency_in_milliseconds_is_converted_to_microseconds() -> None:
    line = (
        "id: x, time 2.000 s, sent: 10 msg/s, received: 10 msg/s, "
        "min/median/75th/95th/99th consumer latency: 1/2/3/4/5 ms"
    )
    interval = parse_interval(line)
    assert interval is not None
    assert interval.confirmed_per_s is None  # no -c: no confirm column
    assert interval.latency_us == (1000, 2000, 3000, 4000, 5000)


@pytest.mark.parametrize(
    "line",
    [
        "id: test-172743-346, starting producer #0, channel #0",
        "test stopped (Reached time limit)",
        "id: test-172743-346, sending rate avg: 316 msg/s",
        COMPACT_LINE,
        "Main thread caught exception: java.net.ConnectException: Connection refused",
    ],
)
def test_other_lines_are_not_intervals(line: str) -> None:
    assert parse_interval(line) is None


def test_the_final_summary() -> None:
    summary = parse_summary(RATE_300_RUN.splitlines())
    assert summary.sending_per_s == 316
    assert summary.receiving_per_s == 316
    assert summary.consumer_latency_us == (3157, 9252, 11109, 31724, 37732)
    assert summary.confirm_latency_us == (975, 2061, 2299, 20749, 35101)


def test_a_run_that_failed_has_no_summary() -> None:
    summary = parse_summary(["Main thread caught exception: java.net.ConnectException"])
    assert summary.sending_per_s is None
    assert summary.consumer_latency_us is None


def test_the_window_leaves_out_the_warm_up_seconds() -> None:
    """2 s warm-up, 5 s measured: the line at 2 s opens the window, 3..7 s are in it."""
    intervals = [i for i in map(parse_interval, RATE_300_RUN.splitlines()) if i is not None]
    tracker = WindowTracker(2, 5)
    opening, measured = None, []
    for interval in intervals:
        event = tracker.feed(round(interval.time_s))
        if event == "open":
            opening = interval
        elif tracker.opened:
            measured.append(interval)
            if event == "close":
                break
    assert opening is not None and opening.time_s == 2.0
    assert [round(i.time_s) for i in measured] == [3, 4, 5, 6, 7]

    figures = window_figures(opening, measured)
    assert [round(f.seconds, 3) for f in figures] == [1.0, 1.001, 0.999, 1.0, 1.0]
    window = summarize(figures)
    assert window.seconds == 5.0
    assert window.received == round(301 * 1.0 + 300 * 1.001 + 299 * 0.999 + 300 + 301)
    assert window.p50_ms == 8.982  # the median of 8.775, 9.256, 8.982, 9.089, 8.725
    # the 52.6 ms second weighs one fifth: the first second's 40 ms is warm-up
    assert window.p99_ms == pytest.approx((15.302 + 52.604 + 16.115 + 19.353 + 14.773) / 5, 0.01)


def test_arguments_for_4p4c_saturation() -> None:
    spec = PerfTestSpec(
        url="amqp://guest:guest@127.0.0.1:5672/%2F",
        queue_prefix="perftest-run-4p4c-proxy",
        warmup_s=10,
        duration_s=30,
        producers=4,
        consumers=4,
        queues=4,
    )
    arguments = perftest_arguments(spec)
    pairs = dict(zip(arguments[::2], arguments[1::2], strict=True))
    assert pairs == {
        "--uri": "amqp://guest:guest@127.0.0.1:5672/%2F",
        "--producers": "4",
        "--consumers": "4",
        "--queue-pattern": "perftest-run-4p4c-proxy-%d",
        "--queue-pattern-from": "1",
        "--queue-pattern-to": "4",
        "--size": "1024",
        "--flag": "persistent",
        "--confirm": "100",
        "--multi-ack-every": "50",
        "--qos": "200",
        "--auto-delete": "true",
        "--time": "41",
    }
    assert spec.queue_names == [f"perftest-run-4p4c-proxy-{i}" for i in range(1, 5)]


def test_a_fixed_rate_is_per_producer_and_whole_when_it_can_be() -> None:
    spec = PerfTestSpec("amqp://x", "q", 2, 5, rate_per_producer=300.0)
    assert perftest_arguments(spec)[-2:] == ["--rate", "300"]
    spec = PerfTestSpec(
        "amqp://x", "q", 2, 5, producers=4, consumers=4, queues=4, rate_per_producer=75.5
    )
    assert perftest_arguments(spec)[-2:] == ["--rate", "75.5"]


def test_a_scenario_with_an_exchange_type_publishes_to_an_exchange_of_its_own() -> None:
    spec = PerfTestSpec("amqp://x", "perftest-run-fan", 2, 5, exchange_type="fanout")
    arguments = perftest_arguments(spec)
    assert arguments[-4:] == ["--type", "fanout", "--exchange", "perftest-run-fan-x"]
    assert "--type" not in perftest_arguments(PerfTestSpec("amqp://x", "q", 2, 5))


def _scenario_arguments(name: str) -> list[str]:
    """PerfTest's arguments for a case of scenario ``name``, as the suite builds them (10 s
    of warm-up, 30 s measured)."""
    settings = SuiteSettings(10, 30, "run", Path("/tmp"), ["java"], Path("/tmp"))
    spec = perftest_spec(SCENARIOS[name], "amqp://x", f"perftest-run-{name}", settings)
    return perftest_arguments(spec)


def _common(prefetch: int = 200) -> list[str]:
    return [
        "--size", "1024",
        "--flag", "persistent",
        "--confirm", "100",
        "--multi-ack-every", "50",
        "--qos", str(prefetch),
        "--auto-delete", "true",
        "--time", "41",
    ]  # fmt: skip


def _spread(prefix: str, producers: int, consumers: int, queues: int) -> list[str]:
    return [
        "--uri", "amqp://x",
        "--producers", str(producers),
        "--consumers", str(consumers),
        "--queue-pattern", f"{prefix}-%d",
        "--queue-pattern-from", "1",
        "--queue-pattern-to", str(queues),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("1p1c", [*_spread("perftest-run-1p1c", 1, 1, 1), *_common()]),
        ("4p4c", [*_spread("perftest-run-4p4c", 4, 4, 4), *_common()]),
        (
            "1p1c-300",
            [*_spread("perftest-run-1p1c-300", 1, 1, 1), *_common(), "--rate", "300"],
        ),
        (
            "1p1c-fanout",
            [
                *_spread("perftest-run-1p1c-fanout", 1, 1, 1),
                *_common(),
                "--type", "fanout",
                "--exchange", "perftest-run-1p1c-fanout-x",
            ],
        ),
    ],
)  # fmt: skip
def test_the_first_scenarios_keep_their_arguments(name: str, expected: list[str]) -> None:
    assert _scenario_arguments(name) == expected


def test_a_work_queue_puts_four_consumers_on_one_queue() -> None:
    """--queue-pattern from 1 to 1: PerfTest spreads the consumers over that one queue."""
    assert _scenario_arguments("1p4c-work") == [
        "--uri", "amqp://x",
        "--producers", "1",
        "--consumers", "4",
        "--queue-pattern", "perftest-run-1p4c-work-%d",
        "--queue-pattern-from", "1",
        "--queue-pattern-to", "1",
        "--size", "1024",
        "--flag", "persistent",
        "--confirm", "100",
        "--multi-ack-every", "5",
        "--qos", "10",
        "--auto-delete", "true",
        "--time", "41",
    ]  # fmt: skip


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_no_scenario_acknowledges_more_at_once_than_its_prefetch(name: str) -> None:
    """PerfTest refuses --multi-ack-every above --qos (and stops at once)."""
    arguments = _scenario_arguments(name)
    every = int(arguments[arguments.index("--multi-ack-every") + 1])
    assert every <= int(arguments[arguments.index("--qos") + 1])


def test_a_fanout_to_ten_queues_has_one_consumer_on_each() -> None:
    """Ten queues bound to the fanout exchange, ten consumers spread one per queue, one
    producer publishing to the exchange."""
    assert _scenario_arguments("1p10c-fanout") == [
        "--uri", "amqp://x",
        "--producers", "1",
        "--consumers", "10",
        "--queue-pattern", "perftest-run-1p10c-fanout-%d",
        "--queue-pattern-from", "1",
        "--queue-pattern-to", "10",
        "--size", "1024",
        "--flag", "persistent",
        "--confirm", "100",
        "--multi-ack-every", "50",
        "--qos", "200",
        "--auto-delete", "true",
        "--time", "41",
        "--type", "fanout",
        "--exchange", "perftest-run-1p10c-fanout-x",
    ]  # fmt: skip
