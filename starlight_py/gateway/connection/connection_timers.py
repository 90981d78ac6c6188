"""One task keeps the deadlines of every client connection of the process: heartbeats to
send and heartbeats missed, the handshake and close-ok timeouts, credential expiry.

A sleeping task per connection costs a task switch, a cancel scope and a trio deadline
each time it wakes, and thousands of idle connections wake hundreds of times a second
(each sends its heartbeat every half interval). Here a connection is an entry in a heap
ordered by when it is due next; the one task sleeps until the earliest, calls each
connection that is due (`on_timer`, which does what is due and says when it is due
again) and sleeps again. Due times are rounded up to GRANULARITY, so connections due at
about the same time share one wake-up.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from typing import Protocol

import trio

log = logging.getLogger("starlight.connection")

# Deadlines are kept to a tenth of a second: a heartbeat or a timeout that much late is
# well within what AMQP allows (a peer is given two intervals).
GRANULARITY = 0.1
# The heap is rebuilt without cancelled entries when they are most of it.
COMPACT_ABOVE = 64


class Timed(Protocol):
    def on_timer(self, now: float) -> float | None:
        """Do what is due at `now` (trio's clock); the next time it is due, or None when
        it needs no more calls."""
        ...


class ConnectionTimers:
    def __init__(self, granularity: float = GRANULARITY) -> None:
        self._granularity = granularity
        self._heap: list[tuple[float, int, Timed]] = []
        # The entry that counts for each scheduled one (its sequence number); older entries
        # in the heap are skipped when they come up.
        self._current: dict[Timed, int] = {}
        self._sequence = itertools.count()
        self._earlier = trio.Event()  # set when an entry is due before the task's wake-up
        self._wakes_at = math.inf

    def __len__(self) -> int:
        return len(self._current)

    def schedule(self, timed: Timed, due: float) -> None:
        """Call `timed.on_timer` at `due` (trio's clock, rounded up to the granularity);
        replaces when it was due before."""
        step = self._granularity
        due = math.ceil(due / step) * step
        sequence = next(self._sequence)
        self._current[timed] = sequence
        heapq.heappush(self._heap, (due, sequence, timed))
        if due < self._wakes_at:
            self._earlier.set()
        self._compact()

    def cancel(self, timed: Timed) -> None:
        """No more calls of `timed`."""
        if self._current.pop(timed, None) is not None:
            self._compact()

    def run_due(self, now: float) -> None:
        """Call every entry due at `now`."""
        heap, current = self._heap, self._current
        while heap and heap[0][0] <= now:
            _, sequence, timed = heapq.heappop(heap)
            if current.get(timed) != sequence:
                continue  # cancelled or scheduled again since
            del current[timed]
            try:
                following = timed.on_timer(now)
            except Exception:
                log.exception("a connection's timer failed")
                continue
            if following is not None and timed not in current:
                self.schedule(timed, following)

    async def run(self) -> None:
        """Until cancelled."""
        while True:
            self.run_due(trio.current_time())
            self._earlier = trio.Event()
            self._wakes_at = self._heap[0][0] if self._heap else math.inf
            with trio.move_on_at(self._wakes_at):
                await self._earlier.wait()

    def _compact(self) -> None:
        heap = self._heap
        if len(heap) > COMPACT_ABOVE and len(heap) > 2 * len(self._current):
            current = self._current
            self._heap = [entry for entry in heap if current.get(entry[2]) == entry[1]]
            heapq.heapify(self._heap)
