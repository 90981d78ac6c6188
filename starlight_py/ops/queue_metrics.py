"""Per-queue metrics under rabbitmq_prometheus's names (`rabbitmq_queue_messages_ready`,
`rabbitmq_queue_messages_unacked`, `rabbitmq_queue_messages`, `rabbitmq_queue_consumers`,
labels `vhost` and `queue`), plus the deliver and ack rates Pulsar measures.

How they are gathered (docs/operations.md#queue-metrics): every QUEUE_METRICS_INTERVAL the
proxy that leads the SubscriptionCleaner (every proxy when the cleaner is off) reads each
Pulsar broker's stats of all its topics once (ops/broker_metrics.py), which have every
subscription's backlog, consumers and rates, and maps the queues' binding subscriptions
(from the topology cache) onto them. Only queues Pulsar shows as being consumed
cost ZooKeeper reads (the AMQP deliveries unacked on every proxy, and the AMQP consumers).
A Prometheus scrape only reads the last snapshot: it never waits for Pulsar or ZooKeeper.
Only the leader exports queue series, so that summing over proxies counts each queue once
(RabbitMQ exports a queue's metrics from the node that hosts it)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import trio
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdmin, PulsarAdminError
from starlight_py.metadata.cache import TopologyCache
from starlight_py.metadata.zookeeper import MetadataUnavailable
from starlight_py.model import naming
from starlight_py.model.counts import ready_messages
from starlight_py.model.namespaces import NamespaceName
from starlight_py.ops.broker_metrics import SubscriptionSample, parse_topic_stats
from starlight_py.topology.service import TopologyService

log = logging.getLogger("starlight.metrics")

QUEUE_METRICS_INTERVAL = 10.0  # seconds between two readings of the brokers' metrics
# Topics missing from the brokers' stats (not loaded in a broker since it started: Pulsar
# loads a topic when a client or an admin call needs it) asked by stats calls, per reading.
TOPIC_STATS_PER_READING = 500


@dataclass(frozen=True)
class QueueSample:
    vhost: str
    queue: str
    ready: int
    unacked: int
    consumers: int
    deliver_rate: float  # messages per second, as Pulsar measured them
    ack_rate: float


@dataclass(frozen=True)
class QueueSubscriptions:
    """A queue and its binding subscriptions, as (Pulsar topic, subscription)."""

    vhost: str
    queue: str
    subscriptions: tuple[tuple[str, str], ...]
    topics: tuple[naming.TopicName, ...] = ()


def combine(
    queues: Iterable[QueueSubscriptions],
    samples: dict[tuple[str, str], SubscriptionSample],
    held: Callable[[str, str], int],
    consumers: Callable[[str, str], int],
) -> list[QueueSample]:
    """The queues' samples, counted as RabbitMQ counts them (model/counts.py): ready =
    the backlog less delayed messages and AMQP deliveries unacked on every proxy, never
    less than what Pulsar has not dispatched. `held` and `consumers` (ZooKeeper reads) are
    asked only for queues Pulsar shows with consumers or unacknowledged messages. A queue
    with a subscription missing from `samples` is left out (a 0 would be a guess)."""
    found = []
    for entry in queues:
        if not all(key in samples for key in entry.subscriptions):
            continue
        parts = [samples[key] for key in entry.subscriptions]
        backlog = sum(int(p.backlog) for p in parts)
        delayed = sum(int(p.delayed) for p in parts)
        pulsar_unacked = sum(int(p.unacked) for p in parts)
        busy = any(p.consumers > 0 or p.unacked > 0 for p in parts)
        unacked = held(entry.vhost, entry.queue) if busy else 0
        waiting = max(0, backlog - delayed)
        undispatched = max(0, backlog - delayed - pulsar_unacked)
        found.append(
            QueueSample(
                entry.vhost,
                entry.queue,
                ready_messages(waiting, undispatched, unacked, 0),
                unacked,
                consumers(entry.vhost, entry.queue) if busy else 0,
                sum(p.rate_out for p in parts),
                sum(p.ack_rate for p in parts),
            )
        )
    return found


def queue_subscriptions(cache: TopologyCache) -> list[QueueSubscriptions]:
    """Every queue of the cache with its binding subscriptions' Pulsar names."""
    by_queue: dict[tuple[str, str], list[tuple[naming.TopicName, str]]] = {}
    for vhost, queue in cache.queues():
        by_queue[(vhost, queue.name)] = []
    namespaces: dict[str, NamespaceName | None] = {}
    for vhost, binding_set in cache.all_binding_sets(made_only=True):
        subscriptions = by_queue.get((vhost, binding_set.queue))
        if vhost not in namespaces:
            record = cache.vhost(vhost)
            namespaces[vhost] = record.namespace if record is not None else None
        namespace = namespaces[vhost]
        if subscriptions is None or namespace is None:
            continue
        topic = naming.TopicName(namespace, binding_set.subscription_topic)
        subscriptions.append((topic, binding_set.subscription))
    return [
        QueueSubscriptions(
            vhost,
            queue,
            tuple((str(topic), subscription) for topic, subscription in subs),
            tuple(topic for topic, _ in subs),
        )
        for (vhost, queue), subs in sorted(by_queue.items())
    ]


def missing_topics(
    queues: Iterable[QueueSubscriptions], samples: dict[tuple[str, str], SubscriptionSample]
) -> list[naming.TopicName]:
    """Topics of the queues' subscriptions that `samples` lacks, each once, in order."""
    seen: dict[str, naming.TopicName] = {}
    for entry in queues:
        for key, topic in zip(entry.subscriptions, entry.topics, strict=False):
            if key not in samples and key[0] not in seen:
                seen[key[0]] = topic
    return list(seen.values())


class QueueMetrics(Collector):
    """The snapshot of queue samples, refreshed by `run` while `exporting()`."""

    def __init__(
        self,
        admin: PulsarAdmin,
        cache: TopologyCache,
        topology: TopologyService,
        exporting: Callable[[], bool],
        interval: float = QUEUE_METRICS_INTERVAL,
    ) -> None:
        self.admin = admin
        self.cache = cache
        self.topology = topology
        self.exporting = exporting
        self.interval = interval
        self.samples: list[QueueSample] = []
        self.gathered_in = 0.0  # seconds the last reading took

    async def run(self) -> None:
        while True:
            if self.exporting():
                started = trio.current_time()
                try:
                    self.samples = await trio.to_thread.run_sync(
                        self.gather, abandon_on_cancel=True
                    )
                except (PulsarAdminError, BackendUnavailable, MetadataUnavailable) as e:
                    log.warning("cannot gather queue metrics: %s", e)
                self.gathered_in = trio.current_time() - started
            else:
                self.samples = []
            await trio.sleep(self.interval)

    def gather(self) -> list[QueueSample]:
        """Blocking: one request per broker, then ZooKeeper reads for busy queues."""
        samples: dict[tuple[str, str], SubscriptionSample] = {}
        for answer in self.admin.broker_topic_stats():
            samples.update(parse_topic_stats(answer))
        queues = queue_subscriptions(self.cache)
        # Topics no broker has loaded: a stats call each (it loads them, so later readings
        # find them in the brokers' stats), a bounded number per reading.
        for topic in missing_topics(queues, samples)[:TOPIC_STATS_PER_READING]:
            for subscription, stats in self.admin.subscription_stats(topic).items():
                samples[(str(topic), subscription)] = SubscriptionSample(
                    stats.backlog,
                    stats.delayed,
                    stats.unacked,
                    len(stats.consumer_names),
                )
        return combine(
            queues, samples, self.topology.counts.held_messages, self.topology.counts.consumer_count
        )

    def collect(self) -> Iterable[Metric]:
        samples = self.samples if self.exporting() else []
        labels = ["vhost", "queue"]
        families = {
            "ready": GaugeMetricFamily(
                "rabbitmq_queue_messages_ready", "Messages ready to be delivered.", labels=labels
            ),
            "unacked": GaugeMetricFamily(
                "rabbitmq_queue_messages_unacked",
                "Messages delivered to AMQP consumers and not yet acknowledged.",
                labels=labels,
            ),
            "messages": GaugeMetricFamily(
                "rabbitmq_queue_messages", "Ready and unacknowledged messages.", labels=labels
            ),
            "consumers": GaugeMetricFamily(
                "rabbitmq_queue_consumers", "AMQP consumers of the queue.", labels=labels
            ),
            "deliver": GaugeMetricFamily(
                "starlight_queue_deliver_rate",
                "Messages per second Pulsar dispatched from the queue's subscriptions.",
                labels=labels,
            ),
            "ack": GaugeMetricFamily(
                "starlight_queue_ack_rate",
                "Messages per second acknowledged on the queue's subscriptions.",
                labels=labels,
            ),
        }
        for s in samples:
            key = [s.vhost, s.queue]
            families["ready"].add_metric(key, s.ready)
            families["unacked"].add_metric(key, s.unacked)
            families["messages"].add_metric(key, s.ready + s.unacked)
            families["consumers"].add_metric(key, s.consumers)
            families["deliver"].add_metric(key, s.deliver_rate)
            families["ack"].add_metric(key, s.ack_rate)
        yield from families.values()
        yield GaugeMetricFamily(
            "rabbitmq_queues", "Queues (exported by the leading proxy).", value=len(samples)
        )
        yield GaugeMetricFamily(
            "starlight_queue_metrics_gather_seconds",
            "How long the last reading of the brokers' metrics and ZooKeeper took.",
            value=self.gathered_in,
        )
