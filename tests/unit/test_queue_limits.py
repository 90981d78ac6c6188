"""Queue length limits (model/queue_limits.py): what x-max-length, x-max-length-bytes and
x-overflow say, checked with RabbitMQ 3.10's rule that a publish is refused when the queue
*with* it would be over the limit (tests/integration/test_flow_length_limits.py runs the same
cases against the proxy and RabbitMQ)."""

from __future__ import annotations

import pytest

from starlight_py.backend.message_codec import REFUSED_BY_KEY, refused_by, refused_by_value
from starlight_py.model.queue_limits import (
    DROP_HEAD,
    REJECT_PUBLISH,
    REJECT_PUBLISH_DLX,
    LengthLimit,
    QueueDepth,
)


def test_a_queue_without_limits_has_none() -> None:
    assert LengthLimit.of({}) is None
    assert LengthLimit.of({"x-overflow": "reject-publish"}) is None


def test_drop_head_is_the_default_overflow() -> None:
    assert LengthLimit.of({"x-max-length": 3}) == LengthLimit(3, None, DROP_HEAD)
    assert LengthLimit.of({"x-max-length-bytes": 9, "x-overflow": b"reject-publish-dlx"}) == (
        LengthLimit(None, 9, REJECT_PUBLISH_DLX)
    )


@pytest.mark.parametrize("bad", [-1, True, "3", 2.5])
def test_values_of_the_wrong_kind_are_no_limit(bad: object) -> None:
    assert LengthLimit.of({"x-max-length": bad}) is None


def test_reject_publish_refuses_when_the_message_would_not_fit() -> None:
    limit = LengthLimit(3, None, REJECT_PUBLISH)
    assert not limit.refuses(QueueDepth(2, 0), 100)
    assert limit.refuses(QueueDepth(3, 0), 1)
    by_bytes = LengthLimit(None, 35_000, REJECT_PUBLISH)
    assert not by_bytes.refuses(QueueDepth(2, 20_000), 10_000)
    assert by_bytes.refuses(QueueDepth(3, 30_000), 10_000)
    assert not by_bytes.refuses(QueueDepth(3, 30_000), 5_000)  # exactly at the limit fits


def test_a_zero_limit_refuses_everything() -> None:
    assert LengthLimit(0, None, REJECT_PUBLISH).refuses(QueueDepth(), 0)


def test_drop_head_never_refuses_and_reports_the_excess() -> None:
    limit = LengthLimit(2, None, DROP_HEAD)
    assert not limit.refuses(QueueDepth(10, 0), 1)
    assert limit.excess(QueueDepth(5, 0), 0) == 3
    assert limit.excess(QueueDepth(2, 0), 0) == 0
    assert LengthLimit(2, None, REJECT_PUBLISH).excess(QueueDepth(5, 0), 0) == 0


def test_drop_head_by_bytes_drops_whole_messages_of_the_average_size() -> None:
    limit = LengthLimit(None, 1_000, DROP_HEAD)
    assert limit.excess(QueueDepth(5, 1_500), 300) == 2  # 500 bytes over: two messages
    assert limit.excess(QueueDepth(5, 1_000), 200) == 0
    assert limit.excess(QueueDepth(1, 9_000), 9_000) == 1  # never more than there are
    both = LengthLimit(4, 1_000, DROP_HEAD)
    assert both.excess(QueueDepth(6, 600), 100) == 2  # the count limit bites first


def test_the_queues_that_refused_a_message_travel_with_it() -> None:
    properties = {REFUSED_BY_KEY: refused_by_value({"b", "a/1"})}
    assert properties[REFUSED_BY_KEY] == '["a/1","b"]'
    assert refused_by(properties) == {"a/1", "b"}
    assert refused_by({}) == frozenset()
    assert refused_by({REFUSED_BY_KEY: "not json"}) == frozenset()
    assert refused_by({REFUSED_BY_KEY: '{"a": 1}'}) == frozenset()
