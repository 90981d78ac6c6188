"""The figures of one case of the Java-driven suite: one scenario against one target."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Scenario:
    """Producers, consumers and queues (or topics), and an optional fixed rate.

    PerfTest spreads the producers and the consumers over the queues round-robin
    (``perftest``); ``consumers`` over one queue compete for its messages, and a fanout
    exchange bound to several queues gives each of them a copy of every message, so msg/s
    (PerfTest's ``received``) then counts deliveries.
    """

    name: str
    producers: int = 1
    consumers: int = 1
    queues: int = 1
    rate: float | None = None  # msg/s over all producers; None = as fast as they can
    # PerfTest publishes to an exchange of this type, which it declares with its queues and
    # bindings just before (None: PerfTest's own direct exchange, one binding per queue).
    exchange_type: str | None = None
    prefetch: int = 200  # of each consumer (PerfTest --qos)

    @property
    def pairs(self) -> int | None:
        """How many queues, when each has one producer and one consumer (the shape
        pulsar-perf runs here, one topic per queue); None for any other shape."""
        if self.producers == self.consumers == self.queues:
            return self.queues
        return None

    def shape(self) -> str:
        """E.g. "1 producer, 4 consumers, 1 queue"."""
        parts = ((self.producers, "producer"), (self.consumers, "consumer"), (self.queues, "queue"))
        return ", ".join(f"{n} {what}" + ("" if n == 1 else "s") for n, what in parts)


SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        Scenario("1p1c"),
        Scenario("4p4c", producers=4, consumers=4, queues=4),
        Scenario("1p1c-300", rate=300.0),
        Scenario("1p1c-fanout", exchange_type="fanout"),
        # a work queue: four consumers compete for one queue's messages
        Scenario("1p4c-work", consumers=4, prefetch=10),
        # one publish, ten deliveries: a fanout exchange bound to ten queues, one consumer each
        Scenario("1p10c-fanout", consumers=10, queues=10, exchange_type="fanout"),
    )
}

# Table order, and the tool that drives each target.
TARGET_TOOLS = {"proxy": "PerfTest", "rabbitmq": "PerfTest", "pulsar": "pulsar-perf"}

# pulsar-perf again, at the rate the proxy reached in the same scenario (saturated scenarios
# only, when proxy and pulsar are both measured): Pulsar's CPU per message depends on the
# rate, so Pulsar's work behind the proxy is also compared with its work at that rate.
MATCHED = "pulsar-matched"
ROW_TOOLS = {**TARGET_TOOLS, MATCHED: "pulsar-perf"}


@dataclass
class LoadResult:
    """One case's measured window. CPU figures are keyed by server: proxy, pulsar, rabbitmq."""

    scenario: str
    target: str  # proxy | rabbitmq | pulsar
    tool: str  # PerfTest | pulsar-perf
    status: str = "ok"  # ok | error | skipped
    detail: str = ""
    seconds: float | None = None  # length of the measured window
    received: int = 0
    sent: int | None = None
    received_per_s: float | None = None
    sent_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    cpu_us_per_msg: dict[str, float] = field(default_factory=dict)
    cpu_percent: dict[str, float] = field(default_factory=dict)  # of one core
    proxy_threads_us_per_msg: dict[str, float] = field(default_factory=dict)
    proxy_workers: int = 1
    raw: dict[str, Any] = field(default_factory=dict)  # the tool's own lines, parsed
    round: int = 1  # which of the run's rounds (--repeat) measured it

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
