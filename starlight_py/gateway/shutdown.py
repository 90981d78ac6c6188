"""Graceful shutdown: what a proxy does between SIGTERM and its exit.

Theory of operation
-------------------
1. Stop accepting: the listeners close at once (a new client is refused and its load
   balancer picks another proxy) and `/readyz` answers 503 "shutting down".
2. Drain: clients get `shutdownDrainMillis` to leave on their own (a rolling upgrade that
   first tells applications to reconnect elsewhere loses nothing and forces nothing).
3. Settle confirms: the remaining connections stop reading (publishes already received are
   handed to Pulsar, later ones wait in the socket), the producers are flushed, and every
   ack/nack owed is sent. A publisher therefore knows the fate of everything it got a
   confirm for; what it sent after that point is unconfirmed and will be republished.
4. Close: `connection.close` 320 CONNECTION_FORCED, the reply text RabbitMQ uses when a
   node shuts down; close-ok is awaited briefly (the connection's own timer). Closing a
   connection closes its Pulsar consumers, so unacked deliveries go back to their shared
   subscriptions and reach consumers on other proxies.
5. `serve` returns; its `finally` closes the producers, the Pulsar client and the
   ZooKeeper session (ephemeral znodes of this proxy go at once, not after a timeout).

Another request (a second SIGTERM or SIGINT) skips what is left of the drain; a third
stops waiting for anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from starlight_py.amqp.errors import ConnectionForced
from starlight_py.gateway.connection.client_connection import CLOSE_OK_TIMEOUT, LINGER_AFTER_CLOSE
from starlight_py.units import MILLISECONDS, SECONDS

if TYPE_CHECKING:
    from starlight_py.gateway.connection.client_connection import ClientConnection
    from starlight_py.gateway.proxy_services import ProxyServices

log = logging.getLogger("starlight.shutdown")

SHUTDOWN_REASON = "broker forced connection closure with reason 'shutdown'"
# Bounds of the steps after the drain: Pulsar may be the reason for the restart.
SETTLE_TIMEOUT = 10 * SECONDS
# close-ok wait, the linger after it, and closing the connection's consumers.
CLOSE_TIMEOUT = CLOSE_OK_TIMEOUT + LINGER_AFTER_CLOSE + 5 * SECONDS
PROGRESS_INTERVAL = 5 * SECONDS
POLL_INTERVAL = 50 * MILLISECONDS


class ShutdownRequest:
    """Asks a running `serve` to stop; safe to call from signal-handling code on trio's
    thread. The first request shuts down gracefully, the second skips the rest of the
    drain, the third stops waiting for anything."""

    def __init__(self) -> None:
        self.requested = trio.Event()
        self.hurried = trio.Event()
        self.forced = trio.Event()
        self.count = 0

    def request(self) -> None:
        self.count += 1
        if self.count == 1:
            self.requested.set()
        elif self.count == 2:
            self.hurried.set()
        else:
            self.forced.set()


async def shut_down_when_requested(
    services: ProxyServices,
    request: ShutdownRequest,
    stop_accepting: Callable[[], None],
    stop_serving: Callable[[], None],
) -> None:
    """Wait for `request`, then run the steps of the module docstring and call
    `stop_serving` (which ends `serve`). Raises nothing of its own."""
    await request.requested.wait()
    async with trio.open_nursery() as nursery:

        async def on_force() -> None:
            await request.forced.wait()
            log.warning("shutdown forced: not waiting for client connections any longer")
            nursery.cancel_scope.cancel()

        nursery.start_soon(on_force)
        await shut_down(services, request, stop_accepting)
        nursery.cancel_scope.cancel()
    stop_serving()


async def shut_down(
    services: ProxyServices, request: ShutdownRequest, stop_accepting: Callable[[], None]
) -> None:
    """Steps 1 to 4; returns when no client connection is left or the bounds ran out."""
    services.shutting_down = True
    stop_accepting()
    drain = services.config.shutdown_drain
    if services.connections:
        log.info(
            "shutting down: listeners closed, %d client connection(s) open; they have %.1f s "
            "to close before they are closed with 320 CONNECTION_FORCED",
            len(services.connections),
            drain,
        )
    else:
        log.info("shutting down: listeners closed, no client connection open")
    if services.connections and drain > 0:
        left = await _wait_for_connections(services, drain, request.hurried)
        if left and request.hurried.is_set():
            log.info("drain cut short by a second signal: %d connection(s) remain", left)
    remaining = list(services.connections)
    if remaining:
        log.info("closing %d remaining client connection(s)", len(remaining))
        await _settle_confirms(services, remaining)
        error = ConnectionForced(SHUTDOWN_REASON)
        for connection in remaining:
            connection.force_close(error)
            connection.release_input()
        left = await _wait_for_connections(services, CLOSE_TIMEOUT, trio.Event())
        if left:
            log.warning("%d client connection(s) did not close in time; cutting them", left)
    log.info("all client connections are closed; stopping")


async def _wait_for_connections(services: ProxyServices, timeout: float, hurry: trio.Event) -> int:
    """Wait until no connection is left, `timeout` passes or `hurry` is set, logging how
    many remain now and then; returns how many are left."""
    deadline = trio.current_time() + timeout
    next_report = trio.current_time() + PROGRESS_INTERVAL
    while services.connections and not hurry.is_set():
        now = trio.current_time()
        if now >= deadline:
            break
        if now >= next_report:
            log.info(
                "waiting for %d client connection(s), %.0f s left",
                len(services.connections),
                deadline - now,
            )
            next_report = now + PROGRESS_INTERVAL
        await trio.sleep(POLL_INTERVAL)
    return len(services.connections)


async def _settle_confirms(services: ProxyServices, connections: list[ClientConnection]) -> None:
    """Step 3: stop reading, let publishes in progress reach Pulsar, flush, and wait until
    every confirm owed has been sent (bounded by SETTLE_TIMEOUT)."""
    for connection in connections:
        connection.hold_input()
    with trio.move_on_after(SETTLE_TIMEOUT) as settling:
        while any(c.handling_input for c in connections):
            await trio.sleep(POLL_INTERVAL)
        unconfirmed = sum(c.unconfirmed for c in connections)
        if unconfirmed:
            log.info("waiting for Pulsar to confirm %d publish(es)", unconfirmed)
        # abandon_on_cancel: a flush stuck on an unreachable Pulsar must not hold the exit.
        await trio.to_thread.run_sync(services.producers.flush_all, abandon_on_cancel=True)
        # Send results reach trio in batches after the flush: wait until all are answered.
        while any(c.unconfirmed for c in connections if not c.conn.closed):
            await trio.sleep(POLL_INTERVAL)
    if settling.cancelled_caught:
        log.warning(
            "%d publish(es) still unconfirmed after %.0f s; their publishers get no confirm",
            sum(c.unconfirmed for c in connections),
            SETTLE_TIMEOUT,
        )
