"""The measured window's figures, from the load generators' per-interval lines.

Neither PerfTest nor pulsar-perf has a warm-up option that leaves the warm-up out of its
final summary, and both print one line per reporting interval (PerfTest every second,
pulsar-perf's consumer every 10 s) with that interval's message count and latency
percentiles. The window is a run of whole intervals after the warm-up; its figures:

- messages: the sum over its intervals;
- p50: the message-weighted median of the intervals' medians;
- p99: the message-weighted mean of the intervals' 99th percentiles.

The percentiles are estimates: the tools do not print their histograms, and percentiles of
parts do not add up to the percentile of the whole. Both estimates are exact when the
intervals have the same distribution, and both are taken the same way for every target, so
ratios between targets compare like with like.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class IntervalFigures:
    """One reporting interval of a load generator."""

    seconds: float  # its length
    received: float  # messages consumed in it
    sent: float | None  # messages published in it, when the tool says
    p50_ms: float
    p99_ms: float


@dataclass(frozen=True)
class WindowFigures:
    """What the table shows of one case's measured window."""

    seconds: float
    received: int
    sent: int | None
    p50_ms: float | None
    p99_ms: float | None

    @property
    def received_per_s(self) -> float | None:
        return round(self.received / self.seconds, 1) if self.seconds > 0 else None

    @property
    def sent_per_s(self) -> float | None:
        if self.sent is None or self.seconds <= 0:
            return None
        return round(self.sent / self.seconds, 1)


def summarize(intervals: Sequence[IntervalFigures]) -> WindowFigures:
    """The window made of ``intervals`` (see the module docstring). Raises nothing."""
    seconds = sum(i.seconds for i in intervals)
    received = sum(i.received for i in intervals)
    sent_values = [i.sent for i in intervals]
    sent = None if any(v is None for v in sent_values) else sum(v or 0.0 for v in sent_values)
    with_traffic = [i for i in intervals if i.received > 0]
    p50 = weighted_median([(i.p50_ms, i.received) for i in with_traffic])
    p99 = weighted_mean([(i.p99_ms, i.received) for i in with_traffic])
    return WindowFigures(
        seconds=round(seconds, 3),
        received=round(received),
        sent=None if sent is None else round(sent),
        p50_ms=None if p50 is None else round(p50, 3),
        p99_ms=None if p99 is None else round(p99, 3),
    )


def weighted_median(values: Sequence[tuple[float, float]]) -> float | None:
    """The value at which half the weight lies at or below; None without weight.

    ``values`` are (value, weight) pairs.
    """
    total = sum(weight for _, weight in values if weight > 0)
    if total <= 0:
        return None
    running = 0.0
    for value, weight in sorted(values):
        if weight <= 0:
            continue
        running += weight
        if running >= total / 2:
            return value
    return max(value for value, _ in values)  # pragma: no cover - float rounding


def weighted_mean(values: Sequence[tuple[float, float]]) -> float | None:
    """Mean of the values by their weights; None without weight."""
    total = sum(weight for _, weight in values if weight > 0)
    if total <= 0:
        return None
    return sum(value * weight for value, weight in values if weight > 0) / total


class WindowTracker:
    """Decides, reporting interval by reporting interval, when the window opens and closes.

    ``feed(index)`` takes the number of the interval a line reports (PerfTest: its time in
    whole seconds; pulsar-perf: the count of lines so far). The window opens at the first
    index at or past ``warmup`` and closes ``measured`` intervals later, so a line the tool
    skipped under load shifts the window rather than shortening it. Returns "open",
    "close" or None.
    """

    def __init__(self, warmup: int, measured: int) -> None:
        if warmup < 1 or measured < 1:
            raise ValueError("the warm-up and the window need one interval each at least")
        self.warmup = warmup
        self.measured = measured
        self._opened_at: int | None = None
        self.closed = False

    @property
    def opened(self) -> bool:
        return self._opened_at is not None

    def feed(self, index: int) -> str | None:
        if self.closed:
            return None
        if self._opened_at is None:
            if index >= self.warmup:
                self._opened_at = index
                return "open"
            return None
        if index >= self._opened_at + self.measured:
            self.closed = True
            return "close"
        return None
