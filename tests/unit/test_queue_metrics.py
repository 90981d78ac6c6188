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
from starlight_py.ops.broker_metrics import SubscriptionSample, parse_subscription_metrics
from starlight_py.ops.metrics import LiveCounts, ProxyMetrics
from starlight_py.ops.queue_metrics import (
    QueueMetrics,
    QueueSample,
    QueueSubscriptions,
    combine,
    missing_topics,
)

# ruff: noqa: E501 (lines of the broker's page as it writes them)

TOPIC = "persistent://public/default/amq.default~~orders"
PAGE = f"""# TYPE pulsar_subscription_back_log gauge
pulsar_subscription_back_log{{cluster="standalone",namespace="public/default",topic="{TOPIC}",subscription="orders~~a1"}} 7
pulsar_subscription_delayed{{cluster="standalone",namespace="public/default",topic="{TOPIC}",subscription="orders~~a1"}} 1
pulsar_subscription_unacked_messages{{cluster="standalone",topic="{TOPIC}",subscription="orders~~a1"}} 4
pulsar_subscription_consumers_count{{topic="{TOPIC}",subscription="orders~~a1"}} 2
pulsar_subscription_msg_rate_out{{topic="{TOPIC}",subscription="orders~~a1"}} 12.5
pulsar_subscription_msg_ack_rate{{topic="{TOPIC}",subscription="orders~~a1"}} 11.0
pulsar_subscription_back_log{{topic="{TOPIC}",subscription="we\\"ird"}} 3 1700000000000
pulsar_subscription_in_replay{{topic="{TOPIC}",subscription="orders~~a1"}} 0
pulsar_topics_count{{cluster="standalone"}} 12
pulsar_subscription_back_log{{topic="{TOPIC}"}} 9
pulsar_subscription_back_log{{topic="{TOPIC}",subscription="x"}} NaNish
"""


def test_subscription_samples_are_read_from_the_page() -> None:
    samples = parse_subscription_metrics(PAGE)
    assert samples[(TOPIC, "orders~~a1")] == SubscriptionSample(7, 1, 4, 2, 12.5, 11.0)
    # Escaped quotes in labels, timestamps after the value; unreadable lines skipped.
    assert samples[(TOPIC, 'we"ird')].backlog == 3
    assert set(samples) == {(TOPIC, "orders~~a1"), (TOPIC, 'we"ird')}


def test_queue_counts_are_rabbitmqs() -> None:
    samples = parse_subscription_metrics(PAGE)
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
