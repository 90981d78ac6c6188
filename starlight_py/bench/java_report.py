"""The Java-driven suite's table (Markdown, so it pastes into docs/performance.md), the
targets met or missed, and the proxy's CPU by thread."""

from __future__ import annotations

from collections.abc import Sequence

from starlight_py.bench.load_result import MATCHED, ROW_TOOLS, SCENARIOS, LoadResult
from starlight_py.bench.targets import (
    ADDED_LATENCY,
    PROXY_CPU,
    PROXY_CPU_VS_RABBITMQ,
    PULSAR_CPU,
    PULSAR_CPU_MATCHED,
    TAIL_LATENCY,
    THROUGHPUT,
    Verdict,
    figures,
    goal_for,
)

TARGET_NAMES = {
    "proxy": "proxy",
    "rabbitmq": "RabbitMQ",
    "pulsar": "Pulsar",
    MATCHED: "Pulsar at the proxy's msg/s",
}
_TARGET_ORDER = {target: i for i, target in enumerate(ROW_TOOLS)}
_SCENARIO_ORDER = {name: i for i, name in enumerate(SCENARIOS)}
MARKS = {True: " ✓", False: " ✗", None: ""}


def _num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _judged(value: float | None, figure: str, scenario: str, text: str) -> str:
    """``text`` with ✓ or ✗ when a target is stated for this figure in this scenario."""
    if value is None:
        return "-"
    goal = goal_for(figure, scenario)
    return text + (MARKS[goal.met_by(value)] if goal is not None else "")


def _sort_key(result: LoadResult) -> tuple[int, int]:
    return (_SCENARIO_ORDER.get(result.scenario, 99), _TARGET_ORDER.get(result.target, 9))


def _target_label(result: LoadResult) -> str:
    name = TARGET_NAMES.get(result.target, result.target)
    if result.target == "proxy" and result.proxy_workers > 1:
        name += f" {result.proxy_workers} workers"
    return f"{name} ({result.tool})"


def table(results: Sequence[LoadResult]) -> str:
    """One Markdown table; the ratio columns sit on the proxy rows."""
    header = [
        "case",
        "target (load)",
        "msg/s",
        "sent msg/s",
        "p50 ms",
        "p99 ms",
        "proxy µs/msg",
        "Pulsar µs/msg",
        "RabbitMQ µs/msg",
        "proxy ÷ RabbitMQ msg/s",
        "Pulsar µs/msg ÷ pulsar-perf",
        "same, at the proxy's msg/s",
        "p99 ÷ RabbitMQ",
        "p50 - pulsar-perf ms",
        "proxy ÷ RabbitMQ µs/msg",
    ]
    rows = [header]
    for r in sorted(results, key=_sort_key):
        rate = _num(r.received_per_s) if r.ok else r.status
        row = [
            r.scenario,
            _target_label(r),
            rate,
            _num(r.sent_per_s) if r.ok else "",
            _num(r.p50_ms, 2) if r.ok else "",
            _num(r.p99_ms, 2) if r.ok else "",
        ]
        cpu = r.cpu_us_per_msg if r.ok else {}
        proxy_cpu = cpu.get("proxy")
        row += [
            _judged(proxy_cpu, PROXY_CPU, r.scenario, _num(proxy_cpu))
            if r.target == "proxy"
            else _num(proxy_cpu),
            _num(cpu.get("pulsar")),
            _num(cpu.get("rabbitmq")),
        ]
        if r.target == "proxy" and r.ok:
            values = figures(r.scenario, results)
            row += [
                _ratio_cell(values[THROUGHPUT], THROUGHPUT, r.scenario),
                _ratio_cell(values[PULSAR_CPU], PULSAR_CPU, r.scenario),
                _ratio_cell(values[PULSAR_CPU_MATCHED], PULSAR_CPU_MATCHED, r.scenario),
                _ratio_cell(values[TAIL_LATENCY], TAIL_LATENCY, r.scenario),
                _judged(
                    values[ADDED_LATENCY],
                    ADDED_LATENCY,
                    r.scenario,
                    f"{values[ADDED_LATENCY]:+.2f}" if values[ADDED_LATENCY] is not None else "",
                ),
                _ratio_cell(values[PROXY_CPU_VS_RABBITMQ], PROXY_CPU_VS_RABBITMQ, r.scenario),
            ]
        else:
            row += ["", "", "", "", "", ""]
        rows.append(row)
    return _markdown(rows)


def _ratio_cell(value: float | None, figure: str, scenario: str) -> str:
    return _judged(value, figure, scenario, f"{value:.2f}x" if value is not None else "")


def _markdown(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(row)) + " |")
        if n == 0:
            lines.append("| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(lines)


def verdict_lines(verdicts: Sequence[Verdict]) -> list[str]:
    """One line per target: scenario, what, value, limit, met/missed."""
    lines = []
    for v in verdicts:
        goal = v.goal
        unit = "x" if goal.unit == "x" else f" {goal.unit}"
        value = "-" if v.value is None else f"{v.value:g}{unit}"
        lines.append(
            f"{goal.scenario:<9} {goal.description:<44} {value:>12}  "
            f"target {goal.limit_text():<10} {v.label()}"
        )
    return lines


def thread_lines(results: Sequence[LoadResult]) -> list[str]:
    """The proxy's CPU per message split by thread group, one line per proxy case."""
    lines = []
    for r in sorted(results, key=_sort_key):
        if r.target != "proxy" or not r.ok or not r.proxy_threads_us_per_msg:
            continue
        # Idle threads (a tick of 10 ms over the whole window, or none) are left out.
        busy = {name: us for name, us in r.proxy_threads_us_per_msg.items() if us >= 0.05}
        ranked = sorted(busy.items(), key=lambda item: -item[1])
        lines.append(
            f"{r.scenario:<9} " + " | ".join(f"{name} {value:g}" for name, value in ranked)
        )
    return lines


def worker_lines(results: Sequence[LoadResult]) -> list[str]:
    """Throughput per proxy worker, when the proxy ran with several."""
    lines = []
    for r in sorted(results, key=_sort_key):
        if r.target == "proxy" and r.ok and r.proxy_workers > 1 and r.received_per_s:
            per_worker = r.received_per_s / r.proxy_workers
            lines.append(
                f"{r.scenario:<9} {r.proxy_workers} workers: {_num(r.received_per_s)} msg/s, "
                f"{_num(per_worker)} msg/s per worker"
            )
    return lines


def problem_lines(results: Sequence[LoadResult], detail_lines: int = 8) -> list[str]:
    """One entry per case that did not complete; a long detail (a tool's last output
    lines) is cut to its first line and last ``detail_lines``, indented under it."""
    entries = []
    for r in sorted(results, key=_sort_key):
        if r.ok:
            continue
        first, *rest = r.detail.splitlines() or [""]
        if len(rest) > detail_lines:
            rest = ["...", *rest[-detail_lines:]]
        entries.append("\n".join([f"{r.scenario} {r.target}: {r.status}: {first}", *rest]))
    return entries


def print_report(
    results: Sequence[LoadResult], judged: Sequence[Verdict], notes: Sequence[str]
) -> None:
    """The table, then the targets, the proxy's threads, its workers and what failed."""
    print()
    print(table(results))
    print()
    print("✓ target met, ✗ missed. msg/s: messages consumed per second (through a fanout, every")
    print("queue's copy counts). CPU: µs of CPU per message consumed, read from /proc over the")
    print("measured window; Pulsar's on a proxy row is the Pulsar behind the proxy.")
    sections = [
        ("targets (docs/performance.md):", verdict_lines(judged)),
        ("proxy CPU by thread, µs/msg:", thread_lines(results)),
        ("proxy workers:", worker_lines(results)),
    ]
    for title, lines in sections:
        if lines:
            print()
            print(title)
            for line in lines:
                print(f"  {line}")
    print()
    for entry in [*problem_lines(results), *notes]:
        first, *rest = entry.splitlines() or [""]
        print(f"note: {first}")
        for line in rest:
            print(f"    {line}")
