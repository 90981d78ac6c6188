"""What each proxy does for the cluster while it serves: register itself, stand for the
SubscriptionCleaner election and run its passes when leading."""

from __future__ import annotations

import logging
import os
import socket
import time

import trio

from starlight_py import __version__
from starlight_py.cluster.cleaner import SubscriptionCleaner
from starlight_py.cluster.registry import ProxyRecord, register_proxy
from starlight_py.metadata.ephemeral import EphemeralNodes
from starlight_py.metadata.records import Paths
from starlight_py.metadata.zookeeper import MetadataUnavailable, ZooKeeperClient

log = logging.getLogger("starlight.cluster")

RETRY = 2.0  # seconds between attempts while ZooKeeper cannot be reached


async def cluster_duties(
    zk: ZooKeeperClient,
    paths: Paths,
    ephemerals: EphemeralNodes,
    proxy_id: str,
    urls: list[str],
    cleaner: SubscriptionCleaner | None,
    interval: float,
) -> None:
    """Runs until cancelled; ZooKeeper outages only delay it."""
    record = ProxyRecord(
        id=proxy_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        version=__version__,
        listeners=tuple(urls),
        started_at=time.time(),
    )
    while True:
        try:
            # Abandoned on cancel: a shutdown does not wait for ZooKeeper's timeout.
            await trio.to_thread.run_sync(
                register_proxy, zk, paths, ephemerals, record, abandon_on_cancel=True
            )
            break
        except MetadataUnavailable as e:
            log.warning("cannot register this proxy yet: %s", e)
            await trio.sleep(RETRY)
    if cleaner is None:
        return
    try:
        while True:
            try:
                await trio.to_thread.run_sync(cleaner.run_once)
            except MetadataUnavailable as e:
                log.warning("SubscriptionCleaner pass skipped: %s", e)
            except Exception:
                cleaner.stats.errors += 1
                log.exception("SubscriptionCleaner pass failed")
            await trio.sleep(interval)
    finally:
        with trio.CancelScope(shield=True):
            # Hand the lead over at once instead of after the session timeout.
            try:
                await trio.to_thread.run_sync(cleaner.election.resign)
            except Exception as e:
                log.debug("could not resign the cleaner election: %s", e)
