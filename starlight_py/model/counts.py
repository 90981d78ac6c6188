"""A queue's ready messages (AMQP's `message_count`) from Pulsar's statistics and the
proxies' unacked deliveries (docs/mapping.md#counts)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def ready_messages(waiting: int, undispatched: int, held: int, settling: int) -> int:
    """RabbitMQ's ready count of a queue.

    - `waiting`: Pulsar's backlog less the delayed messages it tracks (ready, read ahead by
      a proxy, delivered and unacked, or acknowledged but not yet heard of by Pulsar);
    - `undispatched`: the same less Pulsar's unacked (what no Pulsar consumer holds): never
      more than the ready count, since what a proxy read ahead is ready too;
    - `held`: AMQP deliveries unacked on every proxy;
    - `settling`: deliveries this process settled a moment ago, which Pulsar may still count.

    `waiting - held` is never less than the ready count (it is more by the acknowledgements
    Pulsar has not heard of); less `settling` it may undershoot once Pulsar heard of them,
    and `undispatched` is the floor."""
    return max(0, undispatched, waiting - held - settling)


@dataclass(frozen=True, slots=True)
class QueueFlow:
    """How messages flow through a queue, from Pulsar's statistics of the topics it reads
    (docs/management.md#message-rates): `published` messages written to them and
    `delivered` dispatched to the queue's consumers and getters since the brokers loaded
    the topics, and per-second rates. On fanout, topic and headers exchanges a topic is
    the exchange's: `published` also counts what the queue's bindings do not route."""

    published: int = 0
    publish_rate: float = 0.0
    delivered: int = 0
    deliver_rate: float = 0.0
    ack_rate: float = 0.0
    redeliver_rate: float = 0.0

    def plus(self, other: QueueFlow) -> QueueFlow:
        return QueueFlow(
            self.published + other.published,
            self.publish_rate + other.publish_rate,
            self.delivered + other.delivered,
            self.deliver_rate + other.deliver_rate,
            self.ack_rate + other.ack_rate,
            self.redeliver_rate + other.redeliver_rate,
        )

    def message_stats(self) -> dict[str, Any]:
        """RabbitMQ's `message_stats` of a queue (GET /api/queues): the publish count and
        `*_details.rate`. The other counts are left out, as RabbitMQ leaves out what it has
        not seen: Pulsar counts no acknowledgements or redeliveries, and its dispatch count
        misses what consumers it closed had taken since its last stats update (every
        basic.get getter is one), so `delivered` runs short."""
        return {
            "publish": self.published,
            "publish_details": {"rate": round(self.publish_rate, 1)},
            "deliver_get_details": {"rate": round(self.deliver_rate, 1)},
            "ack_details": {"rate": round(self.ack_rate, 1)},
            "redeliver_details": {"rate": round(self.redeliver_rate, 1)},
        }
