"""What one connection's principal may do in its vhost: RabbitMQ's permission checks, with
RabbitMQ's reply codes and texts (model/permissions.py has the rules, docs/security.md the
table of operations).

Checks read the proxy's `PermissionCache` (a watched copy of ZooKeeper), so an allowed
operation costs a dictionary lookup; only a refusal (or a check while the cache is still
loading) asks ZooKeeper, to confirm it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import trio

from starlight_py.amqp.errors import AccessRefused, NotAllowed
from starlight_py.amqp.method_ids import CONNECTION_OPEN
from starlight_py.metadata.permissions import PermissionCache
from starlight_py.metadata.zookeeper import MetadataUnavailable
from starlight_py.model.permissions import (
    Access,
    Permission,
    ResourceKind,
    refusal_text,
    vhost_refusal_text,
)


@dataclass(frozen=True)
class AccessControl:
    """The checks of one principal in one vhost. `permissions` None: authorization is off
    (authentication is disabled) and everything is allowed."""

    permissions: PermissionCache | None = None
    vhost: str = ""
    user: str = ""

    @property
    def enforced(self) -> bool:
        return self.permissions is not None

    async def _allowed(self, allows: Callable[[Permission | None], bool]) -> bool:
        """Whether the user's permission `allows` it: an allowed operation costs a look at
        the cache; a refusal is confirmed with ZooKeeper first, so that a permission granted
        a moment ago (whose watch has not fired yet) is honoured at once. When ZooKeeper is
        away the cache decides."""
        assert self.permissions is not None
        cache = self.permissions
        ready = cache.ready.is_set()
        if ready and allows(cache.cached(self.vhost, self.user)):
            return True
        try:
            permission = await trio.to_thread.run_sync(cache.read, self.vhost, self.user)
        except MetadataUnavailable:
            if not ready:
                raise
            return False
        return allows(permission)

    async def check_vhost(self) -> None:
        """connection.open: raises NotAllowed (530, closing the connection) when the user
        has no permission record in the vhost; MetadataUnavailable when it cannot be read."""
        if self.permissions is None:
            return
        if not await self._allowed(lambda permission: permission is not None):
            raise NotAllowed(vhost_refusal_text(self.vhost, self.user), CONNECTION_OPEN)

    async def check(
        self, access: Access, kind: ResourceKind, name: str, method: tuple[int, int]
    ) -> None:
        """Raises AccessRefused (403, closing the channel) unless the user's `access`
        pattern in the vhost matches the queue or exchange `name`."""
        if self.permissions is None:
            return

        def allows(permission: Permission | None) -> bool:
            return permission is not None and permission.allows(access, kind, name)

        if not await self._allowed(allows):
            raise AccessRefused(refusal_text(kind, name, self.vhost, self.user), method)

    def allows_now(self, access: Access, kind: ResourceKind, name: str) -> bool:
        """True when the cache alone allows it (no I/O: the publish fast path); False
        means `check` must decide."""
        cache = self.permissions
        if cache is None:
            return True
        if not cache.ready.is_set():
            return False
        permission = cache.cached(self.vhost, self.user)
        return permission is not None and permission.allows(access, kind, name)

    async def check_queue(self, access: Access, name: str, method: tuple[int, int]) -> None:
        await self.check(access, ResourceKind.QUEUE, name, method)

    async def check_exchange(self, access: Access, name: str, method: tuple[int, int]) -> None:
        await self.check(access, ResourceKind.EXCHANGE, name, method)


ALLOW_ALL = AccessControl()
