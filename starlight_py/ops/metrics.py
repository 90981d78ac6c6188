"""The proxy's Prometheus metrics, one registry per proxy (several proxies can share a
process in tests). Counters are updated where things happen (publish, delivery, confirm,
errors); gauges of live state (connections, channels, consumers, cache age, the cleaner)
are read when scraped."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from starlight_py.cluster.cleaner import CleanerStats


@dataclass(frozen=True)
class LiveCounts:
    connections: int
    channels: int
    consumers: int
    producers: int = 0  # Pulsar producers open (one per topic published to lately)
    # vhost -> (connections, channels) of connections that opened one
    by_vhost: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Connections that only more than a heartbeat wakes, and the heartbeats their timers
    # read (gateway/connection/quiet_sockets.py).
    quiet_connections: int = 0
    quiet_heartbeats: int = 0
    # Quiet connections with no channel that keep no task (gateway/connection/parking.py).
    parked_connections: int = 0
    resumed_connections: int = 0  # parked connections that got a task again, since the start


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
        # rabbitmq_prometheus's names for the same, so its dashboards work.
        yield GaugeMetricFamily(
            "rabbitmq_connections", "Open AMQP connections.", value=counts.connections
        )
        yield GaugeMetricFamily("rabbitmq_channels", "Open AMQP channels.", value=counts.channels)
        yield GaugeMetricFamily("rabbitmq_consumers", "AMQP consumers.", value=counts.consumers)
        per_vhost_connections = GaugeMetricFamily(
            "starlight_vhost_connections", "Open AMQP connections by vhost.", labels=["vhost"]
        )
        per_vhost_channels = GaugeMetricFamily(
            "starlight_vhost_channels", "Open AMQP channels by vhost.", labels=["vhost"]
        )
        for vhost, (connections, channels) in sorted(counts.by_vhost.items()):
            per_vhost_connections.add_metric([vhost], connections)
            per_vhost_channels.add_metric([vhost], channels)
        yield per_vhost_connections
        yield per_vhost_channels
        yield GaugeMetricFamily(
            "starlight_pulsar_producers",
            "Pulsar producers open: one per topic published to within "
            "pulsarProducerIdleTimeoutMillis.",
            value=counts.producers,
        )
        yield GaugeMetricFamily(
            "starlight_quiet_connections",
            "Connections that received nothing but heartbeats for "
            "amqpQuietConnectionAfterMillis: only more than a heartbeat wakes them.",
            value=counts.quiet_connections,
        )
        yield GaugeMetricFamily(
            "starlight_parked_connections",
            "Quiet connections with no channel that keep no task: one epoll set of the "
            "process watches their sockets.",
            value=counts.parked_connections,
        )
        yield CounterMetricFamily(
            "starlight_connections_resumed",
            "Parked connections that got a task again (a frame, an end, output to write).",
            value=counts.resumed_connections,
        )
        yield CounterMetricFamily(
            "starlight_quiet_heartbeats",
            "Client heartbeats of quiet connections, read by the timers without a wake-up.",
            value=counts.quiet_heartbeats,
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


class _GlobalTotals(Collector):
    """rabbitmq_prometheus's global message counters, from this proxy's own counts."""

    def __init__(self, metrics: ProxyMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        totals = self._metrics.totals
        for name, documentation, key in (
            ("received", "Messages published by AMQP clients.", "received"),
            ("delivered", "Messages delivered to AMQP consumers and basic.get.", "delivered"),
            ("redelivered", "Deliveries flagged redelivered.", "redelivered"),
            ("confirmed", "Publishes Pulsar stored (publisher confirms).", "confirmed"),
            ("unroutable_returned", "Mandatory publishes returned unroutable.", "returned"),
        ):
            yield CounterMetricFamily(
                f"rabbitmq_global_messages_{name}", documentation, value=totals[key]
            )


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # Totals of the counters below, for rabbitmq_prometheus's global names.
        self.totals = dict.fromkeys(
            ("received", "delivered", "redelivered", "confirmed", "returned"), 0
        )
        r.register(_GlobalTotals(self))
        ProcessCollector(registry=r)  # process_cpu_seconds_total, _resident_memory_bytes...
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

    def register(self, collector: Collector) -> None:
        self.registry.register(collector)

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
        self.totals["received"] += count

    def delivered(self, vhost: str, count: int, size: int, redelivered: int) -> None:
        _, _, messages, size_counter, redeliveries = self._of(vhost)
        messages.inc(count)
        size_counter.inc(size)
        totals = self.totals
        totals["delivered"] += count
        if redelivered:
            redeliveries.inc(redelivered)
            totals["redelivered"] += redelivered

    def sends_done(self, ok: bool, count: int, seconds: float) -> None:
        """`count` sends got their outcome from Pulsar, the oldest `seconds` after it was
        handed over (the histogram observes one value per flush)."""
        (self._acks if ok else self._nacks).inc(count)
        if ok:
            self.totals["confirmed"] += count
        self.confirm_latency.observe(seconds)

    def returned(self) -> None:
        self.returns.inc()
        self.totals["returned"] += 1

    def refused(self) -> None:
        self.refusals.inc()

    def backend_error(self, service: str) -> None:
        self.backend_errors.labels(service).inc()
