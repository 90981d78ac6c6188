"""ops/broker_metrics.py (reading Pulsar's Prometheus page) and ops/queue_metrics.py
(turning subscription samples into RabbitMQ's per-queue counts), without Pulsar."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

from prometheus_client import generate_latest

from starlight_py.cluster.cleaner import CleanerStats
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import TopicName
from starlight_py.ops.broker_metrics import SubscriptionSample, parse_topic_stats
from starlight_py.ops.metrics import LiveCounts, ProxyMetrics
from starlight_py.ops.queue_metrics import (
    QueueMetrics,
    QueueSample,
    QueueSubscriptions,
    combine,
    missing_topics,
)

TOPIC = "persistent://public/default/amq.default~~orders"
STATS = {
    "public/default": {
        "0x00000000_0x40000000": {
            "persistent": {
                TOPIC: {
                    "msgRateIn": 3.0,
                    "subscriptions": {
                        "orders~~a1": {
                            "msgBacklog": 7,
                            "msgDelayed": 1,
                            "msgRateOut": 12.5,
                            "messageAckRate": 11.0,
                            "consumers": [
                                {"consumerName": "p/1/c1", "unackedMessages": 3},
                                {"consumerName": "p/2/c2", "unackedMessages": 1},
                            ],
                            "type": "Shared",
                        },
                        "bare~~b2": {"msgBacklog": 2},
                        "broken~~c3": {"msgBacklog": "lots"},
                    },
                },
                "persistent://public/default/no-subscriptions": {"msgRateIn": 0.0},
            }
        }
    },
    "odd": ["not", "a", "map"],
}


def test_subscription_samples_are_read_from_the_brokers_topic_stats() -> None:
    samples = parse_topic_stats(STATS)
    assert samples == {
        (TOPIC, "orders~~a1"): SubscriptionSample(7, 1, 4, 2, 12.5, 11.0),
        (TOPIC, "bare~~b2"): SubscriptionSample(backlog=2),
    }
    assert parse_topic_stats(None) == {}


def test_queue_counts_are_rabbitmqs() -> None:
    samples = parse_topic_stats(STATS)
    asked: list[tuple[str, str]] = []

    def held(vhost: str, queue: str) -> int:
        asked.append((vhost, queue))
        return 3  # AMQP deliveries unacked; the 4th Pulsar-unacked one is read ahead

    other = "persistent://public/default/other"
    samples[(other, "idle~~b2")] = SubscriptionSample(backlog=4)
    queues = [
        QueueSubscriptions("/", "orders", ((TOPIC, "orders~~a1"),)),
        QueueSubscriptions("/", "idle", ((other, "idle~~b2"),)),
        # A subscription the brokers did not report: the queue is left out, not 0.
        QueueSubscriptions("/", "unknown", ((other, "idle~~b2"), (other, "unknown~~c3"))),
    ]
    assert missing_topics(queues, samples) == []  # no TopicName given: nothing to ask
    found = combine(queues, samples, held, lambda vhost, queue: 2)
    assert found == [
        # ready: backlog 7 - delayed 1 - held 3 = 3 (one of them read ahead by a proxy)
        QueueSample("/", "orders", 3, 3, 2, 12.5, 11.0),
        QueueSample("/", "idle", 4, 0, 0, 0.0, 0.0),
    ]
    assert asked == [("/", "orders")]  # the idle queue costs no ZooKeeper read


def test_topics_missing_from_the_pages_are_listed_once() -> None:
    namespace = NamespaceName("public", "default")
    known, absent = TopicName(namespace, "known"), TopicName(namespace, "absent")
    samples = {(str(known), "a"): SubscriptionSample()}
    queues = [
        QueueSubscriptions("/", "q1", ((str(known), "a"), (str(absent), "b")), (known, absent)),
        QueueSubscriptions("/", "q2", ((str(absent), "c"),), (absent,)),
    ]
    assert missing_topics(queues, samples) == [absent]


def test_every_metric_of_the_grafana_dashboard_is_exported() -> None:
    metrics = ProxyMetrics()
    metrics.watch(lambda: LiveCounts(1, 1, 0, 0, {"/": (1, 1)}), lambda: 0.0, CleanerStats)
    metrics.sends_done(True, 1, 0.01)
    metrics.backend_error("pulsar")  # labelled: exported once used
    queues = QueueMetrics(cast(Any, None), cast(Any, None), cast(Any, None), lambda: True)
    queues.samples = [QueueSample("/", "orders", 1, 0, 0, 0.0, 0.0)]
    metrics.register(queues)
    exported = {
        line.split("{")[0].split(" ")[0]
        for line in generate_latest(metrics.registry).decode().splitlines()
        if line and not line.startswith("#")
    }
    root = Path(__file__).resolve().parents[2]
    dashboard = json.loads((root / "deploy/grafana/starlight-dashboard.json").read_text())
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b((?:rabbitmq|starlight|process)_[a-z_]+)", target["expr"])
    }
    assert used and used <= exported, used - exported
