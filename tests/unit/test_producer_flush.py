"""What producer_flush.py says when it cannot work, and how it names results. (Flushing
itself needs a real producer: tests/integration/test_producer_flush.py.)"""

from __future__ import annotations

import pytest

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
