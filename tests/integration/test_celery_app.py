"""A Celery application through the broker, as Celery users run it: a worker (pyamqp
transport) in its own process, tasks and their results (rpc:// backend), retries with a
countdown, `celery inspect ping` (the pidbox fanout and reply exchanges) and task events
(the celeryev topic exchange)."""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.integration.conftest import Broker
from tests.support import amqp_fixtures, celery_app

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def celery_env(broker: Broker) -> Iterator[dict[str, str]]:
    queue = amqp_fixtures.unique("q", "celery")
    env = {
        **os.environ,
        "STARLIGHT_CELERY_BROKER": broker.url().replace("amqp://", "pyamqp://"),
        "STARLIGHT_CELERY_QUEUE": queue,
    }
    old = {k: os.environ.get(k) for k in ("STARLIGHT_CELERY_BROKER", "STARLIGHT_CELERY_QUEUE")}
    os.environ.update({k: env[k] for k in old})
    yield env
    for key, value in old.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def worker(celery_env: dict[str, str], tmp_path: Path) -> Iterator[Path]:
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.support.celery_app",
                "worker",
                "--pool=solo",
                "--without-heartbeat",
                "--without-mingle",
                "--without-gossip",
                "-n",
                f"w1-{celery_env['STARLIGHT_CELERY_QUEUE']}@%h",
                "-l",
                "INFO",
            ],
            env=celery_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).parents[2],
        )
    try:
        deadline = time.monotonic() + 90
        while b"ready." not in log.read_bytes():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield log
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def fresh_app() -> ModuleType:
    """The application module, loaded again now that the environment names the broker."""
    return importlib.reload(celery_app)


def test_tasks_run_and_return_results(worker: Path) -> None:
    module = fresh_app()
    results = [module.add.delay(i, i * 10) for i in range(20)]
    assert [r.get(timeout=60) for r in results] == [i * 11 for i in range(20)]


def test_retry_with_countdown_runs_again_later(worker: Path, tmp_path: Path) -> None:
    module = fresh_app()
    marker = tmp_path / "runs"
    started = time.monotonic()
    result = module.succeed_on_attempt.delay(3, str(marker))
    assert result.get(timeout=90) == 3
    assert marker.read_text() == "3"
    # Two retries with countdown=1: the worker waited for each before running again.
    assert time.monotonic() - started >= 2


def test_inspect_ping_reaches_the_worker(worker: Path, celery_env: dict[str, str]) -> None:
    answer = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.support.celery_app", "inspect", "ping"],
        env=celery_env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
        check=False,
    )
    assert "pong" in answer.stdout, answer.stdout + answer.stderr
    assert celery_env["STARLIGHT_CELERY_QUEUE"] in answer.stdout


def test_task_events_reach_an_event_receiver(worker: Path) -> None:
    module = fresh_app()
    app = module.app
    seen: list[str] = []
    ready = threading.Event()

    def on_event(event: dict[str, object]) -> None:
        seen.append(str(event.get("type")))

    def receive() -> None:
        with app.connection_for_read() as connection:
            receiver = app.events.Receiver(connection, handlers={"*": on_event})
            ready.set()
            with contextlib.suppress(Exception):  # the socket timeout ends the capture
                receiver.capture(limit=None, timeout=30, wakeup=True)

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    assert ready.wait(30)
    time.sleep(1)  # the receiver's queue is bound before the task is sent
    deadline = time.monotonic() + 60
    result = module.add.delay(1, 2)
    assert result.get(timeout=60) == 3
    while "task-succeeded" not in seen and time.monotonic() < deadline:
        time.sleep(0.2)
    assert {"task-sent", "task-received", "task-started", "task-succeeded"} <= set(seen), seen
