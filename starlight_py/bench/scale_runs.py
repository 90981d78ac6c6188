"""One case of the scale bench against one system, and the idle connections: the generator
run (``scale_load``), the servers' CPU and RSS read at the edges of its windows, and the
figures made of both (``scale_report``). ``scale`` starts the servers and runs these."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from starlight_py.bench.cpu import read_processes, server_members
from starlight_py.bench.infra import rss_kib, say
from starlight_py.bench.scale_load import LoadRun, ScaleEvent, run_load
from starlight_py.bench.scale_report import (
    SETTLE_S,
    Case,
    ConnectionsResult,
    SystemResult,
    rates_ms_per_s,
    us_per_delivery,
    with_total,
)

# Beyond setup and delete (each bounded by --setup-timeout): JVM start, connections.
_CASE_ALLOWANCE = 60.0
HEARTBEAT_S = 60  # of the idle connections, as applications commonly ask
_CPU_EVENTS = (
    "setup_begin",
    "setup_done",
    "idle_begin",
    "idle_end",
    "window_begin",
    "window_end",
    "delete_begin",
    "delete_done",
)


@dataclass(frozen=True)
class Servers:
    """Where each system listens and the first process of each of its servers."""

    urls: dict[str, str]  # system -> amqp:// URL
    rabbitmq_version: str | None
    roots: dict[str, dict[str, int]]  # system -> process name -> group leader pid
    alive: dict[str, Callable[[], bool]]


def cpu_seconds(roots: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds so far of each server (its process groups, see ``cpu.server_members``)."""
    table = read_processes()
    return {
        name: sum(table[pid].cpu_seconds for pid in server_members(root, table))
        for name, root in roots.items()
    }


def rss_by_server(roots: Mapping[str, int]) -> dict[str, int]:
    """VmRSS in KiB of each server, its processes added up."""
    table = read_processes()
    return {
        name: sum(rss_kib(pid) or 0 for pid in server_members(root, table))
        for name, root in roots.items()
    }


def progress(system: str) -> Callable[[ScaleEvent], None]:
    def show(event: ScaleEvent) -> None:
        if event.name == "progress":
            say(
                f"  {system} {event.fields.get('phase')}: "
                f"{event.fields.get('done'):,}/{event.fields.get('of'):,}"
            )
        elif event.name in ("setup_done", "delete_done", "connections_open"):
            say(f"  {event.name.replace('_', ' ')} in {(event.number('ms') or 0) / 1000:.2f} s")
        elif event.name in ("idle_begin", "window_begin", "traffic_begin"):
            say(f"  {event.name.replace('_', ' ')}")
        elif event.name == "first_deliveries":
            say(
                f"  first deliveries: {event.number('reached') or 0:,.0f} of "
                f"{event.number('queues') or 0:,.0f} queues, the last "
                f"{(event.number('last_ms') or 0) / 1000:.2f} s after the first publish"
            )
        elif event.name == "error":
            say(f"  error in {event.fields.get('phase')}: {event.fields.get('message')}")

    return show


def run_case(
    args: argparse.Namespace,
    servers: Servers,
    system: str,
    case: Case,
    command: Sequence[str],
    work_dir: Path,
    run_id: str,
    number: int,
) -> SystemResult:
    result = SystemResult(system)
    if not servers.alive[system]():
        result.status, result.detail = "skipped", f"{system} is not running"
        return result
    roots = servers.roots[system]
    cpu: dict[str, tuple[float, dict[str, float]]] = {}
    show = progress(system)

    def on_event(event: ScaleEvent) -> None:
        if event.name in _CPU_EVENTS:
            cpu[event.name] = (time.monotonic(), cpu_seconds(roots))
        if event.name == "idle_end":
            rss = rss_by_server(roots)
            result.rss_mib = with_total({k: round(v / 1024, 1) for k, v in rss.items()})
        show(event)

    name = f"{number:02d}-{case.kind}-{case.queues}-{system}"
    settings = {
        "mode": "topology",
        "uri": servers.urls[system],
        "kind": case.kind,
        "queues": case.queues,
        "prefix": f"scale-{run_id}-{name}",
        "connections": args.connections,
        "size": args.size,
        "prefetch": args.prefetch,
        "rate": args.rate,
        "idle": args.idle,
        "warmup": args.warmup,
        "first_wait": args.first_wait,
        "duration": args.duration,
        "drain": args.drain,
        "rpc_timeout": args.rpc_timeout,
    }
    timeout = (
        2 * args.setup_timeout
        + args.idle
        + args.warmup
        + args.first_wait
        + args.duration
        + args.drain
    ) + _CASE_ALLOWANCE
    log = work_dir / "scale-cases" / f"{name}.log"
    run = run_load(command, settings, log, on_event, timeout)
    if "delete_done" in cpu:
        # What the servers do after the replies (Pulsar topics deleted) counts too.
        time.sleep(max(0.0, cpu["delete_done"][0] + SETTLE_S - time.monotonic()))
        cpu["delete_settled"] = (time.monotonic(), cpu_seconds(roots))
    figures(run, cpu, result)
    result.offered_per_s = args.rate
    if run.error is not None:
        result.status, result.detail = "error", f"{run.error} (log: {log})"
    if not servers.alive[system]():
        result.status = "error"
        result.detail = f"{system} exited during the case; {result.detail}".strip("; ")
    return result


def figures(
    run: LoadRun, cpu: Mapping[str, tuple[float, dict[str, float]]], result: SystemResult
) -> None:
    """Fill ``result`` from the generator's events and the CPU readings at their edges."""
    if (setup := run.first("setup_done")) is not None:
        result.setup_s = _seconds(setup.number("ms"))
    if (delete := run.first("delete_done")) is not None:
        result.delete_s = _seconds(delete.number("ms"))
    if "idle_begin" in cpu and "idle_end" in cpu:
        (t0, before), (t1, after) = cpu["idle_begin"], cpu["idle_end"]
        result.idle_ms_per_s = with_total(rates_ms_per_s(before, after, t1 - t0))
    queues = (setup.number("queues") or 0) if setup is not None else 0
    result.setup_ms_per_queue = _per_queue(cpu, "setup_begin", "setup_done", result, queues)
    result.delete_ms_per_queue = _per_queue(cpu, "delete_begin", "delete_settled", result, queues)
    if (firsts := run.first("first_deliveries")) is not None:
        _first_deliveries(firsts, result)
    window = run.first("window_end")
    if window is not None:
        seconds = window.number("seconds") or 0.0
        delivered = int(window.number("delivered") or 0)
        if seconds > 0:
            result.delivered_per_s = round(delivered / seconds, 1)
            result.published_per_s = round((window.number("published") or 0) / seconds, 1)
        latency = window.fields.get("latency_us") or []
        if len(latency) >= 2:
            result.p50_ms = round(latency[0] / 1000, 2)
            result.p99_ms = round(latency[1] / 1000, 2)
        if "window_begin" in cpu and "window_end" in cpu:
            (t0, before), (t1, after) = cpu["window_begin"], cpu["window_end"]
            idle = {k: v for k, v in result.idle_ms_per_s.items() if k in before}
            result.us_per_delivery = with_total(
                us_per_delivery(before, after, t1 - t0, idle, delivered)
            )
    drained = run.first("drained")
    if drained is not None:
        result.counts = {
            k: int(v) for k, v in drained.fields.items() if isinstance(v, int) and k != "t_ms"
        }
        result.lost = result.counts.get("lost")
        problems = _first_missing(run) + [
            f"{k} {result.counts[k]}"
            for k in ("nacked", "returned", "unconfirmed", "duplicates", "misrouted")
            if result.counts.get(k)
        ]
        if result.counts.get("skipped_slots"):
            skipped = result.counts["skipped_slots"]
            problems.append(
                f"{skipped} publish slots skipped (the publisher was over 100 ms behind: "
                "1,000 unconfirmed, or no CPU for it)"
            )
        if drained.fields.get("publish_error"):
            problems.append(f"publisher: {drained.fields['publish_error']}")
        if window is not None and not window.number("delivered"):
            problems.append("nothing delivered in the measured window")
        if problems:
            result.detail = "; ".join(problems)


def _per_queue(
    cpu: Mapping[str, tuple[float, dict[str, float]]],
    begin: str,
    end: str,
    result: SystemResult,
    queues: float,
) -> dict[str, float]:
    """CPU ms per queue of each server between two readings, its idle rate subtracted."""
    if begin not in cpu or end not in cpu or queues <= 0:
        return {}
    (t0, before), (t1, after) = cpu[begin], cpu[end]
    idle = {k: v for k, v in result.idle_ms_per_s.items() if k in before}
    per_us = us_per_delivery(before, after, t1 - t0, idle, int(queues))
    return with_total({name: round(us / 1000, 2) for name, us in per_us.items()})


def _first_deliveries(event: ScaleEvent, result: SystemResult) -> None:
    """Each queue's first delivery: its latency percentiles, and when the last came."""
    latency = event.fields.get("latency_us") or []
    if len(latency) >= 3:
        result.first_p50_ms = round(latency[0] / 1000, 2)
        result.first_p99_ms = round(latency[1] / 1000, 2)
        result.first_max_ms = round(latency[2] / 1000, 2)
    result.first_last_s = _seconds(event.number("last_ms"))


def _first_missing(run: LoadRun) -> list[str]:
    """'N queues had no first message' when the warm-up ended without every queue's."""
    event = run.first("first_deliveries")
    if event is None:
        return []
    reached, queues = event.number("reached") or 0, event.number("queues") or 0
    return [f"{queues - reached:.0f} queues had no first message"] if reached < queues else []


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else round(ms / 1000, 3)


def say_outcome(result: SystemResult) -> None:
    if result.status != "ok":
        say(f"  -> {result.status}: {result.detail}")
        return
    per = ", ".join(f"{k} {v:g}" for k, v in result.us_per_delivery.items())
    idle = ", ".join(f"{k} {v:g}" for k, v in result.idle_ms_per_s.items())
    say(
        f"  -> setup {result.setup_s} s, delete {result.delete_s} s, "
        f"{result.delivered_per_s} msg/s, p50 {result.p50_ms} ms, p99 {result.p99_ms} ms, "
        f"first deliveries p99 {result.first_p99_ms} ms, lost {result.lost}; "
        f"idle ms/s: {idle}; µs/delivery: {per}" + (f" ({result.detail})" if result.detail else "")
    )


def run_connections(
    args: argparse.Namespace,
    servers: Servers,
    system: str,
    command: Sequence[str],
    work_dir: Path,
) -> ConnectionsResult:
    result = ConnectionsResult(system, args.idle_connections)
    if not servers.alive[system]():
        result.status, result.detail = "skipped", f"{system} is not running"
        return result
    roots = servers.roots[system]
    # What the system costs with no connection at all, over a window as long.
    before = (time.monotonic(), cpu_seconds(roots))
    time.sleep(args.idle)
    after = (time.monotonic(), cpu_seconds(roots))
    result.baseline_ms_per_s = with_total(rates_ms_per_s(before[1], after[1], after[0] - before[0]))
    result.rss_before_kib = rss_by_server(roots)
    cpu: dict[str, tuple[float, dict[str, float]]] = {}
    show = progress(system)

    def on_event(event: ScaleEvent) -> None:
        if event.name in ("idle_begin", "idle_end"):
            cpu[event.name] = (time.monotonic(), cpu_seconds(roots))
        if event.name == "idle_end":
            result.rss_after_kib = rss_by_server(roots)
        show(event)

    settings = {
        "mode": "connections",
        "uri": servers.urls[system],
        "count": args.idle_connections,
        "heartbeat": HEARTBEAT_S,
        "idle": args.idle,
        "rpc_timeout": args.rpc_timeout,
    }
    log = work_dir / "scale-cases" / f"connections-{system}.log"
    run = run_load(command, settings, log, on_event, args.setup_timeout + args.idle + 60)
    problems = []
    if (opened := run.first("connections_open")) is not None:
        result.open_s = _seconds(opened.number("ms"))
        if opened.number("failed"):
            problems.append(
                f"{opened.number('failed'):.0f} failed to open (the first: "
                f"{opened.fields.get('first_failure')})"
            )
    if "idle_begin" in cpu and "idle_end" in cpu:
        (t0, first), (t1, last) = cpu["idle_begin"], cpu["idle_end"]
        result.idle_ms_per_s = with_total(rates_ms_per_s(first, last, t1 - t0))
    ended = run.first("idle_end")
    if ended is not None and (alive := ended.number("alive")) is not None:
        result.opened = int(alive)
        if alive < args.idle_connections:
            problems.append(f"{alive:.0f} of {args.idle_connections} open at the window's end")
    result.detail = "; ".join(problems)
    if run.error is not None:
        result.status = "error"
        result.detail = "; ".join([*problems, f"{run.error} (log: {log})"])
    kib = {p: result.kib_per_connection(p) for p in result.rss_after_kib}
    say(
        f"  -> opened in {result.open_s} s; KiB per connection: {kib}; CPU ms/s "
        f"{result.idle_ms_per_s} (none open: {result.baseline_ms_per_s})"
        + (f" ({result.status}: {result.detail})" if result.detail else "")
    )
    return result
