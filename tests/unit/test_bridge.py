"""gateway/bridge.py: items put from other threads reach trio in order and none are lost;
a closed batcher hands back what it still held."""

from __future__ import annotations

import threading

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
