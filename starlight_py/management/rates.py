"""The `rate` of RabbitMQ's `messages_details`, `messages_ready_details` and
`messages_unacknowledged_details`: how fast each count changes, in messages per second,
from the counts this proxy's API read earlier (RabbitMQ's is over its 5 s statistics
interval; ours over the last reading at least MIN_INTERVAL old and at most WINDOW old).
A queue nobody listed within WINDOW starts at 0.0. Pure but for the lock: endpoints run in
worker threads."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping

MIN_INTERVAL = 5.0  # s
WINDOW = 60.0  # s


class CountRates:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: dict[Hashable, deque[tuple[float, Mapping[str, int]]]] = {}

    def observe(self, key: Hashable, counts: Mapping[str, int]) -> dict[str, float]:
        """Record `counts` (name -> value) of `key` now; each count's rate of change."""
        now = self._clock()
        with self._lock:
            self._forget_before(now - WINDOW)
            samples = self._samples.setdefault(key, deque())
            base = None
            for at, values in reversed(samples):
                if now - at >= MIN_INTERVAL:
                    base = (at, values)
                    break
            samples.append((now, dict(counts)))
            while len(samples) > 2 and now - samples[1][0] >= MIN_INTERVAL:
                samples.popleft()  # one reading old enough is all a rate needs
        if base is None:
            return {name: 0.0 for name in counts}
        elapsed = now - base[0]
        return {
            name: round((value - base[1].get(name, value)) / elapsed, 1)
            for name, value in counts.items()
        }

    def _forget_before(self, oldest: float) -> None:
        for key in list(self._samples):
            samples = self._samples[key]
            while samples and samples[0][0] < oldest:
                samples.popleft()
            if not samples:
                del self._samples[key]
