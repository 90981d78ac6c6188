"""Password users in ZooKeeper: one znode per user under `{root}/v1/users` (records.py,
docs/metadata.md), holding the `User` (name, RabbitMQ password hash, tags).

`UserStore` calls block (ZooKeeper round trips) and raise MetadataUnavailable when ZooKeeper
does not answer and RecordError when a znode holds data this version cannot read;
`starlight-admin`, the management API and definitions imports use it. Logins read each
user from ZooKeeper (a changed password counts at once), and `UserCache`, a watched copy,
when ZooKeeper does not answer.
"""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Callable
from typing import Any

from kazoo.recipe.cache import TreeEvent

from starlight_py.metadata.cache import name_of
from starlight_py.metadata.permissions import PermissionStore
from starlight_py.metadata.records import Paths, RecordError, decode, encode
from starlight_py.metadata.watched_tree import WatchedTree
from starlight_py.metadata.zookeeper import (
    MetadataUnavailable,
    NodeAlreadyExists,
    NodeMissing,
    ZooKeeperClient,
    start_tree_cache,
)
from starlight_py.model.permissions import FULL_PERMISSION
from starlight_py.model.users import ADMINISTRATOR_TAG, DEFAULT_PASSWORD, DEFAULT_USER, User

log = logging.getLogger("starlight.users")


class UserExists(Exception):
    """`add` of a name that is taken."""


class NoSuchUser(Exception):
    """A change to a user that does not exist."""


class UserStore:
    """Reads and writes `User`s."""

    def __init__(self, zk: ZooKeeperClient, paths: Paths) -> None:
        self._zk = zk
        self._paths = paths

    def add(self, user: User) -> None:
        """Create `user`; raises UserExists when the name is taken."""
        self._zk.ensure_path(self._paths.users)
        try:
            self._zk.create(self._paths.user(user.name), encode(user))
        except NodeAlreadyExists:
            raise UserExists(f"user '{user.name}' already exists") from None

    def put(self, user: User) -> bool:
        """Create or replace `user`; True when it was created."""
        path = self._paths.user(user.name)
        data = encode(user)
        for _ in range(5):
            try:
                self._zk.set(path, data)
                return False
            except NodeMissing:
                pass
            try:
                self.add(user)
                return True
            except UserExists:
                continue  # created concurrently: replace it
        raise MetadataUnavailable(f"could not write {path}: it kept changing under us")

    def replace(self, user: User) -> None:
        """Replace an existing user; raises NoSuchUser."""
        try:
            self._zk.set(self._paths.user(user.name), encode(user))
        except NodeMissing:
            raise NoSuchUser(f"no such user '{user.name}'") from None

    def delete(self, name: str) -> None:
        """Raises NoSuchUser."""
        try:
            self._zk.delete(self._paths.user(name))
        except NodeMissing:
            raise NoSuchUser(f"no such user '{name}'") from None

    def get(self, name: str) -> User | None:
        found = self._zk.get(self._paths.user(name))
        return None if found is None else _user(found[0])

    def list(self) -> builtins.list[User]:
        """Every user, sorted by name."""
        users = []
        for child in self._zk.children(self._paths.users):
            found = self._zk.get(f"{self._paths.users}/{child}")
            if found is not None:  # else deleted while we listed
                users.append(_user(found[0]))
        users.sort(key=lambda user: user.name)
        return users


def _user(data: bytes) -> User:
    record = decode(data)
    if not isinstance(record, User):
        raise RecordError(f"not a user record: {type(record).__name__}")
    return record


class UserCache:
    """The watched, in-memory copy of every user, for logins: they ask ZooKeeper
    (`lookup(fresh=True)`), so a user added, deleted or a password changed a moment ago
    counts at once, and fall back on this copy while ZooKeeper is away, so clients keep
    logging in through an outage.

    `on_removed(name)` is called (on the watched tree's thread) when a user is deleted, so that the
    proxy closes its connections, as RabbitMQ does.

    Thread-safe: events arrive on the watched tree's thread, reads come from any thread.
    """

    def __init__(
        self,
        zk: ZooKeeperClient,
        paths: Paths,
        on_removed: Callable[[str], None] | None = None,
    ) -> None:
        self.on_removed = on_removed
        self._store = UserStore(zk, paths)
        self._prefix = paths.users + "/"
        self._tree = WatchedTree(zk.kazoo, paths.users)
        self._lock = threading.Lock()
        self._users: dict[str, User] = {}
        self.ready = threading.Event()

    def start(self) -> None:
        """Blocks until ZooKeeper answers the first reads."""
        self._tree.listen(self._on_event)
        start_tree_cache(self._tree, "the users cache")

    def close(self) -> None:
        self._tree.close()

    def lookup(self, name: str, fresh: bool = False) -> User | None:
        """The user, from the cache, or from ZooKeeper when `fresh` or the cache is not
        loaded yet (blocks then; when ZooKeeper does not answer, the cache decides once it
        is loaded, else MetadataUnavailable is raised)."""
        ready = self.ready.is_set()
        if ready and not fresh:
            with self._lock:
                return self._users.get(name)
        try:
            return self._store.get(name)
        except MetadataUnavailable:
            if not ready:
                raise
            with self._lock:
                return self._users.get(name)

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
        if not path.startswith(self._prefix) or "/" in path[len(self._prefix) :]:
            return
        name = name_of(path[len(self._prefix) :])
        if event.event_type == TreeEvent.NODE_REMOVED:
            with self._lock:
                self._users.pop(name, None)
            if self.on_removed is not None:
                self.on_removed(name)
            return
        try:
            user = _user(event.event_data.data)
        except RecordError as e:
            log.warning("ignoring unreadable user znode %s: %s", path, e)
            with self._lock:
                self._users.pop(name, None)
            return
        with self._lock:
            self._users[name] = user


def delete_user(users: UserStore, permissions: PermissionStore, name: str) -> None:
    """Delete the user and, as RabbitMQ's delete_user does, its permissions in every vhost.
    Raises NoSuchUser (and then touches no permission)."""
    users.delete(name)
    for vhost, principal, _ in permissions.list():
        if principal == name:
            permissions.clear(vhost, principal)


def create_default_user(users: UserStore, permissions: PermissionStore) -> bool:
    """A fresh RabbitMQ's `guest`/`guest`: tagged administrator, full permissions on vhost
    `/` (and, with loopbackUsers' default, only from loopback addresses). Only when there
    are no users at all; True when it was created."""
    if users.list():
        return False
    try:
        users.add(User.with_password(DEFAULT_USER, DEFAULT_PASSWORD, (ADMINISTRATOR_TAG,)))
    except UserExists:
        return False  # another starter made it
    permissions.set("/", DEFAULT_USER, FULL_PERMISSION)
    return True
