"""/api/definitions[/{vhost}] (export with GET, import with POST) and /api/permissions:
the same code as `starlight-admin definitions` and `starlight-admin permission`
(admin/definitions.py, metadata/permissions.py), on this proxy's ZooKeeper session."""

from __future__ import annotations

from typing import Any

from starlight_py.admin.definitions import (
    DefinitionsError,
    export_definitions,
    import_definitions,
)
from starlight_py.management.api import CREATED, NO_CONTENT, Answer, ApiCall
from starlight_py.management.errors import BadRequest, ObjectNotFound
from starlight_py.management.shapes import listed
from starlight_py.management.vhost_access import (
    DEFAULT_VHOST,
    ensure_default_vhost,
    usable_vhost,
)
from starlight_py.metadata.permissions import PermissionStore
from starlight_py.model.permissions import Permission

VHOST_KINDS = ("queues", "exchanges", "bindings", "policies")


def get_definitions(call: ApiCall) -> Answer:
    call.user.require_administrator()
    document = export_definitions(call.context.admin)
    vhost = call.params.get("vhost")
    if vhost is None:
        return Answer(200, document)
    usable_vhost(call, vhost)
    # RabbitMQ's per-vhost export: its objects without their `vhost` fields.
    single: dict[str, Any] = {
        "rabbit_version": document["rabbit_version"],
        "parameters": [],
    }
    for kind in VHOST_KINDS:
        single[kind] = [
            {k: v for k, v in item.items() if k != "vhost"}
            for item in document[kind]
            if item.get("vhost") == vhost
        ]
    return Answer(200, single)


def post_definitions(call: ApiCall) -> Answer:
    """Imports what is missing (idempotent); 400 naming every item that was refused. What
    starlight-py cannot apply (parameters, policy keys such as ha-mode) is left out without
    failing, unlike `starlight-admin definitions import`: the API has no
    --skip-unsupported, and `rabbitmqadmin import` of a whole export must work."""
    call.user.require_administrator()
    document = call.body()
    vhost = call.params.get("vhost")
    if vhost is not None:
        usable_vhost(call, vhost)
        document = {
            kind: [
                {**item, "vhost": vhost}
                for item in document.get(kind) or []
                if isinstance(item, dict)
            ]
            for kind in VHOST_KINDS
        }
    try:
        report = import_definitions(call.context.admin, document)
    except DefinitionsError as e:
        raise BadRequest(str(e)) from e
    if report.failed:
        raise BadRequest("; ".join(report.failed))
    return NO_CONTENT


# ---- permissions ------------------------------------------------------------------------------


def _store(call: ApiCall) -> PermissionStore:
    call.user.require_administrator()
    return PermissionStore(call.context.services.zookeeper, call.context.services.topology.paths)


def _permission_json(vhost: str, user: str, permission: Permission) -> dict[str, str]:
    return {"user": user, "vhost": vhost, **permission.to_json()}


def list_permissions(call: ApiCall) -> Answer:
    vhost = call.params.get("vhost")
    items = [
        _permission_json(v, user, permission)
        for v, user, permission in _store(call).list(vhost)
        if call.params.get("user") in (None, user)
    ]
    return Answer(200, listed(items, call.query))


def get_permission(call: ApiCall) -> Answer:
    vhost, user = call.params["vhost"], call.params["user"]
    permission = _store(call).get(vhost, user)
    if permission is None:
        raise ObjectNotFound()
    return Answer(200, _permission_json(vhost, user, permission))


def put_permission(call: ApiCall) -> Answer:
    """Users are not records here (principals come from tokens or certificates): any name
    may be given permissions, in an existing vhost."""
    store = _store(call)
    vhost, user = call.params["vhost"], call.params["user"]
    if vhost == DEFAULT_VHOST:
        ensure_default_vhost(call)
    if call.context.services.topology.get_vhost(vhost) is None:
        raise BadRequest("vhost_or_user_not_found")
    body = call.body()
    try:
        permission = Permission(
            str(body.get("configure", "")), str(body.get("write", "")), str(body.get("read", ""))
        )
    except ValueError as e:
        raise BadRequest(str(e)) from e
    existed = store.get(vhost, user) is not None
    store.set(vhost, user, permission)
    return NO_CONTENT if existed else CREATED


def delete_permission(call: ApiCall) -> Answer:
    if not _store(call).clear(call.params["vhost"], call.params["user"]):
        raise ObjectNotFound()
    return NO_CONTENT
