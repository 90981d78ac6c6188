"""Permissions in ZooKeeper: one record per (vhost, principal) under
`{root}/v1/permissions` (records.py, docs/metadata.md).

`PermissionStore` calls block (they are ZooKeeper round trips) and raise MetadataUnavailable
when ZooKeeper does not answer and RecordError when a znode holds data this version cannot
read; `starlight-admin` and tests use it. The gateway reads `PermissionCache`, a watched copy,
so no publish waits on ZooKeeper.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import threading
from typing import Any

from kazoo.recipe.cache import TreeEvent

from starlight_py.metadata.cache import name_of
from starlight_py.metadata.records import (
    Paths,
    PermissionRecord,
    RecordError,
    decode,
    encode,
)
from starlight_py.metadata.watched_tree import WatchedTree
from starlight_py.metadata.zookeeper import (
    MetadataUnavailable,
    NodeAlreadyExists,
    NodeMissing,
    NodeNotEmpty,
    ZooKeeperClient,
    start_tree_cache,
)
from starlight_py.model.permissions import Permission

log = logging.getLogger("starlight.permissions")

# A concurrent `clear` may delete the vhost's parent znode between our ensure_path and
# create; a few attempts settle it.
_WRITE_ATTEMPTS = 5


class PermissionStore:
    """Reads and writes `Permission`s of principals in vhosts."""

    def __init__(self, zk: ZooKeeperClient, paths: Paths) -> None:
        self._zk = zk
        self._paths = paths

    def set(self, vhost: str, principal: str, permission: Permission) -> None:
        """Give `principal` `permission` in `vhost` (replacing any it had). The vhost need
        not exist yet."""
        path = self._paths.permission(vhost, principal)
        data = encode(PermissionRecord(vhost, principal, permission))
        for _ in range(_WRITE_ATTEMPTS):
            try:
                self._zk.set(path, data)
                return
            except NodeMissing:
                pass
            try:
                self._zk.ensure_path(self._paths.vhost_permissions(vhost))
                self._zk.create(path, data)
                return
            except (NodeAlreadyExists, NodeMissing):
                continue  # a concurrent set created it, or a clear removed the parent
        raise MetadataUnavailable(f"could not write {path}: it kept changing under us")

    def clear(self, vhost: str, principal: str) -> bool:
        """Remove `principal`'s permission in `vhost`; False when it had none."""
        try:
            self._zk.delete(self._paths.permission(vhost, principal))
        except NodeMissing:
            return False
        # Leave no empty vhost znodes behind; a concurrent set may have refilled it.
        with contextlib.suppress(NodeNotEmpty, NodeMissing):
            self._zk.delete(self._paths.vhost_permissions(vhost))
        return True

    def get(self, vhost: str, principal: str) -> Permission | None:
        """`principal`'s permission in `vhost`, or None when it has none."""
        found = self._zk.get(self._paths.permission(vhost, principal))
        if found is None:
            return None
        return _record(found[0]).permission

    def list(self, vhost: str | None = None) -> builtins.list[tuple[str, str, Permission]]:
        """(vhost, principal, permission) for every principal of `vhost`, or of every vhost
        when `vhost` is None; sorted by vhost, then principal."""
        if vhost is None:
            parents = [
                f"{self._paths.permissions}/{child}"
                for child in self._zk.children(self._paths.permissions)
            ]
        else:
            parents = [self._paths.vhost_permissions(vhost)]
        result = []
        for parent in parents:
            for child in self._zk.children(parent):
                found = self._zk.get(f"{parent}/{child}")
                if found is None:
                    continue  # cleared while we listed
                record = _record(found[0])
                result.append((record.vhost, record.principal, record.permission))
        result.sort(key=lambda item: (item[0], item[1]))
        return result


def _record(data: bytes) -> PermissionRecord:
    record = decode(data)
    if not isinstance(record, PermissionRecord):
        raise RecordError(f"not a permission record: {type(record).__name__}")
    return record


class PermissionCache:
    """The watched, in-memory copy of every permission, for the gateway.

    A watched tree (metadata/watched_tree.py) mirrors `{root}/v1/permissions`, so checking
    a publish or a consume is a dictionary lookup that never waits on ZooKeeper. A change
    made with `PermissionStore` on any proxy reaches every proxy's cache as soon as
    ZooKeeper delivers the watch (a few milliseconds on a healthy ensemble). While
    ZooKeeper is away the cache keeps the last permissions it saw. `read` asks ZooKeeper
    itself (gateway/connection/authorization.py does before refusing, so a grant works at once even
    before its watch has fired).

    Thread-safe: events arrive on the watched tree's thread, reads come from any thread.
    """

    def __init__(self, zk: ZooKeeperClient, paths: Paths) -> None:
        self._store = PermissionStore(zk, paths)
        self._prefix = paths.permissions + "/"
        self._tree = WatchedTree(zk.kazoo, paths.permissions)
        self._lock = threading.Lock()
        self._permissions: dict[tuple[str, str], Permission] = {}
        self.ready = threading.Event()

    def start(self) -> None:
        """Blocks until ZooKeeper answers the first reads."""
        self._tree.listen(self._on_event)
        start_tree_cache(self._tree, "the permissions cache")

    def close(self) -> None:
        self._tree.close()

    def cached(self, vhost: str, principal: str) -> Permission | None:
        """The permission as this cache knows it (never blocks; None also while not
        `ready`)."""
        with self._lock:
            return self._permissions.get((vhost, principal))

    def read(self, vhost: str, principal: str) -> Permission | None:
        """The permission as ZooKeeper has it now (blocks; raises MetadataUnavailable,
        RecordError)."""
        return self._store.get(vhost, principal)

    def _on_event(self, event: Any) -> None:
        if event.event_type == TreeEvent.INITIALIZED:
            self.ready.set()
            return
        if event.event_type not in (
            TreeEvent.NODE_ADDED,
            TreeEvent.NODE_UPDATED,
            TreeEvent.NODE_REMOVED,
        ):
            return
        path: str = event.event_data.path
        if not path.startswith(self._prefix):
            return
        parts = path[len(self._prefix) :].split("/")
        if len(parts) != 2:
            return  # a vhost's znode: it holds no data
        key = (name_of(parts[0]), name_of(parts[1]))
        if event.event_type == TreeEvent.NODE_REMOVED:
            with self._lock:
                self._permissions.pop(key, None)
            return
        try:
            record = _record(event.event_data.data)
        except RecordError as e:
            # Unreadable: grant nothing rather than an old permission.
            log.warning("ignoring unreadable permission znode %s: %s", path, e)
            with self._lock:
                self._permissions.pop(key, None)
            return
        with self._lock:
            self._permissions[key] = record.permission
