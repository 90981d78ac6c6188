"""Users with passwords (authenticationProviders=password), as RabbitMQ has them: a login
with the right password gets in, a wrong one is refused with RabbitMQ's 403 (and the broker
keeps serving everyone else), a user without permissions on the vhost gets 530, passwords
change and users go away at once, a RabbitMQ `password_hash` imported with definitions
logs in with its password, `guest` only from loopback, and the management API's basic auth
checks the same passwords.

The behaviour tests run against a real RabbitMQ too: set STARLIGHT_TEST_AMQP_URL and
STARLIGHT_TEST_MANAGEMENT_URL (its AMQP and HTTP listeners must also listen on a
non-loopback address for the guest test). `starlight-admin user` is ours alone.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingConnection

from starlight_py.local import ServiceEndpoints
from starlight_py.local.ports import free_port
from starlight_py.model.users import SHA256
from tests.support.admin_cli import AdminCLI
from tests.support.management_api import NOT_FOUND, Management
from tests.support.proxy_runner import ProxyThread, proxy_config

LOGIN_REFUSED = (
    "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
    "For details see the broker logfile."
)
# Made by RabbitMQ 3.10.8 (`rabbitmqctl add_user alice 's3cret-Ü'`, export_definitions).
RABBITMQ_HASH = ("0wCherbKaJij/ZehsZlTqc0XS8Zlaq0uLIZCwSXqVgHxvusB", "s3cret-Ü")
FULL = {"configure": ".*", "write": ".*", "read": ".*"}


@dataclass
class Target:
    """The broker under test: its AMQP address, its management API as an administrator, and
    (ours only) `starlight-admin` on the proxy's metadata root."""

    host: str
    port: int
    api: Management
    admin: AdminCLI | None

    @property
    def is_rabbitmq(self) -> bool:
        return self.admin is None

    def connect(self, user: str, password: str, host: str | None = None) -> BlockingConnection:
        return pika.BlockingConnection(
            pika.ConnectionParameters(
                host or self.host,
                self.port,
                "/",
                pika.PlainCredentials(user, password),
                connection_attempts=1,
                heartbeat=0,
            )
        )

    def add_user(self, password: str, tags: str = "", permitted: bool = True) -> str:
        name = f"user-{uuid.uuid4().hex[:10]}"
        reply = self.api.call("PUT", f"/api/users/{name}", {"password": password, "tags": tags})
        assert reply.status == 201, reply
        if permitted:
            reply = self.api.call("PUT", f"/api/permissions/%2F/{name}", FULL)
            assert reply.status in (201, 204), reply
        return name


@pytest.fixture(scope="module")
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    amqp, api = (
        os.environ.get("STARLIGHT_TEST_AMQP_URL"),
        os.environ.get("STARLIGHT_TEST_MANAGEMENT_URL"),
    )
    if amqp and api:
        parts, api_parts = urlsplit(amqp), urlsplit(api)
        management = Management(
            f"http://{api_parts.hostname}:{api_parts.port}",
            api_parts.username or "guest",
            api_parts.password or "guest",
            True,
        )
        yield Target(parts.hostname or "127.0.0.1", parts.port or 5672, management, None)
        return
    services: ServiceEndpoints = request.getfixturevalue("services")
    admin = AdminCLI(services)
    admin.ok("user", "add", "api-admin", "--password", "api-pw", "--tags", "administrator")
    admin.ok("permissions", "set", "api-admin", ".*", ".*", ".*")
    management_port = free_port()
    config = proxy_config(
        services.zookeeper,
        services.pulsar_service_url,
        services.pulsar_web_url,
        authenticationEnabled="true",
        authenticationProviders="password",
        amqpListeners="amqp://0.0.0.0:0",  # for the guest-from-elsewhere test
        managementListener=f"http://0.0.0.0:{management_port}",  # for the guest test too
        **admin.proxy_settings,
    )
    proxy = ProxyThread(config).start()
    management = Management(f"http://127.0.0.1:{management_port}", "api-admin", "api-pw", False)
    try:
        yield Target("127.0.0.1", proxy.port, management, admin)
    finally:
        proxy.stop()


def refused_login(target: Target, user: str, password: str, host: str | None = None) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        target.connect(user, password, host)
    assert LOGIN_REFUSED in str(refused.value)


def test_the_right_password_gets_in_wrong_ones_are_refused_and_others_keep_working(
    target: Target,
) -> None:
    user = target.add_user("pw-1")
    connection = target.connect(user, "pw-1")
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    refused_login(target, user, "wrong")
    refused_login(target, f"nobody-{uuid.uuid4().hex[:6]}", "pw-1")
    refused_login(target, user, "")
    # The broker still serves the connection that logged in.
    channel.basic_publish("", queue, b"still here")
    _, _, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"still here"
    connection.close()


def test_a_user_without_permissions_on_the_vhost_gets_530(target: Target) -> None:
    user = target.add_user("pw", permitted=False)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
        target.connect(user, "pw")
    assert f"NOT_ALLOWED - access to vhost '/' refused for user '{user}'" in str(refused.value)


def test_password_changes_and_deletions_count_at_once(target: Target) -> None:
    user = target.add_user("old")
    target.connect(user, "old").close()
    changed = target.api.call("PUT", f"/api/users/{user}", {"password": "new", "tags": ""})
    assert changed.status == 204
    refused_login(target, user, "old")
    kept = target.connect(user, "new")  # a password change leaves it open
    # A PUT without a password leaves the user without one (RabbitMQ 3.10).
    target.api.call("PUT", f"/api/users/{user}", {"tags": "management"})
    assert target.api.call("GET", f"/api/users/{user}").body["password_hash"] == ""
    refused_login(target, user, "new")
    kept.process_data_events(0)
    assert kept.is_open
    assert target.api.call("DELETE", f"/api/users/{user}").status == 204
    # RabbitMQ closes the connections of a deleted user.
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            kept.process_data_events(0.2)
    assert (closed.value.reply_code, closed.value.reply_text) == (
        320,
        f"CONNECTION_FORCED - user '{user}' is deleted",
    )
    assert target.api.call("GET", f"/api/users/{user}").body == NOT_FOUND
    assert target.api.call("DELETE", f"/api/users/{user}").status == 404
    refused_login(target, user, "new")
    # Its permissions went with it (RabbitMQ's delete_user).
    assert target.api.call("GET", f"/api/permissions/%2F/{user}").body == NOT_FOUND


def test_users_api_speaks_rabbitmqs_shapes(target: Target) -> None:
    user = target.add_user("pw", tags="monitoring,policymaker")
    shown = target.api.call("GET", f"/api/users/{user}").body
    assert shown["name"] == user
    assert shown["hashing_algorithm"] == SHA256
    assert shown["tags"] == ["monitoring", "policymaker"]
    assert shown["limits"] == {}
    assert user in {u["name"] for u in target.api.call("GET", "/api/users").body}
    for body, reason in (
        ({"password": "x"}, "tags_not_present"),
        (
            {"password": "x", "password_hash": RABBITMQ_HASH[0], "tags": ""},
            "both_password_and_password_hash_are_provided",
        ),
    ):
        reply = target.api.call("PUT", f"/api/users/{user}", body)
        assert (reply.status, reply.body["reason"]) == (400, reason)
    # Basic auth of the API checks the same passwords, and wants a management tag.
    whoami = target.api.call("GET", "/api/whoami", auth=(user, "pw"))
    assert (whoami.status, whoami.body) == (
        200,
        {"name": user, "tags": ["monitoring", "policymaker"]},
    )
    assert target.api.call("GET", "/api/whoami", auth=(user, "nope")).status == 401
    not_admin = target.api.call("GET", "/api/users", auth=(user, "pw"))
    assert (not_admin.status, not_admin.body["reason"]) == (401, "Not administrator user")
    tags_as_list = target.api.call("PUT", f"/api/users/{user}", {"password": "pw", "tags": ["a"]})
    assert tags_as_list.status == 204
    assert target.api.call("GET", f"/api/users/{user}").body["tags"] == ["a"]
    untagged = target.api.call("GET", "/api/whoami", auth=(user, "pw"))
    assert (untagged.status, untagged.body) == (
        401,
        {"error": "not_authorised", "reason": "Not management user"},
    )
    target.api.call("DELETE", f"/api/users/{user}")


def test_a_rabbitmq_password_hash_logs_in_unchanged(target: Target) -> None:
    user = f"imported-{uuid.uuid4().hex[:8]}"
    definitions = {
        "users": [
            {
                "name": user,
                "password_hash": RABBITMQ_HASH[0],
                "hashing_algorithm": SHA256,
                "tags": [],
                "limits": {},
            }
        ],
        "permissions": [{"user": user, "vhost": "/", **FULL}],
    }
    assert target.api.call("POST", "/api/definitions", definitions).status in (201, 204)
    target.connect(user, RABBITMQ_HASH[1]).close()
    refused_login(target, user, "s3cret-u")
    exported = target.api.call("GET", "/api/definitions").body
    assert {u["name"]: u["password_hash"] for u in exported["users"]}[user] == RABBITMQ_HASH[0]
    target.api.call("DELETE", f"/api/users/{user}")


def non_loopback_address() -> str | None:
    """An address of this machine that is not loopback (None when it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent
        except OSError:
            return None
        address: str = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_guest_logs_in_from_loopback_only(target: Target) -> None:
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address")
    if target.admin is not None:
        target.admin.run("user", "add", "guest", "--password", "guest", "--tags", "administrator")
        target.admin.ok("user", "change-password", "guest", "--password", "guest")
        target.admin.ok("permissions", "set", "guest", ".*", ".*", ".*")
    target.connect("guest", "guest").close()
    refused_login(target, "guest", "guest", host=address)
    # The management API refuses it too, saying why once the password was right.
    api_port = urlsplit(target.api.base).port
    elsewhere = Management(f"http://{address}:{api_port}", "guest", "guest", target.is_rabbitmq)
    assert elsewhere.call("GET", "/api/whoami").body == {
        "error": "not_authorised",
        "reason": "User can only log in via localhost",
    }
    assert elsewhere.call("GET", "/api/whoami", auth=("guest", "wrong")).body == {
        "error": "not_authorized",
        "reason": "Login failed",
    }
    # Other users may come from anywhere.
    user = target.add_user("pw")
    target.connect(user, "pw", host=address).close()


# ---- starlight-admin user (ours) -----------------------------------------------------------------


@pytest.fixture
def admin(target: Target) -> AdminCLI:
    if target.admin is None:
        pytest.skip("starlight-admin is ours")
    return target.admin


def test_admin_user_commands(target: Target, admin: AdminCLI) -> None:
    name = f"cli-{uuid.uuid4().hex[:8]}"
    added = admin.run("user", "add", name, "--password", "pw-1", "--tags", "management")
    assert (added.code, added.out.strip()) == (0, f"added user '{name}'")
    again = admin.run("user", "add", name, "--password", "x")
    assert (again.code, again.err.strip()) == (1, f"starlight-admin: user '{name}' already exists")
    listed = {u["name"]: u["tags"] for u in admin.json("user", "list")}
    assert listed[name] == ["management"]
    assert name in admin.ok("user", "list").out
    admin.ok("permissions", "set", name, ".*", ".*", ".*")
    target.connect(name, "pw-1").close()

    admin.ok("user", "change-password", name, "--password", "pw-2")
    refused_login(target, name, "pw-1")
    target.connect(name, "pw-2").close()

    admin.ok("user", "delete", name)
    refused_login(target, name, "pw-2")
    assert name not in {p["principal"] for p in admin.json("permissions", "list")}
    for args in (("delete", name), ("change-password", name, "--password", "x")):
        missing = admin.run("user", *args)
        assert (missing.code, missing.err.strip()) == (
            1,
            f"starlight-admin: no such user '{name}'",
        )


def test_admin_user_add_takes_a_rabbitmq_hash_and_refuses_bad_ones(
    target: Target, admin: AdminCLI
) -> None:
    name = f"hashed-{uuid.uuid4().hex[:8]}"
    admin.ok("user", "add", name, "--password-hash", RABBITMQ_HASH[0])
    admin.ok("permissions", "set", name, ".*", ".*", ".*")
    target.connect(name, RABBITMQ_HASH[1]).close()
    bad = admin.run("user", "add", f"{name}-2", "--password-hash", "!!notb64")
    assert bad.code == 2 and "not base64" in bad.err
    admin.ok("user", "delete", name)
