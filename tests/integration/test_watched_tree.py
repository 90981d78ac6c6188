"""The watched tree (metadata/watched_tree.py) against a real ZooKeeper: what it mirrors
after its first read, after changes, after its session is lost and made again, and how many
reads a growing parent costs."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.recipe.cache import TreeEvent

from starlight_py.local import ServiceEndpoints
from starlight_py.metadata.watched_tree import WatchedTree

WAIT = 20.0  # s
NODE_EVENTS = (TreeEvent.NODE_ADDED, TreeEvent.NODE_UPDATED, TreeEvent.NODE_REMOVED)


class Mirror:
    """What a tree's listener has been told: path -> data."""

    def __init__(self) -> None:
        self.nodes: dict[str, bytes] = {}
        self.events: list[tuple[int, str]] = []
        self.initialized = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, event: Any) -> None:
        if event.event_type == TreeEvent.INITIALIZED:
            self.initialized.set()
            return
        if event.event_type not in NODE_EVENTS:
            return
        path = event.event_data.path
        with self._lock:
            self.events.append((event.event_type, path))
            if event.event_type == TreeEvent.NODE_REMOVED:
                self.nodes.pop(path, None)
            else:
                self.nodes[path] = event.event_data.data

    def snapshot(self) -> dict[str, bytes]:
        with self._lock:
            return dict(self.nodes)


def actual(client: KazooClient, root: str) -> dict[str, bytes]:
    """The tree in ZooKeeper now."""
    found: dict[str, bytes] = {}

    def walk(path: str) -> None:
        data, _ = client.get(path)
        found[path] = data
        for child in client.get_children(path):
            walk(f"{path}/{child}")

    walk(root)
    return found


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT} s: {what}")
        time.sleep(0.02)


def _client(services: ServiceEndpoints) -> Iterator[KazooClient]:
    client = KazooClient(hosts=services.zookeeper)
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def writer(services: ServiceEndpoints) -> Iterator[KazooClient]:
    """Makes the changes."""
    yield from _client(services)


@pytest.fixture
def watcher(services: ServiceEndpoints) -> Iterator[KazooClient]:
    """The session the tree watches with."""
    yield from _client(services)


@pytest.fixture
def root(writer: KazooClient) -> Iterator[str]:
    path = f"/watched-tree-test/{uuid.uuid4().hex}"
    writer.ensure_path(path)
    yield path
    writer.delete(path, recursive=True)


def started(client: KazooClient, root: str, persistent: bool = True) -> tuple[WatchedTree, Mirror]:
    tree = WatchedTree(client, root, persistent=persistent)
    mirror = Mirror()
    tree.listen(mirror)
    tree.start()
    assert mirror.initialized.wait(WAIT), "the first read did not end"
    return tree, mirror


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent-watch", "tree-cache"])
def test_mirrors_the_tree_before_and_after_changes(
    writer: KazooClient, watcher: KazooClient, root: str, persistent: bool
) -> None:
    writer.create(f"{root}/a", b"1")
    writer.create(f"{root}/a/b", b"2")
    tree, mirror = started(watcher, root, persistent)
    try:
        assert tree.uses_persistent_watch is persistent
        assert mirror.snapshot() == actual(writer, root)

        writer.create(f"{root}/c", b"3")
        writer.create(f"{root}/c/d/e", b"4", makepath=True)
        writer.set(f"{root}/a", b"changed")
        writer.delete(f"{root}/a", recursive=True)
        writer.create(f"{root}/a", b"again")
        wait_for(lambda: mirror.snapshot() == actual(writer, root), "the mirror follows")
        assert mirror.snapshot()[f"{root}/a"] == b"again"
        assert f"{root}/a/b" not in mirror.snapshot()
    finally:
        tree.close()


def test_changes_while_the_session_is_away_are_caught_up(
    writer: KazooClient, watcher: KazooClient, root: str
) -> None:
    for name in ("kept", "deleted", "changed"):
        writer.create(f"{root}/{name}", name.encode())
    writer.create(f"{root}/deleted/child", b"x")
    tree, mirror = started(watcher, root)
    try:
        watcher.stop()  # the session ends: its watch with it
        writer.delete(f"{root}/deleted", recursive=True)
        writer.set(f"{root}/changed", b"new")
        writer.create(f"{root}/created", b"while away")
        watcher.start(timeout=30)
        wait_for(lambda: mirror.snapshot() == actual(writer, root), "the mirror catches up")
        # And the watch is in place again: a change after the return is followed.
        writer.create(f"{root}/after", b"back")
        wait_for(lambda: f"{root}/after" in mirror.snapshot(), "a change after the return")
        removed = {path for kind, path in mirror.events if kind == TreeEvent.NODE_REMOVED}
        assert removed == {f"{root}/deleted", f"{root}/deleted/child"}
    finally:
        tree.close()


def test_a_growing_parent_is_never_listed_again(
    writer: KazooClient, watcher: KazooClient, root: str
) -> None:
    """kazoo's TreeCache lists a parent's children again for each child added (N^2/2 names
    for N children); the watched tree reads each new znode once."""
    writer.create(f"{root}/queues", b"")
    tree, mirror = started(watcher, root)
    listed: list[str] = []
    read: list[str] = []
    list_children = watcher.get_children_async
    get = watcher.get_async

    def counting_list(path: str, *args: Any, **kwargs: Any) -> Any:
        listed.append(path)
        return list_children(path, *args, **kwargs)

    def counting_get(path: str, *args: Any, **kwargs: Any) -> Any:
        read.append(path)
        return get(path, *args, **kwargs)

    watcher.get_children_async = counting_list  # type: ignore[method-assign]
    watcher.get_async = counting_get  # type: ignore[method-assign]
    try:
        for i in range(200):
            writer.create(f"{root}/queues/q{i}", b"")
        wait_for(lambda: len(mirror.snapshot()) == 202, "200 children mirrored")
        assert listed == []
        assert sorted(read) == sorted(f"{root}/queues/q{i}" for i in range(200))
        assert tree.reads_in_flight() == 0
    finally:
        tree.close()


def test_deletions_cost_no_read_and_never_overtake_an_earlier_answer(
    writer: KazooClient, watcher: KazooClient, root: str
) -> None:
    """A deleted znode is removed without reading it, in order with the answers of the
    reads before it: znodes created, changed, deleted and made again in quick succession
    end as ZooKeeper holds them, never brought back by a late answer."""
    tree, mirror = started(watcher, root)
    read: list[str] = []
    get = watcher.get_async

    def counting_get(path: str, *args: Any, **kwargs: Any) -> Any:
        read.append(path)
        return get(path, *args, **kwargs)

    watcher.get_async = counting_get  # type: ignore[method-assign]
    try:
        for i in range(100):
            writer.create(f"{root}/gone{i}", b"x")
        wait_for(lambda: len(mirror.snapshot()) == 101, "100 children mirrored")
        reads_of_creations = len(read)
        for i in range(100):
            writer.delete(f"{root}/gone{i}")
        wait_for(lambda: len(mirror.snapshot()) == 1, "100 deletions mirrored")
        assert len(read) == reads_of_creations  # no read for a deletion
        assert tree.reads_in_flight() == 0

        # Churn: each znode is made, changed and deleted, most made again; writes go out
        # without waiting, so events and answers interleave.
        pending = []
        for i in range(300):
            path = f"{root}/churn{i % 20}"
            pending.append(writer.create_async(path, b"a"))
            pending.append(writer.set_async(path, f"b{i}".encode()))
            pending.append(writer.delete_async(path))
            if i % 3:
                pending.append(writer.create_async(path, f"c{i}".encode()))
        for result in pending:
            result.wait(WAIT)  # some fail (NoNode, NodeExists): part of the churn
        wait_for(lambda: mirror.snapshot() == actual(writer, root), "the churn mirrored")
    finally:
        tree.close()


def test_a_deletion_waits_behind_an_answer_read_before_it(
    writer: KazooClient, watcher: KazooClient, root: str
) -> None:
    """The race the ordering exists for, made certain: the answer to the read of a new
    znode is held in kazoo's completion queue while the znode is deleted; once released,
    the answer and then the deletion apply, and the znode is not brought back."""
    tree, mirror = started(watcher, root)
    reads: list[Any] = []
    get = watcher.get_async

    def recording_get(path: str, *args: Any, **kwargs: Any) -> Any:
        result = get(path, *args, **kwargs)
        reads.append(result)
        return result

    watcher.get_async = recording_get  # type: ignore[method-assign]
    stall = threading.Event()
    watcher.handler.completion_queue.put(lambda: stall.wait(WAIT))
    path = f"{root}/brief"
    try:
        writer.create(path, b"x")
        wait_for(lambda: bool(reads) and reads[-1].ready(), "the new znode read and answered")
        writer.delete(path)
        watcher.exists(root)  # answered after the deletion's event: the event was read
        stall.set()
        wait_for(lambda: tree.reads_in_flight() == 0, "the answer applied")
        watcher.sync(root)
        time.sleep(0.2)
        assert path not in mirror.snapshot()
        assert mirror.events[-2:] == [
            (TreeEvent.NODE_ADDED, path),
            (TreeEvent.NODE_REMOVED, path),
        ]
    finally:
        stall.set()
        tree.close()


def test_a_closed_tree_tells_nothing_more(
    writer: KazooClient, watcher: KazooClient, root: str
) -> None:
    tree, mirror = started(watcher, root)
    tree.close()
    writer.create(f"{root}/late", b"")
    time.sleep(0.5)
    assert f"{root}/late" not in mirror.snapshot()
    # Another tree on the same client still hears its events.
    other, other_mirror = started(watcher, root)
    try:
        writer.create(f"{root}/later", b"")
        wait_for(lambda: f"{root}/later" in other_mirror.snapshot(), "the second tree hears")
    finally:
        other.close()


def test_a_chrooted_client_follows_its_tree(
    services: ServiceEndpoints, writer: KazooClient
) -> None:
    """A ZooKeeper address with a chroot (`host:port/path`): the watch is asked for in the
    chroot, the events come back without it."""
    chroot = f"/watched-tree-chroot/{uuid.uuid4().hex}"
    writer.ensure_path(f"{chroot}/tree")
    client = KazooClient(hosts=f"{services.zookeeper}{chroot}")
    client.start(timeout=30)
    try:
        tree, mirror = started(client, "/tree")
        try:
            writer.create(f"{chroot}/tree/a", b"1")
            wait_for(lambda: mirror.snapshot().get("/tree/a") == b"1", "a chrooted create")
            writer.delete(f"{chroot}/tree/a")
            wait_for(lambda: "/tree/a" not in mirror.snapshot(), "a chrooted delete")
        finally:
            tree.close()
    finally:
        client.stop()
        client.close()
        writer.delete(chroot, recursive=True)
