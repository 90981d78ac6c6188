"""pulsar-perf's output as the benchmark reads it, from lines Pulsar 4.0.8's printed here."""

from __future__ import annotations

import pytest

from starlight_py.bench.pulsar_perf import (
    UNTHROTTLED_RATE,
    AggregatedStats,
    ConsumerInterval,
    PulsarPerfSpec,
    consumer_arguments,
    parse_aggregated,
    parse_consumer_interval,
    producer_arguments,
    report_intervals,
    topic_admin_path,
    window_figures,
)
from starlight_py.bench.window import summarize

PREFIX = "2026-11-24T17:28:23,594+0000 [main] INFO  org.apache.pulsar.testclient."
CONSUMER_LINES = [
    PREFIX + "PerformanceConsumer - Throughput received:    1962 msg --- 196.198  msg/s --- "
    "1.533 Mbit/s  --- Latency: mean: 9.565 ms - med: 9 - 95pct: 14 - 99pct: 49 - 99.9pct: 91 "
    "- 99.99pct: 95 - Max: 95",
    PREFIX + "PerformanceConsumer - Throughput received:    4974 msg --- 300.109  msg/s --- "
    "2.345 Mbit/s  --- Latency: mean: 8.734 ms - med: 9 - 95pct: 14 - 99pct: 21 - 99.9pct: 32 "
    "- 99.99pct: 37 - Max: 37",
    PREFIX + "PerformanceConsumer - Throughput received:  436208 msg --- 30721.970  msg/s --- "
    "240.015 Mbit/s  --- Latency: mean: 9.120 ms - med: 9 - 95pct: 14 - 99pct: 16 - 99.9pct: "
    "20 - 99.99pct: 27 - Max: 27",
]
CONSUMER_AGGREGATED = [
    "2026-11-24T17:28:25,737+0000 [perf-client-shutdown] INFO  org.apache.pulsar.testclient."
    "PerformanceConsumer - Aggregated throughput stats --- 4980 records received --- 224.509 "
    "msg/s --- 1.754 Mbit/s --- AckRate: 224.5088134507025  msg/s --- ack failed 0 msg",
    "2026-11-24T17:28:25,777+0000 [perf-client-shutdown] INFO  org.apache.pulsar.testclient."
    "PerformanceConsumer - Aggregated latency stats --- Latency: mean: 9.063 ms - med: 9 - "
    "95pct: 14 - 99pct: 28 - 99.9pct: 89 - 99.99pct: 95 - 99.999pct: 95 - Max: 95",
]
PRODUCER_LINES = [
    "2026-11-24T17:28:16,209+0000 [main] INFO  org.apache.pulsar.testclient.PerformanceProducer"
    " - Throughput produced:    2746 msg ---    274.6 msg/s ---      2.1 Mbit/s  --- failure   "
    "   0.0 msg/s --- Latency: mean:   2.974 ms - med:   2.669 - 95pct:   4.287 - 99pct:   "
    "7.965 - 99.9pct:  29.705 - 99.99pct:  32.260 - Max:  32.260",
    "2026-11-24T17:28:25,647+0000 [perf-client-shutdown] INFO  org.apache.pulsar.testclient."
    "PerformanceProducer - Aggregated throughput stats --- 4980 records sent --- 255.567 msg/s "
    "--- 1.997 Mbit/s ",
    "2026-11-24T17:28:25,664+0000 [perf-client-shutdown] INFO  org.apache.pulsar.testclient."
    "PerformanceProducer - Aggregated latency stats --- Latency: mean:   2.972 ms - med:   "
    "2.654 - 95pct:   4.373 - 99pct:   8.990 - 99.9pct:  22.399 - 99.99pct:  32.260 - "
    "99.999pct:  32.260 - Max:  32.260",
]


def test_a_consumer_report_gives_the_running_total_and_latency() -> None:
    assert parse_consumer_interval(CONSUMER_LINES[1]) == ConsumerInterval(
        total_received=4974,
        received_per_s=300.109,
        mean_ms=8.734,
        p50_ms=9.0,
        p95_ms=14.0,
        p99_ms=21.0,
        p999_ms=32.0,
    )


def test_an_idle_consumer_report() -> None:
    line = (
        PREFIX + "PerformanceConsumer - Throughput received:       0 msg --- 0.000  msg/s --- "
        "0.000 Mbit/s  --- Latency: mean: 0.000 ms - med: 0 - 95pct: 0 - 99pct: 0 - 99.9pct: 0 "
        "- 99.99pct: 0 - Max: 0"
    )
    interval = parse_consumer_interval(line)
    assert interval is not None and interval.total_received == 0


@pytest.mark.parametrize(
    "line", [PRODUCER_LINES[0], *CONSUMER_AGGREGATED, "------------------- DONE ---------"]
)
def test_other_lines_are_not_consumer_reports(line: str) -> None:
    assert parse_consumer_interval(line) is None


def test_the_consumers_aggregated_stats() -> None:
    assert parse_aggregated(CONSUMER_AGGREGATED) == AggregatedStats(
        messages=4980, per_s=224.509, mean_ms=9.063, p50_ms=9.0, p95_ms=14.0, p99_ms=28.0
    )


def test_the_producers_aggregated_stats() -> None:
    stats = parse_aggregated(PRODUCER_LINES)
    assert (stats.messages, stats.per_s) == (4980, 255.567)
    assert (stats.p50_ms, stats.p99_ms) == (2.654, 8.99)


def test_a_killed_process_has_no_aggregated_stats() -> None:
    assert parse_aggregated(CONSUMER_LINES) == AggregatedStats()


def test_the_window_counts_messages_from_the_running_totals() -> None:
    opening, *rest = (parse_consumer_interval(line) for line in CONSUMER_LINES[:2])
    assert opening is not None and rest[0] is not None
    figures = window_figures(opening, [(rest[0], 110.0)], opened_at=100.0)
    window = summarize(figures)
    assert window.seconds == 10.0
    assert window.received == 4974 - 1962
    assert window.received_per_s == 301.2
    assert (window.p50_ms, window.p99_ms) == (9.0, 21.0)
    assert window.sent is None  # from the topic stats instead


@pytest.mark.parametrize(("seconds", "intervals"), [(1, 1), (5, 1), (10, 1), (11, 2), (30, 3)])
def test_warm_up_and_window_round_up_to_whole_reports(seconds: int, intervals: int) -> None:
    assert report_intervals(seconds) == intervals


def _spec(pairs: int, rate: float | None) -> PulsarPerfSpec:
    return PulsarPerfSpec(
        service_url="pulsar://127.0.0.1:6651",
        web_url="http://127.0.0.1:8081",
        topic_base="persistent://public/default/pulsar-perf-run-03-1p1c-pulsar",
        pairs=pairs,
        warmup_s=10,
        duration_s=30,
        rate=rate,
    )


def test_one_topic_per_pair() -> None:
    assert _spec(1, None).topics == ["persistent://public/default/pulsar-perf-run-03-1p1c-pulsar"]
    assert _spec(4, None).topics == [
        f"persistent://public/default/pulsar-perf-run-03-1p1c-pulsar-{i}" for i in range(4)
    ]


def test_consumer_arguments_name_our_pulsar_and_a_shared_subscription() -> None:
    arguments = consumer_arguments(_spec(4, None))
    assert arguments[0] == "consume"
    options = dict(zip(arguments[1:-1:2], arguments[2:-1:2], strict=True))
    assert options == {
        "--service-url": "pulsar://127.0.0.1:6651",
        "--subscription-type": "Shared",
        "--subscriptions": "bench",
        "--num-topics": "4",
    }
    assert arguments[-1] == "persistent://public/default/pulsar-perf-run-03-1p1c-pulsar"


def test_producer_arguments_unthrottled_and_at_a_fixed_rate() -> None:
    def options(rate: float | None) -> dict[str, str]:
        arguments = producer_arguments(_spec(1, rate))
        return dict(zip(arguments[1:-1:2], arguments[2:-1:2], strict=True))

    unthrottled = options(None)
    assert unthrottled["--rate"] == str(UNTHROTTLED_RATE)  # pulsar-perf refuses -r 0
    assert unthrottled["--max-outstanding"] == "100"
    assert unthrottled["--size"] == "1024"
    assert unthrottled["--admin-url"] == "http://127.0.0.1:8081"
    assert options(300.0)["--rate"] == "300"  # an int: pulsar-perf refuses "300.0"


def test_admin_paths_quote_the_topic_name() -> None:
    assert topic_admin_path("persistent://public/default/a b") == (
        "/admin/v2/persistent/public/default/a%20b"
    )
