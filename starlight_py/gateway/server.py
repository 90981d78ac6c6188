"""The proxy process: listeners, the services every connection shares, and `serve`."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
from collections.abc import Callable
from functools import partial
from urllib.parse import urlsplit

import trio
from pamqp.common import FieldTable

from starlight_py import __version__, allocator
from starlight_py.amqp import compiled
from starlight_py.amqp.connection import ServerSettings
from starlight_py.amqp.errors import ConnectionForced
from starlight_py.auth.authenticator import build_authenticator
from starlight_py.backend import consumer_ack, list_acks, listened, producer_flush, producer_send
from starlight_py.backend.batching_support import batching_caveat, batching_refusal
from starlight_py.backend.dispatch_turns import turns_caveat
from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdmin, PulsarAdminError
from starlight_py.backend.pulsar_client import PulsarBackend
from starlight_py.backend.stream_index import stream_index_refusal
from starlight_py.cluster.cleaner import SubscriptionCleaner
from starlight_py.cluster.connection_reports import ConnectionReports
from starlight_py.cluster.duties import cluster_duties
from starlight_py.cluster.election import LeaderElection
from starlight_py.config import (
    ConfigError,
    Listener,
    StarlightConfig,
)
from starlight_py.gateway.bridge import take_from_pulsar_threads
from starlight_py.gateway.connection.accepting import serve_clients
from starlight_py.gateway.connection.client_connection import ClientConnection
from starlight_py.gateway.connection.connection_limits import Admission, ConnectionLimits, Ticket
from starlight_py.gateway.connection.connection_report import connection_name, describe_connections
from starlight_py.gateway.connection.proxy_protocol import read_proxy_header
from starlight_py.gateway.connection.tls import (
    ReloadingServerContext,
    TlsListener,
    complete_handshake,
    peer_certificate,
    server_tls,
)
from starlight_py.gateway.connection.vhosts import VhostResolver
from starlight_py.gateway.proxy_services import ProxyServices
from starlight_py.gateway.publish.producer_pool import ProducerPool
from starlight_py.gateway.shutdown import ShutdownRequest, shut_down_when_requested
from starlight_py.gateway.topology_methods import TopologyMethods
from starlight_py.management.http_server import serve_http
from starlight_py.management.routes import management_api
from starlight_py.management.static_ui import with_ui
from starlight_py.metadata.cache import TopologyCache
from starlight_py.metadata.ephemeral import EphemeralNodes
from starlight_py.metadata.permissions import PermissionCache
from starlight_py.metadata.records import Paths
from starlight_py.metadata.routing_barrier import RoutingBarrier, RoutingReports
from starlight_py.metadata.users import UserCache
from starlight_py.metadata.zookeeper import MetadataUnavailable, ZooKeeperClient
from starlight_py.model.namespaces import NamespaceName, NamespaceRules
from starlight_py.model.naming import TopicName
from starlight_py.model.proxy_protocol import ProxyHeader, ProxyProtocolError
from starlight_py.ops.health import serve_health
from starlight_py.ops.metrics import LiveCounts
from starlight_py.ops.queue_metrics import QueueMetrics
from starlight_py.topology.background_work import BackgroundWork
from starlight_py.topology.service import TopologyService
from starlight_py.workers import worker_index

log = logging.getLogger("starlight.server")

PULSAR_CHECK_WAIT = 5.0  # seconds the startup check of Pulsar's admin API waits at most

# What RabbitMQ advertises and clients check before using a feature (pika refuses
# confirm_delivery without publisher_confirms, for instance).
CAPABILITIES: FieldTable = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": False,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": False,
}


def build_services(config: StarlightConfig) -> ProxyServices:
    """Raises ConfigError when the authentication keys cannot be used."""
    zookeeper = ZooKeeperClient(config.zookeeper_servers, config.zookeeper_session_timeout)
    paths = Paths(config.metadata_root)
    users = (
        UserCache(zookeeper, paths)
        if config.authentication_enabled and "password" in config.authentication_providers
        else None
    )
    authenticator = build_authenticator(config, users)
    if not config.authentication_enabled:
        log.warning(
            "AUTHENTICATION IS DISABLED (authenticationEnabled=false): any client that can "
            "reach the listeners gets in with any credentials, and no permissions are checked"
        )
    elif {"token", "password"} & set(config.authentication_providers) and any(
        listener.scheme == "amqp" for listener in config.listeners
    ):
        log.warning(
            "passwords and tokens sent to amqp:// listeners travel in clear text: anyone on "
            "the network path can read them; prefer amqps:// listeners"
        )
    elif any(listener.scheme == "amqp" for listener in config.listeners):
        log.warning(
            "only the tls provider is enabled: clients of amqp:// listeners are offered no "
            "SASL mechanism and cannot log in"
        )
    settings = ServerSettings(
        channel_max=config.channel_max,
        frame_max=config.frame_max,
        heartbeat=int(config.heartbeat),
        max_message_size=config.max_message_size,
        server_properties={
            "product": "starlight-py",
            "version": __version__,
            "platform": f"Python {sys.version.split()[0]}",
            "information": "AMQP 0-9-1 proxy for Apache Pulsar",
            "cluster_name": "starlight",
            "capabilities": CAPABILITIES,
        },
    )
    rules = NamespaceRules(
        config.default_tenant, config.default_namespace, config.map_short_vhost_to_tenant
    )
    admin = PulsarAdmin.from_config(config)
    vhosts = VhostResolver(rules, admin, config.auto_create_namespaces)
    backend = PulsarBackend.from_config(config)
    proxy_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"
    ephemerals = EphemeralNodes(zookeeper, proxy_id)
    topology = TopologyService(zookeeper, paths, admin, backend, ephemerals)
    # A deleted queue's Pulsar subscriptions go after delete-ok (topology/background_work.py).
    topology.after_reply = BackgroundWork("queue-deletes").submit
    cache = TopologyCache(zookeeper, paths)
    topology.known_exchange = cache.exchange
    # Binding changes of topic and headers exchanges wait until every proxy routes by them.
    cache.on_routing_version(RoutingReports(zookeeper, paths, proxy_id).caught_up)
    barrier = RoutingBarrier(zookeeper, paths, proxy_id)
    cleaner = (
        SubscriptionCleaner(
            topology,
            cache,
            LeaderElection(zookeeper, paths.cleaner_election, proxy_id),
            config.cleaner_grace,
            config.cleaner_max_actions,
        )
        if config.cleaner_enabled
        else None
    )
    producers = ProducerPool(backend, config.producer_idle_timeout, cache.retired_binding_topic)
    topology.release_producers = producers.release
    permissions = PermissionCache(zookeeper, paths) if config.authentication_enabled else None
    services = ProxyServices(
        config,
        settings,
        authenticator,
        vhosts,
        zookeeper,
        topology,
        TopologyMethods(topology, producers.flush_all, cache, barrier),
        proxy_id,
        cache,
        backend,
        producers,
        ephemerals,
        cleaner,
        permissions=permissions,
        users=users,
        limits=ConnectionLimits(config.max_connections, config.max_connections_per_ip),
    )
    if users is not None:
        users.on_removed = services.user_deleted
    return services


AnyListener = trio.SocketListener | TlsListener
LISTEN_BACKLOG = 1024


async def open_listeners(
    listeners: tuple[Listener, ...],
    tls: ReloadingServerContext | None = None,
    *,
    reuse_port: bool = False,
) -> list[AnyListener]:
    """Bind every configured listener (amqps:// ones wrap their connections in TLS with
    `tls`; with `reuse_port`, SO_REUSEPORT sockets that other workers share); raises
    ConfigError for an amqps:// listener without `tls` and OSError (address in use,
    permission) with the listener named."""
    opened: list[AnyListener] = []
    for listener in listeners:
        if listener.scheme == "amqps" and tls is None:
            raise ConfigError("amqpListeners", f"{listener.url}: TLS is not configured")
        try:
            if reuse_port:
                sockets = await _shared_port_listeners(listener.host, listener.port)
            else:
                sockets = await trio.open_tcp_listeners(listener.port, host=listener.host)
            if tls is not None and listener.scheme == "amqps":
                opened.extend(TlsListener(sock, tls) for sock in sockets)
            else:
                opened.extend(sockets)
        except OSError as e:
            for sock in opened:
                await sock.aclose()
            raise OSError(e.errno, f"cannot listen on {listener.url}: {e.strerror}") from e
    return opened


async def _shared_port_listeners(host: str | None, port: int) -> list[trio.SocketListener]:
    """Like trio.open_tcp_listeners, with SO_REUSEPORT: every worker binds the same port and
    the kernel spreads new connections across them."""
    infos = await trio.socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    listeners: list[trio.SocketListener] = []
    try:
        for family, kind, proto, _, address in infos:
            sock = trio.socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                await sock.bind(address)
                sock.listen(LISTEN_BACKLOG)
            except BaseException:
                sock.close()
                raise
            listeners.append(trio.SocketListener(sock))
    except BaseException:
        for each in listeners:
            await each.aclose()
        raise
    return listeners


def bound_urls(listeners: list[AnyListener]) -> list[str]:
    urls = []
    for listener in listeners:
        host, port = listener.socket.getsockname()[:2]
        scheme = "amqps" if isinstance(listener, TlsListener) else "amqp"
        urls.append(f"{scheme}://{host}:{port}")
    return urls


async def serve(
    config: StarlightConfig,
    *,
    shutdown: ShutdownRequest | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the proxy until cancelled, or until `shutdown` is requested and the graceful
    shutdown is over (see gateway/shutdown.py). `task_status.started` gets the bound
    listener URLs (useful with port 0). Raises ConfigError or OSError when a listener
    cannot be opened."""
    # Unusable certificate files or keys fail here, before any client or thread is started.
    tls = server_tls(config)
    services = build_services(config)
    services._token = trio.lowlevel.current_trio_token()
    services.metrics.watch(
        lambda: live_counts(services),
        lambda: services.cache.last_change,
        lambda: services.cleaner.stats if services.cleaner is not None else None,
    )
    services.backend.name_threads(
        TopicName(NamespaceName(config.default_tenant, config.default_namespace), "starlight")
    )
    if config.producer_batching:
        await trio.to_thread.run_sync(_check_batching, services)
    await trio.to_thread.run_sync(_check_stream_index, services)
    await trio.to_thread.run_sync(_check_dispatch_turns, services)
    services.cache.on_change(services.topology_changed)
    try:
        await _connect_metadata(services.zookeeper, shutdown)
        await _warn_if_pulsar_unreachable(services, shutdown)
        async with trio.open_nursery() as nursery:
            # A cache's start blocks until ZooKeeper answers: never keep listeners waiting,
            # and never a shutdown either (the thread is abandoned; stopping the ZooKeeper
            # client below ends it).
            nursery.start_soon(_in_thread_until_cancelled, services.cache.start)
            if services.permissions is not None:
                nursery.start_soon(_in_thread_until_cancelled, services.permissions.start)
            if services.users is not None:
                nursery.start_soon(_in_thread_until_cancelled, services.users.start)
            await _serve(config, services, tls, shutdown, task_status)
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            services.cache.close()
            if services.permissions is not None:
                services.permissions.close()
            if services.users is not None:
                services.users.close()
            await trio.to_thread.run_sync(services.producers.close)
            await trio.to_thread.run_sync(services.backend.close)
            await trio.to_thread.run_sync(services.zookeeper.stop)


def live_counts(services: ProxyServices) -> LiveCounts:
    connections = list(services.connections)
    channels = sum(len(c.channels) for c in connections)
    consumers = sum(
        len(session.core.consumers) for c in connections for session in list(c.channels.values())
    )
    by_vhost: dict[str, tuple[int, int]] = {}
    for c in connections:
        if c.vhost is not None:
            seen = by_vhost.get(c.vhost.vhost, (0, 0))
            by_vhost[c.vhost.vhost] = (seen[0] + 1, seen[1] + len(c.channels))
    quiet = services.quiet
    return LiveCounts(
        len(connections),
        channels,
        consumers,
        len(services.producers),
        by_vhost,
        quiet_connections=len(quiet) if quiet is not None else 0,
        quiet_heartbeats=quiet.heartbeats if quiet is not None else 0,
        parked_connections=len(quiet.parking) if quiet is not None else 0,
        resumed_connections=quiet.parking.resumed if quiet is not None else 0,
    )


def close_connection(services: ProxyServices, name: str, reason: str) -> bool:
    """Close this proxy's connection `name` with 320 CONNECTION_FORCED and `reason` (what
    DELETE /api/connections/{name} asks); False when it is not here."""
    for connection in list(services.connections):
        if connection_name(connection) == name:
            connection.force_close(ConnectionForced(reason or "Closed via management plugin"))
            return True
    return False


def readiness_problems(services: ProxyServices) -> list[str]:
    """Blocking: what keeps this proxy from serving well (empty: ready)."""
    if services.shutting_down:
        return ["shutting down"]
    problems = []
    if not services.zookeeper.connected:
        problems.append(f"ZooKeeper {services.config.zookeeper_servers} not connected")
    if not services.cache.ready.is_set():
        problems.append("topology cache not loaded yet")
    if services.permissions is not None and not services.permissions.ready.is_set():
        problems.append("permission cache not loaded yet")
    try:
        services.topology.admin.clusters()
    except Exception as e:
        problems.append(f"Pulsar admin {services.topology.admin.web_url}: {e}")
    return problems


async def _start_management(
    nursery: trio.Nursery, config: StarlightConfig, services: ProxyServices, urls: list[str]
) -> None:
    """The management HTTP API and its web UI (docs/management.md); raises OSError when its
    port is taken."""
    address = urlsplit(config.management_listener)
    port = address.port or 0
    url = await nursery.start(
        serve_http,
        address.hostname or "127.0.0.1",
        # Workers of `serve --workers N` use port, port + 1, ... as for metricsListener.
        port and port + (worker_index() or 0),
        with_ui(management_api(services, urls, lambda: readiness_problems(services))),
    )
    services.management_url = url
    log.info("management API on %s/api/, web UI on %s/", url, url)


async def _proxy_header(
    stream: trio.SocketStream, timeout: float, peer: str
) -> tuple[ProxyHeader, trio.abc.Stream] | None:
    """The PROXY protocol header (amqpProxyProtocol=true), or None after closing a
    connection that does not send a valid one in time."""
    try:
        return await read_proxy_header(stream, timeout)
    except (ProxyProtocolError, trio.TooSlowError, EOFError, trio.BrokenResourceError) as e:
        log.warning("closing connection from %s: no valid PROXY protocol header (%s)", peer, e)
        with trio.CancelScope(shield=True):
            await stream.aclose()
        return None


def _check_batching(services: ProxyServices) -> None:
    """pulsarProducerBatching is used only with brokers that keep RabbitMQ's semantics exact
    with batch entries (backend/batching_support.py); otherwise it is turned off."""
    reason = batching_refusal(services.topology.admin)
    if reason is None:
        log.info("pulsarProducerBatching: on, queue counts in messages (the brokers' plugin)")
        caveat = batching_caveat(services.topology.admin)
        if caveat is not None:
            log.warning("pulsarProducerBatching: %s (docs/operations.md#what-pulsar-needs)", caveat)
        return
    log.warning(
        "pulsarProducerBatching is on but %s: batching turned off, one Pulsar entry per "
        "message (docs/operations.md#what-pulsar-needs)",
        reason,
    )
    services.backend.stop_batching()


def _check_stream_index(services: ProxyServices) -> None:
    """Stream offsets are Pulsar's message index (backend/stream_index.py): say at start
    when the brokers do not give one, rather than when a stream consumer needs it."""
    reason = stream_index_refusal(services.topology.admin)
    if reason is not None:
        log.warning(
            "stream queues: %s; consumers starting at a numeric x-stream-offset are refused and "
            "deliveries carry x-stream-offset -1 (docs/operations.md#what-pulsar-needs)",
            reason,
        )


def _check_dispatch_turns(services: ProxyServices) -> None:
    """Competing consumers get a burst in turns only from brokers that dispatch one entry
    per turn (backend/dispatch_turns.py): say at start when they do not."""
    caveat = turns_caveat(services.topology.admin)
    if caveat is not None:
        log.warning("competing consumers: %s (docs/operations.md#what-pulsar-needs)", caveat)


async def _in_thread_until_cancelled(call: Callable[[], object]) -> None:
    await trio.to_thread.run_sync(call, abandon_on_cancel=True)


async def _connect_metadata(zookeeper: ZooKeeperClient, shutdown: ShutdownRequest | None) -> None:
    """Connect to ZooKeeper (at most its connect timeout); a shutdown requested meanwhile
    (SIGTERM during startup) stops waiting at once."""
    async with trio.open_nursery() as nursery:
        if shutdown is not None:
            nursery.start_soon(_cancel_when_set, shutdown.requested, nursery.cancel_scope)
        try:
            await trio.to_thread.run_sync(zookeeper.start, abandon_on_cancel=True)
        except MetadataUnavailable as e:
            # Serve anyway: kazoo keeps trying, and until ZooKeeper answers clients get 541
            # with the reason instead of a refused TCP connection.
            log.error("%s; serving anyway, metadata operations fail until it is reachable", e)
            zookeeper.kazoo.start_async()
        nursery.cancel_scope.cancel()


async def _warn_if_pulsar_unreachable(
    services: ProxyServices, shutdown: ShutdownRequest | None
) -> None:
    """Say at startup when Pulsar's admin API does not answer (the proxy serves anyway:
    clients get 541 with the reason until it does). Waits at most PULSAR_CHECK_WAIT."""
    admin = services.topology.admin
    problem: str | None = None
    with trio.move_on_after(PULSAR_CHECK_WAIT) as waited:
        async with trio.open_nursery() as nursery:
            if shutdown is not None:
                nursery.start_soon(_cancel_when_set, shutdown.requested, nursery.cancel_scope)
            try:
                await trio.to_thread.run_sync(admin.clusters, abandon_on_cancel=True)
            except (BackendUnavailable, PulsarAdminError) as e:
                problem = str(e)
            nursery.cancel_scope.cancel()
    if waited.cancelled_caught:
        problem = f"no answer within {PULSAR_CHECK_WAIT:g} s"
    if problem is not None:
        log.error(
            "Pulsar admin API %s unreachable at startup (%s); serving anyway, clients get "
            "541 INTERNAL_ERROR until it answers",
            admin.web_url,
            problem,
        )


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _serve(
    config: StarlightConfig,
    services: ProxyServices,
    tls: ReloadingServerContext | None,
    shutdown: ShutdownRequest | None,
    task_status: trio.TaskStatus[list[str]],
) -> None:
    listeners = await open_listeners(config.listeners, tls, reuse_port=worker_index() is not None)
    urls = bound_urls(listeners)
    for url in urls:
        log.info("listening on %s", url)
    _log_paths(config, services)
    async with trio.open_nursery() as nursery:
        await _start_endpoints(nursery, config, services, urls)
        task_status.started(urls)
        _start_duties(nursery, config, services, urls)
        # Connections live in their own nursery so that the listeners can close (the
        # `accepting` scope) while the connections drain.
        async with trio.open_nursery() as connections:
            with trio.CancelScope() as accepting:
                if shutdown is not None:
                    nursery.start_soon(
                        shut_down_when_requested,
                        services,
                        shutdown,
                        accepting.cancel,
                        nursery.cancel_scope.cancel,
                    )
                await serve_clients(
                    partial(_serve_client, config, services), listeners, connections
                )


def _log_paths(config: StarlightConfig, services: ProxyServices) -> None:
    """Say at start what the proxy talks to, and which of its faster paths are in use."""
    log.info(
        "Pulsar %s (admin %s), ZooKeeper %s",
        services.backend.service_url,
        services.topology.admin.web_url,
        config.zookeeper_servers,
    )
    if allocator.as_chosen():
        log.info("memory allocator: %s", allocator.in_use())
    else:
        log.warning(
            "memory allocator: %s; it costs several µs more CPU per message "
            "(docs/performance.md#the-allocator)",
            allocator.in_use(),
        )
    if compiled.loaded():
        log.info("frame codec: compiled (native/)")
    else:
        log.warning(
            "frame codec: in Python, about 6 µs more CPU per message (STARLIGHT_NATIVE=0, or "
            "installed without Rust's cargo; docs/performance.md#the-hot-frames-in-rust)"
        )
    reasons = [x for x in (producer_send.available(), consumer_ack.available()) if x]
    if not reasons and producer_flush.compiled_flush() is not None:
        log.info(
            "pulsar-client calls: sends, flushes and acknowledgements through its C API, "
            "flush outcomes taken by a trio task (native/)"
        )
    elif not reasons:
        log.info("pulsar-client calls: sends and acknowledgements through its C API (native/)")
    else:
        log.warning(
            "pulsar-client calls: through its Python binding, about 4 µs more CPU per "
            "message (%s; docs/performance.md#pulsar-client-calls-through-its-c-api)",
            "; ".join(sorted(set(reasons))),
        )
    listened_reason = listened.available()
    if listened_reason is None:
        log.info("consumers: listened through the C API, taken by a trio task (native/)")
    else:
        log.warning(
            "consumers: a reader thread each, about 5 µs more CPU per message (%s; "
            "docs/performance.md, 'One reader for every consumer')",
            listened_reason,
        )
    list_reason = list_acks.available()
    if list_reason is None:
        log.info("acknowledgements: one list per consumer and round, ungrouped (native/)")
    else:
        log.warning(
            "acknowledgements: grouped for up to %d ms, a timer per Pulsar consumer (%s; "
            "docs/design.md, 'Acknowledgements go to Pulsar in lists, ungrouped')",
            config.consumer_ack_grouping_ms,
            list_reason,
        )


async def _serve_client(
    config: StarlightConfig,
    services: ProxyServices,
    stream: trio.SocketStream | trio.SSLStream[trio.SocketStream],
) -> None:
    """One accepted client, from its PROXY header and admission to its connection's end,
    or until its connection parks (gateway/connection/parking.py): then the connection
    owns its stream, and closes it when it ends."""
    parked = False
    try:
        parked = await _admit_and_run(config, services, stream)
    finally:
        if not parked:
            await trio.aclose_forcefully(stream)


async def _admit_and_run(
    config: StarlightConfig,
    services: ProxyServices,
    stream: trio.SocketStream | trio.SSLStream[trio.SocketStream],
) -> bool:
    """True when the connection parked (it lives on without this task)."""
    is_tls = isinstance(stream, trio.SSLStream)
    sock = stream.transport_stream.socket if isinstance(stream, trio.SSLStream) else stream.socket
    try:
        host, port = sock.getpeername()[:2]
        peer = f"{host}:{port}"
        local_host, local_port = sock.getsockname()[:2]
        local = f"{local_host}:{local_port}"
    except OSError:
        host, peer, local = "?", "?", "?"
    try:
        certificate = None
        client_stream: trio.abc.Stream = stream
        if config.proxy_protocol and isinstance(stream, trio.SocketStream):
            found = await _proxy_header(stream, config.handshake_timeout, peer)
            if found is None:
                return False
            header, client_stream = found
            if header.source is not None:
                host = header.source[0]
                peer = f"{header.source[0]}:{header.source[1]} (via {peer})"
        ticket = services.limits.admit(str(host))
        if ticket.admission is Admission.DROP:
            log.warning("dropped connection from %s: %s", peer, ticket.reason)
            await trio.aclose_forcefully(client_stream)
            return False
        if ticket.admission is Admission.REFUSE:
            log.warning("refusing connection from %s: %s", peer, ticket.reason)
    except Exception:
        log.exception("connection from %s failed", peer)
        return False
    try:
        if isinstance(stream, trio.SSLStream):
            # In this connection's own task: a slow handshake delays no one else.
            if not await complete_handshake(stream, config.tls_handshake_timeout, peer):
                return False
            certificate = peer_certificate(stream)
        connection = ClientConnection(
            client_stream,
            services,
            peer,
            tls=is_tls,
            peer_certificate=certificate,
            refusal=ticket.reason or None,
        )
        connection.local = local
        services.connections.add(connection)
        services.report_changes += 1
        connection.on_end = partial(_connection_ended, services, connection, ticket)
        if await connection.run():
            return True
    except Exception:
        # One connection's failure must never take the listener down.
        log.exception("connection from %s failed", peer)
    services.limits.release(ticket)
    return False


def _connection_ended(
    services: ProxyServices, connection: ClientConnection, ticket: Ticket
) -> None:
    services.connections.discard(connection)
    services.report_changes += 1
    services.limits.release(ticket)


async def _start_endpoints(
    nursery: trio.Nursery, config: StarlightConfig, services: ProxyServices, urls: list[str]
) -> None:
    """The operators' endpoint (metrics, health) and the management API, when configured."""
    if config.metrics_listener and config.queue_metrics_interval > 0:
        queue_metrics = QueueMetrics(
            services.topology.admin,
            services.cache,
            services.topology,
            lambda: services.cleaner is None or services.cleaner.stats.leader,
            config.queue_metrics_interval,
        )
        services.metrics.register(queue_metrics)
        nursery.start_soon(queue_metrics.run)
    if config.metrics_listener:
        address = urlsplit(config.metrics_listener)
        await nursery.start(
            serve_health,
            address.hostname or "127.0.0.1",
            # Workers of `serve --workers N` use port, port + 1, ... (workers.py).
            (address.port or 0) and (address.port or 0) + (worker_index() or 0),
            services.metrics,
            lambda: readiness_problems(services),
        )
    if config.management_listener:
        await _start_management(nursery, config, services, urls)


def _start_duties(
    nursery: trio.Nursery, config: StarlightConfig, services: ProxyServices, urls: list[str]
) -> None:
    """The process's background tasks: Pulsar's threads' hand-over, idle producers,
    expiry, unacked counts, pre-acknowledgements, the connection report, cluster duties."""
    assert services.ephemerals is not None
    assert services.reaper is not None and services.held is not None
    assert services.pre_acks is not None
    nursery.start_soon(take_from_pulsar_threads)
    nursery.start_soon(services.timers.run)
    if services.quiet is not None:
        nursery.start_soon(services.quiet.parking.run)
    nursery.start_soon(services.producers.close_idle_forever)
    nursery.start_soon(services.reaper.run)
    nursery.start_soon(services.held.publish_forever)
    nursery.start_soon(services.pre_acks.run)
    nursery.start_soon(
        ConnectionReports(
            services.zookeeper,
            services.topology.paths,
            services.ephemerals,
            services.proxy_id,
            lambda: describe_connections(list(services.connections), services.proxy_id),
            lambda name, reason: close_connection(services, name, reason),
            lambda: services.report_changes,
        ).run
    )
    nursery.start_soon(
        cluster_duties,
        services.zookeeper,
        services.topology.paths,
        services.ephemerals,
        services.proxy_id,
        urls,
        services.cleaner,
        config.cleaner_interval,
    )
