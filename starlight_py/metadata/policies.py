"""Policies in ZooKeeper: one record per policy under `{root}/v1/vhosts/{vhost}/policies`
(records.py, docs/metadata.md).

`PolicyStore` calls block (ZooKeeper round trips) and raise MetadataUnavailable when
ZooKeeper does not answer and RecordError when a znode holds data this version cannot read;
`starlight-admin`, the management API and definitions import use it. Proxies apply policies
through the topology cache (cache.py), which watches the same znodes.
"""

from __future__ import annotations

import builtins
import contextlib

from starlight_py.metadata.records import Paths, RecordError, decode, encode
from starlight_py.metadata.zookeeper import (
    MetadataUnavailable,
    NodeAlreadyExists,
    NodeMissing,
    ZooKeeperClient,
)
from starlight_py.model.policies import Policy

_WRITE_ATTEMPTS = 5


class PolicyStore:
    """Reads and writes the policies of vhosts; the caller checks that the vhost exists."""

    def __init__(self, zk: ZooKeeperClient, paths: Paths) -> None:
        self._zk = zk
        self._paths = paths

    def set(self, policy: Policy) -> bool:
        """Store `policy` (replacing one of the same name); True when it is new."""
        path = self._paths.policy(policy.vhost, policy.name)
        data = encode(policy)
        for _ in range(_WRITE_ATTEMPTS):
            try:
                self._zk.set(path, data)
                return False
            except NodeMissing:
                pass
            try:
                self._zk.ensure_path(self._paths.policies(policy.vhost))
                self._zk.create(path, data)
                return True
            except NodeAlreadyExists:
                continue  # a concurrent set created it
        raise MetadataUnavailable(f"could not write {path}: it kept changing under us")

    def clear(self, vhost: str, name: str) -> bool:
        """Remove a policy; False when there was none of that name."""
        try:
            self._zk.delete(self._paths.policy(vhost, name))
        except NodeMissing:
            return False
        return True

    def get(self, vhost: str, name: str) -> Policy | None:
        found = self._zk.get(self._paths.policy(vhost, name))
        return None if found is None else _record(found[0])

    def list(self, vhosts: builtins.list[str]) -> builtins.list[Policy]:
        """The policies of these vhosts, sorted by vhost, then name."""
        result = []
        for vhost in vhosts:
            parent = self._paths.policies(vhost)
            for child in self._zk.children(parent):
                with contextlib.suppress(NodeMissing):
                    found = self._zk.get(f"{parent}/{child}")
                    if found is not None:
                        result.append(_record(found[0]))
        result.sort(key=lambda p: (p.vhost, p.name))
        return result


def _record(data: bytes) -> Policy:
    record = decode(data)
    if not isinstance(record, Policy):
        raise RecordError(f"not a policy record: {type(record).__name__}")
    return record
