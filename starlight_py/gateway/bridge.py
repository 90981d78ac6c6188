"""The one way pulsar-client and kazoo threads reach trio (DESIGN.md section 2).

A `Batcher` collects items put from any thread and hands them to a function on the trio
thread in batches: one wake-up (`TrioToken.run_sync_soon`) for however many items arrived
meanwhile, never one trio task per message.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

import trio

T = TypeVar("T")


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
