"""One RabbitMQ PerfTest run against an AMQP server, and what its output says.

PerfTest prints one line per second (default metrics format)::

    id: test-171206-707, time 4.000 s, sent: 25876 msg/s, confirmed: 25876 msg/s, nacked:
    0 msg/s, received: 25837 msg/s, min/median/75th/95th/99th consumer latency:
    437/1788/2312/4019/7640 µs, confirm latency: 733/3256/3932/5163/22537 µs

and a summary of the whole run at the end (``sending rate avg: N msg/s``, ``receiving rate
avg``, ``consumer latency min/median/75th/95th/99th a/b/c/d/e µs``). It has no warm-up
option, so the run lasts warm-up + measured + 1 s, the measured window is made of the
per-second lines after the warm-up (``window``), and the servers' CPU is read when the
line that opens the window arrives and when the one that closes it arrives (``cpu``). The
summary, warm-up included, goes to the JSON file only.

Queues: ``<prefix>-1`` .. ``<prefix>-N`` through ``--queue-pattern``, ``-from 1``,
``-to N``. PerfTest's "Working With Many Queues" (usage-advanced.adoc) says it spreads the
producers and the consumers over that sequence round-robin: with ``-x N -y N`` each queue
has one producer and one consumer, with ``-to 1 -y 4`` the four consumers share the one
queue. Each queue is bound to the exchange PerfTest publishes to (``--exchange``, of
``--type``; its own ``direct`` exchange by default) with the queue's name as routing key,
and a producer publishes with its queue's name as routing key (``SequenceTopologyHandler``
in its MulticastParams.java), so through a fanout exchange one producer's messages reach
every queue of the sequence and ``received`` counts every consumer's deliveries.
Persistent messages (``-f persistent``), which also makes PerfTest declare the queues
durable; ``--auto-delete true`` removes them when the consumers go.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from starlight_py.bench.cpu import CpuMeter
from starlight_py.bench.watched_process import WatchedProcess
from starlight_py.bench.window import IntervalFigures, WindowTracker

# After the run's own length: JVM start, connections, queue declarations, the summary.
_STARTUP_ALLOWANCE = 60.0
_SHUTDOWN_ALLOWANCE = 20.0

_INTERVAL = re.compile(
    r"time:? (?P<time>[\d.]+) ?s, sent: (?P<sent>\d+) msg/s,"
    r"(?: returned: \d+ msg/s,)?(?: confirmed: (?P<confirmed>\d+) msg/s,)?"
    r"(?: nacked: \d+ msg/s,)? received: (?P<received>\d+) msg/s, "
    r"min/median/75th/95th/99th consumer latency: "
    r"(?P<latency>\d+/\d+/\d+/\d+/\d+) (?P<unit>µs|ms)"
)
_SENDING_AVG = re.compile(r"sending rate avg: (\d+) msg/s")
_RECEIVING_AVG = re.compile(r"receiving rate avg: (\d+) msg/s")
_SUMMARY_LATENCY = re.compile(
    r"(consumer|confirm) latency min/median/75th/95th/99th (\d+/\d+/\d+/\d+/\d+) (µs|ms)"
)


@dataclass(frozen=True)
class PerfTestInterval:
    """One per-second line."""

    time_s: float  # since the start of the run, as PerfTest counts
    sent_per_s: int
    confirmed_per_s: int | None
    received_per_s: int
    # consumer latency: min, median, 75th, 95th, 99th percentile, in microseconds
    latency_us: tuple[int, int, int, int, int]


@dataclass(frozen=True)
class PerfTestSummary:
    """The lines PerfTest prints when it stops (the whole run, warm-up included)."""

    sending_per_s: int | None = None
    receiving_per_s: int | None = None
    consumer_latency_us: tuple[int, ...] | None = None  # min/median/75th/95th/99th
    confirm_latency_us: tuple[int, ...] | None = None


def _to_us(values: str, unit: str) -> tuple[int, ...]:
    factor = 1000 if unit == "ms" else 1
    return tuple(int(v) * factor for v in values.split("/"))


def parse_interval(line: str) -> PerfTestInterval | None:
    """The per-second line's figures, or None for any other line."""
    match = _INTERVAL.search(line)
    if match is None:
        return None
    latency = _to_us(match["latency"], match["unit"])
    confirmed = match["confirmed"]
    return PerfTestInterval(
        time_s=float(match["time"]),
        sent_per_s=int(match["sent"]),
        confirmed_per_s=int(confirmed) if confirmed is not None else None,
        received_per_s=int(match["received"]),
        latency_us=(latency[0], latency[1], latency[2], latency[3], latency[4]),
    )


def parse_summary(lines: Sequence[str]) -> PerfTestSummary:
    """The final summary found among ``lines`` (fields missing from them stay None)."""
    sending = receiving = None
    latencies: dict[str, tuple[int, ...]] = {}
    for line in lines:
        if match := _SENDING_AVG.search(line):
            sending = int(match[1])
        elif match := _RECEIVING_AVG.search(line):
            receiving = int(match[1])
        elif match := _SUMMARY_LATENCY.search(line):
            latencies[match[1]] = _to_us(match[2], match[3])
    return PerfTestSummary(sending, receiving, latencies.get("consumer"), latencies.get("confirm"))


def window_figures(
    opening: PerfTestInterval, measured: Sequence[PerfTestInterval]
) -> list[IntervalFigures]:
    """The measured lines as window intervals; ``opening`` is the line that opened the
    window (its time is where the first measured second starts)."""
    figures = []
    previous = opening.time_s
    for interval in measured:
        seconds = max(0.0, interval.time_s - previous)
        previous = interval.time_s
        figures.append(
            IntervalFigures(
                seconds=seconds,
                received=interval.received_per_s * seconds,
                sent=interval.sent_per_s * seconds,
                p50_ms=interval.latency_us[1] / 1000,
                p99_ms=interval.latency_us[4] / 1000,
            )
        )
    return figures


@dataclass(frozen=True)
class PerfTestSpec:
    """What one PerfTest run does. Rates are per producer; None = as fast as it can."""

    url: str
    queue_prefix: str
    warmup_s: int
    duration_s: int
    producers: int = 1
    consumers: int = 1
    queues: int = 1  # <queue_prefix>-1 .. -N; producers and consumers spread round-robin
    size: int = 1024
    rate_per_producer: float | None = None
    confirm_window: int = 100
    multi_ack_every: int = 50
    prefetch: int = 200
    exchange_type: str | None = None  # publish to `<queue_prefix>-x` of this type

    @property
    def exchange(self) -> str:
        return f"{self.queue_prefix}-x"

    @property
    def queue_names(self) -> list[str]:
        return [f"{self.queue_prefix}-{i}" for i in range(1, self.queues + 1)]


def perftest_arguments(spec: PerfTestSpec) -> list[str]:
    """PerfTest's command-line arguments for ``spec``."""
    arguments = [
        "--uri", spec.url,
        "--producers", str(spec.producers),
        "--consumers", str(spec.consumers),
        "--queue-pattern", f"{spec.queue_prefix}-%d",
        "--queue-pattern-from", "1",
        "--queue-pattern-to", str(spec.queues),
        "--size", str(spec.size),
        "--flag", "persistent",
        "--confirm", str(spec.confirm_window),
        "--multi-ack-every", str(spec.multi_ack_every),
        "--qos", str(spec.prefetch),
        "--auto-delete", "true",
        # One more second than measured: the line that closes the window must come
        # before PerfTest stops.
        "--time", str(spec.warmup_s + spec.duration_s + 1),
    ]  # fmt: skip
    if spec.exchange_type is not None:
        arguments += ["--type", spec.exchange_type, "--exchange", spec.exchange]
    if spec.rate_per_producer is not None:
        rate = spec.rate_per_producer
        arguments += ["--rate", str(int(rate)) if rate == int(rate) else str(rate)]
    return arguments


@dataclass
class PerfTestRun:
    """What came out of one run: every per-second line, those of the window, the summary."""

    intervals: list[PerfTestInterval] = field(default_factory=list)
    opening: PerfTestInterval | None = None
    measured: list[PerfTestInterval] = field(default_factory=list)
    summary: PerfTestSummary = field(default_factory=PerfTestSummary)
    error: str | None = None

    @property
    def complete(self) -> bool:
        return self.error is None and self.opening is not None and bool(self.measured)

    def window_intervals(self) -> list[IntervalFigures]:
        if self.opening is None:
            return []
        return window_figures(self.opening, self.measured)

    def to_json(self) -> dict[str, Any]:
        return {
            "summary": asdict(self.summary),
            "intervals": [asdict(i) for i in self.intervals],
            "window_opened_at_s": self.opening.time_s if self.opening else None,
            "error": self.error,
        }


def run_perftest(
    command: Sequence[str], spec: PerfTestSpec, meter: CpuMeter, log_path: Path
) -> PerfTestRun:
    """Run PerfTest (``command`` = java and its class path, see ``perftest_install``) and
    read the servers' CPU at the edges of the measured window.

    Raises BenchError when the process cannot be started; every later failure is in the
    result's ``error``.
    """
    process = WatchedProcess("PerfTest", [*command, *perftest_arguments(spec)], log_path)
    run = PerfTestRun()
    tracker = WindowTracker(spec.warmup_s, spec.duration_s)
    deadline = time.monotonic() + spec.warmup_s + spec.duration_s + _STARTUP_ALLOWANCE
    others: list[str] = []
    try:
        while not tracker.closed:
            line = process.next_line(deadline)
            if line is None:
                if process.ended or time.monotonic() >= deadline:
                    break
                continue
            interval = parse_interval(line.text)
            if interval is None:
                others.append(line.text)
                continue
            run.intervals.append(interval)
            event = tracker.feed(round(interval.time_s))
            if event == "open":
                meter.open_window()
                run.opening = interval
            elif tracker.opened:
                run.measured.append(interval)
                if event == "close":
                    meter.close_window()
        others += [line.text for line in process.drain(_SHUTDOWN_ALLOWANCE)]
        run.summary = parse_summary(others)
        if not tracker.closed:
            seen = f"{len(run.intervals)} per-second lines"
            run.error = f"PerfTest stopped after {seen}:\n{process.tail()}"
    finally:
        process.stop()
    return run
