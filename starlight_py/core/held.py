"""The AMQP deliveries a process holds unacked, by queue: what exact message counts subtract
from Pulsar's backlog (gateway/consume/held_messages.py publishes them, model/counts.py combines).

Shared by every channel core of one vhost in the process, changed on the trio thread only.
A delivery the client acknowledged (or rejected without requeue) stops being held at once,
but Pulsar hears of the acknowledgement up to pulsarAckGroupingTimeMillis later
(pulsar-client groups them): `settled` remembers such recent settlements so that a count
taken meanwhile can take them out of the backlog too.
"""

from __future__ import annotations

from collections import deque


class HeldCounts:
    __slots__ = ("counts", "settled")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}  # queue name -> deliveries unacked
        # (when, queue, how many) of deliveries acknowledged or rejected, oldest first
        self.settled: deque[tuple[float, str, int]] = deque()

    def release(self, queue: str, count: int, settled_at: float | None) -> None:
        """`count` deliveries of `queue` are no longer held: requeued (`settled_at` None)
        or settled at `settled_at` (the core's clock)."""
        left = self.counts.get(queue, 0) - count
        if left > 0:
            self.counts[queue] = left
        else:
            self.counts.pop(queue, None)
        if settled_at is not None:
            self.settled.append((settled_at, queue, count))

    def hold(self, queue: str, count: int) -> None:
        """`count` messages of `queue` are in the proxy's hands without a delivery: dead
        letters on their way to their dead-letter exchange (not ready, as in RabbitMQ)."""
        self.counts[queue] = self.counts.get(queue, 0) + count

    def acknowledged(self, queue: str, count: int, at: float) -> None:
        """`count` messages of `queue` that no delivery held (expired ones the proxy drops
        itself) were acknowledged at `at` (the core's clock)."""
        self.settled.append((at, queue, count))

    def forget_settled(self, before: float) -> None:
        settled = self.settled
        while settled and settled[0][0] < before:
            settled.popleft()

    def settled_since(self, queue: str, since: float) -> int:
        return sum(n for at, name, n in list(self.settled) if name == queue and at >= since)
