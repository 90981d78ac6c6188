"""What the message core asks of the gateway, besides the frames it writes.

Commands are imperative and carry the gateway's own objects back to it:
`sources` are whatever the gateway handed in with a message (a Pulsar consumer and the
message it read), `consumer.link` is the gateway's record of an AMQP consumer. The core
never looks inside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Unacked:
    """A message delivered to the client and not yet settled."""

    source: Any
    consumer: Any  # the core's Consumer that delivered it; None for basic.get
    queue: Any  # the queue record it came from (dead-lettering needs its arguments)


@dataclass(frozen=True, slots=True)
class AckMessages:
    """Acknowledge these messages in Pulsar: consumed, gone from their queue."""

    sources: list[Any]


@dataclass(frozen=True, slots=True)
class RequeueMessages:
    """Return these deliveries to their queue, to be delivered again marked redelivered
    (nack/reject with requeue, basic.recover). The gateway dead-letters instead those
    returned more often than their queue's delivery limit."""

    deliveries: list[Unacked]


@dataclass(frozen=True, slots=True)
class RejectMessages:
    """These deliveries die in their queue (nack/reject without requeue): dead-letter them
    to the queue's dead-letter exchange, or drop them when it has none."""

    deliveries: list[Unacked]


@dataclass(frozen=True, slots=True)
class GiveBack:
    """Messages read for a consumer that never reached the client (it was cancelled):
    back to their queue, not counted as a redelivery."""

    sources: list[Any]


@dataclass(frozen=True, slots=True)
class PauseReading:
    """Stop reading Pulsar for this consumer (all its subscriptions, or only those of
    priority band `rank`): it has no credit, or enough waiting already."""

    consumer: Any
    rank: int | None = None


@dataclass(frozen=True, slots=True)
class ResumeReading:
    """Read Pulsar for this consumer again (all its subscriptions, or band `rank`)."""

    consumer: Any
    rank: int | None = None


@dataclass(frozen=True, slots=True)
class ConsumerSettled:
    """A cancelled consumer has nothing unacked any more: its Pulsar consumers may close
    (closing them earlier would have requeued what the client still held)."""

    consumer: Any


@dataclass(frozen=True, slots=True)
class DrainLater:
    """Call `Channel.drain(consumer)` after `delay` seconds (a priority queue's consumer
    waits briefly for a higher band's next message)."""

    consumer: Any
    delay: float


Command = (
    AckMessages
    | RequeueMessages
    | RejectMessages
    | GiveBack
    | PauseReading
    | ResumeReading
    | ConsumerSettled
    | DrainLater
)
