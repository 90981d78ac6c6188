"""A watched copy of a ZooKeeper subtree, kept by one persistent recursive watch.

kazoo's TreeCache watches every znode of its tree twice (its data and its children) and
re-reads a parent's whole child list whenever a child comes or goes. A parent with N
children (the queues of a vhost, the binding sets reading an exchange) then costs N names
read for each child added: declaring N queues reads N^2/2 names, and every watch
registered holds memory in the server.

`WatchedTree` asks ZooKeeper (3.6 and later) for one persistent recursive watch on its
root (`addWatch`, mode PERSISTENT_RECURSIVE) and then:

- reads the whole tree once (each znode's data and child list), after the watch is in
  place, so every later change produces an event;
- for each event (a znode created, changed or deleted below the root: the server sends one
  notification per change, with the znode's path and its kind, and no child-list events),
  reads that one znode; the answer is applied: a znode not known before is added, one whose
  data or version changed is updated, one no longer there (`NoNode`) is removed. A deletion
  is applied without a read (there is nothing to read), in order with the answers: it goes
  through kazoo's completion queue, behind every answer read before it;
- after the connection comes back (persistent watches belong to a connection, and kazoo
  re-registers only its one-shot watches), adds the watch again and reads the whole tree
  again: znodes not seen by then are removed.

Answers are applied in the order ZooKeeper gave them, on the tree's own thread, so the
last answer for a znode is its newest state; two quick changes to one znode may reach the
listeners as one update. Listeners get kazoo's `TreeEvent`s (NODE_ADDED, NODE_UPDATED,
NODE_REMOVED with the znode's data and stat, INITIALIZED once after the first full read),
as from a TreeCache, so the caches built on one (metadata/cache.py, users.py,
permissions.py) read either.

A server that does not know `addWatch` (ZooKeeper before 3.6) answers UNIMPLEMENTED: the
tree then says so once and runs a kazoo TreeCache instead.
"""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from collections import namedtuple
from collections.abc import Callable
from functools import partial
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError, UnimplementedError
from kazoo.protocol.serialization import Watch, int_struct, write_string
from kazoo.protocol.states import KazooState
from kazoo.recipe.cache import NodeData, TreeCache, TreeEvent

log = logging.getLogger("starlight.zookeeper")

# ZooKeeper's Watcher.Event.EventType.NodeDeleted, as a watch event carries it.
NODE_DELETED = 2

RETRY_PAUSE = 1.0  # s before a full read that failed while connected is made again

Listener = Callable[[Any], None]

# ZooKeeper's addWatch request (OpCode.addWatch) and its AddWatchMode.PERSISTENT_RECURSIVE.
ADD_WATCH_OP = 106
PERSISTENT_RECURSIVE = 1


class AddWatch(namedtuple("AddWatch", "path mode")):
    """The addWatch request, in kazoo's request shape (its answer has no body)."""

    type = ADD_WATCH_OP

    def serialize(self) -> bytearray:
        out = bytearray()
        out.extend(write_string(self.path))
        out.extend(int_struct.pack(self.mode))
        return out

    @classmethod
    def deserialize(cls, _bytes: bytes, _offset: int) -> bool:
        return True


class _EventTap:
    """Hands the watch events one kazoo client reads to the trees whose root is a prefix
    of their path (kazoo itself hands events only to one-shot watches it registered)."""

    def __init__(self, client: KazooClient) -> None:
        self._client = client
        self._trees: list[WatchedTree] = []
        connection = client._connection
        original = connection._read_watch_event

        def read_watch_event(buffer: bytes, offset: int) -> Any:
            watch, _ = Watch.deserialize(buffer, offset)
            path = client.unchroot(watch.path)
            deleted = watch.type == NODE_DELETED
            for tree in self._trees:
                tree.heard(path, deleted)
            return original(buffer, offset)

        connection._read_watch_event = read_watch_event

    def add(self, tree: WatchedTree) -> None:
        self._trees = [*self._trees, tree]

    def remove(self, tree: WatchedTree) -> None:
        self._trees = [t for t in self._trees if t is not tree]


_TAPS: weakref.WeakKeyDictionary[KazooClient, _EventTap] = weakref.WeakKeyDictionary()
_TAPS_LOCK = threading.Lock()


def _tap(client: KazooClient) -> _EventTap:
    with _TAPS_LOCK:
        tap = _TAPS.get(client)
        if tap is None:
            tap = _TAPS[client] = _EventTap(client)
        return tap


class WatchedTree:
    """The znodes below `root`, followed with one persistent recursive watch. Thread-safe
    to start and close; everything else happens on the tree's own thread."""

    def __init__(self, client: KazooClient, root: str, persistent: bool = True) -> None:
        self._client = client
        self._root = root.rstrip("/") or "/"
        self._below = self._root + "/" if self._root != "/" else "/"
        self._persistent = persistent
        self._listeners: list[Listener] = []
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._nodes: dict[str, NodeData] = {}
        self._fallback: TreeCache | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._initialized = False
        # The current full read: its number, the reads of it still unanswered, and the
        # znodes read (by it or by an event's read) since it began.
        self._sync = 0
        self._sync_pending = 0
        self._sync_failed = False
        self._seen: set[str] = set()
        self._in_flight = 0
        """Reads sent and not yet applied (the tree's thread only)."""

    # ---- the TreeCache surface the caches use ----------------------------------------------

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def start(self) -> None:
        """Starts following the tree; INITIALIZED reaches the listeners once it is read.
        Raises what kazoo raises when ZooKeeper cannot be reached right now: the tree then
        follows it once it is back, as after any drop."""
        if not self._persistent:
            self._use_tree_cache("asked to use a TreeCache:")
            return
        _tap(self._client).add(self)
        self._client.add_listener(self._on_state)
        self._thread = threading.Thread(
            target=self._work, name=f"zookeeper watch {self._root}", daemon=True
        )
        self._thread.start()
        self._client.ensure_path(self._root)
        self._tasks.put(self._resync)

    def close(self) -> None:
        self._closed = True
        if self._fallback is not None:
            self._fallback.close()
        _tap(self._client).remove(self)
        self._client.remove_listener(self._on_state)
        self._tasks.put(None)

    def in_background(self, call: Callable[[], None]) -> None:
        """Run `call` on the thread that calls the listeners, after what is queued."""
        if self._fallback is not None:
            self._fallback._in_background(call)
        else:
            self._tasks.put(call)

    def reads_in_flight(self) -> int:
        """Reads sent whose answers are not applied yet."""
        if self._fallback is not None:
            return int(getattr(self._fallback, "_outstanding_ops", 0))
        return self._in_flight

    @property
    def uses_persistent_watch(self) -> bool:
        return self._fallback is None

    # ---- other threads ----------------------------------------------------------------------

    def heard(self, path: str, deleted: bool = False) -> None:
        """kazoo's connection thread: a watch event for `path` (`deleted`: the znode is
        gone, so there is nothing to read)."""
        if self._closed or self._fallback is not None:
            return
        if path == self._root or path.startswith(self._below):
            if not deleted:
                self._tasks.put(partial(self._read, path, 0))
                return
            handler = self._client.handler
            if not handler.running:
                return
            # Behind the answers read before this event: kazoo hands every answer to its
            # completion queue as it reads it, in the order ZooKeeper sent them. Put
            # directly, the removal could overtake an answer read before the deletion and
            # that answer would bring the znode back.
            handler.completion_queue.put(partial(self._tasks.put, partial(self._removed, path)))

    def _on_state(self, state: str) -> bool:
        """kazoo's connection thread: the session's state changed."""
        if self._closed:
            return True  # kazoo drops a listener that returns True
        if state == KazooState.CONNECTED:
            self._tasks.put(self._resync)
        return False

    # ---- the tree's thread -------------------------------------------------------------------

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            try:
                task()
            except Exception:
                log.exception("watched tree %s: a task failed", self._root)

    def _resync(self) -> None:
        """Add the watch (again) and read the whole tree."""
        if self._closed or self._fallback is not None:
            return
        self._sync += 1
        self._sync_pending = 0
        self._sync_failed = False
        self._seen = set()
        added = self._client.handler.async_result()
        self._client._call(AddWatch(self._chrooted(self._root), PERSISTENT_RECURSIVE), added)
        self._ask(added, partial(self._watch_added, self._sync))
        self._walk(self._root, self._sync)

    def _watch_added(self, sync: int, result: Any) -> None:
        if result.successful():
            return
        if isinstance(result.exception, UnimplementedError):
            self._use_tree_cache("ZooKeeper before 3.6 has no persistent watches:")
        elif sync == self._sync:
            self._sync_failed = True

    def _walk(self, path: str, sync: int) -> None:
        self._sync_pending += 2
        self._read(path, sync)
        self._ask(self._client.get_children_async(path), partial(self._children, path, sync))

    def _read(self, path: str, sync: int) -> None:
        """Read one znode; `sync`: the full read it belongs to, 0 for an event's read."""
        self._ask(self._client.get_async(path), partial(self._answered, path, sync))

    def _ask(self, result: Any, then: Callable[[Any], None]) -> None:
        """A request was sent (`result`, kazoo's handle); `then` applies its answer here."""
        if self._fallback is not None:
            return
        self._in_flight += 1
        result.rawlink(lambda answered: self._tasks.put(partial(self._answer, then, answered)))

    def _answer(self, then: Callable[[Any], None], result: Any) -> None:
        self._in_flight -= 1
        if self._fallback is None and not self._closed:
            then(result)

    def _children(self, path: str, sync: int, result: Any) -> None:
        if sync != self._sync:
            return
        if result.successful():
            for child in result.value:
                self._walk(self._join(path, child), sync)
        elif not isinstance(result.exception, NoNodeError):
            self._sync_failed = True
        self._walked()

    def _answered(self, path: str, sync: int, result: Any) -> None:
        if result.successful():
            data, stat = result.value
            if self._sync_pending > 0:
                self._seen.add(path)
            known = self._nodes.get(path)
            if known is None:
                self._store(TreeEvent.NODE_ADDED, NodeData.make(path, data, stat))
            elif _changed(known.stat, stat):
                self._store(TreeEvent.NODE_UPDATED, NodeData.make(path, data, stat))
        elif isinstance(result.exception, NoNodeError):
            gone = self._nodes.pop(path, None)
            if gone is not None:
                self._tell(TreeEvent.make(TreeEvent.NODE_REMOVED, gone))
        elif sync == self._sync:
            self._sync_failed = True
        # An event's read that fails otherwise lost its connection: the reconnection
        # reads the whole tree again.
        if sync == self._sync:
            self._walked()

    def _removed(self, path: str) -> None:
        """A deletion event, in order with the answers (see `heard`)."""
        if self._closed or self._fallback is not None:
            return
        gone = self._nodes.pop(path, None)
        if gone is not None:
            self._tell(TreeEvent.make(TreeEvent.NODE_REMOVED, gone))

    def _walked(self) -> None:
        """One read of the current full read is answered."""
        self._sync_pending -= 1
        if self._sync_pending > 0:
            return
        if self._sync_failed:
            # Not every znode was read: removing what was not seen would be wrong. The
            # connection's return reads again; when it did not drop, try again soon.
            log.info("watched tree %s: a full read failed; reading it again", self._root)
            retry = threading.Timer(RETRY_PAUSE, self._tasks.put, (self._resync,))
            retry.daemon = True
            retry.start()
            return
        gone = [path for path in self._nodes if path not in self._seen]
        for path in sorted(gone, key=lambda p: p.count("/"), reverse=True):
            self._tell(TreeEvent.make(TreeEvent.NODE_REMOVED, self._nodes.pop(path)))
        self._seen = set()
        if not self._initialized:
            self._initialized = True
            self._tell(TreeEvent.make(TreeEvent.INITIALIZED, None))

    def _store(self, kind: int, node: NodeData) -> None:
        self._nodes[node.path] = node
        self._tell(TreeEvent.make(kind, node))

    def _tell(self, event: Any) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                log.exception("watched tree %s: a listener failed", self._root)

    @staticmethod
    def _join(parent: str, child: str) -> str:
        return f"{parent}/{child}" if parent != "/" else f"/{child}"

    def _chrooted(self, path: str) -> str:
        chroot = self._client.chroot or ""
        return chroot + path if path != "/" else (chroot or "/")

    def _use_tree_cache(self, why: str) -> None:
        log.warning("watched tree %s: %s a kazoo TreeCache follows it", self._root, why)
        tree = TreeCache(self._client, self._root)
        for listener in self._listeners:
            tree.listen(listener)
        self._fallback = tree
        tree.start()


def _changed(known: Any, stat: Any) -> bool:
    """A znode read again differs from what was known: written since, or made again."""
    return known is None or (known.mzxid, known.czxid) != (stat.mzxid, stat.czxid)
