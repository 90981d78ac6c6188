"""The figures of ``bench.floor``: per-message arithmetic, the floor block and the table.

Pure functions over frozen dataclasses, so the unit tests check the arithmetic and the
layout without starting a process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from starlight_py.bench.load_result import SCENARIOS
from starlight_py.bench.targets import GOALS, PROXY_CPU

# The proxy's message path at a few hundred msg/s: the publish read, the Pulsar receipt and
# the delivery each wake a sleeping thread; the write to Pulsar, the confirm and the
# delivery each wake a peer. One echo is one wake-up and one such write.
WAKE_UPS_PER_MESSAGE = 3
# The low-rate target the PerfTest suite judges (bench/targets.py), not a copy of it.
LOW_RATE_SCENARIO = "1p1c-300"
TARGET_US_PER_MESSAGE = next(
    goal.limit for goal in GOALS if goal.figure == PROXY_CPU and goal.scenario == LOW_RATE_SCENARIO
)
TARGET_RATE = SCENARIOS[LOW_RATE_SCENARIO].rate or 0.0
# utime and stime are counted in clock ticks (10 ms on Linux): below this much CPU in the
# window a row's figure is coarse.
COARSE_CPU_SECONDS = 0.5


@dataclass(frozen=True)
class ServerReading:
    """What is read of a server process at one instant (start or end of the window)."""

    at: float  # time.monotonic()
    cpu_seconds: float  # utime + stime
    context_switches: int  # voluntary + nonvoluntary, summed over its threads


@dataclass(frozen=True)
class EchoRow:
    """One echo server at one rate: what its process used over the measured window, or why
    it could not be measured (``error``)."""

    server: str
    rate: float  # msg/s asked for
    messages: int = 0  # echoes sent and checked complete inside the window
    bytes_echoed: int = 0  # bytes the client got back inside the window
    seconds: float = 0.0  # length of the window
    cpu_seconds: float = 0.0
    context_switches: int = 0
    error: str | None = None

    @property
    def us_per_message(self) -> float | None:
        """Server CPU µs per message; None when nothing was measured."""
        if self.error is not None or self.messages <= 0:
            return None
        return round(self.cpu_seconds / self.messages * 1e6, 1)

    @property
    def switches_per_message(self) -> float | None:
        """Server context switches per message; None when nothing was measured."""
        if self.error is not None or self.messages <= 0:
            return None
        return round(self.context_switches / self.messages, 2)

    @property
    def achieved_rate(self) -> float | None:
        """Messages per second the client kept up; below ``rate`` when it fell behind."""
        if self.error is not None or self.seconds <= 0:
            return None
        return round(self.messages / self.seconds, 1)


def measured_row(
    server: str,
    rate: float,
    messages: int,
    bytes_echoed: int,
    before: ServerReading,
    after: ServerReading,
) -> EchoRow:
    """The row of a window that opened at ``before`` and closed at ``after``."""
    return EchoRow(
        server=server,
        rate=rate,
        messages=messages,
        bytes_echoed=bytes_echoed,
        seconds=round(after.at - before.at, 3),
        cpu_seconds=round(after.cpu_seconds - before.cpu_seconds, 3),
        context_switches=after.context_switches - before.context_switches,
    )


@dataclass(frozen=True)
class FloorRow:
    """The floor of the proxy's path one echo server implies."""

    server: str
    rate: float  # the lowest rate it was measured at
    us_per_message: float  # one echo
    floor_us: float  # WAKE_UPS_PER_MESSAGE echoes

    @property
    def percent_of_target(self) -> int:
        return round(100 * self.floor_us / TARGET_US_PER_MESSAGE)


def floor_rows(rows: Sequence[EchoRow]) -> list[FloorRow]:
    """Per server (in the order of ``rows``), WAKE_UPS_PER_MESSAGE times its µs per message
    at the lowest rate it was measured at; a server with no measured row has none."""
    lowest: dict[str, tuple[float, float]] = {}  # server -> (rate, µs per message)
    for row in rows:
        us = row.us_per_message
        if us is not None and (row.server not in lowest or row.rate < lowest[row.server][0]):
            lowest[row.server] = (row.rate, us)
    return [
        FloorRow(server, rate, us, round(WAKE_UPS_PER_MESSAGE * us, 1))
        for server, (rate, us) in lowest.items()
    ]


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _rate(rate: float) -> str:
    return f"{rate:g}"


def format_table(rows: Sequence[EchoRow], size: int, warmup: float, duration: float) -> str:
    """One line per (server, rate): messages, the server's CPU and context switches."""
    lines = [
        f"echo servers, one {size}-byte message at a time, {duration:g} s measured after "
        f"{warmup:g} s of warm-up; CPU and context switches of the server process",
        f"{'server':<18} {'rate':>7} {'messages':>9} {'msg/s':>8} {'CPU ms':>8} "
        f"{'CPU µs/msg':>11} {'ctx sw/msg':>11}",
    ]
    for row in rows:
        head = f"{row.server:<18} {_rate(row.rate):>7}"
        if row.error is not None:
            lines.append(f"{head}   error: {row.error}")
            continue
        lines.append(
            f"{head} {row.messages:>9} {_number(row.achieved_rate):>8} "
            f"{row.cpu_seconds * 1000:>8.0f} {_number(row.us_per_message):>11} "
            f"{_number(row.switches_per_message, 2):>11}"
        )
    if any(r.error is None and r.cpu_seconds < COARSE_CPU_SECONDS for r in rows):
        lines.append(
            "note: CPU is counted in 10 ms clock ticks; rows under "
            f"{COARSE_CPU_SECONDS * 1000:.0f} ms of CPU are coarse (a longer --duration helps)"
        )
    return "\n".join(lines)


def format_floor(floors: Sequence[FloorRow]) -> str:
    """The "floor of the proxy's path" block: each server's floor next to the target."""
    lines = [
        f"floor of the proxy's path: {WAKE_UPS_PER_MESSAGE} x an echo's CPU at the lowest "
        f"rate, against the target of {TARGET_US_PER_MESSAGE:g} µs per message at "
        f"{TARGET_RATE:g} msg/s",
        "(the proxy's path at this rate needs three wake-ups and three writes that wake a "
        "peer per message)",
    ]
    if not floors:
        lines.append("no server was measured")
        return "\n".join(lines)
    lines.append(f"{'server':<18} {'rate':>7} {'echo µs':>8} {'floor µs':>9} {'of target':>10}")
    for floor in floors:
        lines.append(
            f"{floor.server:<18} {_rate(floor.rate):>7} {floor.us_per_message:>8.1f} "
            f"{floor.floor_us:>9.1f} {floor.percent_of_target:>9}%"
        )
    return "\n".join(lines)


def figures(
    rows: Sequence[EchoRow], size: int, warmup: float, duration: float
) -> dict[str, object]:
    """Everything the run measured, for ``--json``."""

    def row_figures(row: EchoRow) -> dict[str, object]:
        return {
            **asdict(row),
            "us_per_message": row.us_per_message,
            "switches_per_message": row.switches_per_message,
            "achieved_rate": row.achieved_rate,
        }

    return {
        "size": size,
        "warmup_seconds": warmup,
        "duration_seconds": duration,
        "rows": [row_figures(row) for row in rows],
        "floor": {
            "wake_ups_per_message": WAKE_UPS_PER_MESSAGE,
            "target_us_per_message": TARGET_US_PER_MESSAGE,
            "target_rate": TARGET_RATE,
            "servers": [
                {**asdict(floor), "percent_of_target": floor.percent_of_target}
                for floor in floor_rows(rows)
            ],
        },
    }
