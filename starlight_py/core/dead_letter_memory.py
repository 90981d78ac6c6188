"""Which source messages a connection has dead-lettered, so that one message read again is
not dead-lettered twice.

Pulsar sends a message again when the acknowledgement of its source never reached the
broker: pulsar-client drops an acknowledgement it cannot send at once, which happens while
the source topic moves to another broker (an unload, a bundle split, a broker restart). The
dead letter is then already stored. And a reader that closed before its dead letter was
confirmed (a channel closing, the expiry reaper's reader after its wait) gives the message
back, so the next reader gets it while the first copy is still on its way.

`DeadLetterMemory` keeps, by key (the source subscription and the message's position):

- the dead letters on their way, with the copies read again meanwhile, which are settled
  like the first one once Pulsar answers (`finish`);
- the last `capacity` dead letters stored (or dropped on purpose), whose copies read again
  are only acknowledged.

Pure: no I/O, no clock; the caller settles what `finish` hands back.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from enum import Enum
from typing import Generic, TypeVar

Item = TypeVar("Item")

# Dead letters remembered as stored, per connection: an acknowledgement lost in a topic move
# comes back within seconds of the consumer's reconnection.
DEFAULT_CAPACITY = 4096


class Seen(Enum):
    NEW = "new"  # dead-letter it
    ON_ITS_WAY = "on its way"  # attached to the first copy, settled with it
    STORED = "stored"  # acknowledge it only


class DeadLetterMemory(Generic[Item]):
    __slots__ = ("_capacity", "_on_its_way", "_stored")

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._on_its_way: dict[Hashable, list[Item]] = {}
        self._stored: OrderedDict[Hashable, None] = OrderedDict()

    def see(self, key: Hashable, item: Item) -> Seen:
        """A message died: whether it is a new dead letter (now on its way), a copy of one
        on its way (`item` kept, handed back by `finish`) or of one stored."""
        if key in self._stored:
            self._stored.move_to_end(key)
            return Seen.STORED
        copies = self._on_its_way.get(key)
        if copies is not None:
            copies.append(item)
            return Seen.ON_ITS_WAY
        self._on_its_way[key] = []
        return Seen.NEW

    def finish(self, key: Hashable, stored: bool) -> list[Item]:
        """The first copy's outcome: `stored` (Pulsar has the dead letter, or it was dropped
        on purpose) or not (it goes back to its queue). Returns the copies read meanwhile,
        to be settled the same way."""
        copies = self._on_its_way.pop(key, [])
        if stored:
            self._stored[key] = None
            self._stored.move_to_end(key)
            while len(self._stored) > self._capacity:
                self._stored.popitem(last=False)
        return copies

    def __len__(self) -> int:
        """Keys remembered, on their way or stored."""
        return len(self._on_its_way) + len(self._stored)
