"""The soak: one producer and one consumer through the proxy at a low rate for a long time,
printing the proxy's RSS every 10 s and its slope (memory flatness), optionally with
short-lived connections churning beside them (``churn``)."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import Any

from starlight_py.bench import report
from starlight_py.bench.churn import Churn
from starlight_py.bench.infra import RssSampler, say
from starlight_py.bench.runner import Case, Settings, Target, run_case, size_label


def run_soak(
    args: argparse.Namespace, target: Target, settings: Settings, sampler: RssSampler
) -> dict[str, Any]:
    """Run the soak ``args`` describe through the proxy; returns its JSON summary.
    Raises nothing but KeyboardInterrupt (failures are in the summary's result)."""
    seconds: float = args.soak
    rate: float = args.soak_rate
    soak_settings = replace(
        settings,
        messages=int(rate * seconds) + 1,
        duration=seconds,
        rate=rate,
        timeout=seconds + 90,
        progress_every=10 * seconds,  # the soak prints its own lines
    )
    case = Case("1x1", args.soak_size, args.soak_mode, "proxy")
    say(
        f"soak: {seconds:g} s at {rate:g} msg/s, {size_label(case.size)} bodies, confirms "
        f"{case.mode}, through the proxy (pid {sampler.pid})"
    )
    marks: dict[str, float] = {"next": 0.0, "go": 0.0}

    def tick(elapsed: float, consumed: int) -> None:
        if marks["go"] == 0.0:
            marks["go"] = time.monotonic() - elapsed
        if elapsed >= marks["next"]:
            marks["next"] += 10.0
            kib = sampler.samples[-1][1] if sampler.samples else 0
            say(f"soak t={elapsed:5.0f} s  proxy RSS {kib / 1024:7.1f} MiB  consumed {consumed}")

    churn = Churn(target.url, args.soak_churn) if args.soak_churn > 0 else None
    if churn is not None:
        say(f"soak: plus {args.soak_churn:g} short-lived connections per second ({churn.queue})")
        churn.start()
    try:
        result = run_case(case, target, soak_settings, 1, tick)
    finally:
        churned = churn.stop() if churn is not None else None
    go = marks["go"] or time.monotonic()
    run = [(t - go, kib) for t, kib in sampler.samples if t >= go]
    half = [(t, kib) for t, kib in run if t >= seconds / 2]
    whole_slope = report.slope_kib_per_min(run)
    half_slope = report.slope_kib_per_min(half)
    values = [kib for _, kib in run] or [0]
    summary = {
        "seconds": seconds,
        "rate": rate,
        "size": case.size,
        "mode": case.mode,
        "result": result.to_json(),
        "rss_start_kib": values[0],
        "rss_max_kib": max(values),
        "rss_end_kib": values[-1],
        "slope_kib_per_min": whole_slope,
        "slope_second_half_kib_per_min": half_slope,
        "samples": run,
        "churn": churned.to_json() if churned is not None else None,
    }
    say(
        f"soak done: {result.status}, {result.received}/{result.sent} consumed, "
        f"{result.msgs_per_s} msg/s, p50 {result.p50_ms} ms, p99 {result.p99_ms} ms"
    )
    say(
        f"soak RSS: start {values[0] / 1024:.1f} MiB, max {max(values) / 1024:.1f} MiB, "
        f"end {values[-1] / 1024:.1f} MiB; slope {_fmt_slope(whole_slope)} over the whole "
        f"run, {_fmt_slope(half_slope)} over the second half"
    )
    if churned is not None:
        say(
            f"soak churn: {churned.cycles} connections in {churned.seconds:.0f} s "
            f"({churned.exclusive_queues} with an exclusive queue), {churned.lost} messages "
            f"lost, {churned.failures} failed cycles"
            + (f" (last: {churned.last_failure})" if churned.failures else "")
        )
    return summary


def _fmt_slope(slope: float | None) -> str:
    return "n/a" if slope is None else f"{slope:+.1f} KiB/min"
