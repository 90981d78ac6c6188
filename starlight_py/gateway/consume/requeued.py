"""What this proxy requeued: redelivered flags and delivery limits need it where Pulsar's
own redelivery count falls short."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from starlight_py.model.positions import MessageIdRecord


class RequeuedPositions:
    """Messages this proxy requeued (subscription, position) and how often, so their next
    deliveries are marked redelivered and count towards a delivery limit; bounded, oldest
    forgotten first. Shared by the proxy's connections, all on the trio thread."""

    def __init__(self, limit: int = 100_000) -> None:
        self._limit = limit
        self._positions: OrderedDict[tuple[str, MessageIdRecord], int] = OrderedDict()
        # Subscriptions with an entry: most deliveries are of subscriptions without one,
        # and need no position looked up (it costs pulsar-client calls).
        self._subscriptions: dict[str, int] = {}

    def add(self, subscription: str, position: MessageIdRecord) -> None:
        key = (subscription, position)
        seen = self._positions.pop(key, 0)
        if not seen:
            self._subscriptions[subscription] = self._subscriptions.get(subscription, 0) + 1
        self._positions[key] = seen + 1
        if len(self._positions) > self._limit:
            (old, _), _ = self._positions.popitem(last=False)
            left = self._subscriptions[old] - 1
            if left:
                self._subscriptions[old] = left
            else:
                del self._subscriptions[old]

    def knows(self, subscription: str) -> bool:
        """Whether any message of `subscription` was requeued here (cheap)."""
        return subscription in self._subscriptions

    def returns(self, subscription: str, position: MessageIdRecord) -> int:
        """How often this proxy requeued the message (Pulsar's redelivery count misses
        returns by a closing consumer, e.g. a basic.get's)."""
        if subscription not in self._subscriptions:
            return 0
        return self._positions.get((subscription, position), 0)

    def add_all(self, items: Iterable[tuple[str, MessageIdRecord]]) -> None:
        for subscription, position in items:
            self.add(subscription, position)

    def pop(self, subscription: str, position: MessageIdRecord) -> bool:
        """Whether the message was requeued by this proxy (remembered for its delivery
        limit; forgotten only when the bound is reached)."""
        return (subscription, position) in self._positions
