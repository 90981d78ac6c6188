"""The management API with authentication on: HTTP basic with a JWT as the password (the
username is ignored, as on AMQP), the principal's permissions in each vhost, and
`managementAdministrators` for definitions and permissions. Proxy-specific (RabbitMQ's
users are its own)."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable, Iterator

import jwt
import pytest

from starlight_py.local.ports import free_port
from starlight_py.metadata.permissions import PermissionStore
from starlight_py.model.permissions import Permission
from tests.integration.conftest import ProxyFactory
from tests.support.management_api import Management

SECRET = b"starlight-management-test-secret-key-0123456789abcdef0123456789"


def token(sub: str) -> str:
    return jwt.encode({"sub": sub, "exp": int(time.time() + 3600)}, SECRET, "HS256")


@pytest.fixture
def secured(start_proxy: ProxyFactory) -> Management:
    port = free_port()
    start_proxy(
        authenticationEnabled="true",
        authenticationProviders="token",
        tokenSecretKey="data:;base64," + base64.b64encode(SECRET).decode(),
        managementListener=f"http://127.0.0.1:{port}",
        managementAdministrators="ops",
    )
    return Management(f"http://127.0.0.1:{port}", "ops", token("ops"), False)


@pytest.fixture
def principals(permission_store: PermissionStore) -> Iterator[Callable[[str, Permission], str]]:
    """Unique principals with a permission in vhost `/` (cleared after the test)."""
    made: list[str] = []

    def make(prefix: str, permission: Permission) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        permission_store.set("/", name, permission)
        made.append(name)
        return name

    yield make
    for name in made:
        permission_store.clear("/", name)


def test_logins_need_a_valid_token(secured: Management) -> None:
    for auth in (("", ""), ("ops", "not-a-token"), ("ops", token("ops") + "x")):
        reply = secured.call("GET", "/api/whoami", auth=auth)
        assert (reply.status, reply.body) == (
            401,
            {"error": "not_authorized", "reason": "Login failed"},
        )
    whoami = secured.call("GET", "/api/whoami", auth=("anything", token("ops")))
    assert whoami.body == {"name": "ops", "tags": ["administrator"]}


def test_users_act_within_their_permissions(
    secured: Management, principals: Callable[[str, Permission], str]
) -> None:
    alice = principals("alice", Permission("^mgmt-alice-.*", ".*", ".*"))
    as_alice = ("alice", token(alice))
    assert secured.call("GET", "/api/whoami", auth=as_alice).body == {
        "name": alice,
        "tags": ["management"],
    }
    queue = f"mgmt-alice-{uuid.uuid4().hex[:8]}"
    path = f"/api/queues/%2F/{queue}"
    try:
        assert secured.call("PUT", path, {"durable": True}, auth=as_alice).status == 201
        refused = secured.call("PUT", "/api/queues/%2F/elsewhere", {}, auth=as_alice)
        assert (refused.status, refused.body["error"]) == (401, "not_authorised")
        # publish and get travel over AMQP with alice's own token
        published = secured.call(
            "POST",
            "/api/exchanges/%2F/amq.default/publish",
            {"properties": {}, "routing_key": queue, "payload": "hi", "payload_encoding": "string"},
            auth=as_alice,
        )
        assert published.body == {"routed": True}
        got = secured.call(
            "POST",
            f"{path}/get",
            {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"},
            auth=as_alice,
        )
        assert [m["payload"] for m in got.body] == ["hi"]
        assert secured.call("GET", "/api/definitions", auth=as_alice).status == 401
        assert secured.call("GET", "/api/permissions", auth=as_alice).status == 401
    finally:
        secured.call("DELETE", path)


def test_users_see_only_vhosts_they_have_permissions_in(secured: Management) -> None:
    as_bob = ("bob", token(f"bob-{uuid.uuid4().hex[:8]}"))
    assert secured.call("GET", "/api/vhosts").status == 200
    assert secured.call("GET", "/api/vhosts", auth=as_bob).body == []
    assert secured.call("GET", "/api/queues", auth=as_bob).body == []
    assert secured.call("GET", "/api/queues/%2F", auth=as_bob).status == 401
    assert secured.call("GET", "/api/definitions").status == 200
