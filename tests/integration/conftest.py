"""Real ZooKeeper and Pulsar, started once per test session (or taken from
STARLIGHT_PULSAR_URL / STARLIGHT_PULSAR_WEB_URL / STARLIGHT_ZOOKEEPER), and proxies on top."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pika
import pulsar
import pytest
from pika.adapters.blocking_connection import BlockingConnection

from starlight_py.local import (
    PulsarStandalone,
    ServiceEndpoints,
    ZooKeeperServer,
    endpoints_from_env,
    ensure_pulsar_distribution,
)
from starlight_py.local.cluster import LocalCluster
from starlight_py.metadata.permissions import PermissionStore
from starlight_py.metadata.records import Paths
from starlight_py.metadata.zookeeper import ZooKeeperClient
from starlight_py.model.permissions import FULL_PERMISSION
from tests.support.amqp_fixtures import Created, delete_created
from tests.support.proxy_runner import ProxyThread, proxy_config
from tests.support.raw_amqp import RawClient


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def pulsar_distribution() -> Path:
    return ensure_pulsar_distribution()


@pytest.fixture(scope="session")
def services(
    tmp_path_factory: pytest.TempPathFactory, pulsar_distribution: Path
) -> Iterator[ServiceEndpoints]:
    external = endpoints_from_env()
    if external is not None:
        yield external
        return
    base = tmp_path_factory.mktemp("services")
    zookeeper = ZooKeeperServer(base / "zookeeper", distribution=pulsar_distribution)
    pulsar = PulsarStandalone(base / "pulsar", distribution=pulsar_distribution)
    zookeeper.start()
    try:
        pulsar.start()
        try:
            yield ServiceEndpoints(pulsar.service_url, pulsar.web_url, zookeeper.connect_string)
        finally:
            pulsar.stop()
    finally:
        zookeeper.stop()


@pytest.fixture
def pulsar_client(services: ServiceEndpoints) -> Iterator[pulsar.Client]:
    """A plain pulsar-client Client of the session's Pulsar, its log kept to errors."""
    quiet = logging.getLogger("test.pulsar")
    quiet.setLevel(logging.ERROR)
    made = pulsar.Client(services.pulsar_service_url, logger=quiet)
    yield made
    made.close()


@pytest.fixture(scope="session")
def local_cluster(
    tmp_path_factory: pytest.TempPathFactory, pulsar_distribution: Path
) -> Iterator[LocalCluster]:
    """Three proxy processes behind HAProxy, with a ZooKeeper and a Pulsar of their own
    (not `services`: fault tests stop and restart them), shared by the whole session.

    Tests that break something use `healthy_cluster`, which repairs what an earlier test
    left broken. Started even when STARLIGHT_PULSAR_URL & co. name external servers."""
    cluster = LocalCluster(
        tmp_path_factory.mktemp("local_cluster"),
        proxies=3,
        # Short sessions, so a killed proxy's ephemeral znodes go away within a test.
        proxy_settings={
            "zooKeeperSessionTimeoutMillis": "4000",
            "subscriptionCleanerIntervalMillis": "1000",
            "subscriptionCleanerGracePeriodMillis": "2000",
        },
        distribution=pulsar_distribution,
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def healthy_cluster(local_cluster: LocalCluster) -> LocalCluster:
    """`local_cluster` with every part running and every proxy up in HAProxy."""
    local_cluster.start()
    return local_cluster


ProxyFactory = Callable[..., ProxyThread]


@pytest.fixture
def start_proxy(services: ServiceEndpoints) -> Iterator[ProxyFactory]:
    """Start a proxy with configuration overrides (conf keys), stopped after the test."""
    started: list[ProxyThread] = []

    def start(**overrides: str) -> ProxyThread:
        config = proxy_config(
            services.zookeeper, services.pulsar_service_url, services.pulsar_web_url, **overrides
        )
        proxy = ProxyThread(config).start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


@pytest.fixture(scope="session")
def permission_store(services: ServiceEndpoints) -> Iterator[PermissionStore]:
    """Permissions in the ZooKeeper the proxies of `start_proxy` use (default root)."""
    client = ZooKeeperClient(services.zookeeper)
    client.start()
    config = proxy_config(services.zookeeper, services.pulsar_service_url, services.pulsar_web_url)
    yield PermissionStore(client, Paths(config.metadata_root))
    client.stop()


@pytest.fixture
def grant_all(permission_store: PermissionStore) -> Iterator[Callable[..., None]]:
    """Proxies started with authenticationEnabled=true let in only principals with
    permissions: `grant_all("alice", "bob")` gives them `.* .* .*` in vhost `/` for the
    test (cleared after it)."""
    granted: list[tuple[str, str]] = []

    def grant(*principals: str, vhost: str = "/") -> None:
        for principal in principals:
            permission_store.set(vhost, principal, FULL_PERMISSION)
            granted.append((vhost, principal))

    yield grant
    for vhost, principal in granted:
        permission_store.clear(vhost, principal)


@pytest.fixture
def proxy(start_proxy: ProxyFactory) -> ProxyThread:
    return start_proxy()


@dataclass(frozen=True)
class Broker:
    """Where behaviour tests connect: our proxy, or the AMQP URL in STARLIGHT_TEST_AMQP_URL
    (a real RabbitMQ, to check that the expected values are RabbitMQ's)."""

    host: str
    port: int
    is_rabbitmq: bool

    def url(self, vhost: str = "%2F", **params: object) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        base = f"amqp://guest:guest@{self.host}:{self.port}/{vhost}"
        return base + (f"?{query}" if query else "")

    def raw(self) -> RawClient:
        return RawClient(self.host, self.port)


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> Broker:
    target = os.environ.get("STARLIGHT_TEST_AMQP_URL")
    if target:
        parts = urlsplit(target)
        return Broker(parts.hostname or "127.0.0.1", parts.port or 5672, True)
    proxy: ProxyThread = request.getfixturevalue("proxy")
    return Broker("127.0.0.1", proxy.port, False)


@pytest.fixture
def proxy_only(broker: Broker) -> None:
    """For tests of our own settings or extensions, which a stock RabbitMQ cannot pass."""
    if broker.is_rabbitmq:
        pytest.skip("proxy-specific behaviour")


# --- fixtures of the AMQP behaviour tests (test_topology_*.py, test_flow_*.py) --------


@pytest.fixture
def name_prefix(request: pytest.FixtureRequest) -> str:
    """Prefix of the names `created` makes: the test module's NAME_PREFIX, else "test"."""
    return str(getattr(request.module, "NAME_PREFIX", "test"))


@pytest.fixture
def created(broker: Broker, name_prefix: str) -> Iterator[Created]:
    names = Created(name_prefix)
    yield names
    delete_created(broker.url(), names)


@pytest.fixture
def connect(broker: Broker, created: Created) -> Iterator[Callable[[], BlockingConnection]]:
    """Opens more connections; all are closed before `created` cleans up (exclusive queues
    go with them)."""
    opened: list[BlockingConnection] = []

    def open_connection() -> BlockingConnection:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url()))
        opened.append(conn)
        return conn

    yield open_connection
    for conn in opened:
        if conn.is_open:
            conn.close()


@pytest.fixture
def connection(connect: Callable[[], BlockingConnection]) -> BlockingConnection:
    return connect()
