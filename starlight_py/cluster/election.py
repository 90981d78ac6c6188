"""Leader election among the proxies, for work one of them must do (the
SubscriptionCleaner): ZooKeeper's recipe of ephemeral sequential candidates, where the lowest
sequence leads.

kazoo's Election recipe runs a callback while leading and blocks a thread for it; the cleaner
instead asks "am I leading?" before each pass, which also notices a lost session (its
candidate znode is gone: it stands again, at the back of the line) without extra threads.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

from starlight_py.metadata.zookeeper import NodeMissing, ZooKeeperClient

log = logging.getLogger("starlight.cluster")

PREFIX = "candidate-"


class LeaderElection:
    def __init__(self, zk: ZooKeeperClient, path: str, identity: str) -> None:
        self.zk = zk
        self.path = path
        self.identity = identity
        self._candidate: str | None = None  # our znode's name
        # Askers on several threads stand only once.
        self._lock = threading.Lock()

    def is_leader(self) -> bool:
        """Stand if not standing (first call, or after our session was lost) and tell
        whether our candidate is first. Raises MetadataUnavailable."""
        with self._lock:
            return self._is_leader()

    def _is_leader(self) -> bool:
        candidates = self.zk.children(self.path)
        if self._candidate is None or self._candidate not in candidates:
            self.zk.ensure_path(self.path)
            created = self.zk.create_sequential(f"{self.path}/{PREFIX}", self.identity.encode())
            self._candidate = created.rsplit("/", 1)[1]
            candidates = self.zk.children(self.path)
        ordered = sorted(c for c in candidates if c.startswith(PREFIX))
        return bool(ordered) and ordered[0] == self._candidate

    def watch(self, callback: Callable[[], object]) -> None:
        """Call `callback` (on kazoo's event thread) whenever a candidate stands or goes, so
        that whoever asks `leader_identity` learns of a new leader at once rather than at
        its next poll. Raises MetadataUnavailable."""
        self.zk.watch_children(self.path, lambda _children: callback())

    def leader_identity(self) -> str | None:
        """The identity of the current leader, if any."""
        ordered = sorted(c for c in self.zk.children(self.path) if c.startswith(PREFIX))
        for candidate in ordered:
            found = self.zk.get(f"{self.path}/{candidate}")
            if found is not None:
                return found[0].decode()
        return None

    def resign(self) -> None:
        # Not under the lock: a shutdown must not wait behind a thread stuck on ZooKeeper.
        candidate, self._candidate = self._candidate, None
        if candidate is None:
            return
        with contextlib.suppress(NodeMissing):
            self.zk.delete(f"{self.path}/{candidate}")
