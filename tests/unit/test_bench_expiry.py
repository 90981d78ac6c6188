"""The expiry bench's scoring and table (starlight_py/bench/expiry.py), without servers."""

from __future__ import annotations

import argparse

from starlight_py.bench.expiry import Result, _score, table


def test_lateness_is_counted_from_the_due_time_with_lost_early_and_duplicates() -> None:
    result = Result("proxy", "queue-ttl", sent=4)
    ms = 1_000_000
    sent = {0: 0, 1: 100 * ms, 2: 200 * ms, 3: 300 * ms}
    arrivals = {
        0: [530 * ms],  # 30 ms late
        1: [660 * ms, 900 * ms],  # 60 ms late, then once more
        2: [690 * ms],  # 10 ms early
    }
    _score(result, sent, arrivals, ttl_ms=500)
    assert (result.received, result.lost, result.early, result.duplicates) == (3, 1, 1, 1)
    assert result.lateness_ms == [30.0, 60.0, -10.0]
    assert result.first_ms == 30.0
    assert result.percentile(0.5) == 30.0
    assert result.percentile(0.99) == 60.0


def test_the_table_has_a_row_per_result_and_says_what_failed() -> None:
    done = Result("proxy", "message-ttl", sent=2, received=2, lateness_ms=[40.0, 45.0])
    done.first_ms = 40.0
    unsupported = Result("rabbitmq", "delayed-get", error="not supported")
    args = argparse.Namespace(messages=2, ttl_ms=500, gap_ms=20.0)
    text = table([done, unsupported], args)
    assert "| message-ttl | proxy | 2 | 0 | 0 | 0 | 40 | 45 | 45 | 45 | 45 | 40 |" in text
    assert "| delayed-get | rabbitmq | not supported |" in text
