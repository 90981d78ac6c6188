"""A consumer as the message core sees it, and a message as its client gets it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlight_py.amqp import hot_frames
from starlight_py.model.priorities import RankedPending


class Deliverable:
    """A message as the client gets it (what `vet` says of a source it lets through). A
    value: nothing changes it after it is made (a plain class, made once per delivery, is
    cheaper than a frozen dataclass)."""

    __slots__ = ("body", "exchange", "queue", "raw_properties", "redelivered", "routing_key")

    def __init__(
        self,
        exchange: str,
        routing_key: str,
        raw_properties: bytes,
        body: bytes,
        redelivered: bool,
        queue: Any = None,
    ) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.raw_properties = raw_properties
        self.body = body
        self.redelivered = redelivered
        self.queue = queue  # the queue record, kept with the delivery for dead-lettering


# vet(consumer, source): the message as it is to be delivered now, or None when it is not
# (another binding's message, expired, over its delivery limit: the gateway has already
# acknowledged or dead-lettered it).
Vet = Callable[["Consumer", Any], Deliverable | None]


class Consumer:
    """One basic.consume of a channel, as the core sees it."""

    __slots__ = (
        "cancelled",
        "encoded_tag",
        "exclusive",
        "expected",
        "first_until",
        "link",
        "no_ack",
        "pending",
        "prefetch",
        "queue",
        "ranks",
        "reading",
        "refilling",
        "started",
        "tag",
        "unacked",
        "wake_pending",
    )

    def __init__(
        self, tag: str, queue: str, no_ack: bool, prefetch: int, exclusive: bool, link: Any
    ) -> None:
        self.tag = tag
        self.encoded_tag = hot_frames.short_string(tag)
        self.queue = queue
        self.no_ack = no_ack
        self.prefetch = prefetch
        self.exclusive = exclusive
        self.link = link  # the gateway's record of this consumer
        self.pending: RankedPending[Any] = RankedPending()
        # Priority bands read (rank 1 + band); empty for an ordinary queue.
        self.ranks: set[int] = set()
        # A priority queue's bands that may be refilling: rank -> until when a lower band's
        # message waits for them.
        self.refilling: dict[int, float] = {}
        # Bands whose backlog was known when the consumer subscribed to them: rank -> how
        # many of those messages have not arrived yet (0: all came, or none were there).
        self.expected: dict[int, int] = {}
        # Until when a new consumer of a priority queue delivers nothing while a band's
        # known messages are still on their way (0.0: its first deliveries went out).
        self.first_until = 0.0
        # What the gateway was last told: reading or not, per band (None: every subscription).
        self.reading: dict[int | None, bool] = {}
        self.wake_pending = False
        self.unacked = 0
        self.started = False
        self.cancelled = False

    def __repr__(self) -> str:
        return f"Consumer({self.tag!r}, queue={self.queue!r})"
