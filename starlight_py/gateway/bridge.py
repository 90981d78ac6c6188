"""The one way pulsar-client and kazoo threads reach trio.

Python callbacks on their threads put items into a `Batcher`, which hands them to a
function on the trio thread in batches: one wake-up (`TrioToken.run_sync_soon`) for
however many items arrived meanwhile, never one trio task per message.

The per-message hand-overs of pulsar-client's threads, flush outcomes
(native/src/pulsar_flush.rs) and messages of listened consumers
(native/src/pulsar_listen.rs, backend/listened.py), are queued by compiled code without
the GIL, which writes one eventfd when a queue gets a first entry. `take_from_pulsar_threads`,
a trio task, waits for that eventfd, takes both queues whole and runs their callbacks on
the trio thread: no Python thread state made on pulsar-client's thread, no GIL taken
there, no reader thread in between, and, while trio is busy, no wake-up at all (trio's
next poll finds the eventfd readable). What those callbacks put into Batchers is handed
over when the round ends (`handled_here`), without a wake-up either. Why, measured:
docs/architecture.md, "The bridge".

One such task per process: a second server in the same process leaves the queues to the
first one's task. Where none runs (a producer or consumer used outside the proxy, or after
it stopped), flush outcomes come through a callback with the GIL, into Batchers, and a
reader thread takes the messages.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import trio

from starlight_py.backend import producer_flush
from starlight_py.backend.listened import READER

T = TypeVar("T")

log = logging.getLogger("starlight.gateway")


class _Here(threading.local):
    # (the trio run's token, the Batchers to hand their items to) while `handled_here`
    # runs on this thread.
    batch: tuple[trio.lowlevel.TrioToken, list[Batcher[Any]]] | None = None


_here = _Here()


@contextlib.contextmanager
def handled_here(token: trio.lowlevel.TrioToken) -> Iterator[None]:
    """On the trio thread of `token`: what the block puts into this run's Batchers is
    handed to them when the block ends, without a wake-up of trio. A handler that fails
    is logged; the others still get their items."""
    batchers: list[Batcher[Any]] = []
    _here.batch = (token, batchers)
    try:
        yield
    finally:
        _here.batch = None
        for batcher in batchers:
            try:
                batcher._flush()
            except Exception:
                log.exception("handling items handed over from pulsar-client's threads")


class Batcher(Generic[T]):
    def __init__(self, token: trio.lowlevel.TrioToken, handle: Callable[[list[T]], None]) -> None:
        self._token = token
        self._handle = handle
        # A list, not a deque: an empty deque holds a block of 64 slots (about 600 bytes),
        # and a connection keeps several of these.
        self._items: list[T] = []
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
            items, self._items = self._items, []
            self._scheduled = False
        if items and not self.closed:
            self._handle(items)

    def close(self) -> list[T]:
        """Stop delivering; returns what was queued and not handled."""
        with self._lock:
            self.closed = True
            items, self._items = self._items, []
        return items


async def take_from_pulsar_threads() -> None:
    """Run until cancelled; returns at once when neither queue is compiled here, or
    another task of this process takes them already."""
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    token = trio.lowlevel.current_trio_token()
    flushes = messages = False
    try:
        flushes = producer_flush.attach_outcomes(fd)
        messages = READER.attach(fd)
        if not (flushes or messages):
            return
        while True:
            await trio.lowlevel.wait_readable(fd)
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(fd)
            with handled_here(token):
                if flushes:
                    producer_flush.dispatch(producer_flush.take_outcomes())
                if messages:
                    READER.take()
    finally:
        # Whatever was attached lets go of the eventfd before it is closed.
        with handled_here(token):
            if flushes:
                producer_flush.dispatch(producer_flush.detach_outcomes())
            if messages:
                READER.detach()
        trio.lowlevel.notify_closing(fd)
        os.close(fd)
