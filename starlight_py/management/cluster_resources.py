"""/api/nodes (the live proxies, from the proxy registry) and /api/users (no users are
stored: the principals with permissions are listed, writes are refused). /api/policies is
policies.py."""

from __future__ import annotations

from starlight_py.cluster.registry import live_proxies, uptime
from starlight_py.management.api import Answer, ApiCall
from starlight_py.management.errors import BadRequest, ObjectNotFound
from starlight_py.management.shapes import listed
from starlight_py.metadata.permissions import PermissionStore


def list_nodes(call: ApiCall) -> Answer:
    services = call.context.services
    items = [
        {
            "name": record.id,
            "type": "disc",
            "running": True,
            "uptime": int(uptime(record) * 1000),
            "os_pid": record.pid,
            "starlight_host": record.host,
            "starlight_version": record.version,
            "starlight_listeners": list(record.listeners),
        }
        for record in live_proxies(services.zookeeper, services.topology.paths)
    ]
    return Answer(200, listed(items, call.query))


def get_node(call: ApiCall) -> Answer:
    answer = list_nodes(call)
    for item in answer.value:
        if item["name"] == call.params["node"]:
            return Answer(200, item)
    raise ObjectNotFound()


# ---- users --------------------------------------------------------------------------------

USERS_UNSUPPORTED = (
    "users are not stored by starlight-py: clients log in with tokens (starlight-admin token "
    "create) or certificates; give a principal permissions with PUT /api/permissions"
)


def _users(call: ApiCall) -> list[dict[str, object]]:
    """The principals that have permissions somewhere, and the administrators: as close to
    RabbitMQ's users as there is here (no passwords)."""
    call.user.require_administrator()
    services = call.context.services
    names = {
        principal
        for _, principal, _ in PermissionStore(services.zookeeper, services.topology.paths).list()
    }
    administrators = set(services.config.management_administrators)
    names |= administrators
    return [
        {
            "name": name,
            "password_hash": "",
            "hashing_algorithm": "",
            "tags": ["administrator"] if name in administrators else [],
            "limits": {},
        }
        for name in sorted(names)
    ]


def list_users(call: ApiCall) -> Answer:
    return Answer(200, listed(_users(call), call.query))


def get_user(call: ApiCall) -> Answer:
    for user in _users(call):
        if user["name"] == call.params["user"]:
            return Answer(200, user)
    raise ObjectNotFound()


def put_user(call: ApiCall) -> Answer:
    call.user.require_administrator()
    raise BadRequest(USERS_UNSUPPORTED)
