"""What every client connection of a proxy process shares (`ProxyServices`), made by
`server.build_services`. Its own module so that the modules it serves (the management API,
the graceful shutdown) need not import the server's, which imports them."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from starlight_py.amqp.connection import ServerSettings
from starlight_py.amqp.errors import ConnectionForced, InternalError
from starlight_py.amqp.method_ids import CONNECTION_OPEN
from starlight_py.auth.authenticator import Authenticator
from starlight_py.backend.pulsar_client import PulsarBackend
from starlight_py.cluster.cleaner import SubscriptionCleaner
from starlight_py.config import StarlightConfig
from starlight_py.gateway.channel_session import ChannelSession
from starlight_py.gateway.connection.client_connection import ClientConnection
from starlight_py.gateway.connection.connection_limits import ConnectionLimits
from starlight_py.gateway.connection.connection_timers import ConnectionTimers
from starlight_py.gateway.connection.quiet_sockets import QuietSockets
from starlight_py.gateway.connection.vhosts import VhostResolver
from starlight_py.gateway.consume.held_messages import HeldMessages, settling_time
from starlight_py.gateway.consume.requeued import RequeuedPositions
from starlight_py.gateway.expiry_reaper import ExpiryReaper
from starlight_py.gateway.publish.pre_acks import PreAcks
from starlight_py.gateway.publish.producer_pool import ProducerPool
from starlight_py.gateway.publish.queue_lengths import QueueLengths
from starlight_py.gateway.topology_methods import TopologyMethods
from starlight_py.metadata.cache import QueueChange, TopologyCache
from starlight_py.metadata.ephemeral import EphemeralNodes
from starlight_py.metadata.permissions import PermissionCache
from starlight_py.metadata.users import UserCache
from starlight_py.metadata.zookeeper import MetadataUnavailable, ZooKeeperClient
from starlight_py.model.namespaces import NamespaceName
from starlight_py.ops.metrics import ProxyMetrics
from starlight_py.topology.service import TopologyService

log = logging.getLogger("starlight.server")


@dataclass
class ProxyServices:
    """What every connection of this process shares."""

    config: StarlightConfig
    server_settings: ServerSettings
    authenticator: Authenticator
    vhosts: VhostResolver
    zookeeper: ZooKeeperClient
    topology: TopologyService
    topology_methods: TopologyMethods
    proxy_id: str
    cache: TopologyCache
    backend: PulsarBackend
    producers: ProducerPool
    ephemerals: EphemeralNodes | None = None
    cleaner: SubscriptionCleaner | None = None
    # Checked on every operation when authentication is enabled; None: nobody is checked.
    permissions: PermissionCache | None = None
    # The password provider's watched users; None when that provider is off.
    users: UserCache | None = None
    metrics: ProxyMetrics = field(default_factory=ProxyMetrics)
    connections: set[ClientConnection] = field(default_factory=set)
    requeued: RequeuedPositions = field(default_factory=RequeuedPositions)
    # Connections to tell when the topology changes (consumers follow new bindings).
    change_listeners: set[Callable[[frozenset[tuple[str, str]] | None], None]] = field(
        default_factory=set
    )
    _changes_lock: threading.Lock = field(default_factory=threading.Lock)
    _changed_queues: set[tuple[str, str]] | None = field(default_factory=set)
    _changes_scheduled: bool = False
    # Set when a graceful shutdown starts: /readyz answers 503 from then on.
    shutting_down: bool = False
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    lengths: QueueLengths | None = None  # x-max-length checks; made from topology/producers
    reaper: ExpiryReaper | None = None  # expires messages of queues nobody reads
    held: HeldMessages | None = None  # unacked deliveries by queue, for exact counts
    pre_acks: PreAcks | None = None  # drops messages from queues they were not routed to
    management_url: str = ""  # where the management API listens, once it does
    timers: ConnectionTimers = field(default_factory=ConnectionTimers)
    quiet: QuietSockets | None = None  # made from config.quiet_after
    report_changes: int = 0  # see ConnectionServices

    def __post_init__(self) -> None:
        if self.quiet is None and self.config.quiet_after > 0:
            self.quiet = QuietSockets(self.config.quiet_after)
        if self.lengths is None:
            self.lengths = QueueLengths(self.topology, self.producers)
        self.topology_methods.trimmed = self.lengths.trimmed
        self.topology_methods.queue_deleted = self.cancel_consumers_of
        if self.held is None:
            self.held = HeldMessages(
                self.zookeeper,
                self.topology.paths,
                self.ephemerals,
                lambda: settling_time(self.backend.ack_grouping_ms),
            )
            self.topology.counts.local_held = self.held.local
            self.topology.counts.local_settling = self.held.settling
        if self.pre_acks is None:
            self.pre_acks = PreAcks(self.cache, self.backend, self.proxy_id)
        if self.reaper is None:
            cleaner = self.cleaner
            self.reaper = ExpiryReaper(
                self.cache,
                self.topology,
                self.backend,
                self.producers,
                self.requeued,
                self.proxy_id,
                # Stands for the lead itself if the cleaner has not yet: known at start.
                # Read-only (no standing, no lock): never waits behind the cleaner.
                lambda: (
                    cleaner is not None
                    and cleaner.election.leader_identity() == cleaner.election.identity
                ),
                held_of=self.held.of,
                watch_lead=None if cleaner is None else cleaner.election.watch,
            )

    def cancel_consumers_of(
        self, vhost: str, queue: str, spare: ChannelSession | None = None
    ) -> None:
        """A queue was deleted through this proxy: its consumers on this proxy but those of
        channel `spare` get their basic.cancel now, not when the topology cache hears of it
        (trio thread)."""
        for connection in list(self.connections):
            messages = connection.messages
            if messages is not None and messages.consumers.ctx.vhost == vhost:
                messages.consumers.queue_deleted(queue, spare)

    def user_deleted(self, name: str) -> None:
        """Runs on kazoo's thread: only schedules work on trio's."""
        if self._token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(close_user_connections, self, name)

    def topology_changed(self, touched: QueueChange) -> None:
        """Runs on kazoo's thread: only gathers the changed queues and schedules one call
        on trio's, which tells every listener the queues changed since the last one (None:
        any may have)."""
        with self._changes_lock:
            if touched is None:
                self._changed_queues = None
            elif self._changed_queues is not None:
                self._changed_queues.add(touched)
            if self._changes_scheduled:
                return
            self._changes_scheduled = True
        self._token.run_sync_soon(self._tell_change_listeners)

    def _tell_change_listeners(self) -> None:
        with self._changes_lock:
            changed, self._changed_queues = self._changed_queues, set()
            self._changes_scheduled = False
        frozen = None if changed is None else frozenset(changed)
        for listener in list(self.change_listeners):
            listener(frozen)

    _token: Any = None

    async def refuse_missing_vhost(self, vhost: str) -> None:
        """Raises NotAllowed (530, "vhost ... not found") when connection.open of `vhost`
        would find no vhost to open: no record and, without amqpAutoCreateNamespaces, no
        Pulsar namespace. Creates nothing. A vhost in the watched cache exists: no
        ZooKeeper round trip (and none to wait for while ZooKeeper is away)."""
        if self.cache.vhost(vhost) is not None:
            return
        try:
            record = await trio.to_thread.run_sync(self.topology.get_vhost, vhost)
        except MetadataUnavailable:
            return
        if record is None and not self.vhosts.auto_create:
            await self.vhosts.resolve(vhost)

    async def open_vhost(self, vhost: str) -> NamespaceName:
        """The namespace of a vhost for connection.open: an existing record (an explicit
        mapping by starlight-admin, or one made by the rules earlier) wins; otherwise the
        rules decide and the vhost is created with its predeclared exchanges.

        The watched cache answers first, so a connection to a known vhost costs no
        ZooKeeper round trip and opens at once while ZooKeeper is away; only a vhost the
        cache does not know (new, or the cache still loading) is read from ZooKeeper.

        Raises NotAllowed (530) for unusable vhosts, InternalError (541) when Pulsar or
        ZooKeeper cannot be asked."""
        record = self.cache.vhost(vhost)
        if record is not None:
            await self.vhosts.check_namespace(vhost, record.namespace)
            return record.namespace
        try:
            record = await trio.to_thread.run_sync(self.topology.get_vhost, vhost)
        except MetadataUnavailable as e:
            # ZooKeeper is away: a vhost this proxy has seen stays usable for publishing
            # and consuming on its existing topology.
            record = self.cache.vhost(vhost)
            if record is None:
                raise InternalError(f"cannot open vhost '{vhost}': {e}", CONNECTION_OPEN) from e
            log.warning("opening vhost %r from the cache: %s", vhost, e)
        if record is not None:
            await self.vhosts.check_namespace(vhost, record.namespace)
            return record.namespace
        namespace = await self.vhosts.resolve(vhost)
        try:
            await trio.to_thread.run_sync(self.topology.ensure_vhost, vhost, namespace)
        except MetadataUnavailable as e:
            raise InternalError(f"cannot open vhost '{vhost}': {e}", CONNECTION_OPEN) from e
        return namespace


def close_user_connections(services: ProxyServices, name: str) -> None:
    """A password user was deleted: close its connections with RabbitMQ's 320."""
    for connection in list(services.connections):
        principal = connection.principal
        if principal is not None and principal.by_password and principal.name == name:
            connection.force_close(ConnectionForced(f"user '{name}' is deleted"))
