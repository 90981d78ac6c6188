"""The one way pulsar-client and kazoo threads reach trio (DESIGN.md section 2).

A `Batcher` collects items put from any thread and hands them to a function on the trio
thread in batches: one wake-up (`TrioToken.run_sync_soon`) for however many items arrived
meanwhile, never one trio task per message.

Items put on the trio thread itself, by a task that runs callbacks in a batch of its own
(`handled_here`: gateway/pulsar_handover.py), skip the wake-up: each Batcher they reach is
handed its items once, when that batch ends.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import trio

T = TypeVar("T")


class _Here(threading.local):
    # (the trio run's token, the Batchers to hand their items to) while `handled_here`
    # runs on this thread.
    batch: tuple[trio.lowlevel.TrioToken, list[Batcher[Any]]] | None = None


_here = _Here()


@contextlib.contextmanager
def handled_here(token: trio.lowlevel.TrioToken) -> Iterator[None]:
    """On the trio thread of `token`: what the block puts into this run's Batchers is
    handed to them when the block ends, without a wake-up of trio."""
    batchers: list[Batcher[Any]] = []
    _here.batch = (token, batchers)
    try:
        yield
    finally:
        _here.batch = None
        for batcher in batchers:
            batcher._flush()


class Batcher(Generic[T]):
    def __init__(self, token: trio.lowlevel.TrioToken, handle: Callable[[list[T]], None]) -> None:
        self._token = token
        self._handle = handle
        self._items: deque[T] = deque()
        self._lock = threading.Lock()
        self._scheduled = False
        self.closed = False

    def put(self, item: T) -> None:
        """Any thread. Never blocks on trio."""
        with self._lock:
            if self.closed:
                return
            self._items.append(item)
            if self._scheduled:
                return
            self._scheduled = True
        batch = _here.batch
        if batch is not None and batch[0] is self._token:
            batch[1].append(self)  # handed over when handled_here's block ends
            return
        # RunFinishedError: the proxy is shutting down; nothing will read these items.
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._flush)

    def _flush(self) -> None:
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._scheduled = False
        if items and not self.closed:
            self._handle(items)

    def close(self) -> list[T]:
        """Stop delivering; returns what was queued and not handled."""
        with self._lock:
            self.closed = True
            items = list(self._items)
            self._items.clear()
        return items
