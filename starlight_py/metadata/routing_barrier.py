"""The routing barrier: a queue.bind or queue.unbind of a topic or headers exchange is
answered only once every live proxy routes by it.

Such exchanges write a message only to the topics of the bindings the publishing proxy's
cache knows (model/naming.py, binding topics), so a proxy whose cache has not seen a binding
yet would not write to its topic. RabbitMQ promises that a message published after bind-ok
reaches the queue, from any connection; the proxies keep that promise across the cluster:

1. The binding proxy writes the binding (one ZooKeeper transaction), then bumps the vhost's
   routing version: an unconditional write of `{vhosts}/<vhost>/routing-version`, whose
   znode version is the new routing version V, after (a later zxid than) the binding.
2. Every proxy's topology cache watches that znode like the rest of the vhost's tree. When
   its tree sees version V, it waits until it has no read of ZooKeeper in flight: ZooKeeper
   sends the watch events of one session in zxid order and answers its reads in order, so by
   then every change made before V, the binding among them, is in the cache. It then says so
   in its report znode `{root}/v1/routing-seen/<proxy>` (ephemeral, JSON: vhost -> V).
3. The binding proxy answers bind-ok once every other registered proxy reports V or more
   for the vhost, or after `BARRIER_WAIT` (a proxy that is hung, partitioned, or of an older
   version that does not report), logging which proxies it did not hear from.

A proxy that is not registered (it lost its ZooKeeper session) is not waited for; its
cache follows again with its new session. The registered proxies are known from a watch on
the registry (no read per bind); the registry is read again only when the wait runs out.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

from kazoo.exceptions import NoNodeError

from starlight_py.metadata.records import Paths, segment
from starlight_py.metadata.zookeeper import MetadataUnavailable, ZooKeeperClient

log = logging.getLogger("starlight.metadata")

ROUTING_VERSION = "routing-version"
"""The name of each vhost's routing version znode, beside its `exchanges` and `queues`."""

BARRIER_WAIT = 2.0  # seconds: how long a binding change waits for the other proxies
POLL = 0.002  # seconds between looks at the other proxies' reports


def routing_version_path(paths: Paths, vhost: str) -> str:
    return f"{paths.vhost(vhost)}/{ROUTING_VERSION}"


def routing_seen_path(paths: Paths, proxy_id: str) -> str:
    return f"{paths.root}/v1/routing-seen/{segment(proxy_id)}"


class RoutingReports:
    """This proxy's report of the routing versions its cache has caught up with (step 2).
    `caught_up` is called by the topology cache (on its thread); writes are asynchronous,
    the latest versions of every vhost in one znode."""

    def __init__(self, zk: ZooKeeperClient, paths: Paths, proxy_id: str) -> None:
        self._zk = zk
        self._path = routing_seen_path(paths, proxy_id)
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def caught_up(self, vhost: str, version: int) -> None:
        with self._lock:
            if self._seen.get(vhost, -1) >= version:
                return
            self._seen[vhost] = version
            data = json.dumps(self._seen, sort_keys=True).encode()
        kazoo = self._zk.kazoo
        kazoo.set_async(self._path, data).rawlink(
            lambda result: self._create_if_missing(result, data)
        )

    def _create_if_missing(self, result: object, data: bytes) -> None:
        if not isinstance(getattr(result, "exception", None), NoNodeError):
            return
        self._zk.kazoo.create_async(self._path, data, ephemeral=True, makepath=True)

    def seen(self) -> dict[str, int]:
        with self._lock:
            return dict(self._seen)


class RoutingBarrier:
    """The binding side (steps 1 and 3). Blocking: call it in a worker thread."""

    def __init__(
        self,
        zk: ZooKeeperClient,
        paths: Paths,
        proxy_id: str,
        wait: float = BARRIER_WAIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._zk = zk
        self._paths = paths
        self._own = segment(proxy_id)
        self._wait = wait
        self._clock = clock
        # The registry's names as its watch last told them; None until the watch is set.
        self._registered: list[str] | None = None
        self._watch_lock = threading.Lock()

    def others(self) -> list[str]:
        """The other registered proxies (their registry znode names), as the registry's
        watch last told them: a bind or an unbind asks ZooKeeper nothing for them. Until the
        watch is set (it is set by the first call), read from ZooKeeper."""
        registered = self._registered
        if registered is None:
            self._watch_registry()
            registered = self._registered
        if registered is None:
            return self._live_others()
        return [p for p in registered if p != self._own]

    def _live_others(self) -> list[str]:
        return [p for p in self._zk.children(self._paths.proxies) if p != self._own]

    def _watch_registry(self) -> None:
        with self._watch_lock:
            if self._registered is not None:
                return
            try:
                self._zk.watch_children(self._paths.proxies, self._heard_registry)
            except MetadataUnavailable as e:
                log.debug("routing barrier: cannot watch the proxy registry yet: %s", e)

    def _heard_registry(self, children: list[str]) -> None:
        """kazoo's event thread: the registry's names, at once and on every change."""
        self._registered = list(children)

    def bump(self, vhost: str) -> int:
        """Step 1: the vhost's new routing version. Raises MetadataUnavailable."""
        return self._zk.bump(routing_version_path(self._paths, vhost))

    def routed_everywhere(self, vhost: str) -> list[str]:
        """Steps 1 and 3: bump the version and wait until every other proxy's cache routes
        by it; returns the proxies not heard from within the wait (empty: all caught up,
        or no other proxy). Raises MetadataUnavailable."""
        others = self.others()
        if not others:
            return []
        version = self.bump(vhost)
        deadline = self._clock() + self._wait
        waiting = set(others)
        while True:
            for proxy in sorted(waiting):
                if self._reported(proxy, vhost) >= version:
                    waiting.discard(proxy)
            if not waiting:
                return []
            if self._clock() >= deadline:
                # Gone meanwhile (closed, session lost) counts as caught up: asked of
                # ZooKeeper itself, not of the watch.
                live = set(self._live_others())
                late = sorted(waiting & live)
                if late:
                    log.warning(
                        "routing change in vhost %r answered without word from proxies %s "
                        "(their caches may route by it up to a moment later)",
                        vhost,
                        ", ".join(late),
                    )
                return late
            time.sleep(POLL)

    def _reported(self, proxy: str, vhost: str) -> int:
        found = self._zk.get(f"{self._paths.root}/v1/routing-seen/{proxy}")
        if found is None:
            return -1
        try:
            versions = json.loads(found[0])
            return int(versions.get(vhost, -1))
        except (ValueError, TypeError, AttributeError):
            return -1
