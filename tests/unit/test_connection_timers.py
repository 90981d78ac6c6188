"""The one task that keeps every connection's deadlines (gateway/connection/connection_timers.py),
on trio's mock clock."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from starlight_py.gateway.connection.connection_timers import COMPACT_ABOVE, ConnectionTimers


class Recorder:
    """Records when it is called; is due again `every` seconds later (None: once)."""

    def __init__(self, name: str, calls: list[tuple[str, float]], every: float | None) -> None:
        self.name = name
        self.calls = calls
        self.every = every
        self.fail = False

    def on_timer(self, now: float) -> float | None:
        self.calls.append((self.name, round(now, 3)))
        if self.fail:
            raise RuntimeError("broken")
        return None if self.every is None else now + self.every


def run_for(timers: ConnectionTimers, seconds: float, setup: Callable[[], Awaitable[None]]) -> None:
    """Run the timers' task for `seconds` of mock time, `setup` first."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(timers.run)
            await setup()
            await trio.sleep(seconds)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_each_is_called_when_due_and_again_when_it_says() -> None:
    calls: list[tuple[str, float]] = []
    timers = ConnectionTimers()
    beat = Recorder("beat", calls, every=30.0)
    once = Recorder("once", calls, every=None)

    async def setup() -> None:
        timers.schedule(beat, trio.current_time() + 30.0)
        timers.schedule(once, trio.current_time() + 45.0)

    run_for(timers, 100, setup)
    assert calls == [("beat", 30.0), ("once", 45.0), ("beat", 60.0), ("beat", 90.0)]
    assert len(timers) == 1  # `once` said it needs no more calls


def test_due_times_are_rounded_up_to_the_granularity() -> None:
    calls: list[tuple[str, float]] = []
    timers = ConnectionTimers(granularity=0.5)
    first, second = Recorder("a", calls, None), Recorder("b", calls, None)

    async def setup() -> None:
        timers.schedule(first, 1.01)
        timers.schedule(second, 1.49)

    run_for(timers, 5, setup)
    assert calls == [("a", 1.5), ("b", 1.5)]  # one wake-up for both


def test_scheduling_again_replaces_and_cancel_stops() -> None:
    calls: list[tuple[str, float]] = []
    timers = ConnectionTimers()
    moved, cancelled = Recorder("moved", calls, None), Recorder("cancelled", calls, None)

    async def setup() -> None:
        timers.schedule(moved, 10.0)
        timers.schedule(moved, 3.0)  # nearer: replaces the first
        timers.schedule(cancelled, 5.0)
        timers.cancel(cancelled)
        timers.cancel(cancelled)  # twice is harmless

    run_for(timers, 20, setup)
    assert calls == [("moved", 3.0)]
    assert len(timers) == 0


def test_an_entry_made_nearer_while_the_task_sleeps_wakes_it() -> None:
    calls: list[tuple[str, float]] = []
    timers = ConnectionTimers()
    late, woken = Recorder("late", calls, None), Recorder("woken", calls, None)

    async def setup() -> None:
        timers.schedule(late, 50.0)
        await trio.sleep(1)  # the task now sleeps until 50
        timers.schedule(woken, trio.current_time() + 2.0)

    run_for(timers, 60, setup)
    assert calls == [("woken", 3.0), ("late", 50.0)]


def test_one_that_fails_leaves_the_others_alone(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[tuple[str, float]] = []
    timers = ConnectionTimers()
    broken, fine = Recorder("broken", calls, 1.0), Recorder("fine", calls, 1.0)
    broken.fail = True

    async def setup() -> None:
        timers.schedule(broken, 1.0)
        timers.schedule(fine, 1.0)

    run_for(timers, 3.5, setup)
    assert calls == [("broken", 1.0), ("fine", 1.0), ("fine", 2.0), ("fine", 3.0)]
    assert "timer failed" in caplog.text


def test_cancelled_entries_do_not_pile_up() -> None:
    """Connections that come and go leave no entries behind: the heap is rebuilt when
    cancelled ones are most of it."""
    calls: list[tuple[str, float]] = []
    timers = ConnectionTimers()
    kept = [Recorder(f"kept{i}", calls, None) for i in range(3)]
    for i in range(10 * COMPACT_ABOVE):
        gone = Recorder(f"gone{i}", calls, None)
        timers.schedule(gone, 100.0 + i)
        timers.cancel(gone)
    for i, each in enumerate(kept):
        timers.schedule(each, 10.0 + i)
    assert len(timers._heap) <= 2 * COMPACT_ABOVE + len(kept)

    async def setup() -> None:
        pass

    run_for(timers, 200, setup)
    assert calls == [("kept0", 10.0), ("kept1", 11.0), ("kept2", 12.0)]
