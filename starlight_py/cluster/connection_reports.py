"""Every proxy's AMQP connections, channels and consumers, for the management API of any
proxy: each proxy writes what it holds to one ephemeral znode (zlib-compressed JSON, in
RabbitMQ's management shapes, gateway/connection/connection_report.py) every REPORT_INTERVAL when it
changed; the znode goes away with the proxy. A request to close a connection is a znode
under its proxy's `close_requests`, which that proxy watches, takes and carries out (320
CONNECTION_FORCED with the reason) at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import zlib
from collections.abc import Callable, Hashable
from typing import Any

import trio

from starlight_py.metadata.ephemeral import EphemeralNodes
from starlight_py.metadata.records import Paths
from starlight_py.metadata.zookeeper import (
    MetadataUnavailable,
    NodeAlreadyExists,
    NodeMissing,
    ZooKeeperClient,
)
from starlight_py.units import KIB, SECONDS

log = logging.getLogger("starlight.cluster")

# As RabbitMQ's statistics interval (collect_statistics_interval, 5 s): describing and
# encoding every connection, channel and consumer is most of an idle proxy's CPU when it
# holds thousands of them, so not every second.
REPORT_INTERVAL = 5 * SECONDS
# How often close requests are looked for while their watch is not set (ZooKeeper away at
# start), and with it, in case a change went unseen.
CLOSE_POLL_INTERVAL = 0.5 * SECONDS
CLOSE_RECHECK_INTERVAL = 30 * SECONDS
# ZooKeeper's default jute.maxbuffer is 1 MiB: stay well under it.
MAX_REPORT = 900 * KIB

Report = list[dict[str, Any]]  # one {"connection": {...}, "channels": [...], "consumers": [...]}


def encode_report(proxy_id: str, connections: Report) -> bytes:
    """The znode data; connections that do not fit are left out (and the count said)."""
    kept = list(connections)
    while True:
        body = {
            "schema": 1,
            "proxy": proxy_id,
            "connections": kept,
            "left_out": len(connections) - len(kept),
        }
        data = zlib.compress(json.dumps(body, separators=(",", ":")).encode())
        if len(data) <= MAX_REPORT or not kept:
            return data
        kept = kept[: len(kept) * 3 // 4]


def decode_report(data: bytes) -> tuple[str, Report]:
    """(proxy id, its connections); raises ValueError for data this version cannot read."""
    try:
        body = json.loads(zlib.decompress(data))
    except (zlib.error, json.JSONDecodeError) as e:
        raise ValueError(f"unreadable connection report: {e}") from e
    if not isinstance(body, dict) or not isinstance(body.get("connections"), list):
        raise ValueError("unreadable connection report")
    connections: Report = body["connections"]
    return str(body.get("proxy", "")), connections


def read_reports(zk: ZooKeeperClient, paths: Paths) -> list[tuple[str, Report]]:
    """(proxy id, its connections) for every live proxy that reported. Raises
    MetadataUnavailable."""
    found = []
    for child in sorted(zk.children(paths.connection_reports)):
        raw = zk.get(f"{paths.connection_reports}/{child}")
        if raw is None:
            continue
        try:
            found.append(decode_report(raw[0]))
        except ValueError:
            log.warning("ignoring unreadable connection report of %s", child)
    return found


def request_close(zk: ZooKeeperClient, paths: Paths, proxy: str, name: str, reason: str) -> None:
    """Ask `proxy` (its id, as read_reports gives it) to close connection `name`. Raises
    MetadataUnavailable."""
    zk.ensure_path(paths.close_requests(proxy))
    data = json.dumps({"name": name, "reason": reason}).encode()
    with contextlib.suppress(NodeAlreadyExists):
        zk.create(paths.close_request(proxy, name), data)


def take_close_requests(zk: ZooKeeperClient, paths: Paths, proxy_id: str) -> list[tuple[str, str]]:
    """(connection name, reason) of the requests for this proxy; each is taken once."""
    base = paths.close_requests(proxy_id)
    taken = []
    for child in zk.children(base):
        raw = zk.get(f"{base}/{child}")
        with contextlib.suppress(NodeMissing):
            zk.delete(f"{base}/{child}")
        if raw is None:
            continue
        try:
            body = json.loads(raw[0])
            taken.append((str(body["name"]), str(body.get("reason") or "")))
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable close request %s", child)
    return taken


class ConnectionReports:
    """Writes this proxy's report when it changes; carries out close requests."""

    def __init__(
        self,
        zk: ZooKeeperClient,
        paths: Paths,
        ephemerals: EphemeralNodes,
        proxy_id: str,
        describe: Callable[[], Report],
        close: Callable[[str, str], bool],
        state: Callable[[], Hashable] | None = None,
    ) -> None:
        """`state`: a cheap token of what `describe` would show (the proxy's count of
        changes to it); while it does not change the report is neither described nor
        encoded again."""
        self.zk = zk
        self.paths = paths
        self.ephemerals = ephemerals
        self.proxy_id = proxy_id
        self.describe = describe  # runs on trio's thread: reads the live connections
        self.close = close  # (name, reason) -> whether this proxy had the connection
        self.state = state
        self._written: bytes | None = None
        self._reported_state: Hashable = None  # `state` when the report was last written
        self._close_requested = trio.Event()  # set when the close requests changed

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._report_forever)
            nursery.start_soon(self._close_forever)

    async def _report_forever(self) -> None:
        while True:
            await self.report_once()
            await trio.sleep(REPORT_INTERVAL)

    async def report_once(self) -> None:
        """Describe, encode and write the report, unless nothing it shows changed since it
        was last written."""
        state = self.state() if self.state is not None else None
        if state is not None and state == self._reported_state and self._written is not None:
            return
        data = encode_report(self.proxy_id, self.describe())
        if data != self._written:
            try:
                # Abandoned on cancel: a shutdown does not wait for an absent ZooKeeper.
                await trio.to_thread.run_sync(self.write, data, abandon_on_cancel=True)
            except MetadataUnavailable as e:
                log.debug("connection report not written yet: %s", e)
                return
        self._reported_state = state

    def write(self, data: bytes) -> None:
        """Blocking. Raises MetadataUnavailable."""
        path = self.paths.connection_report(self.proxy_id)
        try:
            self.zk.set(path, data)
        except NodeMissing:
            self.zk.ensure_path(self.paths.connection_reports)
            try:
                self.zk.create(path, data, ephemeral=True)
            except NodeAlreadyExists:
                self.zk.set(path, data)
        self.ephemerals.remember(path, data)
        self._written = data

    def _wake_closer(self) -> None:
        """On trio's thread: close requests came (the event of the closer's current wait)."""
        self._close_requested.set()

    async def _close_forever(self) -> None:
        token = trio.lowlevel.current_trio_token()

        def changed(children: list[str]) -> None:
            # On kazoo's event thread.
            if children:
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(self._wake_closer)

        watching = False
        while True:
            if not watching:
                try:
                    await trio.to_thread.run_sync(
                        self.zk.watch_children,
                        self.paths.close_requests(self.proxy_id),
                        changed,
                        abandon_on_cancel=True,
                    )
                    watching = True
                except MetadataUnavailable:
                    pass
            with trio.move_on_after(CLOSE_RECHECK_INTERVAL if watching else CLOSE_POLL_INTERVAL):
                await self._close_requested.wait()
            self._close_requested = trio.Event()
            try:
                requests = await trio.to_thread.run_sync(
                    take_close_requests, self.zk, self.paths, self.proxy_id, abandon_on_cancel=True
                )
            except MetadataUnavailable:
                continue
            for name, reason in requests:
                if not self.close(name, reason):
                    log.info("close request for %r: no such connection here", name)
