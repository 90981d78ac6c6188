"""One ``pulsar-perf produce`` + ``pulsar-perf consume`` run against Pulsar, and its output.

The baseline the proxy's Pulsar figures are held against: Pulsar's own Java client, with
producer batching at its defaults (1 ms, 1000 messages), a Shared subscription, 1 KiB
messages, one topic per producer/consumer pair (``-t N``: ``<base>-0`` .. ``<base>-N-1``,
or ``<base>`` alone when N = 1). Started through the distribution's ``bin/pulsar-perf``, so
the JVM options are the ones it sets; ``PULSAR_PERFTEST_CONF`` points it at a client.conf
naming our Pulsar, never the ``localhost:6650`` of the distribution's own conf.

"Unthrottled" has no value of its own in pulsar-perf (``-r 0`` is refused), so it is a rate
no producer reaches; and each producer keeps at most ``max_outstanding`` messages in flight
(``-o``, the counterpart of PerfTest's confirm window), or it outruns the consumer into a
backlog of seconds and measures that backlog.

The consumer prints a line every 10 s (hard-coded in pulsar-perf)::

    ... PerformanceConsumer - Throughput received:  436208 msg --- 30721.970  msg/s ---
    240.015 Mbit/s  --- Latency: mean: 9.120 ms - med: 9 - 95pct: 14 - 99pct: 16 -
    99.9pct: 20 - 99.99pct: 27 - Max: 27

(a running total, then this interval's rate and end-to-end latency from the message's
publish time, in whole milliseconds). So its warm-up and window are whole 10 s intervals,
rounded up from what was asked; the servers' CPU is read when the lines at the window's
edges arrive, and the messages published in the window are read from the topics' stats.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from starlight_py.bench.cpu import CpuMeter
from starlight_py.bench.watched_process import WatchedProcess
from starlight_py.bench.window import IntervalFigures, WindowTracker

REPORT_INTERVAL_S = 10  # pulsar-perf's consumer reports every 10 s; not configurable
UNTHROTTLED_RATE = 10_000_000
SUBSCRIPTION = "bench"
_READY_TIMEOUT = 90.0
_SHUTDOWN_ALLOWANCE = 20.0
_ADMIN_TIMEOUT = 10.0

_NUMBER = r"([\d.]+|NaN)"
_CONSUMER_INTERVAL = re.compile(
    r"Throughput received:\s+(\d+) msg ---\s+" + _NUMBER + r"\s+msg/s .*?"
    r"Latency: mean:\s+" + _NUMBER + r" ms - med:\s+" + _NUMBER + r" - 95pct:\s+" + _NUMBER
    + r" - 99pct:\s+" + _NUMBER + r" - 99\.9pct:\s+" + _NUMBER
)  # fmt: skip
_AGGREGATED_THROUGHPUT = re.compile(
    r"Aggregated throughput stats --- (\d+) records (sent|received) --- " + _NUMBER + " msg/s"
)
_AGGREGATED_LATENCY = re.compile(
    r"Aggregated latency stats --- Latency: mean:\s+" + _NUMBER + r" ms - med:\s+" + _NUMBER
    + r" - 95pct:\s+" + _NUMBER + r" - 99pct:\s+" + _NUMBER
)  # fmt: skip


def _float(text: str) -> float:
    return 0.0 if text == "NaN" else float(text)


@dataclass(frozen=True)
class ConsumerInterval:
    """One 10-second line of ``pulsar-perf consume``."""

    total_received: int  # since the consumer started
    received_per_s: float
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float


def parse_consumer_interval(line: str) -> ConsumerInterval | None:
    """The consumer's interval line's figures, or None for any other line."""
    match = _CONSUMER_INTERVAL.search(line)
    if match is None:
        return None
    values = [_float(v) for v in match.groups()[1:]]
    return ConsumerInterval(int(match[1]), *values)


@dataclass(frozen=True)
class AggregatedStats:
    """What either side prints when it stops (its whole run, warm-up included). For the
    producer the latency is the publish latency, for the consumer end-to-end."""

    messages: int | None = None
    per_s: float | None = None
    mean_ms: float | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None


def parse_aggregated(lines: Sequence[str]) -> AggregatedStats:
    """The ``Aggregated ...`` lines among ``lines`` (missing ones leave fields None)."""
    messages = per_s = None
    latency: list[float | None] = [None, None, None, None]
    for line in lines:
        if match := _AGGREGATED_THROUGHPUT.search(line):
            messages, per_s = int(match[1]), _float(match[3])
        elif match := _AGGREGATED_LATENCY.search(line):
            latency = [_float(v) for v in match.groups()]
    return AggregatedStats(messages, per_s, *latency)


def window_figures(
    opening: ConsumerInterval,
    measured: Sequence[tuple[ConsumerInterval, float]],
    opened_at: float,
) -> list[IntervalFigures]:
    """The measured lines (each with its arrival time) as window intervals; ``opening``
    arrived at ``opened_at``. The sent counts are not in these lines (see PulsarPerfRun)."""
    figures = []
    previous_total, previous_at = opening.total_received, opened_at
    for interval, at in measured:
        figures.append(
            IntervalFigures(
                seconds=max(0.0, at - previous_at),
                received=interval.total_received - previous_total,
                sent=None,
                p50_ms=interval.p50_ms,
                p99_ms=interval.p99_ms,
            )
        )
        previous_total, previous_at = interval.total_received, at
    return figures


def report_intervals(seconds: float) -> int:
    """Whole 10 s reporting intervals covering ``seconds`` (at least one)."""
    return max(1, math.ceil(seconds / REPORT_INTERVAL_S))


@dataclass(frozen=True)
class PulsarPerfSpec:
    """What one run does. ``rate`` is the total over all producers; None = unthrottled."""

    service_url: str
    web_url: str
    topic_base: str  # persistent://public/default/<name>
    pairs: int
    warmup_s: int
    duration_s: int
    size: int = 1024
    rate: float | None = None
    max_outstanding: int = 100

    @property
    def topics(self) -> list[str]:
        if self.pairs == 1:
            return [self.topic_base]
        return [f"{self.topic_base}-{i}" for i in range(self.pairs)]


def consumer_arguments(spec: PulsarPerfSpec) -> list[str]:
    return [
        "consume",
        "--service-url", spec.service_url,
        "--subscription-type", "Shared",
        "--subscriptions", SUBSCRIPTION,
        "--num-topics", str(spec.pairs),
        spec.topic_base,
    ]  # fmt: skip


def producer_arguments(spec: PulsarPerfSpec) -> list[str]:
    # pulsar-perf takes whole messages per second only.
    rate = UNTHROTTLED_RATE if spec.rate is None else max(1, round(spec.rate))
    return [
        "produce",
        "--service-url", spec.service_url,
        "--admin-url", spec.web_url,
        "--size", str(spec.size),
        "--num-topics", str(spec.pairs),
        "--rate", str(rate),
        "--max-outstanding", str(spec.max_outstanding),
        spec.topic_base,
    ]  # fmt: skip


@dataclass
class PulsarPerfRun:
    """What came out of one run."""

    intervals: list[ConsumerInterval] = field(default_factory=list)
    opening: ConsumerInterval | None = None
    opened_at: float = 0.0
    measured: list[tuple[ConsumerInterval, float]] = field(default_factory=list)
    # messages the topics took in during the window (topic stats), None if unreadable
    published_in_window: int | None = None
    producer: AggregatedStats = field(default_factory=AggregatedStats)
    consumer: AggregatedStats = field(default_factory=AggregatedStats)
    error: str | None = None

    @property
    def complete(self) -> bool:
        return self.error is None and self.opening is not None and bool(self.measured)

    def window_intervals(self) -> list[IntervalFigures]:
        if self.opening is None:
            return []
        return window_figures(self.opening, self.measured, self.opened_at)

    def to_json(self) -> dict[str, Any]:
        return {
            "producer_whole_run": asdict(self.producer),
            "consumer_whole_run": asdict(self.consumer),
            "consumer_intervals": [asdict(i) for i in self.intervals],
            "published_in_window": self.published_in_window,
            "error": self.error,
        }


def run_pulsar_perf(
    distribution: Path, spec: PulsarPerfSpec, meter: CpuMeter, log_dir: Path
) -> PulsarPerfRun:
    """Start the consumer, then the producer; read the servers' CPU and the topics'
    counters at the edges of the window; stop both; delete the topics.

    Raises BenchError when a process cannot be started; later failures are in ``error``.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    conf = log_dir / "client.conf"
    conf.write_text(f"webServiceUrl={spec.web_url}\nbrokerServiceUrl={spec.service_url}\n")
    env = {**os.environ, "PULSAR_LOG_DIR": str(log_dir), "PULSAR_PERFTEST_CONF": str(conf)}
    script = str(distribution / "bin" / "pulsar-perf")
    run = PulsarPerfRun()
    consumer = WatchedProcess(
        "pulsar-perf consume", [script, *consumer_arguments(spec)], log_dir / "consume.log", env
    )
    producer: WatchedProcess | None = None
    try:
        if not consumer.wait_for("Start receiving from", _READY_TIMEOUT):
            run.error = f"pulsar-perf consume did not subscribe:\n{consumer.tail()}"
            return run
        producer = WatchedProcess(
            "pulsar-perf produce", [script, *producer_arguments(spec)], log_dir / "produce.log", env
        )
        _measure(consumer, producer, spec, meter, run)
        producer.stop(signal.SIGINT)  # SIGINT: it prints its aggregated stats
        run.producer = parse_aggregated([line.text for line in producer.drain(_SHUTDOWN_ALLOWANCE)])
        consumer.stop(signal.SIGINT)
        run.consumer = parse_aggregated([line.text for line in consumer.drain(_SHUTDOWN_ALLOWANCE)])
    finally:
        if producer is not None:
            producer.stop()
        consumer.stop()
        for topic in spec.topics:
            _delete_topic(spec.web_url, topic)
    return run


def _measure(
    consumer: WatchedProcess,
    producer: WatchedProcess,
    spec: PulsarPerfSpec,
    meter: CpuMeter,
    run: PulsarPerfRun,
) -> None:
    tracker = WindowTracker(report_intervals(spec.warmup_s), report_intervals(spec.duration_s))
    total_s = (tracker.warmup + tracker.measured + 1) * REPORT_INTERVAL_S
    deadline = time.monotonic() + total_s + _READY_TIMEOUT
    published_before: int | None = None
    while not tracker.closed:
        # Woken every second: a producer that fails (bad option, no connection) ends the
        # case now rather than after a whole window of empty reports.
        line = consumer.next_line(min(deadline, time.monotonic() + 1.0))
        if producer.exit_code() is not None:
            run.error = f"pulsar-perf produce exited early:\n{producer.tail()}"
            return
        if line is None:
            if consumer.ended or time.monotonic() >= deadline:
                run.error = (
                    f"pulsar-perf consume stopped after {len(run.intervals)} reports:\n"
                    f"{consumer.tail()}\nproducer:\n{producer.tail()}"
                )
                return
            continue
        interval = parse_consumer_interval(line.text)
        if interval is None:
            continue
        run.intervals.append(interval)
        event = tracker.feed(len(run.intervals))
        if event == "open":
            meter.open_window()
            published_before = _published(spec)
            run.opening, run.opened_at = interval, line.at
        elif tracker.opened:
            run.measured.append((interval, line.at))
            if event == "close":
                meter.close_window()
                published_after = _published(spec)
                if published_before is not None and published_after is not None:
                    run.published_in_window = published_after - published_before


def topic_admin_path(topic: str) -> str:
    """``persistent://tenant/ns/name`` -> ``/admin/v2/persistent/tenant/ns/name`` (the
    name URL-quoted), the topic's path in Pulsar's admin REST API."""
    scheme, _, rest = topic.partition("://")
    tenant, namespace, name = rest.split("/", 2)
    return f"/admin/v2/{scheme}/{tenant}/{namespace}/{urllib.parse.quote(name, safe='')}"


def _published(spec: PulsarPerfSpec) -> int | None:
    """Messages the topics have taken in so far, from their stats; None if unreadable."""
    total = 0
    for topic in spec.topics:
        url = spec.web_url.rstrip("/") + topic_admin_path(topic) + "/stats"
        try:
            with urllib.request.urlopen(url, timeout=_ADMIN_TIMEOUT) as response:
                stats = json.load(response)
            total += int(stats["msgInCounter"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return total


def _delete_topic(web_url: str, topic: str) -> None:
    url = web_url.rstrip("/") + topic_admin_path(topic) + "?force=true"
    request = urllib.request.Request(url, method="DELETE")
    try:
        with urllib.request.urlopen(request, timeout=_ADMIN_TIMEOUT):
            pass
    except (OSError, urllib.error.HTTPError):
        pass  # best effort: the topic names are unique to this run anyway
