"""A small Celery application for tests/integration/test_celery_app.py: its worker runs in a
subprocess against the broker named by STARLIGHT_CELERY_BROKER (pyamqp transport, rpc://
results), as a Celery user's application would."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from celery import Celery

app = Celery(
    "starlight_celery_test",
    broker=os.environ.get("STARLIGHT_CELERY_BROKER", "pyamqp://guest:guest@127.0.0.1//"),
    backend="rpc://",
)
app.conf.update(
    task_default_queue=os.environ.get("STARLIGHT_CELERY_QUEUE", "celery"),
    broker_connection_retry_on_startup=True,
    worker_send_task_events=True,
    task_send_sent_event=True,
    result_expires=300,
)


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task(bind=True, max_retries=5)
def succeed_on_attempt(self: Any, attempt: int, marker: str) -> int:
    """Fails (and retries with a countdown) until its `attempt`-th run; the runs are counted
    in the `marker` file so the test can check how many there were."""
    path = Path(marker)
    runs = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(runs))
    if runs < attempt:
        raise self.retry(countdown=1)
    return runs
