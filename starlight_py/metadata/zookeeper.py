"""A thin, typed wrapper over kazoo: every call bounded by a timeout, every kazoo exception
translated to one of ours, multi-op transactions as lists of plain operations.

Calls block; the gateway runs them in worker threads. A ZooKeeper that is down or
unreachable makes calls fail with MetadataUnavailable after `operation_timeout`, never hang.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    SessionExpiredError,
    UnimplementedError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.watchers import ChildrenWatch
from kazoo.retry import KazooRetry

from starlight_py.metadata.kazoo_handler import PollingThreadingHandler
from starlight_py.metadata.multi_read import Children, Data, MultiRead, Read, ReadAnswer
from starlight_py.units import SECONDS

log = logging.getLogger("starlight.zookeeper")


class MetadataUnavailable(Exception):
    """ZooKeeper did not answer in time (down, unreachable, session lost)."""


class NodeMissing(Exception):
    """The znode does not exist."""


class NodeAlreadyExists(Exception):
    """The znode exists already."""


class VersionConflict(Exception):
    """The znode changed since it was read (compare-and-set lost)."""


class NodeNotEmpty(Exception):
    """The znode still has children."""


class TransactionFailed(Exception):
    """One operation of a multi-op transaction failed; none was applied."""

    def __init__(self, index: int, operation: Op, cause: Exception) -> None:
        super().__init__(f"operation {index} ({operation}) failed: {type(cause).__name__}")
        self.index = index
        self.operation = operation
        self.cause = cause


@dataclass(frozen=True)
class Create:
    path: str
    data: bytes = b""
    # Ephemeral: owned by this process's session, gone when the session ends.
    ephemeral: bool = False


@dataclass(frozen=True)
class SetData:
    path: str
    data: bytes
    version: int


@dataclass(frozen=True)
class Delete:
    path: str
    version: int = -1


@dataclass(frozen=True)
class Check:
    path: str
    version: int


Op = Create | SetData | Delete | Check


class Startable(Protocol):
    def start(self) -> None: ...


_TRANSLATED: tuple[tuple[type[Exception], type[Exception]], ...] = (
    (NoNodeError, NodeMissing),
    (NodeExistsError, NodeAlreadyExists),
    (BadVersionError, VersionConflict),
    (NotEmptyError, NodeNotEmpty),
)


def _translate(error: Exception) -> Exception:
    for theirs, ours in _TRANSLATED:
        if isinstance(error, theirs):
            return ours(str(error) or theirs.__name__)
    return MetadataUnavailable(f"ZooKeeper error: {type(error).__name__}: {error}")


class ReadAnswers:
    """What ZooKeeperClient.read found, by path."""

    def __init__(self, found: dict[tuple[str, int], tuple[bytes, int] | list[str] | None]) -> None:
        self._found = found

    def data(self, path: str) -> tuple[bytes, int] | None:
        """(data, version) of a `Data` read, or None when the znode does not exist."""
        value = self._found[(path, Data.op)]
        assert value is None or isinstance(value, tuple)
        return value

    def children(self, path: str) -> list[str]:
        """The child names of a `Children` read, empty when the znode does not exist."""
        value = self._found[(path, Children.op)]
        assert isinstance(value, list)
        return value


def _read_answer(read: Read, answer: ReadAnswer) -> tuple[bytes, int] | list[str] | None:
    """One multiRead answer as ZooKeeperClient.get or .children answers."""
    if isinstance(answer, NoNodeError):
        return None if isinstance(read, Data) else []
    if isinstance(answer, Exception):
        raise _translate(answer) from answer
    if isinstance(read, Children):
        assert isinstance(answer, list)
        return answer
    assert isinstance(answer, tuple)
    data, stat = answer
    return data, stat.version


def start_tree_cache(tree: Startable, what: str) -> None:
    """Start a watched tree (metadata/watched_tree.py), even when ZooKeeper goes away
    meanwhile.

    A tree registers its session listener first, then makes sure its root exists and reads
    it; when the connection drops in between (ZooKeeper restarted right then), it raises.
    The tree is started anyway: its listener reads the whole tree again on reconnection, so
    it follows ZooKeeper once it is back, as after any other drop. Blocking; raises nothing
    but a KazooException not due to the connection (programming errors such as starting
    twice)."""
    try:
        tree.start()
    except (ConnectionLoss, ConnectionClosedError, SessionExpiredError, KazooTimeoutError) as e:
        log.warning(
            "%s: ZooKeeper went away while it started (%s); it follows ZooKeeper once it is back",
            what,
            type(e).__name__,
        )


class ZooKeeperClient:
    """One ZooKeeper session for the process."""

    def __init__(
        self,
        hosts: str,
        session_timeout: float = 30 * SECONDS,
        operation_timeout: float = 10 * SECONDS,
    ) -> None:
        self.hosts = hosts
        self.operation_timeout = operation_timeout
        self.session_timeout = session_timeout
        self.kazoo = KazooClient(
            hosts=hosts,
            handler=PollingThreadingHandler(),
            timeout=session_timeout,
            # Reconnect within a couple of seconds of ZooKeeper coming back (kazoo's
            # default back-off grows to a minute).
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2.0),
        )
        self.kazoo.add_listener(self._on_state)
        self._session_lost = False
        self._stopping = False
        self.multi_read = True  # False once the server answered multiRead UNIMPLEMENTED
        self._new_session_callbacks: list[Callable[[], object]] = []

    def on_new_session(self, callback: Callable[[], object]) -> None:
        """Call `callback` (in a thread of its own) whenever a session replaces one that was
        lost: the ephemeral znodes of the old session are gone and must be made again."""
        self._new_session_callbacks.append(callback)

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's event thread: never block it (no ZooKeeper calls here).
        if state == KazooState.SUSPENDED:
            log.warning("ZooKeeper connection to %s suspended", self.hosts)
        elif state == KazooState.LOST:
            self._session_lost = True
            if self._stopping:
                return
            log.warning(
                "ZooKeeper session with %s lost (its ephemeral znodes are gone)", self.hosts
            )
        else:
            log.info("ZooKeeper connected to %s", self.hosts)
            if self._session_lost:
                self._session_lost = False
                for callback in self._new_session_callbacks:
                    threading.Thread(
                        target=callback, name="zookeeper-new-session", daemon=True
                    ).start()

    @property
    def connected(self) -> bool:
        return bool(self.kazoo.connected)

    def start(self, timeout: float = 15 * SECONDS) -> None:
        """Connect; raises MetadataUnavailable when ZooKeeper does not answer in time."""
        try:
            self.kazoo.start(timeout=timeout)
        except KazooTimeoutError as e:
            self.kazoo.stop()
            raise MetadataUnavailable(f"cannot connect to ZooKeeper at {self.hosts}") from e

    def stop(self) -> None:
        self._stopping = True
        self.kazoo.stop()
        self.kazoo.close()

    def _wait(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs).get(timeout=self.operation_timeout)
        except SessionExpiredError:
            # Queued while disconnected and failed when the session turned out expired:
            # it never ran. Once kazoo has a new session, try it again (once).
            deadline = time.monotonic() + self.operation_timeout
            while not self.kazoo.connected and time.monotonic() < deadline:
                time.sleep(0.05)
            return self._wait_once(call, *args, **kwargs)
        except KazooTimeoutError as e:
            raise MetadataUnavailable(
                f"ZooKeeper at {self.hosts} did not answer within {self.operation_timeout:.0f} s"
            ) from e
        except KazooException as e:
            raise _translate(e) from e

    def _wait_once(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs).get(timeout=self.operation_timeout)
        except KazooTimeoutError as e:
            raise MetadataUnavailable(
                f"ZooKeeper at {self.hosts} did not answer within {self.operation_timeout:.0f} s"
            ) from e
        except KazooException as e:
            raise _translate(e) from e

    def get(self, path: str) -> tuple[bytes, int] | None:
        """(data, version), or None when the znode does not exist."""
        try:
            data, stat = self._wait(self.kazoo.get_async, path)
        except NodeMissing:
            return None
        return data, stat.version

    def read(self, reads: Sequence[Read]) -> ReadAnswers:
        """The reads' answers (`ReadAnswers.data`, `.children`). One request where
        ZooKeeper has multiRead (metadata/multi_read.py), else one request per read. The
        reads are not a snapshot: each sees its znode as it is when the server gets to it,
        as separate reads would."""
        if len(reads) > 1 and self.multi_read:
            try:
                answers = self._wait(self._multi_read_async, reads)
            except MetadataUnavailable as e:
                if not isinstance(e.__cause__, UnimplementedError):
                    raise
                log.info("ZooKeeper has no multiRead (before 3.6): reading one znode at a time")
                self.multi_read = False
            else:
                return ReadAnswers(
                    {
                        (r.path, r.op): _read_answer(r, a)
                        for r, a in zip(reads, answers, strict=True)
                    }
                )
        return ReadAnswers(
            {
                (r.path, r.op): self.get(r.path) if isinstance(r, Data) else self.children(r.path)
                for r in reads
            }
        )

    def _multi_read_async(self, reads: Sequence[Read]) -> Any:
        chroot = self.kazoo.chroot or ""
        request = MultiRead([chroot + r.path for r in reads], [r.op for r in reads])
        result = self.kazoo.handler.async_result()
        self.kazoo._call(request, result)
        return result

    def children(self, path: str) -> list[str]:
        """Child names; empty when the znode does not exist."""
        try:
            result: list[str] = self._wait(self.kazoo.get_children_async, path)
        except NodeMissing:
            return []
        return result

    def watch_children(self, path: str, callback: Callable[[list[str]], object]) -> None:
        """Call `callback` with the children of `path` now and whenever they change, on
        kazoo's event thread (never block there), across reconnections. Creates `path`."""
        self.ensure_path(path)
        try:
            ChildrenWatch(self.kazoo, path, callback)
        except Exception as e:
            raise _translate(e) from e

    def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False) -> None:
        """Raises NodeAlreadyExists, NodeMissing (parent), MetadataUnavailable."""
        self._wait(self.kazoo.create_async, path, data, ephemeral=ephemeral)

    def create_sequential(self, prefix: str, data: bytes = b"") -> str:
        """An ephemeral znode named `prefix` + a 10-digit sequence number; returns its
        path. Raises NodeMissing (parent), MetadataUnavailable."""
        path: str = self._wait(self.kazoo.create_async, prefix, data, ephemeral=True, sequence=True)
        return path

    def modified_at(self, path: str) -> float | None:
        """When the znode's data was last written (seconds since the epoch, ZooKeeper
        server clock); None when it does not exist."""
        try:
            _, stat = self._wait(self.kazoo.get_async, path)
        except NodeMissing:
            return None
        return float(stat.mtime) / 1000

    def ensure_path(self, path: str) -> None:
        """Create `path` and its parents as needed; raises MetadataUnavailable."""
        self._wait(self.kazoo.ensure_path_async, path)

    def set(self, path: str, data: bytes, version: int = -1) -> None:
        """Raises VersionConflict, NodeMissing, MetadataUnavailable."""
        self._wait(self.kazoo.set_async, path, data, version)

    def bump(self, path: str) -> int:
        """Write `path` (empty data, whatever its version), creating it when missing;
        returns its new version, which counts the writes. Raises NodeMissing (parent),
        MetadataUnavailable."""
        try:
            stat = self._wait(self.kazoo.set_async, path, b"", -1)
        except NodeMissing:
            try:
                self.create(path)
                return 0
            except NodeAlreadyExists:
                stat = self._wait(self.kazoo.set_async, path, b"", -1)
        return int(stat.version)

    def delete(self, path: str, version: int = -1) -> None:
        """Raises NodeMissing, VersionConflict, NodeNotEmpty, MetadataUnavailable."""
        self._wait(self.kazoo.delete_async, path, version)

    def commit(self, operations: Sequence[Op]) -> None:
        """Apply all operations atomically, or none; raises TransactionFailed naming the
        operation that failed, or MetadataUnavailable."""
        if not operations:
            return
        transaction = self.kazoo.transaction()
        for op in operations:
            if isinstance(op, Create):
                transaction.create(op.path, op.data, ephemeral=op.ephemeral)
            elif isinstance(op, SetData):
                transaction.set_data(op.path, op.data, op.version)
            elif isinstance(op, Delete):
                transaction.delete(op.path, op.version)
            else:
                transaction.check(op.path, op.version)
        results = self._wait(transaction.commit_async)
        for index, result in enumerate(results):
            if isinstance(result, Exception) and not isinstance(result, RolledBackError):
                raise TransactionFailed(index, operations[index], _translate(result))
