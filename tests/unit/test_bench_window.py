"""The measured window's figures from per-interval lines."""

from __future__ import annotations

import pytest

from starlight_py.bench.window import (
    IntervalFigures,
    WindowTracker,
    summarize,
    weighted_mean,
    weighted_median,
)


def test_weighted_median() -> None:
    assert weighted_median([(5.0, 1), (1.0, 1), (3.0, 1)]) == 3.0
    # the heavy interval decides
    assert weighted_median([(1.0, 10), (9.0, 1), (8.0, 1)]) == 1.0
    assert weighted_median([(1.0, 1), (2.0, 1)]) == 1.0  # half the weight at or below
    assert weighted_median([(4.0, 0)]) is None
    assert weighted_median([]) is None


def test_weighted_mean() -> None:
    assert weighted_mean([(10.0, 3), (20.0, 1)]) == 12.5
    assert weighted_mean([(10.0, 0)]) is None


def test_summarize_sums_counts_and_weighs_percentiles_by_messages() -> None:
    window = summarize(
        [
            IntervalFigures(1.0, received=100, sent=110, p50_ms=2.0, p99_ms=10.0),
            IntervalFigures(1.0, received=300, sent=290, p50_ms=4.0, p99_ms=20.0),
            IntervalFigures(0.5, received=0, sent=0, p50_ms=0.0, p99_ms=0.0),  # idle
        ]
    )
    assert window.seconds == 2.5
    assert (window.received, window.sent) == (400, 400)
    assert window.received_per_s == 160.0
    assert window.sent_per_s == 160.0
    assert window.p50_ms == 4.0
    assert window.p99_ms == 17.5  # (10 * 100 + 20 * 300) / 400; the idle second adds nothing


def test_an_empty_window() -> None:
    window = summarize([])
    assert (window.received, window.received_per_s, window.p50_ms) == (0, None, None)


def test_unknown_sent_counts_leave_the_sent_rate_unknown() -> None:
    window = summarize([IntervalFigures(10.0, 3000, None, 9.0, 21.0)])
    assert window.sent is None and window.sent_per_s is None
    assert window.received_per_s == 300.0


def test_the_tracker_opens_after_the_warm_up_and_closes_after_the_window() -> None:
    tracker = WindowTracker(warmup=2, measured=3)
    events = [tracker.feed(index) for index in range(1, 8)]
    assert events == [None, "open", None, None, "close", None, None]
    assert tracker.closed


def test_a_skipped_line_shifts_the_window_instead_of_shortening_it() -> None:
    tracker = WindowTracker(warmup=10, measured=5)
    assert [tracker.feed(i) for i in (9, 11, 12, 15, 16)] == [None, "open", None, None, "close"]


def test_the_tracker_needs_an_interval_of_each() -> None:
    with pytest.raises(ValueError, match="one interval each"):
        WindowTracker(warmup=0, measured=3)
