"""gateway/bridge.py: items put from other threads reach trio in order and none are lost;
a closed batcher hands back what it still held; items put on the trio thread inside
`handled_here` are handed over when the block ends, without a wake-up."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
import trio

from starlight_py.gateway import bridge


def test_items_from_many_threads_all_arrive_in_order_per_thread() -> None:
    threads, per_thread = 4, 2_000
    got: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}

    async def scenario() -> None:
        token = trio.lowlevel.current_trio_token()
        batchers = {name: bridge.Batcher[tuple[int, int]](token, got[name].extend) for name in got}

        def produce(t: int) -> None:
            for i in range(per_thread):
                batchers["a" if t % 2 else "b"].put((t, i))

        workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        with trio.fail_after(30):
            while sum(len(v) for v in got.values()) < threads * per_thread:
                await trio.sleep(0.01)
        for w in workers:
            w.join()

    trio.run(scenario)
    for name, items in got.items():
        assert len(items) == threads // 2 * per_thread, name
        for t in range(threads):
            mine = [i for (tt, i) in items if tt == t]
            assert mine in ([], list(range(per_thread)))


def test_a_closed_batcher_hands_back_what_it_held_and_takes_nothing_more() -> None:
    seen: list[int] = []

    async def scenario() -> list[int]:
        token = trio.lowlevel.current_trio_token()
        batcher = bridge.Batcher[int](token, seen.extend)
        other = bridge.Batcher[int](token, seen.extend)
        worker = threading.Thread(target=lambda: [batcher.put(1), other.put(2)])
        worker.start()
        worker.join()  # trio has not run meanwhile: both items wait
        left = batcher.close()
        batcher.put(3)
        await trio.sleep(0.05)
        return left

    left = trio.run(scenario)
    assert left == [1]
    assert seen == [2]  # the other batcher is not held up


def test_items_put_in_a_handled_here_block_are_handed_over_once_when_it_ends() -> None:
    seen: list[list[int]] = []
    wakeups: list[object] = []

    class CountedToken:
        """The run's token, counting its wake-ups."""

        def __init__(self, real: trio.lowlevel.TrioToken) -> None:
            self.real = real

        def run_sync_soon(self, sync_fn: Callable[..., object], *args: object) -> None:
            wakeups.append(sync_fn)
            self.real.run_sync_soon(sync_fn, *args)

    async def scenario() -> None:
        token: Any = CountedToken(trio.lowlevel.current_trio_token())
        batcher = bridge.Batcher[int](token, seen.append)
        with bridge.handled_here(token):
            batcher.put(1)
            batcher.put(2)
            assert seen == []  # not before the block ends
        assert seen == [[1, 2]]
        assert wakeups == []  # no wake-up of trio for them
        batcher.put(3)  # outside a block: through the wake-up, as from another thread
        await trio.sleep(0.01)
        assert seen == [[1, 2], [3]]
        assert len(wakeups) == 1

    trio.run(scenario)


def test_a_batcher_of_another_trio_run_is_woken_as_usual_inside_handled_here() -> None:
    seen: list[tuple[int, int]] = []
    other_token: list[trio.lowlevel.TrioToken] = []
    other_ready = threading.Event()
    other_done = threading.Event()

    async def other_run() -> None:
        other_token.append(trio.lowlevel.current_trio_token())
        other_ready.set()
        with trio.fail_after(10):
            while not seen:
                await trio.sleep(0.01)
        other_done.set()

    worker = threading.Thread(target=trio.run, args=(other_run,))
    worker.start()
    assert other_ready.wait(10)

    async def scenario() -> None:
        batcher = bridge.Batcher[int](
            other_token[0], lambda items: seen.append((threading.get_ident(), items[0]))
        )
        with bridge.handled_here(trio.lowlevel.current_trio_token()):
            batcher.put(7)
        assert seen == []  # not handed over here: it belongs to the other run

    trio.run(scenario)
    worker.join(10)
    assert other_done.is_set()
    assert seen == [(worker.ident, 7)]


def test_a_failing_handler_in_handled_here_is_logged_and_the_others_still_get_theirs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[int] = []

    def fails(items: list[int]) -> None:
        raise RuntimeError("boom")

    async def scenario() -> None:
        token = trio.lowlevel.current_trio_token()
        failing = bridge.Batcher[int](token, fails)
        fine = bridge.Batcher[int](token, seen.extend)
        with bridge.handled_here(token):
            failing.put(1)
            fine.put(2)
        assert seen == [2]
        # Neither is left waiting for a hand-over that never comes.
        with bridge.handled_here(token):
            failing.put(3)
            fine.put(4)
        assert seen == [2, 4]

    with caplog.at_level(logging.ERROR, logger="starlight.gateway"):
        trio.run(scenario)
    assert len([r for r in caplog.records if r.exc_info]) == 2
