"""Priority bands, the consumer's ranked waiting list, band topic names, and where a
publish to priority queues is written (model/priorities.py, gateway/publish/publishing.py)."""

from __future__ import annotations

import pytest

from starlight_py.backend.message_codec import (
    IN_PRIORITY_BAND_KEY,
    REFUSED_BY_KEY,
    skipped_by,
)
from starlight_py.gateway.publish.message_copies import joined, message_copies
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.priorities import (
    PRIORITY_BAND_TYPE,
    RankedPending,
    band_count,
    band_of,
    max_priority_of,
)
from starlight_py.model.routing import any_binding_routes
from starlight_py.model.topology import Exchange

NS = NamespaceName("public", "default")


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({}, None),
        ({"x-max-priority": 0}, None),
        ({"x-max-priority": True}, None),
        ({"x-max-priority": "5"}, None),
        ({"x-max-priority": 1}, 1),
        ({"x-max-priority": 255}, 255),
    ],
)
def test_max_priority_of_queue_arguments(arguments: dict[str, object], expected: object) -> None:
    assert max_priority_of(arguments) == expected


def test_up_to_ten_priorities_each_have_a_band() -> None:
    assert band_count(10) == 11
    assert [band_of(p, 10) for p in range(11)] == list(range(11))
    assert band_of(None, 10) == 0
    assert band_of(11, 10) == band_of(255, 10) == 10  # above the maximum: the maximum
    assert band_of(-3, 10) == 0
    assert band_count(1) == 2
    assert [band_of(p, 1) for p in (None, 0, 1, 9)] == [0, 0, 1, 1]


def test_more_priorities_share_ten_bands_in_order() -> None:
    assert band_count(255) == 11
    bands = [band_of(p, 255) for p in range(256)]
    assert bands[0] == 0
    assert bands[1] == 1 and bands[255] == 10
    assert bands == sorted(bands)  # higher priority, never a lower band
    assert set(bands) == set(range(11))
    assert band_of(30, 255) == band_of(40, 255)


def test_ranked_pending_is_fifo_within_a_rank_and_highest_rank_first() -> None:
    pending: RankedPending[str] = RankedPending()
    assert not pending and pending.top_rank() is None
    for rank, item in [(0, "a0"), (2, "c0"), (1, "b0"), (2, "c1"), (0, "a1")]:
        pending.put(rank, item)
    assert len(pending) == 5 and pending.count(2) == 2 and pending.top_rank() == 2
    assert list(pending) == ["c0", "c1", "b0", "a0", "a1"]
    assert [pending.pop(), pending.pop(), pending.pop()] == ["c0", "c1", "b0"]
    pending.put(3, "d0")
    assert pending.pop() == "d0"
    assert pending.take_all() == ["a0", "a1"]
    assert len(pending) == 0
    with pytest.raises(IndexError):
        pending.pop()


def test_band_topics_name_the_queue_and_band_and_are_no_exchange_topic() -> None:
    topic = naming.priority_band_topic(NS, "tasks with space", 7)
    assert topic.local == "amq.priority~~tasks~20with~20space~~7"
    assert naming.parse_priority_band_topic(topic.local) == ("tasks with space", 7)
    with pytest.raises(ValueError):
        naming.parse_exchange_topic(topic.local)
    assert naming.exchange_and_key_of_topic(topic.local) == ("", None)
    assert naming.exchange_and_key_of_topic("amq.default~~q") == ("", "q")
    for other in ("amq.default~~q", "amq.priority~~q", "amq.priority~~q~~x", "amq.priority~~q~~07"):
        assert naming.parse_priority_band_topic(other) is None


def test_a_band_routes_everything_on_its_topic() -> None:
    assert any_binding_routes(PRIORITY_BAND_TYPE, (), "any-key", None, None)
    assert not any_binding_routes("direct", (), "any-key", None, None)


DEFAULT = Exchange("", "direct")
FANOUT = Exchange("fan", "fanout")


def test_a_publish_to_the_default_exchange_goes_to_the_priority_band_only() -> None:
    main = naming.exchange_topic(NS, "", "direct", "p")
    copies = message_copies(NS, main, DEFAULT, {"k": "v"}, {"p"}, set(), {"p": 10}, 7)
    assert copies == [(naming.priority_band_topic(NS, "p", 7), {"k": "v"})]


def test_other_queues_and_exchanges_keep_the_main_copy_marked() -> None:
    main = naming.exchange_topic(NS, "fan", "fanout", "")
    copies = message_copies(
        NS, main, FANOUT, {"k": "v"}, {"p", "plain", "full"}, {"full"}, {"p": 3}, None
    )
    assert [t for t, _ in copies] == [main, naming.priority_band_topic(NS, "p", 0)]
    marked = copies[0][1]
    assert skipped_by(marked) == {"p", "full"}
    assert REFUSED_BY_KEY in marked and IN_PRIORITY_BAND_KEY in marked
    assert copies[1][1] == {"k": "v"}  # the band copy is skipped by nobody
    # No priority queue routed: one copy, the properties untouched.
    plain = message_copies(NS, main, FANOUT, {"k": "v"}, {"plain"}, set(), {"p": 3}, 9)
    assert plain == [(main, {"k": "v"})]
    # A fanout that only priority queues read still writes the main copy (cache lag).
    only = message_copies(NS, main, FANOUT, {}, {"p"}, set(), {"p": 3}, 1)
    assert [t for t, _ in only] == [main, naming.priority_band_topic(NS, "p", 1)]


def test_the_confirm_waits_for_every_copy() -> None:
    results: list[tuple[bool, str]] = []
    each = joined(3, lambda ok, error: results.append((ok, error)))
    each(True, "")
    each(False, "timeout")
    assert results == []
    each(True, "")
    assert results == [(False, "timeout")]
    single = lambda ok, error: results.append((ok, error))  # noqa: E731
    assert joined(1, single) is single
