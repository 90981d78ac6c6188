"""The proxy registry: each proxy announces itself with an ephemeral znode, so operators
(`starlight-admin`) can list the live proxies, and the znode disappears with the proxy's
ZooKeeper session when it dies."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass

from starlight_py.metadata.ephemeral import EphemeralNodes
from starlight_py.metadata.records import Paths
from starlight_py.metadata.zookeeper import NodeAlreadyExists, ZooKeeperClient

log = logging.getLogger("starlight.cluster")


@dataclass(frozen=True)
class ProxyRecord:
    id: str
    host: str
    pid: int
    version: str
    listeners: tuple[str, ...]
    started_at: float

    def encode(self) -> bytes:
        body = asdict(self)
        body["schema"] = 1
        body["kind"] = "proxy"
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> ProxyRecord:
        body = json.loads(data)
        return cls(
            id=str(body["id"]),
            host=str(body["host"]),
            pid=int(body["pid"]),
            version=str(body["version"]),
            listeners=tuple(str(u) for u in body["listeners"]),
            started_at=float(body["started_at"]),
        )


def register_proxy(
    zk: ZooKeeperClient, paths: Paths, ephemerals: EphemeralNodes, record: ProxyRecord
) -> None:
    """Announce this proxy (ephemeral; made again after a new session). Raises
    MetadataUnavailable."""
    zk.ensure_path(paths.proxies)
    path = paths.proxy(record.id)
    data = record.encode()
    try:
        zk.create(path, data, ephemeral=True)
    except NodeAlreadyExists:
        zk.set(path, data)
    ephemerals.remember(path, data)
    log.info("registered proxy %s in ZooKeeper", record.id)


def live_proxies(zk: ZooKeeperClient, paths: Paths) -> list[ProxyRecord]:
    """The proxies registered now (unreadable records are skipped)."""
    records = []
    for child in sorted(zk.children(paths.proxies)):
        found = zk.get(f"{paths.proxies}/{child}")
        if found is None:
            continue
        try:
            records.append(ProxyRecord.decode(found[0]))
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable proxy record %s", child)
    return records


def uptime(record: ProxyRecord) -> float:
    return max(0.0, time.time() - record.started_at)
