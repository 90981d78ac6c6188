"""What a Pulsar broker holds in memory for delayed messages, sampled from its Prometheus
page (`/metrics` on the web service port) while a bench runs.

Figures read (summed over the broker's topics where they are per topic):

- `jvm_memory_bytes_used{area="heap"}`: the heap in use, garbage included;
- `jvm_memory_pool_bytes_used` of the old generation: what survived the young collections
  (and the old data not yet collected), the figure that shows whether long-lived data grows;
- `pulsar_delayed_message_index_size_bytes`: the delayed-delivery trackers' index in memory;
- `pulsar_delayed_message_index_loaded` and `pulsar_delayed_message_index_bucket_total`
  (the bucket-based tracker only): indexes held in memory, and snapshot buckets in BookKeeper.

Per-subscription samples of the same names are left out: they repeat their topic's.

`parse` is pure; `BrokerMemorySampler` polls in a thread of its own.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

MIB = 1024 * 1024
_OLD_GENERATIONS = ("G1 Old Gen", "PS Old Gen", "Tenured Gen", "ZHeap", "Shenandoah")


@dataclass(frozen=True)
class BrokerMemory:
    """One sample; None where the page did not have the figure."""

    heap_used: float | None = None
    old_generation: float | None = None
    delayed_index_bytes: float | None = None
    delayed_index_loaded: float | None = None
    delayed_buckets: float | None = None

    def describe(self) -> str:
        parts = [
            f"{label} {value / MIB:,.1f} MiB"
            for label, value in (
                ("heap used", self.heap_used),
                ("old generation", self.old_generation),
                ("delayed index", self.delayed_index_bytes),
            )
            if value is not None
        ]
        parts += [
            f"{label} {value:,.0f}"
            for label, value in (
                ("indexes in memory", self.delayed_index_loaded),
                ("buckets", self.delayed_buckets),
            )
            if value is not None
        ]
        return ", ".join(parts) or "no memory figures on the broker's page"


def parse(text: str) -> BrokerMemory:
    """The figures of a Prometheus text page. Raises ValueError for a malformed page."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = _key(sample.name, sample.labels)
            if key is not None:
                totals[key] = totals.get(key, 0.0) + sample.value
    return BrokerMemory(
        heap_used=totals.get("heap"),
        old_generation=totals.get("old"),
        delayed_index_bytes=totals.get("index"),
        delayed_index_loaded=totals.get("loaded"),
        delayed_buckets=totals.get("buckets"),
    )


def _key(name: str, labels: dict[str, str]) -> str | None:
    if "subscription" in labels:
        return None  # a topic's figure again, per subscription
    if name == "jvm_memory_bytes_used" and labels.get("area") == "heap":
        return "heap"
    if name == "jvm_memory_pool_bytes_used" and labels.get("pool") in _OLD_GENERATIONS:
        return "old"
    if name == "pulsar_delayed_message_index_size_bytes":
        return "index"
    if name == "pulsar_delayed_message_index_loaded":
        return "loaded"
    if name == "pulsar_delayed_message_index_bucket_total":
        return "buckets"
    return None


@dataclass
class Peaks:
    """The largest value of each figure over the samples taken."""

    samples: int = 0
    largest: dict[str, float] = field(default_factory=dict)

    def add(self, memory: BrokerMemory) -> None:
        self.samples += 1
        for name, value in vars(memory).items():
            if value is not None:
                self.largest[name] = max(value, self.largest.get(name, value))

    def describe(self) -> str:
        return BrokerMemory(**self.largest).describe()


class BrokerMemorySampler:
    """Reads `web_url`/metrics every `every` seconds and hands each sample to `report`
    (with its time since start); `peaks` keeps the largest values. A failed read is
    skipped."""

    def __init__(
        self, web_url: str, every: float, report: Callable[[float, BrokerMemory], None]
    ) -> None:
        self._url = web_url.rstrip("/") + "/metrics"
        self._every = every
        self._report = report
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-memory", daemon=True)
        self.peaks = Peaks()

    def __enter__(self) -> BrokerMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def sample(self) -> BrokerMemory | None:
        try:
            with urllib.request.urlopen(self._url, timeout=20) as answer:
                memory = parse(answer.read().decode("utf-8", "replace"))
        except (OSError, ValueError):
            return None
        self.peaks.add(memory)
        return memory

    def _run(self) -> None:
        elapsed = 0.0
        while not self._stop.wait(self._every):
            elapsed += self._every
            memory = self.sample()
            if memory is not None:
                self._report(elapsed, memory)
