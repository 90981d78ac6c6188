"""A proxy's connection report is described, encoded and written only when what it shows
changed (cluster/connection_reports.py): an idle proxy with thousands of consumers does not
re-describe them every interval."""

from __future__ import annotations

from typing import Any

import trio

from starlight_py.cluster.connection_reports import ConnectionReports, decode_report
from starlight_py.metadata.records import Paths
from starlight_py.metadata.zookeeper import MetadataUnavailable, NodeMissing


class RecordingZooKeeper:
    """The three calls a report write makes, recorded; `down` makes them fail."""

    def __init__(self) -> None:
        self.nodes: dict[str, bytes] = {}
        self.writes = 0
        self.down = False

    def set(self, path: str, data: bytes) -> None:
        if self.down:
            raise MetadataUnavailable("ZooKeeper is away")
        if path not in self.nodes:
            raise NodeMissing(path)
        self.nodes[path] = data
        self.writes += 1

    def create(self, path: str, data: bytes, ephemeral: bool = False) -> None:
        self.nodes[path] = data
        self.writes += 1

    def ensure_path(self, path: str) -> None:
        pass


class Remembered:
    def remember(self, path: str, data: bytes) -> None:
        pass


class Proxy:
    """What the report describes: a list of connections, each a list of consumer tags."""

    def __init__(self) -> None:
        self.connections: list[list[str]] = [["ctag-1"]]
        self.described = 0

    def describe(self) -> list[dict[str, Any]]:
        self.described += 1
        return [
            {"connection": {"name": str(i)}, "consumers": c} for i, c in enumerate(self.connections)
        ]

    def state(self) -> tuple[tuple[str, ...], ...]:
        return tuple(tuple(c) for c in self.connections)


def reports(zk: RecordingZooKeeper, proxy: Proxy, with_state: bool = True) -> ConnectionReports:
    return ConnectionReports(
        zk,  # type: ignore[arg-type]
        Paths("/sl"),
        Remembered(),  # type: ignore[arg-type]
        "proxy-1",
        proxy.describe,
        lambda name, reason: False,
        proxy.state if with_state else None,
    )


def test_an_unchanged_proxy_is_not_described_again() -> None:
    zk, proxy = RecordingZooKeeper(), Proxy()
    writer = reports(zk, proxy)

    async def main() -> None:
        for _ in range(5):
            await writer.report_once()

    trio.run(main)
    assert (proxy.described, zk.writes) == (1, 1)
    _, written = decode_report(zk.nodes["/sl/v1/connections/proxy-1"])
    assert written == [{"connection": {"name": "0"}, "consumers": ["ctag-1"]}]


def test_a_change_is_described_and_written_once() -> None:
    zk, proxy = RecordingZooKeeper(), Proxy()
    writer = reports(zk, proxy)

    async def main() -> None:
        await writer.report_once()
        proxy.connections[0].append("ctag-2")
        await writer.report_once()
        await writer.report_once()

    trio.run(main)
    assert (proxy.described, zk.writes) == (2, 2)
    _, written = decode_report(zk.nodes["/sl/v1/connections/proxy-1"])
    assert written[0]["consumers"] == ["ctag-1", "ctag-2"]


def test_a_report_zookeeper_did_not_take_is_tried_again() -> None:
    zk, proxy = RecordingZooKeeper(), Proxy()
    writer = reports(zk, proxy)

    async def main() -> None:
        await writer.report_once()
        proxy.connections.append([])
        zk.down = True
        await writer.report_once()
        zk.down = False
        await writer.report_once()

    trio.run(main)
    assert (proxy.described, zk.writes) == (3, 2)
    _, written = decode_report(zk.nodes["/sl/v1/connections/proxy-1"])
    assert len(written) == 2


def test_without_a_state_every_pass_describes_but_writes_only_changes() -> None:
    zk, proxy = RecordingZooKeeper(), Proxy()
    writer = reports(zk, proxy, with_state=False)

    async def main() -> None:
        for _ in range(3):
            await writer.report_once()

    trio.run(main)
    assert (proxy.described, zk.writes) == (3, 1)
