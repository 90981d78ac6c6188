"""What producer_flush.py says when it cannot work, how it names results, and how it runs
the callbacks of finished flushes. (Flushing
itself needs a real producer: tests/integration/test_producer_flush.py.)"""

from __future__ import annotations

import logging

import pytest

from starlight_py.backend import producer_flush
from starlight_py.backend.producer_flush import (
    NativeFlushUnavailable,
    ProducerFlusher,
    result_text,
)


def test_something_that_is_not_a_pulsar_client_producer_is_refused_with_a_reason() -> None:
    with pytest.raises(NativeFlushUnavailable, match="object has no pybind11 conduit"):
        ProducerFlusher(object())


def test_result_codes_are_named_as_the_binding_names_them() -> None:
    assert result_text(0) == "Result.Ok"
    assert result_text(5) == "Result.ConnectError"
    assert result_text(9999) == "Result 9999"


def test_dispatch_runs_each_waiting_callback_once_and_goes_on_past_one_that_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[tuple[str, int]] = []

    def fails(result: int) -> None:
        raise RuntimeError("boom")

    producer_flush._waiting.update(
        {
            10_001: lambda result: seen.append(("a", result)),
            10_002: fails,
            10_003: lambda result: seen.append(("c", result)),
        }
    )
    with caplog.at_level(logging.ERROR, logger="starlight.pulsar"):
        producer_flush.dispatch([(10_001, 0), (10_002, 0), (10_003, 5), (10_001, 0), (99, 0)])
    assert seen == [("a", 0), ("c", 5)]  # once each; an unknown key is nothing
    assert "boom" in caplog.text
    assert not {10_001, 10_002, 10_003} & set(producer_flush._waiting)
