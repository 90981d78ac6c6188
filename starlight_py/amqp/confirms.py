"""Publisher confirms for one channel: sequence numbers in publish order, one ack or nack
for each, and `multiple` used for contiguous runs (as RabbitMQ does). Pure."""

from __future__ import annotations

from pamqp import commands
from pamqp.base import Frame as PamqpMethod


class ConfirmTracker:
    def __init__(self) -> None:
        self.next_seq = 1
        self._lowest_open = 1
        self._done: dict[int, bool] = {}

    @property
    def outstanding(self) -> int:
        return self.next_seq - self._lowest_open

    def reserve(self) -> int:
        """The sequence number of the next publish (confirm.select numbering starts at 1)."""
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def complete(self, seq: int, ok: bool) -> list[PamqpMethod]:
        """Record an outcome; returns the acks/nacks that can now be sent, in order. A
        confirm is held back until every earlier publish has its outcome, so each ack with
        `multiple` covers exactly one contiguous run of equal outcomes."""
        if seq < self._lowest_open or seq >= self.next_seq or seq in self._done:
            raise ValueError(f"confirm for unknown or settled publish {seq}")
        self._done[seq] = ok
        frames: list[PamqpMethod] = []
        while self._lowest_open in self._done:
            outcome = self._done[self._lowest_open]
            first = self._lowest_open
            while self._done.get(self._lowest_open) is outcome:
                del self._done[self._lowest_open]
                self._lowest_open += 1
            last = self._lowest_open - 1
            multiple = last > first
            if outcome:
                frames.append(commands.Basic.Ack(delivery_tag=last, multiple=multiple))
            else:
                frames.append(
                    commands.Basic.Nack(delivery_tag=last, multiple=multiple, requeue=False)
                )
        return frames
