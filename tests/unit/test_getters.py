"""basic.get's pure pieces (gateway/consume/getting.py): which kept getters close when, and the
concurrent look-ups of a get."""

from __future__ import annotations

import pytest
import trio

from starlight_py.gateway.concurrency import concurrently
from starlight_py.gateway.consume.getting import (
    GETTER_IDLE,
    GETTER_RECHECK,
    idle_getters,
    next_idle_look,
)


def test_a_getter_closes_once_it_was_not_got_from_for_the_idle_time() -> None:
    used = {"src": 10.0, "dlq": 10.4}
    assert idle_getters(used, {"src", "dlq"}, set(), 10.0 + GETTER_IDLE, GETTER_IDLE) == ["src"]


def test_polling_one_queue_does_not_keep_another_queues_getter_open() -> None:
    """The user's case: the channel polls dlq every 50 ms; src's getter was last got from
    at 0 and closes, whatever dlq's getter does."""
    used = {"src": 0.0, "dlq": 0.0}
    closed: list[str] = []
    for tick in range(1, 21):
        now = tick * 0.05
        used["dlq"] = now
        closed += idle_getters(used, {"src", "dlq"} - set(closed), set(), now, GETTER_IDLE)
    assert closed == ["src"]


def test_a_getter_holding_an_unacked_get_or_dead_letter_stays_open() -> None:
    assert idle_getters({"src": 0.0}, {"src"}, {"src"}, 100.0, GETTER_IDLE) == []


def test_the_next_look_comes_when_the_oldest_idle_getter_is_due() -> None:
    used = {"a": 1.0, "b": 1.3}
    assert next_idle_look(used, {"a", "b"}, set(), 1.3) == pytest.approx(GETTER_IDLE - 0.3)
    assert next_idle_look(used, {"a", "b"}, {"a"}, 1.3) == pytest.approx(GETTER_IDLE)
    assert next_idle_look(used, {"a"}, {"a"}, 1.3) == GETTER_RECHECK
    assert next_idle_look(used, {"a"}, set(), 9.0) > 0


def test_concurrently_returns_results_in_order() -> None:
    async def value(v: int, delay: float) -> int:
        await trio.sleep(delay)
        return v

    async def scenario() -> list[int]:
        return await concurrently(lambda: value(1, 0.02), lambda: value(2, 0.0))

    assert trio.run(scenario) == [1, 2]


def test_concurrently_raises_the_first_calls_error_unwrapped() -> None:
    class NotFound(Exception):
        pass

    async def missing() -> int:
        await trio.sleep(0.01)
        raise NotFound("queue")

    async def broken() -> int:
        raise RuntimeError("the others do not matter")

    async def scenario() -> list[int]:
        return await concurrently(missing, broken)

    with pytest.raises(NotFound):
        trio.run(scenario)
