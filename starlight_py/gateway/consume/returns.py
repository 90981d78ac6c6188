"""Messages a Pulsar consumer is handed again, and how the proxy tells them.

Pulsar dispatches a subscription's messages to a consumer in the order it stored them; only
a redelivery comes from behind a position the consumer already had: a requeue, another
consumer of the queue closing, or a topic reload (an unload, a bundle move, a broker
restart). After a reload Pulsar hands the reconnected consumer everything of the
subscription not acknowledged yet, with its redelivery count back at 0, including what the
channel still holds; and Pulsar 4.0.8 can forget acknowledgements of single messages of a
batch entry across a reload (apache/pulsar#14982). So, per Pulsar consumer:

- a message from behind the furthest position it was handed is a return: it is delivered
  with `redelivered` set, whatever Pulsar's count says (delayed messages excepted: Pulsar
  hands them out late by design, so they are not returns);
- a return of a message the channel still holds (delivered and not settled, or waiting for
  credit) is a copy of it, and is dropped: the client settles the one it has, and that
  settles the position.

Checking costs two positions per batch a Pulsar consumer hands over in order; only a batch
that reaches behind is looked at message by message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from starlight_py.model.positions import MessageIdRecord

# The header of an x-delayed-message exchange's message, as a Pulsar property.
DELAY_PROPERTY = "amqp.header.x-delay"
# Returns remembered until delivered; the oldest go first past this many (a return that is
# never delivered: given back on cancel, expired, or not routed).
MOST_REMEMBERED = 10_000

Holdings = Callable[[], Iterable[Any]]


def known_position(message: Any) -> MessageIdRecord | None:
    """The message's position, or None when it has none that compares (a chunked
    message's id names its first and last chunks)."""
    try:
        position: MessageIdRecord = message.position
    except RuntimeError:
        return None
    return position


def _ahead(
    first: MessageIdRecord | None, last: MessageIdRecord | None, frontier: MessageIdRecord | None
) -> MessageIdRecord | None:
    """The batch's last position when the batch is in order and wholly ahead of `frontier`
    (its first and last positions say so), else None: then it is looked at one by one."""
    if first is None or last is None or last < first:
        return None
    if frontier is not None and not first > frontier:
        return None
    return last


class Returns:
    """One AMQP consumer's record: each of its Pulsar consumers' furthest position, and the
    returns found behind it, until they are delivered."""

    __slots__ = ("_frontiers", "_returned")

    def __init__(self) -> None:
        self._frontiers: dict[int, MessageIdRecord] = {}  # id(handle) -> furthest position
        self._returned: dict[int, Any] = {}  # id(message) -> message

    def sort(self, handle: Any, batch: list[Any], held: Holdings) -> list[Any]:
        """The batch `handle` handed over, less copies of what the channel holds (`held()`:
        the messages it holds); the returns among them are remembered."""
        if not batch:
            return batch
        key = id(handle)
        frontier = self._frontiers.get(key)
        ahead = _ahead(known_position(batch[0]), known_position(batch[-1]), frontier)
        if ahead is not None:
            self._frontiers[key] = ahead
            return batch
        kept: list[Any] = []
        held_positions: set[MessageIdRecord | None] | None = None
        for message in batch:
            position = known_position(message)
            if position is None:
                pass  # not judged
            elif frontier is None or position > frontier:
                frontier = position
            elif DELAY_PROPERTY not in message.properties:
                if held_positions is None:
                    held_positions = {known_position(m) for m in held() if m.handle is handle}
                if position in held_positions:
                    continue  # a copy of what the channel holds
                self._remember(message)
            kept.append(message)
        if frontier is not None:
            self._frontiers[key] = frontier
        return kept

    def returned(self, message: Any) -> bool:
        """Whether `message` is a return (asked once, when it is delivered)."""
        returned = self._returned
        return bool(returned) and returned.pop(id(message), None) is not None

    def _remember(self, message: Any) -> None:
        returned = self._returned
        if len(returned) >= MOST_REMEMBERED:
            del returned[next(iter(returned))]
        returned[id(message)] = message
