"""BackgroundWork: calls run off the caller's thread, all of them, a failing one logged
without stopping the rest (topology/background_work.py)."""

from __future__ import annotations

import logging
import threading

import pytest

from starlight_py.topology.background_work import BackgroundWork, at_once


def test_every_call_runs_off_the_callers_thread() -> None:
    work = BackgroundWork("test", threads=3)
    done = threading.Semaphore(0)
    threads: list[str] = []
    lock = threading.Lock()

    def call() -> None:
        with lock:
            threads.append(threading.current_thread().name)
        done.release()

    for _ in range(50):
        work.submit(call)
    for _ in range(50):
        assert done.acquire(timeout=10)
    work.close()
    assert len(threads) == 50
    assert threading.current_thread().name not in threads
    assert all(name.startswith("test-") for name in threads)


def test_a_failing_call_is_logged_and_the_next_still_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    work = BackgroundWork("failing", threads=1)
    ran = threading.Event()

    def fail() -> None:
        raise RuntimeError("pulsar said no")

    with caplog.at_level(logging.ERROR, logger="starlight.topology"):
        work.submit(fail)
        work.submit(ran.set)
        assert ran.wait(10)
    work.close()
    assert "background work failed" in caplog.text
    assert "pulsar said no" in caplog.text


def test_no_threads_until_the_first_call() -> None:
    before = threading.active_count()
    work = BackgroundWork("lazy", threads=2)
    assert threading.active_count() == before
    work.close()


def test_at_least_one_thread() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        BackgroundWork("none", threads=0)


def test_at_once_runs_in_the_callers_thread() -> None:
    seen: list[str] = []
    at_once(lambda: seen.append(threading.current_thread().name))
    assert seen == [threading.current_thread().name]
