"""The AMQP listeners' accept loops.

Like trio.serve_listeners, with one difference: the handler owns the stream it is given,
and closes it itself. A parked connection (parking.py) outlives the task that accepted
it, so its socket must not be closed when that task returns.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

log = logging.getLogger("starlight.server")

# accept() errors that mean "too busy right now" (out of descriptors or kernel memory):
# the loop waits a little and goes on; any other error ends it.
_BUSY = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
BUSY_PAUSE = 0.1

Handler = Callable[[Any], Awaitable[None]]


async def serve_clients(
    handler: Handler, listeners: Sequence[trio.abc.Listener[Any]], nursery: trio.Nursery
) -> None:
    """Accept on every listener until cancelled; `handler(stream)` runs in `nursery` for
    each connection and closes its stream."""
    async with trio.open_nursery() as loops:
        for listener in listeners:
            loops.start_soon(_accept_forever, listener, handler, nursery)


async def _accept_forever(
    listener: trio.abc.Listener[Any], handler: Handler, nursery: trio.Nursery
) -> None:
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as e:
                if e.errno not in _BUSY:
                    raise
                log.error(
                    "accept failed with %s (%s); trying again in %s s",
                    errno.errorcode.get(e.errno or 0, "?"),
                    os.strerror(e.errno or 0),
                    BUSY_PAUSE,
                )
                await trio.sleep(BUSY_PAUSE)
            else:
                nursery.start_soon(handler, stream)
