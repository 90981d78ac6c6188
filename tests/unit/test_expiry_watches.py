"""Which queues the expiry reaper watches (gateway/expiry_reaper.py `_refresh`), fed by a
topology cache filled by hand: a change to one queue looks at that queue only; a change
that may concern every queue (a policy) looks at all of them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from starlight_py.gateway.expiry_reaper import ExpiryReaper, _Watch
from starlight_py.metadata.cache import TopologyCache
from starlight_py.metadata.records import Paths, encode
from starlight_py.metadata.zookeeper import ZooKeeperClient
from starlight_py.model.policies import Policy
from starlight_py.model.topology import Queue

PATHS = Paths("/starlight")


@pytest.fixture
def cache() -> Iterator[TopologyCache]:
    zookeeper = ZooKeeperClient("127.0.0.1:1")  # never started, never connects
    yield TopologyCache(zookeeper, PATHS)
    zookeeper.kazoo.close()


class CountingCache:
    """The cache, counting how often every queue is listed."""

    def __init__(self, cache: TopologyCache) -> None:
        self.cache = cache
        self.listed = 0

    def queues(self) -> list[tuple[str, Queue]]:
        self.listed += 1
        return self.cache.queues()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cache, name)


def put(cache: TopologyCache, path: str, record: object) -> None:
    cache._apply(path[len(PATHS.vhosts) + 1 :].split("/"), encode(record))


def remove(cache: TopologyCache, path: str) -> None:
    cache._apply(path[len(PATHS.vhosts) + 1 :].split("/"), None)


def reaper(cache: CountingCache) -> ExpiryReaper:
    made = ExpiryReaper(
        cache,  # type: ignore[arg-type]
        topology=None,  # type: ignore[arg-type]
        backend=None,  # type: ignore[arg-type]
        producers=None,  # type: ignore[arg-type]
        requeued=None,  # type: ignore[arg-type]
        proxy_id="p",
        leading=lambda: True,
    )
    made._leading = True
    return made


def watched(made: ExpiryReaper) -> set[tuple[str, str]]:
    return set(made._watches)


def test_a_queue_change_looks_at_that_queue_only(cache: TopologyCache) -> None:
    counting = CountingCache(cache)
    made = reaper(counting)
    put(cache, PATHS.queue("/", "ttl"), Queue("ttl", arguments={"x-message-ttl": 1000}))
    put(cache, PATHS.queue("/", "plain"), Queue("plain"))
    made._refresh(0.0)  # the first refresh looks at every queue
    assert watched(made) == {("/", "ttl")} and counting.listed == 1

    put(cache, PATHS.queue("/", "dlx"), Queue("dlx", arguments={"x-dead-letter-exchange": "d"}))
    made._topology_changed(("/", "dlx"))
    made._refresh(1.0)
    assert watched(made) == {("/", "ttl"), ("/", "dlx")}
    assert counting.listed == 1  # no listing of every queue for one declared

    remove(cache, PATHS.queue("/", "ttl"))
    made._topology_changed(("/", "ttl"))
    made._refresh(2.0)
    assert watched(made) == {("/", "dlx")} and counting.listed == 1


def test_a_change_to_every_queue_looks_at_every_queue(cache: TopologyCache) -> None:
    counting = CountingCache(cache)
    made = reaper(counting)
    put(cache, PATHS.queue("/", "orders"), Queue("orders"))
    made._refresh(0.0)
    assert watched(made) == set()

    policy = Policy("/", "ttl", "^orders$", {"message-ttl": 500}, "queues")
    put(cache, PATHS.policy("/", "ttl"), policy)
    made._topology_changed(None)
    made._refresh(1.0)
    assert watched(made) == {("/", "orders")} and counting.listed == 2


def test_a_busy_watch_of_a_deleted_queue_goes_once_its_look_is_over(
    cache: TopologyCache,
) -> None:
    made = reaper(CountingCache(cache))
    put(cache, PATHS.queue("/", "ttl"), Queue("ttl", arguments={"x-message-ttl": 1000}))
    made._refresh(0.0)
    made._watches[("/", "ttl")].busy = True
    remove(cache, PATHS.queue("/", "ttl"))
    made._topology_changed(("/", "ttl"))
    made._refresh(1.0)
    assert watched(made) == {("/", "ttl")}  # not while its look runs
    made._watches[("/", "ttl")].busy = False
    made._refresh(2.0)  # no other change: the key was kept for this refresh
    assert watched(made) == set()


def test_a_hinted_queue_stays_watched_until_its_hint_is_served(cache: TopologyCache) -> None:
    made = reaper(CountingCache(cache))
    made._leading = False
    put(cache, PATHS.queue("/", "plain"), Queue("plain"))
    made._watches[("/", "plain")] = _Watch("/", "plain", 5.0, hinted=True)
    made._topology_changed(("/", "plain"))
    made._refresh(0.0)
    assert watched(made) == {("/", "plain")}
    made._watches[("/", "plain")].hinted = False
    made._topology_changed(("/", "plain"))
    made._refresh(1.0)
    assert watched(made) == set()
