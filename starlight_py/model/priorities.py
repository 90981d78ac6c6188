"""Priority queues (`x-max-priority`): which band a message's priority falls in, and the
container that hands a consumer its waiting messages highest band first.

Theory of operation. A priority queue reads, besides its binding subscriptions, one
subscription per priority *band* on a topic of its own (`naming.priority_band_topic`). The
proxy that routes a publish to such a queue writes the message to the band topic of its
priority instead of relying on the exchange's topic (docs/mapping.md#priority-queues).

Bands. A queue with `x-max-priority` = M has min(M, MAX_BANDS) + 1 bands, 0 to B. Priority
p (absent = 0, above M = M, as RabbitMQ) is in band ceil(p * B / M): with M <= 10 (what
RabbitMQ recommends) every priority has its own band; with M = 255, priorities 1-25 share
band 1, and so on. Messages of one band keep their publish order; across bands the higher
band is delivered first. The queue's binding subscriptions rank below band 0: they carry
what Pulsar-native producers wrote to the exchange topics, which has no AMQP priority.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

MAX_BANDS = 10
"""Bands above band 0 at most: each band is a topic and a subscription per queue."""

PRIORITY_BAND_TYPE = "x-priority-band"
"""The `exchange_type` of a binding set that is a priority band, not a binding."""


def max_priority_of(arguments: Mapping[str, Any]) -> int | None:
    """A queue's `x-max-priority` (validated: an integer up to 255), None when the queue
    is not a priority queue (absent or 0, as on RabbitMQ)."""
    value = arguments.get("x-max-priority")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return min(value, 255)


def band_count(max_priority: int) -> int:
    """How many bands (0 to B) a queue with this `x-max-priority` has."""
    return min(max_priority, MAX_BANDS) + 1


def band_of(priority: int | None, max_priority: int) -> int:
    """The band of a message's `priority` in a queue with `max_priority`."""
    p = min(max(priority or 0, 0), max_priority)
    top = band_count(max_priority) - 1
    return (p * top + max_priority - 1) // max_priority


T = TypeVar("T")


class RankedPending(Generic[T]):
    """Messages waiting for a consumer's credit, FIFO within a rank, highest rank first.
    Rank 0 is a binding subscription; rank 1 + b is priority band b. For an ordinary queue
    everything has rank 0 and this is a plain FIFO."""

    def __init__(self) -> None:
        self._ranks: dict[int, deque[T]] = {}
        self._order: list[int] = []  # ranks present, highest first
        self._size = 0

    def put(self, rank: int, item: T) -> None:
        queue = self._ranks.get(rank)
        if queue is None:
            queue = self._ranks[rank] = deque()
            self._order = sorted(self._ranks, reverse=True)
        queue.append(item)
        self._size += 1

    def extend(self, rank: int, items: list[T]) -> None:
        """`put` each of `items`, in order, at one rank."""
        if not items:
            return
        queue = self._ranks.get(rank)
        if queue is None:
            queue = self._ranks[rank] = deque()
            self._order = sorted(self._ranks, reverse=True)
        queue.extend(items)
        self._size += len(items)

    def pop(self) -> T:
        """The oldest item of the highest rank; raises IndexError when empty."""
        return self.pop_ranked()[1]

    def pop_ranked(self) -> tuple[int, T]:
        """(rank, item) of the oldest item of the highest rank; raises IndexError when
        empty."""
        for rank in self._order:
            queue = self._ranks[rank]
            if queue:
                self._size -= 1
                return rank, queue.popleft()
        raise IndexError("pop from an empty RankedPending")

    def top_rank(self) -> int | None:
        """The highest rank with an item; None when empty."""
        for rank in self._order:
            if self._ranks[rank]:
                return rank
        return None

    def count(self, rank: int) -> int:
        queue = self._ranks.get(rank)
        return len(queue) if queue is not None else 0

    def take_all(self) -> list[T]:
        """Everything, highest rank first, leaving it empty."""
        items = list(self)
        self._ranks.clear()
        self._order = []
        self._size = 0
        return items

    def __iter__(self) -> Iterator[T]:
        for rank in self._order:
            yield from self._ranks[rank]

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0
