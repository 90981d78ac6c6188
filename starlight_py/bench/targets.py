"""The performance targets (docs/performance.md), and whether a run met them.

Every target is a figure of the proxy's row of a scenario, compared with the RabbitMQ row
or the pulsar-perf row of the same scenario (same machine, same run):

- throughput: proxy msg/s ÷ RabbitMQ msg/s at saturation, at least 1.2 with one producer
  and one consumer per queue (1p1c, 4p4c), at least 1.0 with four consumers on one queue
  (1p4c-work) and through a fanout to ten queues (1p10c-fanout, where msg/s counts
  deliveries: PerfTest's ``received`` sums every consumer's);
- proxy CPU: µs of the proxy's CPU per message, at most 35 at saturation and 150 at a
  fixed 300 msg/s (where idle costs are spread over few messages);
- proxy CPU against RabbitMQ's: proxy µs per message ÷ RabbitMQ µs per message at 300
  msg/s, at most 1.0;
- Pulsar's work: Pulsar's CPU per message behind the proxy ÷ behind pulsar-perf, at most
  1.5 against pulsar-perf at saturation (the same scenario's pulsar row) and at most 1.2
  against pulsar-perf at the rate the proxy reached (the pulsar-matched row, saturated
  scenarios), since Pulsar's CPU per message falls as its rate rises;
- tail latency: proxy p99 ÷ RabbitMQ p99 at the same rate (300 msg/s), at most 2;
- added latency: proxy p50 - pulsar-perf p50 at 300 msg/s, at most 1 ms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from starlight_py.bench.load_result import MATCHED, LoadResult

THROUGHPUT = "throughput"
PROXY_CPU = "proxy_cpu"
PROXY_CPU_VS_RABBITMQ = "proxy_cpu_vs_rabbitmq"
PULSAR_CPU = "pulsar_cpu"
PULSAR_CPU_MATCHED = "pulsar_cpu_matched"
TAIL_LATENCY = "tail_latency"
ADDED_LATENCY = "added_latency"
FIGURES = (
    THROUGHPUT,
    PROXY_CPU,
    PROXY_CPU_VS_RABBITMQ,
    PULSAR_CPU,
    PULSAR_CPU_MATCHED,
    TAIL_LATENCY,
    ADDED_LATENCY,
)


@dataclass(frozen=True)
class Goal:
    figure: str  # one of the names above
    scenario: str
    limit: float
    at_least: bool  # True: the figure must be >= limit; False: <= limit
    description: str
    unit: str  # "x" for ratios

    def met_by(self, value: float | None) -> bool | None:
        """None when there is no value to judge."""
        if value is None:
            return None
        return value >= self.limit if self.at_least else value <= self.limit

    def limit_text(self) -> str:
        sign = ">=" if self.at_least else "<="
        return f"{sign} {self.limit:g}{'' if self.unit == 'x' else ' ' + self.unit}"


_RATIO = "x"
GOALS: tuple[Goal, ...] = (
    Goal(THROUGHPUT, "1p1c", 1.2, True, "proxy msg/s ÷ RabbitMQ msg/s", _RATIO),
    Goal(THROUGHPUT, "4p4c", 1.2, True, "proxy msg/s ÷ RabbitMQ msg/s", _RATIO),
    Goal(THROUGHPUT, "1p4c-work", 1.0, True, "proxy msg/s ÷ RabbitMQ msg/s", _RATIO),
    Goal(
        THROUGHPUT,
        "1p10c-fanout",
        1.0,
        True,
        "proxy deliveries/s ÷ RabbitMQ deliveries/s",
        _RATIO,
    ),
    Goal(PROXY_CPU, "1p1c", 35.0, False, "proxy CPU per message", "µs"),
    Goal(PROXY_CPU, "4p4c", 35.0, False, "proxy CPU per message", "µs"),
    Goal(PROXY_CPU, "1p1c-300", 150.0, False, "proxy CPU per message", "µs"),
    Goal(
        PROXY_CPU_VS_RABBITMQ,
        "1p1c-300",
        1.0,
        False,
        "proxy CPU/msg ÷ RabbitMQ CPU/msg",
        _RATIO,
    ),
    *(
        Goal(PULSAR_CPU, scenario, 1.5, False, "Pulsar CPU/msg behind proxy ÷ pulsar-perf", _RATIO)
        for scenario in ("1p1c", "4p4c", "1p1c-300")
    ),
    *(
        Goal(
            PULSAR_CPU_MATCHED,
            scenario,
            1.2,
            False,
            "same, pulsar-perf at the proxy's msg/s",
            _RATIO,
        )
        for scenario in ("1p1c", "4p4c")
    ),
    Goal(TAIL_LATENCY, "1p1c-300", 2.0, False, "proxy p99 ÷ RabbitMQ p99", _RATIO),
    Goal(ADDED_LATENCY, "1p1c-300", 1.0, False, "proxy p50 - pulsar-perf p50", "ms"),
)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator ÷ denominator rounded to 3 decimals, None if either is missing or zero."""
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def figures(scenario: str, results: Sequence[LoadResult]) -> dict[str, float | None]:
    """The figures targets are stated in, for one scenario's proxy row (values of rows
    that did not complete count as missing)."""
    rows = {r.target: r for r in results if r.scenario == scenario and r.ok}
    proxy, rabbit, perf = rows.get("proxy"), rows.get("rabbitmq"), rows.get("pulsar")
    matched = rows.get(MATCHED)
    if proxy is None:
        return dict.fromkeys(FIGURES)
    added = None
    if perf is not None and proxy.p50_ms is not None and perf.p50_ms is not None:
        added = round(proxy.p50_ms - perf.p50_ms, 3)
    return {
        THROUGHPUT: ratio(proxy.received_per_s, rabbit.received_per_s if rabbit else None),
        PROXY_CPU: proxy.cpu_us_per_msg.get("proxy"),
        PROXY_CPU_VS_RABBITMQ: ratio(
            proxy.cpu_us_per_msg.get("proxy"),
            rabbit.cpu_us_per_msg.get("rabbitmq") if rabbit else None,
        ),
        PULSAR_CPU: ratio(
            proxy.cpu_us_per_msg.get("pulsar"), perf.cpu_us_per_msg.get("pulsar") if perf else None
        ),
        PULSAR_CPU_MATCHED: ratio(
            proxy.cpu_us_per_msg.get("pulsar"),
            matched.cpu_us_per_msg.get("pulsar") if matched else None,
        ),
        TAIL_LATENCY: ratio(proxy.p99_ms, rabbit.p99_ms if rabbit else None),
        ADDED_LATENCY: added,
    }


@dataclass(frozen=True)
class Verdict:
    goal: Goal
    value: float | None

    @property
    def met(self) -> bool | None:
        return self.goal.met_by(self.value)

    def label(self) -> str:
        return {True: "met", False: "missed", None: "not measured"}[self.met]

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.goal.scenario,
            "figure": self.goal.figure,
            "description": self.goal.description,
            "value": self.value,
            "unit": self.goal.unit,
            "limit": self.goal.limit,
            "at_least": self.goal.at_least,
            "verdict": self.label(),
        }


def verdicts(results: Sequence[LoadResult]) -> list[Verdict]:
    """One verdict per goal whose scenario was run."""
    scenarios = {r.scenario for r in results}
    by_scenario = {scenario: figures(scenario, results) for scenario in scenarios}
    return [
        Verdict(goal, by_scenario[goal.scenario][goal.figure])
        for goal in GOALS
        if goal.scenario in by_scenario
    ]


def goal_for(figure: str, scenario: str) -> Goal | None:
    for goal in GOALS:
        if goal.figure == figure and goal.scenario == scenario:
            return goal
    return None
