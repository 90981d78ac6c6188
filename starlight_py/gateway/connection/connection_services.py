"""What a client connection (`client_connection.py`) uses of the services its process
shares: an interface that `proxy_services.ProxyServices` satisfies, so that the connection's
module need not import that one (it imports the connection's, for the set of connections)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from starlight_py.amqp.connection import ServerSettings
from starlight_py.auth.authenticator import Authenticator
from starlight_py.backend.pulsar_client import PulsarBackend
from starlight_py.config import StarlightConfig
from starlight_py.gateway.connection.connection_timers import ConnectionTimers
from starlight_py.gateway.connection.quiet_sockets import QuietSockets
from starlight_py.gateway.consume.held_messages import HeldMessages
from starlight_py.gateway.consume.requeued import RequeuedPositions
from starlight_py.gateway.expiry_reaper import ExpiryReaper
from starlight_py.gateway.publish.pre_acks import PreAcks
from starlight_py.gateway.publish.producer_pool import ProducerPool
from starlight_py.gateway.publish.queue_lengths import QueueLengths
from starlight_py.gateway.topology_methods import TopologyMethods
from starlight_py.metadata.cache import TopologyCache
from starlight_py.metadata.permissions import PermissionCache
from starlight_py.model.namespaces import NamespaceName
from starlight_py.ops.metrics import ProxyMetrics
from starlight_py.topology.service import TopologyService


class ConnectionServices(Protocol):
    config: StarlightConfig
    server_settings: ServerSettings
    authenticator: Authenticator
    cache: TopologyCache
    topology: TopologyService
    topology_methods: TopologyMethods
    backend: PulsarBackend
    producers: ProducerPool
    proxy_id: str
    permissions: PermissionCache | None  # None: nobody's permissions are checked
    metrics: ProxyMetrics
    requeued: RequeuedPositions
    # Told when the topology changes (the connection's consumers follow new bindings).
    change_listeners: set[Callable[[frozenset[tuple[str, str]] | None], None]]
    lengths: QueueLengths | None
    reaper: ExpiryReaper | None
    held: HeldMessages | None
    pre_acks: PreAcks | None
    # The deadlines of every connection (heartbeats, handshake and close-ok timeouts).
    timers: ConnectionTimers
    # Quiet plain-TCP connections, not woken by heartbeats (None: turned off, every
    # heartbeat wakes its connection).
    quiet: QuietSockets | None
    # Bumped by whatever changes what the connection report shows (not by heartbeats): the
    # report is described again only when it moved (cluster/connection_reports.py).
    report_changes: int

    async def open_vhost(self, vhost: str) -> NamespaceName: ...

    async def refuse_missing_vhost(self, vhost: str) -> None: ...
