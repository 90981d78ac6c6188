"""The charts' sample history (management/samples.py) and the pure parts of a queue's
Pulsar view (management/pulsar_view.py)."""

from __future__ import annotations

import pytest

from starlight_py.backend.pulsar_admin import SubscriptionStats
from starlight_py.management import samples
from starlight_py.management.pulsar_view import (
    ACTIVE,
    DRAINING,
    RETIRED,
    queue_subscriptions,
    subscription_json,
)
from starlight_py.management.samples import (
    INTERVAL,
    KEPT,
    Sample,
    SampleHistory,
    add_length_samples,
    add_rate_samples,
    samples_asked,
)
from starlight_py.metadata.records import BindingEntry, BindingSet, RetiredSubscription
from starlight_py.model.counts import QueueFlow
from starlight_py.model.namespaces import NamespaceName

START = 1_700_000_000.0  # a slot boundary (divisible by INTERVAL)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def test_a_reading_within_a_slot_replaces_the_slots_sample() -> None:
    clock = Clock()
    history = SampleHistory(clock)
    history.record("q", Sample(ready=1), clock.now)
    history.record("q", Sample(ready=2), clock.now + 1)
    history.record("q", Sample(ready=3), clock.now + INTERVAL)
    clock.now += INTERVAL
    assert [(at - START, s.ready) for at, s in history.history(["q"], 60)] == [
        (0.0, 2),
        (INTERVAL, 3),
    ]


def test_a_key_keeps_its_last_ten_minutes_and_older_ages_are_cut() -> None:
    clock = Clock()
    history = SampleHistory(clock)
    for i in range(KEPT + 30):
        history.record("q", Sample(ready=i), START + i * INTERVAL)
    clock.now = START + (KEPT + 29) * INTERVAL
    kept = history.history(["q"], 10 * 3600)
    assert len(kept) == KEPT
    assert (kept[0][1].ready, kept[-1][1].ready) == (30, KEPT + 29)
    assert [s.ready for _, s in history.history(["q"], 3 * INTERVAL)] == [
        KEPT + 27,
        KEPT + 28,
        KEPT + 29,
    ]


def test_the_least_recently_recorded_keys_are_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(samples, "MAX_KEYS", 3)
    history = SampleHistory(Clock())
    for key in ("a", "b", "c"):
        history.record(key, Sample(ready=1), START)
    history.record("a", Sample(ready=2), START)  # a is recent again
    history.record("d", Sample(ready=1), START)
    assert history.history(["b"], 60) == []
    assert [s.ready for _, s in history.history(["a"], 60)] == [2]


def test_sums_count_each_key_with_its_latest_sample() -> None:
    clock = Clock()
    history = SampleHistory(clock)
    history.record("a", Sample(ready=1, publish_rate=1.5), START)
    history.record("b", Sample(ready=10), START)
    history.record("a", Sample(ready=2), START + INTERVAL)  # b not read in this slot
    clock.now = START + INTERVAL
    summed = history.history(["a", "b", "missing"], 60)
    assert [(s.ready, s.publish_rate) for _, s in summed] == [(11, 1.5), (12, 0.0)]


def test_rabbitmqs_query_and_sample_shapes() -> None:
    asked = samples_asked({"lengths_age": "60", "lengths_incr": "10", "msg_rates_age": "x"})
    assert (asked.lengths_age, asked.lengths_incr, asked.msg_rates_age) == (60.0, 10.0, 0.0)
    assert not samples_asked({}).any
    history = [(START + i * INTERVAL, Sample(ready=i, unacked=1, ack_rate=2.25)) for i in range(5)]
    now = START + 4 * INTERVAL
    queue: dict[str, object] = {"messages_ready_details": {"rate": 0.2}}
    add_length_samples(queue, history, asked, now)
    ready = queue["messages_ready_details"]
    assert ready == {
        "rate": 0.2,
        "samples": [
            {"sample": 4, "timestamp": int((START + 20) * 1000)},
            {"sample": 2, "timestamp": int((START + 10) * 1000)},
            {"sample": 0, "timestamp": int(START * 1000)},
        ],
        "avg": 2.0,
        "avg_rate": 0.2,
    }
    assert queue["messages_details"]["samples"][0]["sample"] == 5  # type: ignore[index]
    stats: dict[str, object] = {}
    add_rate_samples(stats, history, samples_asked({"msg_rates_age": "5"}), now)
    assert stats["ack_details"] == {
        "rate": 0.0,
        "samples": [
            {"rate": 2.2, "timestamp": int((START + 20) * 1000)},
            {"rate": 2.2, "timestamp": int((START + 15) * 1000)},
        ],
    }


def test_a_queues_subscriptions_active_draining_and_retired() -> None:
    active = BindingSet(
        "q",
        "orders",
        "orders~t",
        "q~~1",
        (BindingEntry("a"), BindingEntry("b", unbound=True)),
        exchange_type="direct",
    )
    old = BindingSet("q", "logs", "logs~t", "q~~0", (BindingEntry("x", unbound=True),))
    retired = [
        RetiredSubscription("logs~t", "q~~0", "q", None, True, START, old),
        RetiredSubscription("gone~t", "q~~9", "q", None, False, START),
    ]
    found = queue_subscriptions([active], retired)
    assert [(s.topic, s.state, s.routing_keys) for s in found] == [
        ("gone~t", RETIRED, ()),
        ("logs~t", DRAINING, ("x",)),
        ("orders~t", ACTIVE, ("a",)),
    ]
    assert active.subscription_topic == "orders~t"
    stats = SubscriptionStats(5, 2, ("c1",), 1, 300, QueueFlow(ack_rate=1.26))
    shaped = subscription_json(NamespaceName("public", "default"), found[1], stats)
    assert shaped == {
        "topic": "persistent://public/default/logs~t",
        "subscription": "q~~0",
        "state": DRAINING,
        "exchange": "logs",
        "exchange_type": "direct",
        "routing_keys": ["x"],
        "exists": True,
        "retired_at": int(START * 1000),
        "backlog": 5,
        "unacked": 2,
        "delayed": 1,
        "ready": 2,
        "backlog_size": 300,
        "consumers": ["c1"],
        "msg_rate_out": 0.0,
        "msg_rate_ack": 1.3,
        "msg_rate_redeliver": 0.0,
    }
    gone = subscription_json(NamespaceName("public", "default"), found[0], None)
    assert gone["exists"] is False and "backlog" not in gone
