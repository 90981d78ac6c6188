"""How a queue's counts and message rates went over the last minutes, for the web UI's
charts and for RabbitMQ's `?lengths_age=600&lengths_incr=5&msg_rates_age=600&msg_rates_incr=5`
(their `samples`).

Theory of operation: nothing samples on its own. Each time this proxy's API reads a
queue's counts (listing queues, showing one, the overview with an age asked), it records
them with the queue's message rates under the queue's key, and the sums of a whole vhost
listed at once under the vhost's key. Samples fall in INTERVAL-long slots (the UI's
refresh): a second reading within one slot replaces the first. A key keeps KEPT samples
(its last ten minutes when read at least once a slot) in one flat array, and at most
MAX_KEYS keys are kept, the least recently recorded going first: bounded memory (about 6
KiB a key) however many queues there are and however often they are read. A proxy knows
only the readings made through its own API; a freshly started one has none.

Pure but for the lock: endpoints run in worker threads.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from starlight_py.units import MINUTES, SECONDS

INTERVAL = 5 * SECONDS
KEPT = int(10 * MINUTES / INTERVAL)
MAX_KEYS = 2048
MAX_AGE = KEPT * INTERVAL  # longer ages are cut to this
_WIDTH = 6  # a sample's slot and its five values


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of a queue (or the sum of a vhost's queues): its counts, and its
    message rates (messages per second, Pulsar's: management/queues.py)."""

    ready: int = 0
    unacked: int = 0
    publish_rate: float = 0.0
    deliver_rate: float = 0.0
    ack_rate: float = 0.0

    def plus(self, other: Sample) -> Sample:
        return Sample(
            self.ready + other.ready,
            self.unacked + other.unacked,
            self.publish_rate + other.publish_rate,
            self.deliver_rate + other.deliver_rate,
            self.ack_rate + other.ack_rate,
        )


class _Ring:
    """A key's last KEPT samples, oldest first, as (slot, values) rows in one array."""

    __slots__ = ("data", "start")

    def __init__(self) -> None:
        self.data = array("d")
        self.start = 0  # the oldest row, once the ring is full

    def __len__(self) -> int:
        return len(self.data) // _WIDTH

    def put(self, slot: int, sample: Sample) -> None:
        row = array(
            "d",
            (
                slot,
                sample.ready,
                sample.unacked,
                sample.publish_rate,
                sample.deliver_rate,
                sample.ack_rate,
            ),
        )
        count = len(self)
        if count:
            newest = (self.start + count - 1) % count
            if self.data[newest * _WIDTH] == slot:
                self.data[newest * _WIDTH : (newest + 1) * _WIDTH] = row
                return
        if count < KEPT:
            self.data.extend(row)
        else:
            self.data[self.start * _WIDTH : (self.start + 1) * _WIDTH] = row
            self.start = (self.start + 1) % KEPT

    def rows(self, first_slot: int) -> list[tuple[int, Sample]]:
        """The samples from `first_slot` on, oldest first."""
        count = len(self)
        found = []
        for i in range(count):
            at = ((self.start + i) % count) * _WIDTH
            slot = int(self.data[at])
            if slot >= first_slot:
                values = self.data[at + 1 : at + _WIDTH]
                found.append((slot, Sample(int(values[0]), int(values[1]), *values[2:])))
        return found


class SampleHistory:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._rings: OrderedDict[Hashable, _Ring] = OrderedDict()

    def now(self) -> float:
        """The time to record a reading at (seconds since the epoch)."""
        return self._clock()

    def record(self, key: Hashable, sample: Sample, at: float) -> None:
        """Keep `sample` of `key`, read at `at` (`now()`); forgets the least recently
        recorded key when there are MAX_KEYS."""
        slot = int(at // INTERVAL)
        with self._lock:
            ring = self._rings.get(key)
            if ring is None:
                ring = self._rings[key] = _Ring()
                while len(self._rings) > MAX_KEYS:
                    self._rings.popitem(last=False)
            else:
                self._rings.move_to_end(key)
            ring.put(slot, sample)

    def history(self, keys: Iterable[Hashable], age: float) -> list[tuple[float, Sample]]:
        """The samples of the last `age` seconds, oldest first, as (time, sample); of
        several keys, their sum, each key counted with its latest sample at that time (a
        key not read in a slot does not dip the sum)."""
        now = self._clock()
        first_slot = int((now - min(age, MAX_AGE)) // INTERVAL) + 1
        with self._lock:
            each = [ring.rows(first_slot) for key in keys if (ring := self._rings.get(key))]
        if len(each) == 1:
            return [(slot * INTERVAL, sample) for slot, sample in each[0]]
        slots = sorted({slot for rows in each for slot, _ in rows})
        summed = []
        latest: list[Sample | None] = [None] * len(each)
        positions = [0] * len(each)
        for slot in slots:
            total = Sample()
            for i, rows in enumerate(each):
                while positions[i] < len(rows) and rows[positions[i]][0] <= slot:
                    latest[i] = rows[positions[i]][1]
                    positions[i] += 1
                found = latest[i]
                if found is not None:
                    total = total.plus(found)
            summed.append((slot * INTERVAL, total))
        return summed

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._rings.pop(key, None)


# ---- RabbitMQ's query and shapes ----------------------------------------------------------


@dataclass(frozen=True)
class SamplesAsked:
    """What `?lengths_age=&lengths_incr=&msg_rates_age=&msg_rates_incr=` ask for, in
    seconds (age 0: not asked)."""

    lengths_age: float = 0.0
    lengths_incr: float = INTERVAL
    msg_rates_age: float = 0.0
    msg_rates_incr: float = INTERVAL

    @property
    def any(self) -> bool:
        return self.lengths_age > 0 or self.msg_rates_age > 0

    @property
    def age(self) -> float:
        return max(self.lengths_age, self.msg_rates_age)


def samples_asked(query: Mapping[str, str]) -> SamplesAsked:
    """The ages and increments of a request's query; malformed or missing numbers are not
    asked (ages) or INTERVAL (increments), as RabbitMQ ignores what it cannot read."""

    def seconds(name: str, default: float) -> float:
        text = query.get(name, "")
        return float(int(text)) if text.isdigit() and int(text) > 0 else default

    return SamplesAsked(
        seconds("lengths_age", 0.0),
        seconds("lengths_incr", INTERVAL),
        seconds("msg_rates_age", 0.0),
        seconds("msg_rates_incr", INTERVAL),
    )


def _thinned(
    history: list[tuple[float, Sample]], age: float, increment: float, now: float
) -> list[tuple[float, Sample]]:
    """Newest first (as RabbitMQ lists samples), within `age`, at least `increment` apart."""
    kept: list[tuple[float, Sample]] = []
    for at, sample in reversed(history):
        if now - at > age:
            break
        if not kept or kept[-1][0] - at >= increment:
            kept.append((at, sample))
    return kept


def _length_details(
    rate: float, kept: list[tuple[float, Sample]], value: Callable[[Sample], int]
) -> dict[str, Any]:
    details: dict[str, Any] = {"rate": rate}
    details["samples"] = [{"sample": value(s), "timestamp": int(at * 1000)} for at, s in kept]
    if kept:
        details["avg"] = round(sum(value(s) for _, s in kept) / len(kept), 1)
        span = kept[0][0] - kept[-1][0]
        change = value(kept[0][1]) - value(kept[-1][1])
        details["avg_rate"] = round(change / span, 1) if span > 0 else 0.0
    return details


def add_length_samples(
    shaped: dict[str, Any],
    history: list[tuple[float, Sample]],
    asked: SamplesAsked,
    now: float,
) -> None:
    """Add `samples` (RabbitMQ's shape: `{"sample": count, "timestamp": ms}`, newest first),
    `avg` and `avg_rate` to `messages_details`, `messages_ready_details` and
    `messages_unacknowledged_details` of a queue (or the overview's `queue_totals`)."""
    if asked.lengths_age <= 0:
        return
    kept = _thinned(history, asked.lengths_age, asked.lengths_incr, now)
    lengths: tuple[tuple[str, Callable[[Sample], int]], ...] = (
        ("messages", lambda s: s.ready + s.unacked),
        ("messages_ready", lambda s: s.ready),
        ("messages_unacknowledged", lambda s: s.unacked),
    )
    for name, value in lengths:
        rate = float(shaped.get(f"{name}_details", {}).get("rate", 0.0))
        shaped[f"{name}_details"] = _length_details(rate, kept, value)


def add_rate_samples(
    message_stats: dict[str, Any],
    history: list[tuple[float, Sample]],
    asked: SamplesAsked,
    now: float,
) -> None:
    """Add `samples` to `publish_details`, `deliver_get_details` and `ack_details`. Unlike
    RabbitMQ's, whose samples are running counts, ours are the rates Pulsar's statistics
    gave at each reading (`{"rate": per_second, "timestamp": ms}`): Pulsar counts no
    acknowledgements."""
    if asked.msg_rates_age <= 0:
        return
    kept = _thinned(history, asked.msg_rates_age, asked.msg_rates_incr, now)
    rates: tuple[tuple[str, Callable[[Sample], float]], ...] = (
        ("publish", lambda s: s.publish_rate),
        ("deliver_get", lambda s: s.deliver_rate),
        ("ack", lambda s: s.ack_rate),
    )
    for name, value in rates:
        details = message_stats.setdefault(f"{name}_details", {"rate": 0.0})
        details["samples"] = [
            {"rate": round(value(s), 1), "timestamp": int(at * 1000)} for at, s in kept
        ]
