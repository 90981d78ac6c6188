"""Requeues of messages that share a Pulsar batch entry with others.

Pulsar redelivers whole entries: a negative acknowledgement of one message of a batch entry
has the broker send the entry again, less only the messages whose acknowledgements it has
heard. Sent at once, it would bring back

- the entry's other messages that the same Pulsar consumer still holds (delivered and not
  acknowledged yet, or waiting for credit), as duplicates, to any consumer of the queue;
- those acknowledged within the last acknowledgement grouping time, whose acknowledgements
  pulsar-client has not sent yet.

So the negative acknowledgement of a message of a batch entry waits until its consumer
holds no other message of that entry, and then one grouping time more (and a margin). A
message that is not part of a batch entry goes back at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from starlight_py.gateway.consume.returns import known_position

# s added to the grouping time, for pulsar-client's timer to have sent what it gathered.
MARGIN = 0.05
# s: how often entries waiting to go back are looked at, at most (and at least this often).
SHORTEST_CHECK = 0.02
LONGEST_CHECK = 0.25

EntryKey = tuple[int, int, int, int]  # id(handle), ledger, entry, partition
Holdings = Callable[[], Iterable[Any]]


@dataclass
class _Waiting:
    handle: Any
    messages: list[Any]
    held: Holdings  # what the handle's consumer (and channel) holds now
    indexes: set[int] = field(default_factory=set)  # batch indexes going back
    clear_since: float | None = None  # since when no other message of the entry is held


class BatchRequeues:
    """Negative acknowledgements of batch messages, held back as the module says. One per
    connection; its task runs in the connection's nursery while any wait."""

    def __init__(self, grouping: float, spawn: Callable[..., None]) -> None:
        """`grouping`: s, the acknowledgement grouping time of a consumer that does not
        tell its own (`ack_grouping_ms` of a ConsumerHandle)."""
        self._grouping = grouping
        self._check = min(max((grouping + MARGIN) / 4, SHORTEST_CHECK), LONGEST_CHECK)
        self._spawn = spawn
        self._waiting: dict[EntryKey, _Waiting] = {}
        self._running = False

    def __len__(self) -> int:
        return len(self._waiting)

    def negative_acknowledge(self, message: Any, held: Holdings) -> None:
        """Send `message` back to its queue: at once when it is alone in its entry, else
        once `held()` shows no other message of its entry on its consumer."""
        position = known_position(message)
        if position is None or position.batch_index < 0:  # not part of a batch entry
            message.handle.negative_acknowledge(message)
            return
        key = (id(message.handle), position.ledger_id, position.entry_id, position.partition)
        waiting = self._waiting.get(key)
        if waiting is None:
            waiting = self._waiting[key] = _Waiting(message.handle, [], held)
        waiting.messages.append(message)
        waiting.indexes.add(position.batch_index)
        # Other messages of the entry may have been acknowledged just now.
        waiting.clear_since = None
        if not self._running:
            self._running = True
            self._spawn(self._run)

    def check(self, now: float) -> None:
        """Send back what has waited long enough; forget what a closed consumer held (the
        broker gave it back when the consumer closed)."""
        for key, waiting in list(self._waiting.items()):
            handle = waiting.handle
            if getattr(handle, "closed", False):
                del self._waiting[key]
            elif _holds_another(waiting, key):
                waiting.clear_since = None
            elif waiting.clear_since is None:
                waiting.clear_since = now
            elif now - waiting.clear_since >= self._wait(handle):
                del self._waiting[key]
                for message in waiting.messages:
                    handle.negative_acknowledge(message)

    def _wait(self, handle: Any) -> float:
        """s an entry of `handle`'s waits once its consumer holds no other message of it."""
        grouping_ms = getattr(handle, "ack_grouping_ms", None)
        grouping = self._grouping if grouping_ms is None else grouping_ms / 1000
        return grouping + MARGIN

    async def _run(self) -> None:
        try:
            while self._waiting:
                self.check(trio.current_time())
                if not self._waiting:
                    break
                await trio.sleep(self._check)
        finally:
            self._running = False


def _holds_another(waiting: _Waiting, key: EntryKey) -> bool:
    handle = waiting.handle
    _, ledger, entry, partition = key
    for message in waiting.held():
        if message.handle is not handle:
            continue
        position = known_position(message)
        if position is not None and (
            position.entry_id == entry
            and position.ledger_id == ledger
            and position.partition == partition
            and position.batch_index not in waiting.indexes
        ):
            return True
    return False
