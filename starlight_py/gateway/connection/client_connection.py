"""The I/O shell around one `AMQPConnection`: a socket, its tasks, and the dispatch of events.

Tasks (one nursery per connection):
- reader (the connection's own task): the socket's bytes (read directly on plain TCP, see
  `_receive`) -> `receive_data` -> handle each event in order;
- writer: on plain TCP output is written straight to the socket when it takes it all
  (`_kick`); the writer task is started for what it does not take, and ends when that is
  written. On TLS it runs for the connection's life, the only task that sends;
- timers (one task of the process for every connection, connection_timers.py): handshake
  deadline, heartbeats both ways (two missed intervals disconnects), the bounded wait for
  close-ok after we closed the connection, and the expiry of the login token (320, unless
  connection.update-secret renewed it).

A quiet plain TCP connection with no channel parks (parking.py): its reader ends too, and
the process's parking lot resumes it in a new task when it has more to do.

Every exception from handling an event ends in `AMQPConnection.fail`, the one place that
picks channel.close or connection.close.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import trio
from pamqp import commands
from pamqp.base import Frame as PamqpMethod

from starlight_py.amqp import events as ev
from starlight_py.amqp.connection import AMQPConnection, ConnectionState
from starlight_py.amqp.errors import (
    AMQPError,
    ConnectionAccessRefused,
    ConnectionForced,
    InternalError,
    NotAllowed,
    NotImplementedMethod,
)
from starlight_py.amqp.framing import method_ids
from starlight_py.amqp.method_ids import CONNECTION_OPEN, CONNECTION_START_OK
from starlight_py.amqp.transactions import TransactionLimit
from starlight_py.auth.authenticator import AuthenticationFailed, Principal
from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdminError
from starlight_py.core.channel import MAX_OUTPUT_BACKLOG, Channel, Tally, TransactionBudget
from starlight_py.gateway.channel_session import ChannelSession
from starlight_py.gateway.connection.authorization import AccessControl
from starlight_py.gateway.connection.connection_services import ConnectionServices
from starlight_py.gateway.connection.quiet_sockets import (
    drain_heartbeats,
    only_heartbeats,
    set_low_water,
)
from starlight_py.gateway.consume.consuming import Consumers
from starlight_py.gateway.dead_lettering import DeadLetters
from starlight_py.gateway.errors import as_amqp_error
from starlight_py.gateway.message_flow import MessageFlow
from starlight_py.gateway.publish.publishing import Publisher
from starlight_py.gateway.publish.queue_lengths import ConnectionLengthChecks
from starlight_py.gateway.topology_methods import VhostContext
from starlight_py.metadata.zookeeper import MetadataUnavailable
from starlight_py.model.addresses import host_port
from starlight_py.structured_logging import current_connection
from starlight_py.units import SECONDS

# s: an open connection's timer is due on whole multiples of it, or of a twentieth of its
# heartbeat when that is shorter (on_timer)
OPEN_GRANULARITY = 1.0
# s: the longest an open connection's timer task sleeps; it is woken sooner when a deadline
# it keeps comes (the connection starts closing, a credential with an expiry)
OPEN_TICK_LIMIT = 60.0

log = logging.getLogger("starlight.connection")

CLOSE_OK_TIMEOUT = 3 * SECONDS
# The longest a closing connection waits for its exclusive queues to go before it sends
# connection.close (below CLOSE_OK_TIMEOUT, which starts with the close).
EXCLUSIVE_RELEASE_WAIT = 2 * SECONDS
LINGER_AFTER_CLOSE = 1 * SECONDS
RECEIVE_SIZE = 64 * 1024
# Output waiting while the client does not read what we already sent: past this, we stop
# reading its input too (a client publishing with confirms but never reading would
# otherwise grow our buffers without end).
MAX_PENDING_OUTPUT = 4 * 1024 * 1024
_ids = itertools.count(1)


class ClientConnection:
    """One accepted client. `run()` returns when the connection is over."""

    # Slots: over 30 attributes, an instance's dict would not share its keys with the
    # others' and cost about 1.6 KB a connection.
    __slots__ = (
        "_backlog",
        "_beats_kept",
        "_bindings_changed",
        "_budget",
        "_changed_queues",
        "_close_deadline",
        "_credential_deadline",
        "_direct_fd",
        "_following",
        "_handling_input",
        "_handshake_deadline",
        "_input_gate",
        "_last_active",
        "_last_received",
        "_last_sent",
        "_log",
        "_low_water",
        "_nursery",
        "_output_hold",
        "_output_taken",
        "_parked",
        "_tally",
        "_timed",
        "_unread",
        "_waiting",
        "_wakeup",
        "_writer_busy",
        "_writer_running",
        "channels",
        "conn",
        "connected_at",
        "id",
        "local",
        "messages",
        "on_end",
        "peer",
        "peer_certificate",
        "principal",
        "refusal",
        "services",
        "stream",
        "tls",
        "vhost",
    )

    def __init__(
        self,
        stream: trio.abc.Stream,
        services: ConnectionServices,
        peer: str,
        *,
        tls: bool = False,
        peer_certificate: bytes | None = None,
        refusal: str | None = None,
    ) -> None:
        """`refusal`: why connection.open is to be refused (a connection limit)."""
        self.stream = stream
        self.refusal = refusal
        self.services = services
        self.peer = peer
        self.local = ""  # this proxy's address of the connection (set by the server)
        self.tls = tls
        self.connected_at = time.time()
        self.id = f"conn-{next(_ids)}"
        # The mechanisms offered depend on the transport (EXTERNAL only over TLS).
        settings = dataclasses.replace(
            services.server_settings, mechanisms=services.authenticator.mechanisms(tls)
        )
        self.conn = AMQPConnection(settings)
        self.peer_certificate = peer_certificate
        self.principal: Principal | None = None
        # trio clock time at which the principal's credential expires (see on_timer).
        self._credential_deadline: float | None = None
        self.channels: dict[int, ChannelSession] = {}
        self.vhost: VhostContext | None = None
        self.messages: MessageFlow | None = None
        self._tally = Tally()
        self._budget = TransactionBudget(
            TransactionLimit.for_message_size(services.server_settings.max_message_size)
        )
        self._nursery: trio.Nursery | None = None
        # Events are made when a task is to wait on them (an idle connection keeps none).
        self._bindings_changed: trio.Event | None = None
        self._following = False  # whether `_follow_bindings` runs
        # The queues of this vhost changed since consumers last followed (None: any).
        self._changed_queues: set[str] | None = set()
        self._wakeup: trio.Event | None = None  # what the writer waits on
        self._output_taken: trio.Event | None = None  # what a reader held by output waits on
        # Plain TCP: output is written to the socket's file descriptor directly when the
        # writer task has nothing pending (see _kick); -1 for TLS and other streams.
        self._direct_fd = stream.socket.fileno() if type(stream) is trio.SocketStream else -1
        self._writer_busy = False
        self._writer_running = False  # whether the writer task runs (`_wake_writer`)
        # Set while a closing connection's exclusive queues are deleted: nothing is written.
        self._output_hold: trio.Event | None = None
        self._backlog = b""  # taken from the connection, not written yet (the writer's)
        self._last_received = trio.current_time()
        self._last_sent = trio.current_time()
        # The last frame received other than a heartbeat: `quiet.quiet_after` later, a
        # plain TCP connection's socket wakes it only for more than a heartbeat
        # (`_low_water`, quiet_sockets.py).
        self._last_active = trio.current_time()
        self._low_water = False
        self._unread = b""  # read by a drain after heartbeats: the reader's next input
        # While the reader waits for the socket on plain TCP: its cancellation asks the
        # reader to park (`_ask_to_park`).
        self._waiting: trio.CancelScope | None = None
        self._parked = False  # no task: the parking lot watches the socket (parking.py)
        # While parked: the lot keeps its heartbeats (a row of parked_beats.py), not the
        # process's timers.
        self._beats_kept = False
        # Called once when the connection is over (the server's bookkeeping).
        self.on_end: Callable[[], None] | None = None
        self._handshake_deadline = trio.current_time() + services.config.handshake_timeout
        self._close_deadline: float | None = None
        self._timed = False  # while the process's timers keep its deadlines (`on_timer`)
        # Set while a graceful shutdown settles confirms: input waits in the socket.
        self._input_gate: trio.Event | None = None
        self._handling_input = False
        self._log = logging.LoggerAdapter(log, {"conn": self.id})

    async def run(self) -> bool:
        """Serve the connection until it is over (False), or until it parks (True): it
        keeps no task then, and the parking lot resumes it in a new one (`resume`)."""
        # Tasks started from here inherit it: their records name this connection.
        current_connection.set(self.id)
        timers = self.services.timers
        if not self._timed:
            self._log.debug("%s accepted from %s", self.id, self.peer)
            self._timed = True
            now = trio.current_time()
            timers.schedule(self, now + self._next_tick(now, 0))
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self._direct_fd < 0:
                    self._writer_running = True
                    nursery.start_soon(self._write_loop, nursery.cancel_scope)
                elif self.conn.closed or self._writer_busy:
                    self._wake_writer()  # what woke a parked connection
                await self._read_loop(nursery.cancel_scope)
        finally:
            self._nursery = None  # closed: nothing more starts in it
            if not self._parked:
                await self._end()
        return self._parked

    async def resume(self) -> None:
        """A parked connection goes on, in the parking lot's task (parking.py)."""
        self._parked = False
        if self._beats_kept:  # resumed by the lot itself: its row is gone
            self._beats_back(None)
        try:
            await self.run()
        except Exception:
            self._log.exception("%s failed", self.id)

    def needs_task(self) -> bool:
        """Its parked socket became readable (parking.py): heartbeats are read here."""
        return self._drain_heartbeats(trio.current_time())

    def close_parked(self) -> None:
        """The proxy stops while this connection is parked: its socket closes now, and
        it is over."""
        self._parked = False
        self._beats_kept = False
        self._timed = False
        self.services.timers.cancel(self)
        self.conn.abort()
        try:
            cast(trio.SocketStream, self.stream).socket.close()  # parked: plain TCP
        finally:
            self._ended()

    async def _end(self) -> None:
        self._timed = False
        self.services.timers.cancel(self)
        try:
            await self._hang_up()
            await self._release()
        finally:
            self._ended()

    def _ended(self) -> None:
        if self._low_water:  # it ended quiet (closed by the proxy while parked, say)
            self._low_water = False
            if self.services.quiet is not None:
                self.services.quiet.quiet -= 1
        # Connections that never opened a vhost (load balancer health checks, port
        # scans) are logged at DEBUG: twice a second per proxy behind HAProxy.
        level = logging.INFO if self.vhost is not None else logging.DEBUG
        self._log.log(level, "%s from %s closed", self.id, self.peer)
        on_end, self.on_end = self.on_end, None
        if on_end is not None:
            on_end()

    async def _release(self) -> None:
        """What dies with the connection: its consumers (the broker requeues what they
        held), its producers' pending confirms, its exclusive queues."""
        with trio.CancelScope(shield=True), trio.move_on_after(30):
            self.services.change_listeners.discard(self._on_topology_change)
            if self.messages is not None:
                messages, self.messages = self.messages, None
                try:
                    await messages.close(list(self.channels.values()))
                    self.channels.clear()
                except Exception:
                    self._log.exception("%s: could not close its consumers", self.id)
            if self.vhost is None or not self.vhost.exclusive_queues:
                return
            try:
                await self.services.topology_methods.release_connection(self.vhost)
            except Exception:
                self._log.exception("%s: could not delete its exclusive queues", self.id)

    def _on_topology_change(self, touched: frozenset[tuple[str, str]] | None) -> None:
        """Queues changed (None: any may have): those of this vhost that this connection
        consumes from are followed. The work per change does not grow with the number of
        queues elsewhere."""
        if self.vhost is None or self.messages is None or not self.messages.consumers.links:
            return  # no consumer to follow them: those that start read the cache
        if touched is None:
            self._changed_queues = None
        elif self._changed_queues is not None:
            vhost = self.vhost.vhost
            mine = {queue for each, queue in touched if each == vhost}
            if not mine:
                return
            self._changed_queues |= mine
        self._changes_to_follow()
        if not self._following and self._nursery is not None:
            # Started by the first change that concerns a consumer: an idle connection
            # keeps no task for it. (Called from the process's change notice: it must
            # not raise, even for a nursery that is closing.)
            self._following = True
            try:
                self._nursery.start_soon(self._follow_bindings)
            except RuntimeError:
                self._following = False

    def _changes_to_follow(self) -> None:
        if self._bindings_changed is None:
            self._bindings_changed = trio.Event()
        self._bindings_changed.set()

    async def _follow_bindings(self) -> None:
        """Consumers follow bindings added (and queues deleted) after they started."""
        while True:
            if self._bindings_changed is None:
                self._bindings_changed = trio.Event()
            await self._bindings_changed.wait()
            self._bindings_changed = None
            changed, self._changed_queues = self._changed_queues, set()
            if self.messages is not None:
                try:
                    await self.messages.consumers.follow_bindings(changed)
                except Exception as e:
                    self._log.warning("%s: following binding changes failed: %s", self.id, e)
                    await trio.sleep(1)
                    self._changed_queues = None
                    self._changes_to_follow()

    # ---- reading ----------------------------------------------------------------------------

    async def _read_loop(self, scope: trio.CancelScope) -> None:
        while not self.conn.closed:
            data = await self._receive()
            if data is None:
                return  # parked
            if not data:
                self._log.debug("%s: peer closed the socket", self.id)
                self.conn.abort()
                scope.cancel()
                return
            self._last_received = trio.current_time()
            if not only_heartbeats(data):
                self._last_active = self._last_received
            while self.conn.pending_output > MAX_PENDING_OUTPUT and not self.conn.closed:
                self._output_taken = trio.Event()
                await self._output_taken.wait()
            while self._input_gate is not None:
                await self._input_gate.wait()
            self._handling_input = True
            events = self.conn.receive_data(data)
            if events:
                self.services.report_changes += 1  # what the connection report shows may change
            while events:
                for event in events:
                    if not self._handle_now(event):
                        await self._handle(event)
                # Frames pipelined behind a login or connection.open, now that it is answered.
                events = self.conn.resume()
            if self.messages is not None:
                self.messages.end_of_batch()
            self._handling_input = False
            self._kick()

    async def _receive(self) -> bytes | bytearray | None:
        """The next bytes the client sent; b"" when it closed the socket or it broke; None
        when the connection parked instead (`_ask_to_park`). On
        plain TCP the socket is read directly once it is readable: trio's receive_some
        reads first and waits after, so every read that finds the client idle makes a
        failed recv and raises BlockingIOError, and every read that finds bytes yields to
        the run loop once more. At a few hundred messages a second each message comes
        alone and pays both (docs/history/performance-log.md, "Wake-ups at a low rate")."""
        fd = self._direct_fd
        if fd < 0:
            try:
                return await self.stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return b""
        while True:
            if self._unread:
                data, self._unread = self._unread, b""
                return data
            quiet = self.services.quiet
            if (
                quiet is not None
                and not self._low_water
                and self.conn.is_open
                and not self.conn.mid_frame
                and trio.current_time() - self._last_active >= quiet.quiet_after
            ):
                # Nothing but heartbeats for a while: only more than a heartbeat wakes
                # this wait (the timers drain the heartbeats: on_timer).
                self._set_low_water(True)
            with trio.CancelScope() as waiting:
                self._waiting = waiting
                try:
                    await trio.lowlevel.wait_readable(fd)
                except trio.ClosedResourceError:
                    return b""
                finally:
                    self._waiting = None
            if waiting.cancelled_caught and self._park():
                return None  # the socket keeps its raised mark
            if self._low_water:
                self._set_low_water(False)  # read everything there, as usual
            if waiting.cancelled_caught:
                continue  # it could not park after all
            try:
                return os.read(fd, RECEIVE_SIZE)
            except BlockingIOError:
                continue  # woken with nothing to read (the readiness was stale)
            except OSError:
                return b""  # reset by the peer: the same end as a close

    def _set_low_water(self, quiet: bool) -> None:
        counts = self.services.quiet
        if set_low_water(self._direct_fd, quiet) or not quiet:
            self._low_water = quiet
            if counts is not None:
                counts.quiet += 1 if quiet else -1

    # ---- parking (parking.py) -----------------------------------------------------------------

    def _parkable(self, now: float) -> bool:
        """Quiet, plain TCP, open, with no channel and nothing in progress: nothing it
        keeps needs a task until the client sends more than a heartbeat."""
        quiet = self.services.quiet
        nursery = self._nursery
        return (
            quiet is not None
            and self._direct_fd >= 0
            and self.conn.is_open
            and not self.channels
            and self.messages is None
            and (self.vhost is None or not self.vhost.exclusive_queues)
            and nursery is not None
            and not nursery.child_tasks
            and not self._writer_running
            and not self._writer_busy
            and not self.conn.pending_output
            and self._output_hold is None
            and self._input_gate is None
            and not self._handling_input
            and not self._unread
            and not self.conn.mid_frame
            and now - self._last_active >= quiet.park_after
        )

    def _ask_to_park(self, now: float) -> None:
        """From the timers: a quiet connection's reader stops waiting, to park."""
        if self._waiting is not None and self._parkable(now):
            self._waiting.cancel()

    def _park(self) -> bool:
        """The reader parks the connection, if it still may; True when it did."""
        quiet = self.services.quiet
        if quiet is None or not self._parkable(trio.current_time()):
            return False
        if not self._low_water:
            self._set_low_water(True)
        if not self._low_water or not quiet.parking.park(self._direct_fd, self):
            return False
        self._parked = True
        heartbeat = self.conn.heartbeat
        if heartbeat and self._credential_deadline is None:
            # The lot keeps its heartbeats from now on (one row of parked_beats.py): it
            # leaves the process's timers until it takes them back (`_beats_back`).
            kept = quiet.parking.keep_beats(
                self._direct_fd, float(heartbeat), self._last_sent, self._last_received
            )
            if kept:
                self._beats_kept = True
                self.services.timers.cancel(self)
        return True

    def parked_input(self, data: bytes) -> None:
        """Its row in the lot read more than heartbeats (b"": the socket ended)."""
        self._unread += data  # an end is the reader's to find (the socket reads as one)
        self._unpark()

    def parked_output(self, data: bytes) -> None:
        """The socket took only part of a heartbeat the lot wrote: the writer sends the
        rest."""
        self._backlog = data
        self._writer_busy = True
        self._wake_writer()

    def parked_silence(self) -> None:
        """Nothing heard for two intervals: its timer (due at once) closes it."""
        self._unpark()

    def _beats_back(self, times: tuple[float, float] | None) -> None:
        """The lot no longer keeps its heartbeats: the process's timers take them back,
        from when the lot last sent and heard one (`times`)."""
        if not self._beats_kept:
            return
        self._beats_kept = False
        if times is not None:
            self._last_sent, self._last_received = times
        if self._timed:
            self.services.timers.schedule(self, trio.current_time())

    def _drain_heartbeats(self, now: float) -> bool:
        """The heartbeats a quiet connection's socket holds (they do not wake the reader)
        are read here, and count as heard. True when more than heartbeats came (kept for
        the reader, `_unread`) or the socket ended: the reader is to look."""
        beats, rest = drain_heartbeats(self._direct_fd)
        if beats:
            self._last_received = now
            if self.services.quiet is not None:
                self.services.quiet.drained(beats)
        if rest is None:
            return False
        self._unread += rest
        return True

    def _wake_reader(self) -> None:
        """A drain read more than heartbeats: the reader takes it (resumed if parked)."""
        if self._parked:
            self._unpark()
        elif self._waiting is not None:
            self._waiting.cancel()

    def _unpark(self) -> None:
        """A parked connection gets a task again (the parking lot starts its `resume`)."""
        self._parked = False
        if self.services.quiet is not None:
            self._beats_back(self.services.quiet.parking.resume(self._direct_fd))

    async def _handle(self, event: ev.Event) -> None:
        channel = getattr(event, "channel", 0)
        if (
            isinstance(event, ev.MethodReceived | ev.ContentReceived)
            and channel
            and self.conn.discards_input_of(channel)
        ):
            # Read in the same chunk as a method that failed and closed its channel (or the
            # connection): ignored, as the spec says; a tx.commit sent right after a failed
            # ack must not commit.
            return
        try:
            await self._dispatch(event)
        except Exception as e:
            self._failed(event, channel, e)

    def _handle_now(self, event: ev.Event) -> bool:
        """The per-message events (a publish, an ack) handled without awaiting anything
        when everything they need is at hand; False: `_handle` must do it."""
        kind = type(event)
        if kind is ev.ContentReceived:
            content = cast(ev.ContentReceived, event)
            messages = self.messages
            session = self.channels.get(content.channel)
            if messages is None or session is None:
                return False
            core = session.core
            if core.in_transaction or self.conn.discards_input_of(content.channel):
                return False
            try:
                return messages.publisher.publish_now(
                    core, content.method, content.properties, content.body, content.raw_properties
                )
            except Exception as e:
                self._failed(event, content.channel, e)
                return True
        if kind is not ev.MethodReceived:
            return False
        method = cast(ev.MethodReceived, event)
        messages = self.messages
        session = self.channels.get(method.channel)
        if messages is None or session is None or self.conn.discards_input_of(method.channel):
            return False
        try:
            return messages.settle_now(session, method.method)
        except Exception as e:
            self._failed(event, method.channel, e)
            return True

    def _failed(self, event: ev.Event, channel: int, e: Exception) -> None:
        """Handling `event` raised `e`: the one translation into a close (gateway/errors.py),
        through `AMQPConnection.fail`."""
        error = as_amqp_error(e)
        if isinstance(e, MetadataUnavailable):
            self.services.metrics.backend_error("zookeeper")
        elif isinstance(e, BackendUnavailable | PulsarAdminError):
            self.services.metrics.backend_error("pulsar")
        if error is None:
            # Our bug, not the client's: 541, with the details in our log only.
            self._log.exception("%s: internal error handling %s", self.id, type(event).__name__)
            error = InternalError(f"internal error ({type(e).__name__})")
        self._on_error(channel, error)
        self.conn.fail(error, channel)

    async def _dispatch(self, event: ev.Event) -> None:
        result = self._event_handlers[type(event)](self, event)
        if result is not None:
            await result

    async def _on_login(self, event: ev.LoginRequested) -> None:
        await self._login(event)

    async def _on_open(self, event: ev.OpenRequested) -> None:
        if self.refusal is not None:
            raise NotAllowed(self.refusal, CONNECTION_OPEN)
        user = self.principal.name if self.principal else ""
        access = AccessControl(self.services.permissions, event.virtual_host, user)
        # Before open_vhost: a user without access must not create vhosts or namespaces.
        try:
            await access.check_vhost()
        except NotAllowed:
            # RabbitMQ says a missing vhost is missing before it looks at the user's access.
            await self.services.refuse_missing_vhost(event.virtual_host)
            raise
        namespace = await self.services.open_vhost(event.virtual_host)
        self.vhost = VhostContext(
            event.virtual_host,
            namespace,
            f"{self.services.proxy_id}/{self.id}",
            user=user,
            access=access,
        )
        self.services.change_listeners.add(self._on_topology_change)
        self.conn.accept_open()
        self._log.info(
            "%s: %s opened vhost %r (Pulsar namespace %s)",
            self.id,
            self.principal.name if self.principal else "?",
            event.virtual_host,
            namespace,
        )

    def _on_channel_opened(self, event: ev.ChannelOpened) -> None:
        if self.messages is None:
            # Made with the first channel: a connection that opens none (a health check, an
            # idle pool's spare) keeps no publisher, consumers or dead-letter side.
            assert self.vhost is not None
            self.messages = self._message_flow(self.vhost)
        core = Channel(
            event.channel,
            self.conn,
            self.messages.consumers.vet,
            frame_max=self.conn.frame_max,
            clock=time.monotonic,
            tally=self._tally,
            budget=self._budget,
            held=self.services.held.of(self.vhost.vhost)
            if self.services.held is not None and self.vhost is not None
            else None,
        )
        self.channels[event.channel] = ChannelSession(event.channel, core)

    async def _on_method(self, event: ev.MethodReceived) -> None:
        await self._method(event)

    async def _on_content(self, event: ev.ContentReceived) -> None:
        session = self.channels.get(event.channel)
        if session is not None and self.messages is not None:
            await self.messages.publish(session, event)

    async def _on_channel_close_requested(self, event: ev.ChannelCloseRequested) -> None:
        session = self.channels.pop(event.channel, None)
        if session is not None and self.messages is not None:
            await self.messages.channel_closed(session)
        self.conn.finish_channel_close(event.channel)

    async def _on_channel_closed(self, event: ev.ChannelClosed) -> None:
        session = self.channels.pop(event.channel, None)
        if session is not None and self.messages is not None:
            await self.messages.channel_closed(session)

    async def _on_connection_close_requested(self, event: ev.ConnectionCloseRequested) -> None:
        # As RabbitMQ: what dies with the connection is gone before close-ok.
        await self._release()
        self.channels.clear()
        self.conn.finish_connection_close()

    def _on_error_raised(self, event: ev.ErrorRaised) -> None:
        self._on_error(event.channel, event.error)

    _event_handlers: dict[type, Callable[[ClientConnection, Any], Awaitable[None] | None]] = {
        ev.LoginRequested: _on_login,
        ev.OpenRequested: _on_open,
        ev.ChannelOpened: _on_channel_opened,
        ev.MethodReceived: _on_method,
        ev.ContentReceived: _on_content,
        ev.ChannelCloseRequested: _on_channel_close_requested,
        ev.ChannelClosed: _on_channel_closed,
        ev.ConnectionCloseRequested: _on_connection_close_requested,
        ev.ErrorRaised: _on_error_raised,
    }

    async def _login(self, event: ev.LoginRequested) -> None:
        try:
            # In a worker thread: a password login may ask ZooKeeper for the user.
            self.principal = await trio.to_thread.run_sync(
                self.services.authenticator.authenticate,
                event.mechanism,
                event.response,
                self.peer_certificate,
                host_port(self.peer)[0],
            )
        except AuthenticationFailed as e:
            self._log.warning("%s: login refused from %s: %s", self.id, self.peer, e)
            raise ConnectionAccessRefused(
                f"Login was refused using authentication mechanism {event.mechanism}. "
                "For details see the broker logfile.",
                CONNECTION_START_OK,
            ) from e
        self._set_credential_deadline(self.principal)
        self.conn.accept_login()

    def _set_credential_deadline(self, principal: Principal) -> None:
        if principal.expires_at is None:
            self._credential_deadline = None
        else:
            # exp is wall-clock time; timers run on trio's monotonic clock.
            remaining = principal.expires_at - time.time()
            self._credential_deadline = trio.current_time() + max(0.0, remaining)
        self._wake_timers()

    def _wake_timers(self) -> None:
        """Have `on_timer` look at its deadlines now (one of them was set or came nearer)."""
        if self._timed:
            self.services.timers.schedule(self, trio.current_time())

    async def _update_secret(self, method: commands.Connection.UpdateSecret) -> None:
        """connection.update-secret (RabbitMQ's extension for renewing OAuth 2 tokens): a
        refused secret closes the connection with 530, as RabbitMQ does."""
        assert self.principal is not None
        secret = method.new_secret or b""
        raw = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
        try:
            # In a worker thread: a password user's secret is checked against ZooKeeper.
            principal = await trio.to_thread.run_sync(
                self.services.authenticator.update_secret, self.principal, raw
            )
        except AuthenticationFailed as e:
            self._log.warning("%s: secret update refused from %s: %s", self.id, self.peer, e)
            raise NotAllowed(
                "New secret was refused by one of the backends", method_ids(method)
            ) from e
        self.principal = principal
        self._set_credential_deadline(principal)
        self._log.info(
            "%s: %s updated secret, reason: %s", self.id, principal.name, method.reason or ""
        )
        self.conn.send_method(0, commands.Connection.UpdateSecretOk())

    async def _method(self, event: ev.MethodReceived) -> None:
        method = event.method
        if isinstance(method, commands.Connection.UpdateSecret):
            await self._update_secret(method)
            return
        session = self.channels.get(event.channel)
        if session is not None and self.vhost is not None and self.messages is not None:
            handler = self.messages.handler(method)
            if handler is not None:
                result = handler(self.messages, session, method)
                if result is not None:
                    await result
                return

            def reply(answer: PamqpMethod) -> None:
                session.core.write_method(answer)

            if await self.services.topology_methods.handle(self.vhost, session, method, reply):
                return
        raise NotImplementedMethod(f"{method.name} is not implemented yet", method_ids(method))

    def _message_flow(self, ctx: VhostContext) -> MessageFlow:
        services = self.services
        nursery = self._nursery
        assert nursery is not None and services.lengths is not None
        dead_letters = DeadLetters(
            ctx,
            services.cache,
            services.topology,
            services.producers,
            nursery.start_soon,
            services.requeued.returns,
            held=services.held.of(ctx.vhost) if services.held is not None else None,
        )
        consumers = Consumers(
            ctx,
            services.cache,
            services.topology,
            services.backend,
            f"{services.proxy_id}/{self.id}",
            self._kick,
            nursery.start_soon,
            services.requeued,
            dead_letters,
            self._notify_cancel,
        )
        consumers.trimmed = services.lengths.trimmed if services.lengths is not None else None
        publisher = Publisher(
            self.conn,
            ctx,
            services.cache,
            services.topology,
            services.producers,
            self._kick,
            services.metrics,
            ConnectionLengthChecks(
                services.lengths,
                ctx.vhost,
                ctx.namespace,
                nursery.start_soon,
                consumers.drop_oldest,
                services.cache,
                dead_letters,
            ),
            services.reaper.hint if services.reaper is not None else None,
            services.pre_acks,
        )
        publisher.on_backend_failure = self._backend_failed
        return MessageFlow(ctx, publisher, consumers, dead_letters, services.metrics, self._tally)

    def _backend_failed(self, e: Exception) -> None:
        """Pulsar failed this connection outside the handling of an event (a producer the
        pool could not make for its publishes): it closes as if the publish had raised
        `e` (gateway/errors.py), once."""
        if self.conn.state in (
            ConnectionState.CLOSED,
            ConnectionState.CLOSING,
            ConnectionState.CLIENT_CLOSING,
        ):
            return
        self.services.metrics.backend_error("pulsar")
        error = as_amqp_error(e) or InternalError(f"internal error ({type(e).__name__})")
        self._on_error(0, error)
        self.conn.fail(error)
        self._kick()

    def _notify_cancel(self, session: ChannelSession, tag: str) -> None:
        """basic.cancel from the server (the consumer's queue was deleted), for clients that
        understand it (consumer_cancel_notify), as RabbitMQ does."""
        capabilities = self.conn.client_properties.get("capabilities")
        if isinstance(capabilities, dict) and capabilities.get("consumer_cancel_notify"):
            session.core.write_method(commands.Basic.Cancel(tag, nowait=True))

    def _on_error(self, channel: int, error: AMQPError) -> None:
        closing = error.closes_connection or channel == 0
        scope = "connection" if closing else f"channel {channel}"
        self._log.warning("%s: closing %s: %s", self.id, scope, error.reply_text)
        vhost = self.vhost
        if closing and vhost is not None and vhost.exclusive_queues and self._nursery:
            # RabbitMQ deletes the connection's exclusive queues before its connection.close
            # goes out: a client that declares one again at once must not get 405.
            self._output_hold = trio.Event()
            self._nursery.start_soon(self._release_exclusive_queues, vhost, self._output_hold)

    async def _release_exclusive_queues(self, vhost: VhostContext, hold: trio.Event) -> None:
        try:
            with trio.move_on_after(EXCLUSIVE_RELEASE_WAIT):
                await self.services.topology_methods.release_connection(vhost)
        except Exception as e:
            self._log.warning("%s: could not delete its exclusive queues: %s", self.id, e)
        finally:
            self._output_hold = None
            hold.set()
            self._kick()

    # ---- writing ----------------------------------------------------------------------------

    def _kick(self, reported: bool = True) -> None:
        """Output is queued (or the connection closed): send it. On a plain TCP socket
        whose writer is idle, it is written at once, from here (one syscall, no task
        switch); what the socket does not take, and TLS streams, go through the writer
        task. Many kicks come with nothing to write (after reading an ack, for one).
        `reported`: False when the output (a heartbeat) changes nothing the connection
        report shows."""
        if self._output_hold is not None:
            return  # written once the connection's exclusive queues are gone
        conn = self.conn
        if conn.closed:
            self._wake_writer()
            return
        if not conn.pending_output:
            return
        if reported:
            self.services.report_changes += 1
        if conn.state is ConnectionState.CLOSING and self._close_deadline is None:
            self._wake_timers()  # it starts counting the wait for close-ok
        fd = self._direct_fd
        if fd < 0 or self._writer_busy:
            self._wake_writer()
            return
        data = conn.data_to_send()
        try:
            sent = os.write(fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:
            sent = 0  # broken: the writer's send fails too, and ends the connection
        if sent < len(data):
            self._backlog = data[sent:]
            self._writer_busy = True
            self._wake_writer()
            return
        self._sent(len(data))

    def _wake_writer(self) -> None:
        """The writer task is to send what the socket did not take, or to end a closed
        connection: woken, or started (plain TCP), or the connection resumed if parked."""
        if self._wakeup is not None:
            self._wakeup.set()
        if self._writer_running:
            return
        if self._parked:
            self._unpark()  # its run() starts the writer
            return
        if self._nursery is not None:
            self._writer_running = True
            self._nursery.start_soon(self._write_loop, self._nursery.cancel_scope)

    def _sent(self, size: int) -> None:
        """What was queued has been written."""
        self._last_sent = trio.current_time()
        if self._output_taken is not None:
            self._output_taken.set()
        if self.messages is not None:
            self.messages.publish_tally()
            if size >= MAX_OUTPUT_BACKLOG:
                # Consumers stop while this much waits: they may go on.
                self.messages.consumers.output_drained(self.channels.values())
                if self.conn.pending_output:
                    self._kick()

    async def _write_loop(self, scope: trio.CancelScope) -> None:
        """TLS: for the connection's life. Plain TCP: until what waited is written."""
        while True:
            while (hold := self._output_hold) is not None:
                await hold.wait()
            while True:
                data = self._backlog + self.conn.data_to_send()
                self._backlog = b""
                if not data:
                    break
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self.conn.abort()
                    scope.cancel()
                    return
                self._sent(len(data))
            self._writer_busy = False
            if self._output_taken is not None:
                self._output_taken.set()
            if self.conn.closed:
                scope.cancel()
                return
            if self._direct_fd >= 0:
                self._writer_running = False
                return
            self._wakeup = trio.Event()
            await self._wakeup.wait()
            self._wakeup = None

    # ---- timers -----------------------------------------------------------------------------

    def on_timer(self, now: float) -> float | None:
        """The process's timers (gateway/connection/connection_timers.py) call it when one of its
        deadlines is due: the handshake and close-ok timeouts, heartbeats to send or
        missed, the credential's expiry. Returns when it is due next."""
        if not self._timed:
            return None
        if self._beats_kept and self.services.quiet is not None:
            # Woken while the lot keeps its heartbeats (a close begins): they are back here.
            self._beats_kept = False
            times = self.services.quiet.parking.beats.remove(self._direct_fd)
            if times is not None:
                self._last_sent, self._last_received = times
        heartbeat = self.conn.heartbeat if self.conn.is_open else 0
        try:
            beat_only = self._check_deadlines(now, heartbeat)
        except Exception:
            self._log.exception("%s: its timers failed", self.id)
            self.conn.abort()
            beat_only = False
        self._kick(reported=not beat_only)
        if self.conn.closed:
            return None  # its tasks end, and take it off the timers
        if beat_only and not self._parked:
            self._ask_to_park(now)
        due = now + self._next_tick(now, heartbeat)
        return self._rounded(due, heartbeat) if self.conn.is_open else due

    @staticmethod
    def _rounded(due: float, heartbeat: int) -> float:
        """Heartbeats and an open connection's timeouts take a small delay well (a
        twentieth of the heartbeat, a second at most): connections due within it share
        one wake-up of the process."""
        step = min(OPEN_GRANULARITY, heartbeat / 20) if heartbeat else OPEN_GRANULARITY
        return math.ceil(due / step) * step

    def _check_deadlines(self, now: float, heartbeat: int) -> bool:
        """Carry out what is due; True when that is at most a heartbeat sent."""
        quiet = True
        deadline = self._credential_deadline
        if self.conn.is_open and deadline is not None and now >= deadline:
            # RabbitMQ (3.13+) closes the connection with 320 when the credential expires
            # and no connection.update-secret renewed it.
            self._credential_deadline = None
            name = self.principal.name if self.principal else "?"
            self._log.warning("%s: credential of '%s' has expired", self.id, name)
            error = ConnectionForced("credential expired")
            self._on_error(0, error)
            self.conn.fail(error)
            quiet = False
        if self.conn.state is ConnectionState.CLOSING:
            if self._close_deadline is None:
                self._close_deadline = now + CLOSE_OK_TIMEOUT
            elif now >= self._close_deadline:
                self._log.info("%s: no close-ok within %.0f s", self.id, CLOSE_OK_TIMEOUT)
                self.conn.abort()
            return False
        if not quiet:
            return False
        if not self.conn.is_open and self.conn.state is not ConnectionState.CLIENT_CLOSING:
            if now >= self._handshake_deadline:
                self._log.warning("%s: handshake timeout from %s", self.id, self.peer)
                self.conn.abort()
                return False
        elif heartbeat:
            if self._low_water and self._drain_heartbeats(now):
                self._wake_reader()
            if now - self._last_received > 2 * heartbeat:
                self._log.warning(
                    "%s: missed heartbeats from client, timeout: %ss", self.id, heartbeat
                )
                self.conn.abort()
                return False
            if now - self._last_sent >= heartbeat / 2:
                self.conn.send_heartbeat()
        return True

    def _next_tick(self, now: float, heartbeat: float) -> float:
        """How long until `on_timer` is due again. An open connection is due when its next
        heartbeat is to be sent or missed, or its credential expires, and at least every
        `OPEN_TICK_LIMIT`; sooner when the connection starts closing or gets a credential
        deadline (`_wake_timers`). An idle connection with a 60 s heartbeat is due about
        every 30 s, to send its heartbeat. During the handshake and the close it looks
        every second."""
        if not self.conn.is_open or self.conn.state is ConnectionState.CLOSING:
            return max(0.05, min(1.0, heartbeat / 4) if heartbeat else 1.0)
        due = [OPEN_TICK_LIMIT]
        if heartbeat:
            due.append(self._last_sent + heartbeat / 2 - now)
            due.append(self._last_received + 2 * heartbeat - now)
        if self._credential_deadline is not None:
            due.append(self._credential_deadline - now)
        quiet = self.services.quiet
        if quiet is not None and self._waiting is not None and self.messages is None:
            parks_in = self._last_active + quiet.park_after - now
            if parks_in > 0:
                due.append(parks_in)  # when it may park (`_ask_to_park`)
        return max(0.05, min(due))

    # ---- graceful shutdown (see gateway/shutdown.py) ----------------------------------------

    def hold_input(self) -> None:
        """Stop handling what the client sends (it waits in the socket) until
        `release_input`: nothing new is published while confirms are being settled."""
        if self._input_gate is None:
            self._input_gate = trio.Event()

    def release_input(self) -> None:
        gate, self._input_gate = self._input_gate, None
        if gate is not None:
            gate.set()

    @property
    def handling_input(self) -> bool:
        """True while a received chunk is being handled (a publish may be on its way to
        Pulsar without having been handed over yet)."""
        return self._handling_input

    @property
    def unconfirmed(self) -> int:
        """Publishes on confirm channels whose ack/nack has not been sent yet."""
        return sum(session.core.unconfirmed for session in self.channels.values())

    def force_close(self, error: ConnectionForced) -> None:
        """Close the connection from our side (connection.close with `error`); a socket that
        has not even sent the protocol header is just dropped."""
        if self.conn.state is ConnectionState.AWAITING_HEADER:
            self.conn.abort()
        elif self.conn.state not in (
            ConnectionState.CLOSED,
            ConnectionState.CLOSING,
            ConnectionState.CLIENT_CLOSING,
        ):
            self._log.info("%s: closing connection from %s: %s", self.id, self.peer, error.text)
            self.conn.fail(error)
        self._kick()

    # ---- the end ----------------------------------------------------------------------------

    async def _hang_up(self) -> None:
        """Close the socket politely: flush, half-close, give the peer a moment to read our
        last frames (closing with unread input would reset the connection and lose them)."""
        with trio.CancelScope(shield=True), trio.move_on_after(LINGER_AFTER_CLOSE):
            data = self._backlog + self.conn.data_to_send()
            self._backlog = b""
            try:
                if data:
                    await self.stream.send_all(data)
                if isinstance(self.stream, trio.SocketStream):
                    await self.stream.send_eof()
                if isinstance(self.stream, trio.SocketStream | trio.SSLStream):
                    while await self.stream.receive_some(RECEIVE_SIZE):
                        pass
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
                pass
        with trio.CancelScope(shield=True):
            # TLS sends close_notify, which must not wait forever on a peer that stopped reading.
            with trio.move_on_after(LINGER_AFTER_CLOSE) as closing:
                await self.stream.aclose()
            if closing.cancelled_caught:
                await trio.aclose_forcefully(self.stream)
