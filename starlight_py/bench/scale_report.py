"""The scale bench's cases, arithmetic and tables; no process, socket or clock here.

A case is one topology (``Case``: a topic exchange with one binding per queue, the default
exchange, or a fanout exchange, with N queues) run against each system; ``SystemResult``
holds what one run measured. The figures:

- idle CPU per process, in ms of CPU per s of wall clock, over a window with every consumer
  attached and nothing published;
- CPU per delivery per process, in µs: the CPU over the traffic window minus that
  process's idle rate times the window's length, divided by the deliveries in the window,
  so that what a topology costs at rest is not charged to its messages;
- the ratios proxy / RabbitMQ, for the proxy process alone and for the proxy with the
  Pulsar and ZooKeeper behind it (``ALL``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = ("topic", "default", "fanout")
PROXY_PROCESSES = ("proxy", "pulsar", "zookeeper")
RABBITMQ_PROCESSES = ("rabbitmq",)
SYSTEMS = ("proxy", "rabbitmq")
ALL = "all"  # every process of a system, added up


@dataclass(frozen=True)
class Case:
    """One topology: ``kind`` of exchange and how many queues, one consumer each."""

    kind: str
    queues: int

    @property
    def label(self) -> str:
        return f"{self.kind} {self.queues:,}"

    @property
    def fanout_width(self) -> int:
        """Deliveries per published message."""
        return self.queues if self.kind == "fanout" else 1


def plan(kinds: Sequence[str], sizes: Sequence[int], fanout_sizes: Sequence[int]) -> list[Case]:
    """The cases in the order they run: topic over ``sizes``, then the default exchange over
    ``sizes``, then fanout over ``fanout_sizes`` (each kind only when in ``kinds``)."""
    cases = []
    for kind in KINDS:
        if kind in kinds:
            for queues in fanout_sizes if kind == "fanout" else sizes:
                cases.append(Case(kind, queues))
    return cases


def processes_of(system: str) -> tuple[str, ...]:
    return PROXY_PROCESSES if system == "proxy" else RABBITMQ_PROCESSES


def rates_ms_per_s(
    before: Mapping[str, float], after: Mapping[str, float], seconds: float
) -> dict[str, float]:
    """CPU ms per wall-clock s of each process between two readings of CPU seconds; a
    process missing from either reading is left out."""
    if seconds <= 0:
        return {}
    return {
        name: round(max(0.0, after[name] - before[name]) / seconds * 1000, 2)
        for name in after
        if name in before
    }


def us_per_delivery(
    before: Mapping[str, float],
    after: Mapping[str, float],
    seconds: float,
    idle_ms_per_s: Mapping[str, float],
    deliveries: int,
) -> dict[str, float]:
    """Each process's CPU per delivery in µs over a window of ``seconds``, its idle rate
    subtracted. May be negative when the idle rate was noisier than the traffic's cost;
    left so rather than hidden."""
    if deliveries <= 0:
        return {}
    figures = {}
    for name in after:
        if name not in before:
            continue
        used = after[name] - before[name] - idle_ms_per_s.get(name, 0.0) / 1000 * seconds
        figures[name] = round(used / deliveries * 1e6, 1)
    return figures


def with_total(figures: Mapping[str, float]) -> dict[str, float]:
    """``figures`` and their sum under ``ALL`` (nothing added to an empty mapping)."""
    if not figures:
        return {}
    return {**figures, ALL: round(sum(figures.values()), 2)}


def ratio(proxy: float | None, rabbitmq: float | None) -> float | None:
    """proxy / RabbitMQ, or None when either is missing or RabbitMQ's is not positive."""
    if proxy is None or rabbitmq is None or rabbitmq <= 0:
        return None
    return proxy / rabbitmq


# How long after the last delete-ok the delete's CPU is still counted.
SETTLE_S = 10.0


@dataclass
class SystemResult:
    """What one case measured against one system."""

    system: str
    status: str = "ok"  # ok, error, skipped
    detail: str = ""
    setup_s: float | None = None
    delete_s: float | None = None
    idle_ms_per_s: dict[str, float] = field(default_factory=dict)  # with ALL
    rss_mib: dict[str, float] = field(default_factory=dict)  # after setup; with ALL
    us_per_delivery: dict[str, float] = field(default_factory=dict)  # with ALL
    # CPU per queue of the setup, and of the delete with the SETTLE_S after it, idle
    # subtracted; with ALL.
    setup_ms_per_queue: dict[str, float] = field(default_factory=dict)
    delete_ms_per_queue: dict[str, float] = field(default_factory=dict)
    offered_per_s: float | None = None  # deliveries/s asked of the publisher
    published_per_s: float | None = None  # in the window
    delivered_per_s: float | None = None  # in the window
    p50_ms: float | None = None
    p99_ms: float | None = None
    # Each queue's first delivered message, in the warm-up: a binding's first use.
    first_p50_ms: float | None = None
    first_p99_ms: float | None = None
    first_max_ms: float | None = None
    first_last_s: float | None = None  # from the first publish to the last first delivery
    lost: int | None = None
    counts: dict[str, int] = field(default_factory=dict)  # published, confirmed, ...

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CaseResult:
    case: Case
    systems: dict[str, SystemResult] = field(default_factory=dict)

    def figure(self, system: str, name: str, process: str | None = None) -> float | None:
        """A figure of one system (of one process, for the per-process ones), or None."""
        result = self.systems.get(system)
        if result is None or result.status == "skipped":
            return None
        value = getattr(result, name)
        if process is not None:
            value = value.get(process)
        return float(value) if isinstance(value, int | float) else None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.case.kind,
            "queues": self.case.queues,
            "systems": {name: r.to_json() for name, r in self.systems.items()},
            "ratios": self.ratios(),
        }

    def ratios(self) -> dict[str, float | None]:
        """proxy / RabbitMQ for each figure (per-process ones: the proxy alone and ALL)."""
        ratios: dict[str, float | None] = {}
        for name in ("setup_s", "delete_s", "delivered_per_s", "p50_ms", "p99_ms", "first_p99_ms"):
            ratios[name] = _rounded(
                ratio(self.figure("proxy", name), self.figure("rabbitmq", name))
            )
        for name in PER_PROCESS_TITLES:
            theirs = self.figure("rabbitmq", name, "rabbitmq")
            for process in ("proxy", ALL):
                ours = self.figure("proxy", name, process)
                ratios[f"{name}.{process}"] = _rounded(ratio(ours, theirs))
        return ratios


@dataclass
class ConnectionsResult:
    """Idle connections against one system."""

    system: str
    count: int  # asked for
    status: str = "ok"
    detail: str = ""
    opened: int | None = None  # open through the idle window (None: not known)
    open_s: float | None = None
    rss_before_kib: dict[str, int] = field(default_factory=dict)
    rss_after_kib: dict[str, int] = field(default_factory=dict)
    baseline_ms_per_s: dict[str, float] = field(default_factory=dict)  # no connection
    idle_ms_per_s: dict[str, float] = field(default_factory=dict)  # with them

    def kib_per_connection(self, process: str) -> float | None:
        before, after = self.rss_before_kib.get(process), self.rss_after_kib.get(process)
        opened = self.count if self.opened is None else self.opened
        if before is None or after is None or opened <= 0 or self.status != "ok":
            return None
        return round((after - before) / opened, 2)

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["kib_per_connection"] = {
            name: self.kib_per_connection(name) for name in self.rss_after_kib
        }
        return document


def _rounded(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


# --- tables --------------------------------------------------------------------------------


def cell(value: float | None, digits: int = 1) -> str:
    """A figure as the tables show it: thousands separated, '-' when missing."""
    if value is None:
        return "-"
    if digits == 0 or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def ratio_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned first column, right-aligned others, two spaces between columns."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        first, *rest = cells
        parts = [first.ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(rest, widths[1:], strict=True)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def _status_note(result: CaseResult) -> str:
    notes = [f"{name}: {r.status}" for name, r in result.systems.items() if r.status != "ok"]
    return "; ".join(notes)


def _side_by_side(results: Sequence[CaseResult], name: str, digits: int) -> list[list[str]]:
    rows = []
    for r in results:
        proxy, rabbit = r.figure("proxy", name), r.figure("rabbitmq", name)
        rows.append([cell(proxy, digits), cell(rabbit, digits), ratio_cell(ratio(proxy, rabbit))])
    return rows


def timing_table(results: Sequence[CaseResult]) -> str:
    """Setup, delete, reached rate, latency and losses, proxy and RabbitMQ side by side."""
    headers = [
        "case",
        "setup s P", "R", "P/R",
        "delete s P", "R", "P/R",
        "msg/s P", "R",
        "p50 ms P", "R", "P/R",
        "p99 ms P", "R", "P/R",
        "first p99 ms P", "R",
        "lost P", "R",
        "status",
    ]  # fmt: skip
    setup = _side_by_side(results, "setup_s", 2)
    delete = _side_by_side(results, "delete_s", 2)
    p50 = _side_by_side(results, "p50_ms", 2)
    p99 = _side_by_side(results, "p99_ms", 2)
    rows = []
    for i, r in enumerate(results):
        rate = [cell(r.figure(s, "delivered_per_s"), 0) for s in SYSTEMS]
        lost = [cell(r.figure(s, "lost"), 0) for s in SYSTEMS]
        first = [cell(r.figure(s, "first_p99_ms"), 1) for s in SYSTEMS]
        rows.append(
            [
                r.case.label,
                *setup[i],
                *delete[i],
                *rate,
                *p50[i],
                *p99[i],
                *first,
                *lost,
                _status_note(r),
            ]
        )
    return format_table(headers, rows)


def per_process_table(results: Sequence[CaseResult], name: str, digits: int = 1) -> str:
    """One per-process figure (idle_ms_per_s, rss_mib or us_per_delivery): the proxy's
    processes, their sum, RabbitMQ, and the two ratios."""
    headers = ["case", *PROXY_PROCESSES, "P all", "rabbitmq", "proxy/R", "all/R"]
    rows = []
    for r in results:
        ours = [cell(r.figure("proxy", name, p), digits) for p in (*PROXY_PROCESSES, ALL)]
        theirs = r.figure("rabbitmq", name, "rabbitmq")
        rows.append(
            [
                r.case.label,
                *ours,
                cell(theirs, digits),
                ratio_cell(ratio(r.figure("proxy", name, "proxy"), theirs)),
                ratio_cell(ratio(r.figure("proxy", name, ALL), theirs)),
            ]
        )
    return format_table(headers, rows)


def connections_table(results: Sequence[ConnectionsResult]) -> str:
    """Idle connections: RSS per connection and CPU, per process of each system."""
    headers = [
        "system", "process", "connections", "open s", "RSS before MiB", "RSS after MiB",
        "KiB/conn", "CPU ms/s none", "CPU ms/s open",
    ]  # fmt: skip
    rows = []
    for r in results:
        for process in processes_of(r.system):
            before, after = r.rss_before_kib.get(process), r.rss_after_kib.get(process)
            rows.append(
                [
                    r.system if r.status == "ok" else f"{r.system} ({r.status})",
                    process,
                    f"{r.opened if r.opened is not None else r.count:,} of {r.count:,}",
                    cell(r.open_s, 2),
                    cell(before / 1024 if before is not None else None),
                    cell(after / 1024 if after is not None else None),
                    cell(r.kib_per_connection(process), 1),
                    cell(r.baseline_ms_per_s.get(process), 2),
                    cell(r.idle_ms_per_s.get(process), 2),
                ]
            )
    return format_table(headers, rows)


def notes(results: Sequence[CaseResult]) -> list[str]:
    """One line per case and system with something to say: an error, or counts that are
    not what they should be (nacks, returns, duplicates, skipped publish slots)."""
    lines = []
    for r in results:
        for system, outcome in r.systems.items():
            if outcome.status != "ok" or outcome.detail:
                lines.append(f"{r.case.label} / {system}: {outcome.status}. {outcome.detail}")
    return lines


PER_PROCESS_TITLES = {
    "idle_ms_per_s": "Idle CPU, ms per s (every consumer attached, nothing published)",
    "rss_mib": "RSS, MiB (after setup, consumers attached)",
    "us_per_delivery": "CPU per delivery, µs (idle CPU subtracted)",
    "setup_ms_per_queue": "CPU per queue of the setup, ms (idle CPU subtracted)",
    "delete_ms_per_queue": (
        f"CPU per queue of the delete and the {SETTLE_S:g} s after its last delete-ok, ms "
        "(what the servers finish in the background included; idle CPU subtracted)"
    ),
}


def full_report(
    results: Sequence[CaseResult],
    connections: Sequence[ConnectionsResult] = (),
    heartbeat_s: int = 60,
) -> str:
    """Every table, titled. P = the proxy (with Pulsar and ZooKeeper behind it), R =
    RabbitMQ, P/R their ratio."""
    blocks = [
        "Setup, delete, rate, latency, losses (P = proxy, R = RabbitMQ, P/R = ratio; setup "
        "= declare + bind + consume, delete = cancel + delete, both timed by the client; "
        "p50 and p99 of the measured window; first p99 = of each queue's first delivered "
        "message, in the warm-up, which goes on until every queue has had one)",
        timing_table(results),
        *(f"note: {line}" for line in notes(results)),
    ]
    for name, title in PER_PROCESS_TITLES.items():
        digits = 0 if name == "rss_mib" else 1 if name == "us_per_delivery" else 2
        blocks += ["", title, per_process_table(results, name, digits)]
    if connections:
        title = f"Idle connections (heartbeat {heartbeat_s} s; none = before they opened)"
        blocks += ["", title, connections_table(connections)]
        blocks += [f"note: {c.system}: {c.status}. {c.detail}" for c in connections if c.detail]
    return "\n".join(blocks)
