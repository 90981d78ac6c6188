"""The figures of one case of the Java-driven suite: one scenario against one target."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Scenario:
    """Producers and consumers, one pair per queue (or topic), and an optional fixed rate."""

    name: str
    pairs: int
    rate: float | None = None  # msg/s over all producers; None = as fast as they can
    # PerfTest publishes to an exchange of this type, declared with its queues just before
    # (None: the default exchange); pulsar-perf runs as for the others.
    exchange_type: str | None = None


SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        Scenario("1p1c", 1),
        Scenario("4p4c", 4),
        Scenario("1p1c-300", 1, 300.0),
        Scenario("1p1c-fanout", 1, exchange_type="fanout"),
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
