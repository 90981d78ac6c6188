"""Publisher confirms of one channel: sequence numbers in publish order, exactly one ack or
nack for each, and `multiple` for every contiguous run of equal outcomes, as RabbitMQ does.

Outcomes are recorded as they come (`settle_all`), in any order; `runs()` then gives the
confirms that can be sent, so a batch of outcomes handled together costs one frame per run,
not one per message.
"""

from __future__ import annotations

from collections.abc import Iterable


class Confirms:
    def __init__(self) -> None:
        self.next_seq = 1
        self._lowest_open = 1
        self._done: dict[int, bool] = {}

    @property
    def outstanding(self) -> int:
        """Publishes whose confirm has not been sent yet."""
        return self.next_seq - self._lowest_open

    def reserve(self) -> int:
        """The sequence number of the next publish (numbering starts at 1)."""
        seq = self.next_seq
        self.next_seq = seq + 1
        return seq

    def settle_all(self, outcomes: Iterable[tuple[int, bool]]) -> None:
        """Record each (sequence number, ok); number 0 (a publish before confirm.select) is
        left out. Raises ValueError for a number never reserved or settled twice (a bug of
        ours, not of the client)."""
        done = self._done
        lowest = self._lowest_open
        top = self.next_seq
        for seq, ok in outcomes:
            if not seq:
                continue
            if seq < lowest or seq >= top or seq in done:
                raise ValueError(f"confirm for unknown or settled publish {seq}")
            done[seq] = ok

    def runs(self) -> list[tuple[int, bool, bool]]:
        """(last sequence number, multiple, ok) of each confirm that can be sent now, in
        order: a confirm waits until every earlier publish has its outcome."""
        done = self._done
        runs: list[tuple[int, bool, bool]] = []
        lowest = self._lowest_open
        while lowest in done:
            outcome = done.pop(lowest)
            first = lowest
            lowest += 1
            while done.get(lowest) is outcome:
                del done[lowest]
                lowest += 1
            runs.append((lowest - 1, lowest - 1 > first, outcome))
        self._lowest_open = lowest
        return runs
