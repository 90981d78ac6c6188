"""Positions in a Pulsar topic, as plain values (the broker's MessageId without the client).

A binding records the topic's last message id when it is unbound (its end); the
SubscriptionCleaner deletes the subscription once the cursor's mark-delete position has
reached that end. Both are `MessageIdRecord`s, compared like Pulsar's MessageId.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MessageIdRecord:
    """A message id: ledger, entry, index in a batch (-1: not batched) and partition (-1: a
    non-partitioned topic).

    Ordered like Pulsar's MessageId: by ledger, then entry, then batch index; the partition
    is ignored, so only compare positions of one topic (or one partition). Equality, like
    Pulsar's, includes every field. An entry id of -1 is a real position too: a cursor's
    mark-delete position `L:-1` means "nothing of ledger L acknowledged yet", which is
    before `L:0`.
    """

    ledger_id: int
    entry_id: int
    batch_index: int = -1
    partition: int = -1

    @property
    def _order(self) -> tuple[int, int, int]:
        return (self.ledger_id, self.entry_id, self.batch_index)

    def __lt__(self, other: MessageIdRecord) -> bool:
        if not isinstance(other, MessageIdRecord):
            return NotImplemented
        return self._order < other._order

    def __le__(self, other: MessageIdRecord) -> bool:
        if not isinstance(other, MessageIdRecord):
            return NotImplemented
        return self._order <= other._order

    def __gt__(self, other: MessageIdRecord) -> bool:
        if not isinstance(other, MessageIdRecord):
            return NotImplemented
        return self._order > other._order

    def __ge__(self, other: MessageIdRecord) -> bool:
        if not isinstance(other, MessageIdRecord):
            return NotImplemented
        return self._order >= other._order

    def entry(self) -> MessageIdRecord:
        """The position of the whole entry this message is in (batch index -1). A cursor's
        mark-delete position is an entry: it has reached a batched message's end once it
        reaches that message's entry."""
        if self.batch_index == -1:
            return self
        return MessageIdRecord(self.ledger_id, self.entry_id, -1, self.partition)

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}:{self.batch_index}:{self.partition}"

    @classmethod
    def parse_position(cls, text: str) -> MessageIdRecord:
        """A managed-ledger position `ledger:entry` (as internalStats shows cursors).

        Raises ValueError when `text` is not two integers joined by `:`.
        """
        ledger, separator, entry = text.partition(":")
        if not separator:
            raise ValueError(f"{text!r} is not a position (ledger:entry)")
        try:
            return cls(int(ledger), int(entry))
        except ValueError as e:
            raise ValueError(f"{text!r} is not a position (ledger:entry)") from e
