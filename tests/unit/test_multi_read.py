"""The multiRead request (metadata/multi_read.py): its bytes, the answers it reads, and
ZooKeeperClient.read falling back to one read at a time on a server without it. Against a
real ZooKeeper: tests/integration/test_zookeeper_multi_read.py."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss, NoNodeError, UnimplementedError
from kazoo.protocol.serialization import ZnodeStat, stat_struct

from starlight_py.metadata.multi_read import Children, Data, MultiRead
from starlight_py.metadata.zookeeper import MetadataUnavailable, ZooKeeperClient


def header(op: int, done: bool, err: int) -> bytes:
    return struct.pack("!i?i", op, done, err)


def string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("!i", len(raw)) + raw


def test_the_request_lists_each_read_without_a_watch_and_ends_with_done() -> None:
    request = MultiRead(["/a", "/b"], [Data.op, Children.op])
    assert request.type == 22
    assert bytes(request.serialize()) == (
        header(4, False, -1)
        + string("/a")
        + b"\x00"
        + header(8, False, -1)
        + string("/b")
        + b"\x00"
        + header(-1, True, -1)
    )


def test_the_answers_come_in_order_with_a_failed_read_as_its_exception() -> None:
    stat = ZnodeStat(1, 2, 3, 4, 7, 0, 0, 0, 5, 0, 2)
    answer = (
        header(4, False, 0)
        + string("data")
        + stat_struct.pack(*stat)
        + header(8, False, 0)
        + struct.pack("!i", 2)
        + string("x")
        + string("y")
        + header(-1, False, NoNodeError.code)
        + struct.pack("!i", NoNodeError.code)
        + header(-1, True, -1)
    )
    found = MultiRead.deserialize(answer, 0)
    assert found[0] == (b"data", stat)
    assert found[1] == ["x", "y"]
    assert isinstance(found[2], NoNodeError)


class Unanswered:
    """A kazoo async result that failed with `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def get(self, timeout: float | None = None) -> Any:
        raise self.error


class OldServer(ZooKeeperClient):
    """A client whose server has no multiRead, and answers single reads from a dict."""

    def __init__(self, nodes: dict[str, tuple[bytes, list[str]]]) -> None:
        super().__init__("127.0.0.1:1")
        self.nodes = nodes
        self.multi_reads = 0

    def _multi_read_async(self, reads: Any) -> Any:
        self.multi_reads += 1
        return Unanswered(UnimplementedError())

    def get(self, path: str) -> tuple[bytes, int] | None:
        found = self.nodes.get(path)
        return None if found is None else (found[0], 0)

    def children(self, path: str) -> list[str]:
        found = self.nodes.get(path)
        return [] if found is None else found[1]


def test_a_server_without_multi_read_is_read_one_znode_at_a_time_from_then_on() -> None:
    zk = OldServer({"/q": (b"queue", ["bindings"])})
    reads = [Data("/q"), Children("/q"), Data("/gone"), Children("/gone")]
    for _ in range(2):
        found = zk.read(reads)
        assert found.data("/q") == (b"queue", 0)
        assert found.children("/q") == ["bindings"]
        assert found.data("/gone") is None
        assert found.children("/gone") == []
    assert zk.multi_reads == 1
    assert zk.multi_read is False


def test_other_failures_of_a_multi_read_are_raised() -> None:
    zk = OldServer({})
    zk._multi_read_async = lambda reads: Unanswered(ConnectionLoss())  # type: ignore[method-assign]
    with pytest.raises(MetadataUnavailable):
        zk.read([Data("/a"), Data("/b")])
    assert zk.multi_read is True
