"""The results table (Markdown, so it pastes into docs/performance.md), the machine
description and the JSON file."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from starlight_py.bench.runner import CaseResult, size_label

TARGET_ORDER = {"proxy": 0, "rabbitmq": 1, "pulsar": 2}
TARGET_NAMES = {"proxy": "proxy", "rabbitmq": "RabbitMQ", "pulsar": "pulsar-client"}
MODE_NAMES = {"each": "each", "pipelined": "pipelined"}


def machine_info(rabbitmq_version: str | None, pulsar_version: str | None) -> dict[str, Any]:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    try:
        java = subprocess.run(
            ["java", "-version"], capture_output=True, text=True, timeout=20, check=False
        ).stderr.splitlines()
        java_version = java[0] if java else ""
    except (OSError, subprocess.SubprocessError):
        java_version = "not found"
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model,
        "ram_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "java": java_version,
        "pulsar": pulsar_version,
        "rabbitmq": rabbitmq_version,
        "loadavg_at_start": os.getloadavg(),
    }


def _num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "-"
    return f"{a / b:.2f}x"


def sort_key(r: CaseResult) -> tuple[int, int, str, int]:
    return (int(r.scenario.split("x")[0]), r.size, r.mode, TARGET_ORDER.get(r.target, 9))


def table(results: Sequence[CaseResult]) -> str:
    """One Markdown table; the ratio columns sit on the proxy rows."""
    rates = {(r.scenario, r.size, r.mode, r.target): r.msgs_per_s for r in results}
    header = [
        "scenario",
        "size",
        "confirms",
        "target",
        "msg/s",
        "p50 ms",
        "p99 ms",
        "proxy/RabbitMQ",
        "proxy/direct",
        "server CPU %",
        "client CPU %",
        "other CPU %",
    ]
    rows = [header, ["---"] * len(header)]
    for r in sorted(results, key=sort_key):
        key = (r.scenario, r.size, r.mode)
        is_proxy = r.target == "proxy"
        rate = r.msgs_per_s
        if r.status != "ok":
            rate_text = r.status if rate is None else f"{_num(rate)} ({r.status})"
        else:
            rate_text = _num(rate)
        rows.append(
            [
                r.scenario,
                size_label(r.size),
                MODE_NAMES.get(r.mode, r.mode),
                TARGET_NAMES.get(r.target, r.target),
                rate_text,
                _num(r.p50_ms, 2),
                _num(r.p99_ms, 2),
                _ratio(rate, rates.get((*key, "rabbitmq"))) if is_proxy else "",
                _ratio(rate, rates.get((*key, "pulsar"))) if is_proxy else "",
                " + ".join(f"{name} {v:.0f}" for name, v in r.server_cpu.items()) or "-",
                _num(r.client_cpu, 0),
                _num(r.other_cpu, 0),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        cells = [
            cell.ljust(widths[i]) if row[0] != "---" else "-" * widths[i]
            for i, cell in enumerate(row)
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def problems(results: Sequence[CaseResult]) -> list[str]:
    return [
        f"{r.target} {r.scenario} {size_label(r.size)} {r.mode}: {r.status}: {r.detail}"
        for r in sorted(results, key=sort_key)
        if r.status != "ok" or r.detail
    ]


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")


def slope_kib_per_min(samples: Sequence[tuple[float, int]]) -> float | None:
    """Least-squares slope of (seconds, KiB) samples, in KiB per minute."""
    if len(samples) < 3:
        return None
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_v = sum(v for _, v in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    if var == 0:
        return None
    cov = sum((t - mean_t) * (v - mean_v) for t, v in samples)
    return cov / var * 60
