"""ZooKeeperClient.read against a real ZooKeeper: many reads in one multiRead request,
answered as the reads one at a time answer, missing znodes included."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from starlight_py.local import ServiceEndpoints
from starlight_py.metadata.multi_read import Children, Data
from starlight_py.metadata.zookeeper import ZooKeeperClient


@pytest.fixture
def zk(services: ServiceEndpoints) -> Iterator[ZooKeeperClient]:
    client = ZooKeeperClient(services.zookeeper)
    client.start()
    yield client
    client.stop()


@pytest.fixture
def root(zk: ZooKeeperClient) -> Iterator[str]:
    path = f"/multi-read-test/{uuid.uuid4().hex}"
    zk.ensure_path(f"{path}/a/b")
    zk.ensure_path(f"{path}/a/c")
    zk.set(f"{path}/a", b"record")
    zk.set(f"{path}/a", b"record, again")
    yield path
    zk.kazoo.delete(path, recursive=True)


def test_one_request_answers_data_children_and_missing_znodes(
    zk: ZooKeeperClient, root: str
) -> None:
    reads = [
        Data(f"{root}/a"),
        Children(f"{root}/a"),
        Data(f"{root}/missing"),
        Children(f"{root}/missing"),
        Children(root),
        Data(f"{root}/a/b"),
    ]
    found = zk.read(reads)
    assert zk.multi_read, "ZooKeeper 3.6 or later answers multiRead"
    assert found.data(f"{root}/a") == (b"record, again", 2)
    assert sorted(found.children(f"{root}/a")) == ["b", "c"]
    assert found.data(f"{root}/missing") is None
    assert found.children(f"{root}/missing") == []
    assert found.children(root) == ["a"]
    assert found.data(f"{root}/a/b") == (b"", 0)

    zk.multi_read = False  # what a server before 3.6 gets: the same answers, one read each
    again = zk.read(reads)
    for read in reads:
        if isinstance(read, Data):
            assert again.data(read.path) == found.data(read.path)
        else:
            assert sorted(again.children(read.path)) == sorted(found.children(read.path))


def test_reads_of_many_znodes_fit_one_request(zk: ZooKeeperClient, root: str) -> None:
    for i in range(300):
        zk.create(f"{root}/a/b/n{i:03d}", f"value {i}".encode())
    names = zk.children(f"{root}/a/b")
    found = zk.read([Data(f"{root}/a/b/{name}") for name in names])
    assert {name: found.data(f"{root}/a/b/{name}") for name in names} == {
        f"n{i:03d}": (f"value {i}".encode(), 0) for i in range(300)
    }
