"""The trio task through which pulsar-client's threads hand over to trio: outcomes of
producer flushes (native/src/pulsar_flush.rs) and messages of listened consumers
(native/src/pulsar_listen.rs, backend/listened.py).

pulsar-client reports a flush, and hands over a received message, on threads of its own.
There the compiled code only queues it, without the GIL, and writes one eventfd when its
queue gets a first entry. This task waits for the eventfd, takes both queues whole and
runs their callbacks on the trio thread: no Python thread state made on pulsar-client's
thread, no GIL taken there, no reader thread in between, and, while trio is busy, no
wake-up at all (epoll finds the eventfd readable on trio's next pass). What the callbacks
hand to Batchers is handled when the round ends (bridge.handled_here).

One task per process: a second server in the same process leaves the queues to the first
one's task; once that task ended, flush outcomes come through callbacks on pulsar-client's
thread again, and a reader thread takes the messages.
"""

from __future__ import annotations

import contextlib
import os

import trio

from starlight_py.backend import producer_flush
from starlight_py.backend.listened import READER
from starlight_py.gateway.bridge import handled_here


async def take_from_pulsar_threads() -> None:
    """Run until cancelled; returns at once when neither queue is compiled here, or
    another task of this process takes them already."""
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    flushes = messages = False
    try:
        flushes = producer_flush.attach_outcomes(fd)
        messages = READER.attach(fd)
        if not (flushes or messages):
            return
        token = trio.lowlevel.current_trio_token()
        try:
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
            with handled_here(token):
                if flushes:
                    producer_flush.dispatch(producer_flush.detach_outcomes())
                if messages:
                    READER.detach()
    finally:
        trio.lowlevel.notify_closing(fd)
        os.close(fd)
