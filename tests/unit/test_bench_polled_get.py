"""bench.polled_get's figures and arguments (the measuring itself needs brokers)."""

from __future__ import annotations

import pytest

from starlight_py.bench.polled_get import Run, main


def test_percentiles_are_read_from_the_sorted_latencies() -> None:
    run = Run("proxy", 1, sent=4, got=[0, 1, 2, 3], latency_ms=[9.0, 1.0, 5.0, 3.0])
    assert (run.percentile(0.5), run.percentile(0.99)) == (5.0, 9.0)
    assert Run("rabbitmq", 1).percentile(0.5) is None


def test_a_row_says_how_many_came_and_whether_in_order() -> None:
    row = Run("proxy", 2, sent=3, got=[0, 2, 1], latency_ms=[1.0, 2.0, 3.0]).line()
    assert row.split()[:4] == ["proxy", "2", "3/3", "NO"]


def test_some_broker_is_needed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([])
    assert "--private-proxy" in capsys.readouterr().err
