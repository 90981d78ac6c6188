"""The vhosts a request may see or use (blocking: reads ZooKeeper)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlight_py.admin import inventory
from starlight_py.management.errors import ObjectNotFound
from starlight_py.metadata.records import VhostRecord

if TYPE_CHECKING:
    from starlight_py.management.api import ApiCall


DEFAULT_VHOST = "/"


def ensure_default_vhost(call: ApiCall) -> None:
    """RabbitMQ always has the vhost `/`; here it is made by the first connection that opens
    it, or by the first management request that needs it (same rules, same record)."""
    if not call.context.default_vhost_seen:
        call.context.admin.usable_vhost(DEFAULT_VHOST)
        call.context.default_vhost_seen = True


def usable_vhost(call: ApiCall, name: str) -> VhostRecord:
    """The vhost's record; raises ObjectNotFound when there is none, NotAuthorised when
    the caller has no permissions in it."""
    if name == DEFAULT_VHOST:
        ensure_default_vhost(call)
    record = call.context.services.topology.get_vhost(name)
    if record is None:
        raise ObjectNotFound()
    call.user.require_vhost(name)
    return record


def visible_vhosts(call: ApiCall, only: str | None = None) -> list[VhostRecord]:
    """Every vhost the caller may use, or just `only` (ObjectNotFound when missing)."""
    if only is not None:
        return [usable_vhost(call, only)]
    ensure_default_vhost(call)
    return [r for r in inventory.vhosts(call.context.admin) if call.user.may_use_vhost(r.name)]
