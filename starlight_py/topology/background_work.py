"""Work a reply need not wait for, done on a few daemon threads.

A deleted queue's Pulsar subscriptions (and binding topics) are removed after delete-ok:
the ZooKeeper transaction that deleted the queue also wrote a retired-subscription record
for each of them, so what is not removed here (the proxy stops, Pulsar refuses) is removed
by the SubscriptionCleaner. Waiting for Pulsar's deletes made every queue.delete take two
or three admin round trips longer than the metadata change that decides it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("starlight.topology")

DEFAULT_THREADS = 2


class BackgroundWork:
    """Runs submitted calls on `threads` daemon threads, in the order submitted (several
    at once). A call that raises is logged. What is still queued when the process ends is
    dropped: submit only work that something else finishes otherwise."""

    def __init__(self, name: str, threads: int = DEFAULT_THREADS) -> None:
        """Raises ValueError: fewer than one thread."""
        if threads < 1:
            raise ValueError("threads must be at least 1")
        self._calls: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{n}", daemon=True)
            for n in range(threads)
        ]
        self._started = False
        self._lock = threading.Lock()

    def submit(self, call: Callable[[], object]) -> None:
        """Queue `call`; the threads start with the first one. Raises nothing."""
        with self._lock:
            if not self._started:
                self._started = True
                for thread in self._threads:
                    thread.start()
        self._calls.put(call)

    def close(self) -> None:
        """Let the threads end once what is queued is done (they are daemons: the process
        does not wait for them). Raises nothing."""
        for _ in self._threads:
            self._calls.put(None)

    def _run(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                return
            try:
                call()
            except Exception:
                log.exception("background work failed")


def at_once(call: Callable[[], object]) -> None:
    """The synchronous stand-in for BackgroundWork.submit (command-line tools)."""
    call()
