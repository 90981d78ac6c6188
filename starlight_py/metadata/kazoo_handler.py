"""kazoo's threading handler, waiting on its sockets with one poll(2) call.

kazoo's connection thread waits on its ZooKeeper socket (and its wake-up pipe) before every
read and write. Its handler makes a new epoll selector for each wait (epoll_create,
epoll_ctl, epoll_wait, close and their Python objects): with tens of ZooKeeper requests per
declared queue, those waits were most of kazoo's thread, itself the largest part of the
proxy's CPU while queues are declared. A poll object has no kernel side (one syscall per
wait) and, unlike select(2), takes descriptors above 1,024, which a proxy holding thousands
of client connections has.
"""

from __future__ import annotations

import math
import select
from collections.abc import Sequence
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import fileobj_to_fd

_READABLE = select.POLLIN | select.POLLPRI
# What poll(2) reports whatever was asked: the caller's next read or write meets the error.
_FAILED = select.POLLERR | select.POLLHUP
_WRITABLE = select.POLLOUT


def poll_select(
    rlist: Sequence[Any], wlist: Sequence[Any], xlist: Sequence[Any], timeout: float | None = None
) -> tuple[list[Any], list[Any], list[Any]]:
    """select(2)'s contract, as kazoo's `selector_select` keeps it: the objects of `rlist`
    and `wlist` that are ready within `timeout` seconds (None: wait without limit). A
    descriptor asked for both goes, with every object naming it, to the readable list when
    it can be read, else to the writable one (as kazoo's does). Raises ValueError for a
    negative timeout or a closed descriptor."""
    if timeout is not None:
        if not isinstance(timeout, (int, float)):
            raise TypeError("timeout must be a number")
        if timeout < 0:
            raise ValueError("timeout must be non-negative")
    wanted: dict[int, int] = {}
    objects: dict[int, list[Any]] = {}  # fd -> what was asked for it, readers first
    for fileobj in rlist:
        fd = fileobj_to_fd(fileobj)
        wanted[fd] = wanted.get(fd, 0) | _READABLE
        objects.setdefault(fd, []).append(fileobj)
    for fileobj in wlist:
        fd = fileobj_to_fd(fileobj)
        wanted[fd] = wanted.get(fd, 0) | _WRITABLE
        objects.setdefault(fd, []).append(fileobj)
    poller = select.poll()
    for fd, mask in wanted.items():
        poller.register(fd, mask)
    # poll(2) takes milliseconds; round up so that a short wait is not a busy loop.
    ready = poller.poll(None if timeout is None else math.ceil(timeout * 1000))
    readable: list[Any] = []
    writable: list[Any] = []
    for fd, events in ready:
        if events & select.POLLNVAL:
            raise ValueError("Invalid event mask or fd")
        if wanted[fd] & _READABLE and events & (_READABLE | _FAILED):
            readable.extend(objects[fd])
        elif wanted[fd] & _WRITABLE and events & (_WRITABLE | _FAILED):
            writable.extend(objects[fd])
    return readable, writable, []


class PollingThreadingHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's threading handler with `poll_select` for its waits."""

    def select(self, *args: Any, **kwargs: Any) -> tuple[list[Any], list[Any], list[Any]]:
        return poll_select(*args, **kwargs)
