"""The ephemeral znodes this proxy holds (its registration, its connections' exclusive-queue
ownerships, its AMQP consumers), remembered so that they are made again when ZooKeeper
replaces a lost session: a proxy that lost its session but lives on must not look dead to
the rest of the cluster for longer than it takes to reconnect.
"""

from __future__ import annotations

import logging
import threading

from starlight_py.metadata.zookeeper import (
    MetadataUnavailable,
    NodeAlreadyExists,
    NodeMissing,
    ZooKeeperClient,
)

log = logging.getLogger("starlight.zookeeper")


class EphemeralNodes:
    def __init__(self, zookeeper: ZooKeeperClient, owner_id: str) -> None:
        self.zk = zookeeper
        self.owner_id = owner_id  # written into consumer znodes: which proxy holds them
        self._held: dict[str, bytes] = {}
        self._lock = threading.Lock()
        zookeeper.on_new_session(self.recreate)

    def remember(self, path: str, data: bytes) -> None:
        """`path` was created ephemeral by this process: make it again after a new session."""
        with self._lock:
            self._held[path] = data

    def forget(self, path: str) -> None:
        with self._lock:
            self._held.pop(path, None)

    def forget_under(self, prefix: str) -> None:
        """Forget every remembered path below `prefix` (a deleted queue's)."""
        with self._lock:
            for path in [p for p in self._held if p.startswith(prefix)]:
                del self._held[path]

    @property
    def held(self) -> dict[str, bytes]:
        with self._lock:
            return dict(self._held)

    def recreate(self) -> int:
        """Create every remembered znode that is missing; forget those whose parent is gone
        (the queue was deleted meanwhile). Returns how many were made."""
        made = 0
        for path, data in self.held.items():
            try:
                self.zk.create(path, data, ephemeral=True)
                made += 1
            except NodeAlreadyExists:
                pass
            except NodeMissing:
                self.forget(path)
            except MetadataUnavailable as e:
                log.warning("could not recreate ephemeral znode %s: %s", path, e)
        if made:
            log.info("recreated %d ephemeral znodes after a new ZooKeeper session", made)
        return made
