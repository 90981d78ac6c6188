"""The proxy's Prometheus metrics, one registry per proxy (several proxies can share a
process in tests). Counters are updated where things happen (publish, delivery, confirm,
errors); gauges of live state (connections, channels, consumers, cache age, the cleaner)
are read when scraped."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from starlight_py.cluster.cleaner import CleanerStats


@dataclass(frozen=True)
class LiveCounts:
    connections: int
    channels: int
    consumers: int
    producers: int = 0  # Pulsar producers open (one per topic published to lately)


class _LiveState(Collector):
    def __init__(
        self,
        live: Callable[[], LiveCounts],
        cache_last_change: Callable[[], float],
        cleaner: Callable[[], CleanerStats | None],
    ) -> None:
        self._live = live
        self._cache_last_change = cache_last_change
        self._cleaner = cleaner

    def collect(self) -> Iterable[Metric]:
        counts = self._live()
        yield GaugeMetricFamily(
            "starlight_connections", "Open AMQP connections.", value=counts.connections
        )
        yield GaugeMetricFamily("starlight_channels", "Open AMQP channels.", value=counts.channels)
        yield GaugeMetricFamily(
            "starlight_consumers", "AMQP consumers (basic.consume).", value=counts.consumers
        )
        yield GaugeMetricFamily(
            "starlight_pulsar_producers",
            "Pulsar producers open: one per topic published to within "
            "pulsarProducerIdleTimeoutMillis.",
            value=counts.producers,
        )
        last = self._cache_last_change()
        yield GaugeMetricFamily(
            "starlight_metadata_cache_age_seconds",
            "Time since the topology cache last applied a change from ZooKeeper.",
            value=time.time() - last if last else 0.0,
        )
        stats = self._cleaner()
        if stats is None:
            return
        yield GaugeMetricFamily(
            "starlight_cleaner_leader",
            "1 when this proxy runs the SubscriptionCleaner.",
            value=1.0 if stats.leader else 0.0,
        )
        actions = CounterMetricFamily(
            "starlight_cleaner_actions", "What the SubscriptionCleaner did.", labels=["action"]
        )
        actions.add_metric(["subscription_drained"], stats.subscriptions_drained)
        actions.add_metric(["subscription_deleted"], stats.subscriptions_deleted)
        actions.add_metric(["entry_pruned"], stats.entries_pruned)
        actions.add_metric(["expiry_sweep"], stats.expiry_sweeps)
        for reason, count in sorted(stats.queues_deleted.items()):
            actions.add_metric([f"queue_deleted_{reason.replace('-', '_')}"], count)
        yield actions
        yield CounterMetricFamily(
            "starlight_cleaner_errors", "Failed cleaner steps.", value=stats.errors
        )
        if not stats.leader:
            return
        messages = GaugeMetricFamily(
            "starlight_stream_messages",
            "Messages a stream queue keeps (the SubscriptionCleaner's leader, at its last pass).",
            labels=["vhost", "queue"],
        )
        size = GaugeMetricFamily(
            "starlight_stream_bytes",
            "Stored bytes a stream queue keeps (the SubscriptionCleaner's leader, at its last "
            "pass).",
            labels=["vhost", "queue"],
        )
        for (vhost, queue), (count, stored) in sorted(stats.stream_sizes.items()):
            messages.add_metric([vhost, queue], count)
            size.add_metric([vhost, queue], stored)
        yield messages
        yield size


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.messages_in = Counter(
            "starlight_messages_published", "Messages published.", ["vhost"], registry=r
        )
        self.bytes_in = Counter(
            "starlight_bytes_published", "Body bytes published.", ["vhost"], registry=r
        )
        self.messages_out = Counter(
            "starlight_messages_delivered",
            "Messages delivered (basic.deliver and get-ok).",
            ["vhost"],
            registry=r,
        )
        self.bytes_out = Counter(
            "starlight_bytes_delivered", "Body bytes delivered.", ["vhost"], registry=r
        )
        self.redeliveries = Counter(
            "starlight_redeliveries", "Deliveries flagged redelivered.", ["vhost"], registry=r
        )
        self.confirms = Counter(
            "starlight_publisher_confirms",
            "Pulsar send results of published messages (ack: written; nack: failed).",
            ["result"],
            registry=r,
        )
        self.returns = Counter(
            "starlight_returns", "basic.return sent (mandatory, unroutable).", registry=r
        )
        self.refusals = Counter(
            "starlight_publishes_refused",
            "Publishes refused by a queue at its length limit (x-overflow reject-publish).",
            registry=r,
        )
        self.confirm_latency = Histogram(
            "starlight_publish_confirm_seconds",
            "From a publish handed to Pulsar to Pulsar's answer.",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.backend_errors = Counter(
            "starlight_backend_errors",
            "Operations failed because ZooKeeper or Pulsar could not be used.",
            ["service"],
            registry=r,
        )

        self._by_vhost: dict[str, tuple[Any, Any, Any, Any, Any]] = {}
        self._acks = self.confirms.labels("ack")
        self._nacks = self.confirms.labels("nack")

    def watch(
        self,
        live: Callable[[], LiveCounts],
        cache_last_change: Callable[[], float],
        cleaner: Callable[[], CleanerStats | None],
    ) -> None:
        self.registry.register(_LiveState(live, cache_last_change, cleaner))

    def _of(self, vhost: str) -> tuple[Any, Any, Any, Any, Any]:
        # Labelled children are looked up once per vhost: this runs for every message.
        found = self._by_vhost.get(vhost)
        if found is None:
            found = self._by_vhost[vhost] = (
                self.messages_in.labels(vhost),
                self.bytes_in.labels(vhost),
                self.messages_out.labels(vhost),
                self.bytes_out.labels(vhost),
                self.redeliveries.labels(vhost),
            )
        return found

    # Counters are added once per batch (a socket read, a batch of deliveries), not once per
    # message: each update takes a lock and a label lookup.

    def published(self, vhost: str, count: int, size: int) -> None:
        messages, size_counter, _, _, _ = self._of(vhost)
        messages.inc(count)
        size_counter.inc(size)

    def delivered(self, vhost: str, count: int, size: int, redelivered: int) -> None:
        _, _, messages, size_counter, redeliveries = self._of(vhost)
        messages.inc(count)
        size_counter.inc(size)
        if redelivered:
            redeliveries.inc(redelivered)

    def sends_done(self, ok: bool, count: int, seconds: float) -> None:
        """`count` sends got their outcome from Pulsar, the oldest `seconds` after it was
        handed over (the histogram observes one value per flush)."""
        (self._acks if ok else self._nacks).inc(count)
        self.confirm_latency.observe(seconds)

    def returned(self) -> None:
        self.returns.inc()

    def refused(self) -> None:
        self.refusals.inc()

    def backend_error(self, service: str) -> None:
        self.backend_errors.labels(service).inc()
