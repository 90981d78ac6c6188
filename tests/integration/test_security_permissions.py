"""Per-vhost permissions (RabbitMQ's configure/write/read regexes) enforced on a proxy with
JWT logins: for each operation one allowed and one refused case, with RabbitMQ's reply code,
the side that closes (the channel for 403, the connection for 530 at connection.open) and
RabbitMQ's text; and a permission change taking effect without reconnecting.

Every test logs in as principals of its own (a fresh name), so permissions left in the
session's ZooKeeper by other tests never matter.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import jwt
import pika
import pika.exceptions
import pytest
from pamqp import commands
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from starlight_py.local import ServiceEndpoints
from starlight_py.metadata.permissions import PermissionStore
from starlight_py.model.permissions import FULL_PERMISSION, Permission
from tests.integration.conftest import ProxyFactory
from tests.support.amqp_fixtures import get_one
from tests.support.proxy_runner import ProxyThread, proxy_config
from tests.support.raw_amqp import RawClient

SECRET = b"starlight-permission-tests-secret-key-0123456789abcdef0123456789"
AUTHENTICATED = {
    "authenticationEnabled": "true",
    "authenticationProviders": "token",
    "tokenSecretKey": "data:;base64," + base64.b64encode(SECRET).decode(),
}


def token(sub: str) -> str:
    return jwt.encode({"sub": sub, "exp": int(time.time() + 3600)}, SECRET, "HS256")


@pytest.fixture(scope="module")
def proxy(services: ServiceEndpoints) -> Iterator[ProxyThread]:
    config = proxy_config(
        services.zookeeper, services.pulsar_service_url, services.pulsar_web_url, **AUTHENTICATED
    )
    started = ProxyThread(config).start()
    yield started
    started.stop()


@dataclass
class World:
    """One test's principals and names: `admin` may do anything in `/`, `user` what each
    test grants it; queue and exchange names start with `prefix`."""

    proxy: ProxyThread
    store: PermissionStore
    prefix: str
    admin: str
    user: str
    connections: list[BlockingConnection]

    def name(self, suffix: str) -> str:
        return f"{self.prefix}{suffix}"

    def grant(self, configure: str, write: str, read: str, vhost: str = "/") -> None:
        self.store.set(vhost, self.user, Permission(configure, write, read))

    def connect(self, principal: str | None = None) -> BlockingConnection:
        connection = pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1",
                self.proxy.port,
                credentials=pika.PlainCredentials("ignored", token(principal or self.user)),
                connection_attempts=1,
                heartbeat=0,
            )
        )
        self.connections.append(connection)
        return connection

    def admin_channel(self) -> BlockingChannel:
        return self.connect(self.admin).channel()

    def user_channel(self) -> BlockingChannel:
        return self.connect().channel()


@pytest.fixture
def world(proxy: ProxyThread, permission_store: PermissionStore) -> Iterator[World]:
    tag = uuid.uuid4().hex[:8]
    world = World(proxy, permission_store, f"perm-{tag}-", f"admin-{tag}", f"user-{tag}", [])
    permission_store.set("/", world.admin, FULL_PERMISSION)
    yield world
    for connection in world.connections:
        if connection.is_open:
            connection.close()
    try:
        channel = world.admin_channel()
        for suffix in ("q", "other-q", "x", "other-x", "dlx"):
            channel.queue_delete(world.name(suffix))
            channel.exchange_delete(world.name(suffix))
        channel.connection.close()
    finally:
        permission_store.clear("/", world.user)
        permission_store.clear("/", world.admin)


def refused(
    channel: BlockingChannel, call: Callable[[], object], kind: str, name: str, user: str
) -> None:
    """`call` closes `channel` (and only it) with RabbitMQ's 403 naming the resource."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        call()
    assert closed.value.reply_code == 403
    assert closed.value.reply_text == (
        f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '/' refused for user '{user}'"
    )
    assert not channel.is_open
    # The connection lives on: a new channel works.
    assert channel.connection.is_open
    assert channel.connection.channel().is_open


# ---- vhost access at connection.open -----------------------------------------------------------


def test_a_principal_without_permissions_in_the_vhost_is_refused_at_connection_open(
    world: World,
) -> None:
    client = RawClient("127.0.0.1", world.proxy.port)
    tune = client.login("PLAIN", f"\x00ignored\x00{token(world.user)}")
    assert isinstance(tune, commands.Connection.Tune)  # the login itself succeeds
    client.send_method(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
    client.send_method(0, commands.Connection.Open(virtual_host="/"))
    close = client.expect_connection_close()
    assert close.reply_code == 530
    assert close.reply_text == f"NOT_ALLOWED - access to vhost '/' refused for user '{world.user}'"
    assert (close.class_id, close.method_id) == (10, 40)
    client.close()

    with pytest.raises(pika.exceptions.AMQPConnectionError):
        world.connect()


def test_any_permission_record_opens_the_vhost_even_one_granting_nothing(world: World) -> None:
    world.grant("", "", "")
    connection = world.connect()
    channel = connection.channel()
    refused(
        channel,
        lambda: channel.queue_declare(world.name("q")),
        "queue",
        world.name("q"),
        world.user,
    )


def test_permissions_are_per_vhost(world: World) -> None:
    world.grant(".*", ".*", ".*", vhost=f"/{world.prefix}elsewhere")
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        world.connect()  # vhost `/`: no record there
    world.store.clear(f"/{world.prefix}elsewhere", world.user)


# ---- configure: declare and delete -------------------------------------------------------------


def test_queue_declare_needs_configure_on_the_queue(world: World) -> None:
    world.grant(f"^{world.prefix}q$", "", "")
    channel = world.user_channel()
    assert channel.queue_declare(world.name("q")).method.queue == world.name("q")
    other = world.name("other-q")
    refused(channel, lambda: channel.queue_declare(other), "queue", other, world.user)


def test_a_passive_queue_declare_needs_no_permission(world: World) -> None:
    world.admin_channel().queue_declare(world.name("other-q"))
    world.grant("", "", "")
    channel = world.user_channel()
    assert channel.queue_declare(world.name("other-q"), passive=True).method.queue


def test_a_server_named_queue_is_checked_under_its_generated_name(world: World) -> None:
    world.grant("^amq\\.gen-", "", "")
    channel = world.user_channel()
    assert channel.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
    world.grant("^x", "", "")
    time.sleep(0.5)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.queue_declare("", exclusive=True)
    assert closed.value.reply_code == 403
    assert "access to queue 'amq.gen-" in closed.value.reply_text


def test_exchange_declare_needs_configure_on_the_exchange(world: World) -> None:
    world.admin_channel().exchange_declare(world.name("other-x"), "fanout")
    world.grant(f"^{world.prefix}x$", "", "")
    channel = world.user_channel()
    channel.exchange_declare(world.name("x"), "direct")
    other = world.name("other-x")
    # Passive: no permission needed.
    channel.exchange_declare(other, passive=True)
    refused(
        channel, lambda: channel.exchange_declare(other, "fanout"), "exchange", other, world.user
    )


def test_queue_delete_needs_configure_on_the_queue(world: World) -> None:
    admin = world.admin_channel()
    admin.queue_declare(world.name("q"))
    admin.queue_declare(world.name("other-q"))
    world.grant(f"^{world.prefix}q$", "", "")
    channel = world.user_channel()
    channel.queue_delete(world.name("q"))
    other = world.name("other-q")
    refused(channel, lambda: channel.queue_delete(other), "queue", other, world.user)
    assert admin.queue_declare(other, passive=True)  # still there


def test_exchange_delete_needs_configure_on_the_exchange(world: World) -> None:
    admin = world.admin_channel()
    admin.exchange_declare(world.name("x"), "direct")
    admin.exchange_declare(world.name("other-x"), "direct")
    world.grant(f"^{world.prefix}x$", "", "")
    channel = world.user_channel()
    channel.exchange_delete(world.name("x"))
    other = world.name("other-x")
    refused(channel, lambda: channel.exchange_delete(other), "exchange", other, world.user)
    admin.exchange_declare(other, passive=True)  # still there


def test_a_dead_letter_exchange_needs_write_on_it(world: World) -> None:
    world.grant(f"^{world.prefix}", f"^{world.prefix}dlx$", f"^{world.prefix}")
    channel = world.user_channel()
    channel.queue_declare(world.name("q"), arguments={"x-dead-letter-exchange": world.name("dlx")})
    other_dlx = world.name("other-x")
    refused(
        channel,
        lambda: channel.queue_declare(
            world.name("other-q"), arguments={"x-dead-letter-exchange": other_dlx}
        ),
        "exchange",
        other_dlx,
        world.user,
    )


# ---- bind and unbind: write on the queue, read on the exchange -------------------------------


def bind_setup(world: World) -> tuple[str, str]:
    admin = world.admin_channel()
    queue, exchange = world.name("q"), world.name("x")
    admin.queue_declare(queue)
    admin.exchange_declare(exchange, "direct")
    return queue, exchange


def test_queue_bind_needs_write_on_the_queue_and_read_on_the_exchange(world: World) -> None:
    queue, exchange = bind_setup(world)
    world.grant("", f"^{queue}$", f"^{exchange}$")
    channel = world.user_channel()
    channel.queue_bind(queue, exchange, "k")

    world.grant("", "", f"^{exchange}$")  # no write on the queue
    time.sleep(0.5)
    refused(channel, lambda: channel.queue_bind(queue, exchange, "k2"), "queue", queue, world.user)

    world.grant("", f"^{queue}$", "")  # no read on the exchange
    time.sleep(0.5)
    channel = channel.connection.channel()
    refused(
        channel, lambda: channel.queue_bind(queue, exchange, "k3"), "exchange", exchange, world.user
    )


def test_queue_unbind_needs_write_on_the_queue_and_read_on_the_exchange(world: World) -> None:
    queue, exchange = bind_setup(world)
    admin = world.admin_channel()
    admin.queue_bind(queue, exchange, "k")
    admin.queue_bind(queue, exchange, "k2")
    world.grant("", f"^{queue}$", f"^{exchange}$")
    channel = world.user_channel()
    channel.queue_unbind(queue, exchange, "k")
    world.grant("", f"^{queue}$", "")
    time.sleep(0.5)
    refused(
        channel,
        lambda: channel.queue_unbind(queue, exchange, "k2"),
        "exchange",
        exchange,
        world.user,
    )


@pytest.mark.parametrize("method", ["bind", "unbind"])
def test_exchange_bind_needs_write_on_the_destination_and_read_on_the_source(
    world: World, method: str
) -> None:
    source, destination = world.name("x"), world.name("other-x")
    admin = world.admin_channel()
    admin.exchange_declare(source, "direct")
    admin.exchange_declare(destination, "fanout")
    world.grant("", f"^{destination}$", f"^{source}$")
    channel = world.user_channel()
    action = channel.exchange_bind if method == "bind" else channel.exchange_unbind
    action(destination, source, "k")

    world.grant("", "", f"^{source}$")  # no write on the destination
    time.sleep(0.5)
    refused(channel, lambda: action(destination, source, "k2"), "exchange", destination, world.user)

    world.grant("", f"^{destination}$", "")  # no read on the source
    time.sleep(0.5)
    channel = channel.connection.channel()
    action = channel.exchange_bind if method == "bind" else channel.exchange_unbind
    refused(channel, lambda: action(destination, source, "k3"), "exchange", source, world.user)


# ---- publish: write on the exchange ------------------------------------------------------------


def test_basic_publish_needs_write_on_the_exchange(world: World) -> None:
    queue, exchange = bind_setup(world)
    world.admin_channel().queue_bind(queue, exchange, "k")
    world.grant("", f"^{exchange}$", "")
    channel = world.user_channel()
    channel.confirm_delivery()
    channel.basic_publish(exchange, "k", b"allowed", mandatory=True)

    other = world.name("other-x")
    world.admin_channel().exchange_declare(other, "fanout")
    refused(
        channel,
        lambda: channel.basic_publish(other, "k", b"refused"),
        "exchange",
        other,
        world.user,
    )

    world.grant(".*", ".*", ".*")
    time.sleep(0.5)
    assert get_one(world.user_channel(), queue, auto_ack=True)[2] == b"allowed"


def test_publish_is_refused_before_the_exchange_is_looked_up(world: World) -> None:
    world.grant("", "", "")
    channel = world.user_channel()
    channel.confirm_delivery()
    missing = world.name("missing")
    # RabbitMQ checks permissions first: 403, not 404, for an exchange that does not exist.
    refused(
        channel, lambda: channel.basic_publish(missing, "k", b"m"), "exchange", missing, world.user
    )


def test_the_default_exchange_is_checked_as_amq_default(world: World) -> None:
    queue = world.name("q")
    world.admin_channel().queue_declare(queue)
    world.grant("", "^amq\\.default$", "")
    channel = world.user_channel()
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"via the default exchange")

    world.grant("", f"^{world.prefix}", "")
    time.sleep(0.5)
    refused(
        channel,
        lambda: channel.basic_publish("", queue, b"m"),
        "exchange",
        "amq.default",
        world.user,
    )


# ---- consume, get, purge: read on the queue -----------------------------------------------------


def two_queues_with_a_message(world: World) -> tuple[str, str]:
    admin = world.admin_channel()
    queue, other = world.name("q"), world.name("other-q")
    admin.confirm_delivery()
    for name in (queue, other):
        admin.queue_declare(name)
        admin.basic_publish("", name, b"hello")
    return queue, other


def test_basic_consume_needs_read_on_the_queue(world: World) -> None:
    queue, other = two_queues_with_a_message(world)
    world.grant("", "", f"^{queue}$")
    channel = world.user_channel()
    received: list[bytes] = []
    channel.basic_consume(queue, lambda ch, m, p, body: received.append(body), auto_ack=True)
    deadline = time.monotonic() + 10
    while not received and time.monotonic() < deadline:
        channel.connection.process_data_events(0.1)
    assert received == [b"hello"]
    refused(
        channel,
        lambda: channel.basic_consume(other, lambda *a: None, auto_ack=True),
        "queue",
        other,
        world.user,
    )


def test_basic_get_needs_read_on_the_queue(world: World) -> None:
    queue, other = two_queues_with_a_message(world)
    world.grant("", "", f"^{queue}$")
    channel = world.user_channel()
    assert get_one(channel, queue, auto_ack=True)[2] == b"hello"
    refused(channel, lambda: channel.basic_get(other), "queue", other, world.user)


def test_queue_purge_needs_read_on_the_queue(world: World) -> None:
    queue, other = two_queues_with_a_message(world)
    world.grant("", "", f"^{queue}$")
    channel = world.user_channel()
    channel.queue_purge(queue)
    refused(channel, lambda: channel.queue_purge(other), "queue", other, world.user)
    # Not purged.
    assert get_one(world.admin_channel(), other, auto_ack=True)[2] == b"hello"


# ---- changes take effect without reconnecting ----------------------------------------------------


def test_a_permission_change_takes_effect_for_the_next_operation(world: World) -> None:
    queue = world.name("q")
    world.admin_channel().queue_declare(queue)
    world.grant("", "", "")
    connection = world.connect()
    channel = connection.channel()
    refused(channel, lambda: channel.basic_get(queue), "queue", queue, world.user)

    # Granted while connected: the same connection gets through within a watch's delay.
    world.grant("", "", ".*")
    granted_at = time.monotonic()
    while True:
        channel = connection.channel()
        try:
            channel.basic_get(queue)
            break
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code == 403
            assert time.monotonic() - granted_at < 2, "the grant took over 2 s"
            time.sleep(0.05)

    # Taken away again: refused again, still without reconnecting.
    world.store.clear("/", world.user)
    cleared_at = time.monotonic()
    while True:
        try:
            channel.basic_get(queue)
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code == 403
            break
        assert time.monotonic() - cleared_at < 2, "the removal took over 2 s"
        time.sleep(0.05)
    assert connection.is_open


# ---- the store, against the real ZooKeeper -----------------------------------------------------


def test_the_store_sets_gets_lists_and_clears_permissions(
    permission_store: PermissionStore,
) -> None:
    tag = uuid.uuid4().hex[:8]
    vhost, other_vhost = f"store-{tag}/ns", f"store-{tag}-other"
    store = permission_store
    assert store.get(vhost, "alice") is None
    assert store.list(vhost) == []
    # No vhost record needed (as rabbitmqctl set_permissions before add_vhost works here).
    store.set(vhost, "CN=app/1", Permission("^a", "", ".*"))
    store.set(vhost, "alice", FULL_PERMISSION)
    store.set(vhost, "alice", Permission("", "^x$", ""))  # replaces
    store.set(other_vhost, "alice", FULL_PERMISSION)
    assert store.get(vhost, "alice") == Permission("", "^x$", "")
    assert store.get(vhost, "CN=app/1") == Permission("^a", "", ".*")
    assert store.list(vhost) == [
        (vhost, "CN=app/1", Permission("^a", "", ".*")),
        (vhost, "alice", Permission("", "^x$", "")),
    ]
    everything = store.list()
    assert (other_vhost, "alice", FULL_PERMISSION) in everything
    assert everything == sorted(everything, key=lambda item: (item[0], item[1]))

    assert store.clear(vhost, "alice") is True
    assert store.clear(vhost, "alice") is False
    assert store.get(vhost, "alice") is None
    assert store.clear(vhost, "CN=app/1") is True
    assert store.clear(other_vhost, "alice") is True
    assert store.list(vhost) == []
    # No empty containers left behind.
    assert [v for v, _, _ in store.list() if v.startswith(f"store-{tag}")] == []
    assert store._zk.get(store._paths.vhost_permissions(vhost)) is None


def test_with_authentication_disabled_nobody_is_checked(
    start_proxy: ProxyFactory, permission_store: PermissionStore
) -> None:
    user = f"restricted-{uuid.uuid4().hex[:8]}"
    permission_store.set("/", user, Permission("", "", ""))  # would allow nothing
    try:
        proxy = start_proxy()  # authenticationEnabled=false
        connection = pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1", proxy.port, credentials=pika.PlainCredentials(user, "any")
            )
        )
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"unchecked")
        assert get_one(channel, queue, auto_ack=True)[2] == b"unchecked"
        connection.close()
    finally:
        permission_store.clear("/", user)
