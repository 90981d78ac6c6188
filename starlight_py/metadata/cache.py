"""The watched, in-memory copy of the topology that every proxy keeps.

A watched tree (metadata/watched_tree.py) mirrors `{root}/v1/vhosts`; its events (on its
own thread) update plain
dictionaries behind a lock, indexed for routing: exchange -> the binding sets that read its
topics. Routing reads only this cache and never waits on ZooKeeper; declares and binds read
ZooKeeper itself (they must see the latest state). How fast a change reaches the other
proxies' caches is measured by tests/integration/test_topology_cluster.py (docs/metadata.md).

Policies (model/policies.py) are applied here: `queue()`, `exchange()` and the indexes hand
out records whose arguments are the declared ones combined with the one policy that applies,
so every feature that reads arguments follows policies, and a policy set on any proxy
reaches existing queues on every proxy as soon as the watch fires. Declares compare what
was declared, read from ZooKeeper, never these records.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar, TypeVar

from kazoo.recipe.cache import TreeEvent

from starlight_py.metadata.records import (
    BindingSet,
    ExchangeBinding,
    Paths,
    RecordError,
    RetiredSubscription,
    VhostRecord,
    decode,
)
from starlight_py.metadata.routing_barrier import ROUTING_VERSION
from starlight_py.metadata.watched_tree import WatchedTree
from starlight_py.metadata.zookeeper import ZooKeeperClient, start_tree_cache
from starlight_py.model import naming
from starlight_py.model.batch_share import UNBATCHED, queue_share, topic_share
from starlight_py.model.naming import unescape
from starlight_py.model.policies import (
    Policy,
    effective_exchange_arguments,
    effective_queue_arguments,
    matching_policy,
)
from starlight_py.model.priorities import max_priority_of
from starlight_py.model.queue_limits import LengthLimit
from starlight_py.model.route_index import ExchangeRoutes
from starlight_py.model.topology import Exchange, Queue

log = logging.getLogger("starlight.cache")

V = TypeVar("V")

WAIT_RECHECK = 0.05  # s: wait_until asks its predicate again at least this often
QueueChange = tuple[str, str] | None
"""What a change concerns (TopologyCache.on_change): (vhost, queue), or None: any queue."""
VERSION_CHECK_PAUSE = 0.0005  # s between looks for reads in flight (routing versions)


# A consumer's registered name (topology/queue_consumers.py) carries its prefetch: PREFETCH_MARK
# and the number, before the exclusive mark if any. gateway/consume/consuming.py writes it.
PREFETCH_MARK = "!p"
# "!x" is topology.service.EXCLUSIVE_MARK (metadata/ does not import topology/).
_PREFETCH_AT_END = re.compile(re.escape(PREFETCH_MARK) + r"([0-9]+)(?:!x)?$")


def consumer_prefetch(segment: str) -> int:
    """The prefetch a consumer's znode name (`segment`) carries (0: unlimited); 1 for a
    name without one (a proxy of an earlier version), which keeps its queue unbatched."""
    try:
        found = _PREFETCH_AT_END.search(unescape(segment))
    except ValueError:
        return 1
    return int(found.group(1)) if found else 1


def name_of(segment: str) -> str:
    """Inverse of records.segment: '~' is the empty name, '~2E'-dots are '.' and '..'."""
    if segment == "~":
        return ""
    if segment in ("~2E", "~2E~2E"):
        return "." * (len(segment) // 3)
    return unescape(segment)


class TopologyCache:
    def __init__(self, zookeeper: ZooKeeperClient, paths: Paths) -> None:
        self._paths = paths
        self._prefix = paths.vhosts + "/"
        self._tree = WatchedTree(zookeeper.kazoo, paths.vhosts)
        self._lock = threading.Lock()
        # As declared; `_exchanges` and `_queues` hold them with their policy applied.
        self._declared_exchanges: dict[tuple[str, str], Exchange] = {}
        self._declared_queues: dict[tuple[str, str], Queue] = {}
        self._exchanges: dict[tuple[str, str], Exchange] = {}
        self._queues: dict[tuple[str, str], Queue] = {}
        # vhost -> {name: policy}
        self._policies: dict[str, dict[str, Policy]] = {}
        # (vhost, exchange) -> {(queue, topic): BindingSet}
        self._sets_by_exchange: dict[tuple[str, str], dict[tuple[str, str], BindingSet]] = {}
        self._set_keys: dict[str, tuple[tuple[str, str], tuple[str, str]]] = {}
        # (vhost, exchange) -> which of its binding sets (by (queue, topic)) route a message
        self._routes: dict[tuple[str, str], ExchangeRoutes[tuple[str, str]]] = {}
        # The binding topics of the active binding sets (local names).
        self._active_binding_topics: set[str] = set()
        # Those of them not made yet (topology/binding_topics.py): no producer writes there.
        self._unmade_binding_topics: set[str] = set()
        # (vhost, exchange) -> its binding sets whose subscription is on the exchange's topic
        self._exchange_topic_readers: dict[tuple[str, str], set[tuple[str, str]]] = {}
        # (vhost, queue) -> {topic: BindingSet}
        self._sets_by_queue: dict[tuple[str, str], dict[str, BindingSet]] = {}
        self._retired: dict[tuple[str, str], RetiredSubscription] = {}
        # (vhost, source exchange) -> {znode name: exchange-to-exchange binding}
        self._e2e: dict[tuple[str, str], dict[str, ExchangeBinding]] = {}
        self._vhosts: dict[str, VhostRecord] = {}
        # vhost -> {queue: its length limit}, for the publish path's overflow checks
        self._limited: dict[str, dict[str, LengthLimit]] = {}
        # vhost -> {queue: its x-max-priority}, for the publish path's priority bands
        self._prioritised: dict[str, dict[str, int]] = {}
        # (vhost, queue) -> its AMQP consumers on every proxy (their znodes' names)
        self._consumers: dict[tuple[str, str], set[str]] = {}
        # (vhost, topic) -> {(queue, binding topic) reading it: the batch share of the
        # queue's consumers (model/batch_share.py)}, and the topic's entry limit from them.
        self._shares: dict[tuple[str, str], dict[tuple[str, str], int | None]] = {}
        self._batch_limits: dict[tuple[str, str], int | None] = {}
        self.ready = threading.Event()
        self.changes = 0
        self.last_change = 0.0
        self._listeners: list[Callable[[QueueChange], None]] = []
        self._changed = threading.Condition()
        # Routing versions seen but not yet reported (metadata/routing_barrier.py).
        self._version_listeners: list[Callable[[str, int], None]] = []
        self._pending_versions: dict[str, int] = {}
        self._version_check_queued = False

    def start(self) -> None:
        self._tree.listen(self._on_event)
        start_tree_cache(self._tree, "the topology cache")

    def close(self) -> None:
        self._tree.close()

    def on_routing_version(self, callback: Callable[[str, int], None]) -> None:
        """Call `callback(vhost, version)` (on the cache's thread) once the cache holds
        every change made before the vhost's routing version `version`
        (metadata/routing_barrier.py)."""
        self._version_listeners.append(callback)

    def _routing_version_seen(self, vhost: str, version: int) -> None:
        """The watched tree's thread: the vhost's routing version is `version`. It is
        reported once no read of ZooKeeper is in flight: the reads that events before it
        asked for are answered, and their changes applied, first."""
        pending = self._pending_versions
        pending[vhost] = max(version, pending.get(vhost, -1))
        if not self._version_check_queued:
            self._version_check_queued = True
            self._in_tree_thread(self._report_versions)

    def _report_versions(self) -> None:
        if self._tree.reads_in_flight() > 0:
            time.sleep(VERSION_CHECK_PAUSE)
            self._in_tree_thread(self._report_versions)
            return
        self._version_check_queued = False
        pending, self._pending_versions = self._pending_versions, {}
        for vhost, version in pending.items():
            for callback in self._version_listeners:
                try:
                    callback(vhost, version)
                except Exception:
                    log.exception("routing version listener failed")

    def _in_tree_thread(self, call: Callable[[], None]) -> None:
        self._tree.in_background(call)

    def on_change(self, callback: Callable[[QueueChange], None]) -> None:
        """Call `callback(touched)` (on the watched tree's thread) after every applied change:
        `touched` is the (vhost, queue) whose binding sets, retired subscriptions or record
        changed, or None when the change may concern any queue (a vhost, exchange or
        policy)."""
        self._listeners.append(callback)

    # ---- reads (any thread) -----------------------------------------------------------------

    def exchange(self, vhost: str, name: str) -> Exchange | None:
        with self._lock:
            return self._exchanges.get((vhost, name))

    def vhost(self, name: str) -> VhostRecord | None:
        with self._lock:
            return self._vhosts.get(name)

    def queue(self, vhost: str, name: str) -> Queue | None:
        with self._lock:
            return self._queues.get((vhost, name))

    def policy_of(self, vhost: str, kind: str, name: str) -> Policy | None:
        """The policy that applies to a queue (`kind` "queues") or exchange ("exchanges")."""
        with self._lock:
            return matching_policy(self._policies.get(vhost, {}).values(), kind, name)

    def binding_sets_of_exchange(self, vhost: str, exchange: str) -> list[BindingSet]:
        with self._lock:
            return list(self._sets_by_exchange.get((vhost, exchange), {}).values())

    def has_exchange_bindings(self, vhost: str, source: str) -> bool:
        """Is `source` the source of any exchange-to-exchange binding (one dict lookup)?"""
        return (vhost, source) in self._e2e

    def exchange_bindings_from(self, vhost: str, source: str) -> list[ExchangeBinding]:
        """The exchange-to-exchange bindings whose source is `source`."""
        with self._lock:
            return list(self._e2e.get((vhost, source), {}).values())

    def retired(self, vhost: str, subscription: str) -> RetiredSubscription | None:
        with self._lock:
            return self._retired.get((vhost, subscription))

    def batchable(self, vhost: str, topic: str) -> bool:
        """Whether a publish to the topic may put more than one message in a Pulsar entry:
        every queue that reads it has a consumer (on any proxy), and none has so many
        competing consumers for their prefetch that its share is one message
        (model/batch_share.py)."""
        return self.batch_limit(vhost, topic) != UNBATCHED

    def batch_limit(self, vhost: str, topic: str) -> int | None:
        """How many messages of one socket read may share a Pulsar entry on the topic: 1
        when a queue reading it has no consumer; else the smallest share of those queues'
        consumers (a consumer takes an entry whole; model/batch_share.py), None when none
        of them limits."""
        return self._batch_limits.get((vhost, topic), UNBATCHED)

    def binding_sets_of_queue(self, vhost: str, queue: str) -> list[BindingSet]:
        with self._lock:
            return list(self._sets_by_queue.get((vhost, queue), {}).values())

    def made_sets_of_queue(self, vhost: str, queue: str) -> list[BindingSet]:
        """The queue's binding sets that have their subscription (those to read): not the
        ones the first publish they route makes (topology/binding_topics.py)."""
        with self._lock:
            return [b for b in self._sets_by_queue.get((vhost, queue), {}).values() if b.made]

    def binding_topic_unmade(self, local: str) -> bool:
        """Whether `local` is the topic of an active binding set not made yet: its first
        message makes it (topology/binding_topics.py)."""
        return local in self._unmade_binding_topics

    def binding_topic_made(self, local: str) -> bool:
        """Whether `local` is the topic of an active binding set that is made."""
        return local in self._active_binding_topics and local not in self._unmade_binding_topics

    def queues(self) -> list[tuple[str, Queue]]:
        """Every queue, as (vhost, queue)."""
        with self._lock:
            return [(vhost, queue) for (vhost, _), queue in self._queues.items()]

    def draining_sets(self, vhost: str, queue: str) -> list[BindingSet]:
        """The bindings of `queue`'s retired subscriptions that still drain into it."""
        with self._lock:
            return [
                record.binding_set
                for (each, _), record in self._retired.items()
                if each == vhost
                and record.queue == queue
                and record.drain
                and record.binding_set is not None
            ]

    def retired_records(self) -> list[tuple[str, RetiredSubscription]]:
        """Every retired subscription, as (vhost, record)."""
        with self._lock:
            return [(vhost, record) for (vhost, _), record in self._retired.items()]

    def all_binding_sets(self, made_only: bool = False) -> list[tuple[str, BindingSet]]:
        """Every active binding set, as (vhost, set); `made_only`: those that have their
        subscription (topology/binding_topics.py)."""
        with self._lock:
            return [
                (vhost, binding_set)
                for (vhost, _), sets in self._sets_by_queue.items()
                for binding_set in sets.values()
                if binding_set.made or not made_only
            ]

    def binding_set(self, vhost: str, queue: str, topic: str) -> BindingSet | None:
        with self._lock:
            return self._sets_by_queue.get((vhost, queue), {}).get(topic)

    def retired_binding_topic(self, topic: naming.TopicName) -> bool:
        """Whether `topic` is a binding topic (model/naming.py) that no active binding set
        of this cache uses any more: nothing routes messages there."""
        local = topic.local
        return naming.parse_binding_topic(local) is not None and (
            local not in self._active_binding_topics
        )

    def reads_exchange_topic(self, vhost: str, exchange: str) -> bool:
        """Whether a binding set of `exchange` reads the exchange's own topic (fanout
        exchanges, and topic or headers bindings made before bindings had topics of their
        own): a message routed by the exchange is then written there too."""
        return (vhost, exchange) in self._exchange_topic_readers

    def binding_set_reading(self, vhost: str, queue: str, topic: str) -> BindingSet | None:
        """The active binding set of `queue` whose subscription is on `topic` (a local
        name: the exchange's topic, or the set's own binding topic)."""
        with self._lock:
            sets = self._sets_by_queue.get((vhost, queue), {})
            found = sets.get(topic)
            if found is not None and found.subscription_topic == topic:
                return found
            for binding_set in sets.values():
                if binding_set.subscription_topic == topic:
                    return binding_set
            return None

    def routed_sets(
        self,
        vhost: str,
        exchange: Exchange,
        routing_key: str,
        headers: dict[str, Any] | None,
    ) -> list[BindingSet]:
        """The binding sets of `exchange` whose active bindings route this message now (per
        this cache), one per queue reached; found through the exchange's route index, so
        the cost does not grow with its number of bindings (model/route_index.py). Not for
        the default exchange, which has no binding sets."""
        key = (vhost, exchange.name)
        with self._lock:
            routes = self._routes.get(key)
            if routes is None:
                return []
            sets = self._sets_by_exchange.get(key, {})
            if routes.routing_type != exchange.routing_type:
                # Indexed by the type its binding sets recorded; the exchange's own record
                # decides (records written before sets knew their type say "direct").
                routes = self._routes[key] = ExchangeRoutes(exchange.routing_type)
                for set_key, binding_set in sets.items():
                    routes.put(set_key, _active_bindings(binding_set))
            return [sets[found] for found in routes.routed(routing_key, headers) if found in sets]

    def has_route(
        self,
        vhost: str,
        exchange: Exchange,
        routing_key: str,
        headers: dict[str, Any] | None,
    ) -> bool:
        """Does any queue's active binding route this message now (per this cache)?"""
        if exchange.name == "":
            return self.queue(vhost, routing_key) is not None
        return bool(self.routed_sets(vhost, exchange, routing_key, headers))

    def length_limits(self, vhost: str) -> dict[str, LengthLimit]:
        """The queues of `vhost` with `x-max-length` / `x-max-length-bytes`, and their limits
        (empty for almost every vhost: the publish path asks this first)."""
        with self._lock:
            return self._limited.get(vhost, {})

    def max_priorities(self, vhost: str) -> dict[str, int]:
        """The priority queues of `vhost` and their `x-max-priority` (empty for almost every
        vhost: the publish path asks this first)."""
        with self._lock:
            return self._prioritised.get(vhost, {})

    def routed_queues(
        self,
        vhost: str,
        exchange: Exchange,
        routing_key: str,
        headers: dict[str, Any] | None,
    ) -> set[str]:
        """The queues whose active bindings route this message now (per this cache)."""
        if exchange.name == "":
            return {routing_key} if self.queue(vhost, routing_key) is not None else set()
        return {b.queue for b in self.routed_sets(vhost, exchange, routing_key, headers)}

    def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Whether `predicate` became true within `timeout` seconds; it is asked again after
        each change the cache applies (blocking: call it in a worker thread)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                # Bounded: a change the predicate reads but no event announces (a consumer
                # count) is still seen soon.
                self._changed.wait(min(left, WAIT_RECHECK))
        return True

    # ---- events (the watched tree's thread) ----------------------------------------------

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
        data = event.event_data
        path: str = data.path
        if not path.startswith(self._prefix):
            return
        parts = path[len(self._prefix) :].split("/")
        removed = event.event_type == TreeEvent.NODE_REMOVED
        if len(parts) == 2 and parts[1] == ROUTING_VERSION:
            if not removed and data.stat is not None:
                self._routing_version_seen(name_of(parts[0]), data.stat.version)
            return
        if len(parts) == 5 and parts[1] == "queues" and parts[3] == "consumers":
            self._count_consumer(name_of(parts[0]), name_of(parts[2]), parts[4], removed)
            return
        if not _indexed(parts):
            return  # owners, usage marks: nothing routing or consumers follow
        retired_before = self._retired_queue(parts)
        try:
            self._apply(parts, None if removed else data.data)
        except (RecordError, ValueError) as e:
            log.warning("ignoring unreadable znode %s: %s", path, e)
            return
        self.changes += 1
        self.last_change = time.time()
        if parts[1:2] == ["retired"]:
            queue = self._retired_queue(parts) or retired_before
            touched: QueueChange = None if queue is None else (name_of(parts[0]), queue)
        else:
            touched = _touched_queue(parts)
        for callback in self._listeners:
            callback(touched)
        with self._changed:
            self._changed.notify_all()

    def _retired_queue(self, parts: list[str]) -> str | None:
        """The queue of the retired subscription at `parts`, as the cache holds it now."""
        if len(parts) != 3 or parts[1] != "retired":
            return None
        with self._lock:
            record = self._retired.get((name_of(parts[0]), name_of(parts[2])))
        return None if record is None else record.queue

    def _count_consumer(self, vhost: str, queue: str, consumer: str, removed: bool) -> None:
        with self._lock:
            present = self._consumers.setdefault((vhost, queue), set())
            if removed:
                present.discard(consumer)
                if not present:
                    del self._consumers[(vhost, queue)]
            else:
                present.add(consumer)
            share = self._queue_share(vhost, queue)
            for binding_set in self._sets_by_queue.get((vhost, queue), {}).values():
                key = (vhost, binding_set.subscription_topic)
                self._note_share(key, (queue, binding_set.topic), share)

    def _note_share(
        self, key: tuple[str, str], reader: tuple[str, str], share: int | None, gone: bool = False
    ) -> None:
        """Called with the lock held: `reader` (a queue's binding set) reads topic `key`
        with this batch share, or (`gone`) no longer reads it; the topic's limit follows."""
        shares = self._shares.get(key)
        if gone:
            if shares is None or reader not in shares:
                return
            del shares[reader]
            if not shares:
                del self._shares[key]
                self._batch_limits.pop(key, None)
                return
        else:
            shares = self._shares.setdefault(key, {})
            if reader in shares and shares[reader] == share:
                return
            shares[reader] = share
        self._batch_limits[key] = topic_share(shares.values())

    def _queue_share(self, vhost: str, queue: str) -> int | None:
        """Called with the lock held: the batch share of the queue's consumers."""
        present = self._consumers.get((vhost, queue), ())
        return queue_share([consumer_prefetch(name) for name in present])

    def _apply(self, parts: list[str], raw: bytes | None) -> None:
        """Index one znode's record (None: removed); only for paths `_indexed` accepts."""
        if len(parts) == 1:
            self._apply_vhost(name_of(parts[0]), raw)
            return
        if len(parts) < 3:
            return
        vhost = name_of(parts[0])
        kind, name = parts[1], name_of(parts[2])
        record = decode(raw) if raw else None
        with self._lock:
            if len(parts) == 3:
                apply = self._APPLY_RECORD.get(kind)
                if apply is not None:
                    apply(self, vhost, name, record, raw is None)
            elif len(parts) == 5 and (kind, parts[3]) == ("exchanges", "e2e"):
                self._apply_e2e((vhost, name), parts[4], record, raw is None)
            elif len(parts) == 5 and (kind, parts[3]) == ("queues", "bindings"):
                path_key = "/".join(parts)
                if isinstance(record, BindingSet):
                    self._put_binding_set(vhost, path_key, record)
                elif raw is None and path_key in self._set_keys:
                    self._drop_binding_set(vhost, path_key)

    def _apply_vhost(self, vhost: str, raw: bytes | None) -> None:
        vhost_record = decode(raw) if raw else None
        with self._lock:
            if isinstance(vhost_record, VhostRecord):
                self._vhosts[vhost] = vhost_record
            elif raw is None:
                self._vhosts.pop(vhost, None)

    # ---- one record each (called with the lock held; `removed`: the znode is gone) --------

    def _apply_exchange(self, vhost: str, name: str, record: object, removed: bool) -> None:
        if isinstance(record, Exchange):
            self._declared_exchanges[(vhost, name)] = record
            self._apply_exchange_policy(vhost, record)
        elif removed:
            self._declared_exchanges.pop((vhost, name), None)
            self._exchanges.pop((vhost, name), None)

    def _apply_queue(self, vhost: str, name: str, record: object, removed: bool) -> None:
        if isinstance(record, Queue):
            self._declared_queues[(vhost, name)] = record
            self._apply_queue_policy(vhost, record)
        elif removed:
            self._declared_queues.pop((vhost, name), None)
            self._queues.pop((vhost, name), None)
            _index(self._limited, vhost, name, None)
            _index(self._prioritised, vhost, name, None)

    def _apply_policy(self, vhost: str, name: str, record: object, removed: bool) -> None:
        if isinstance(record, Policy):
            self._policies.setdefault(vhost, {})[name] = record
        elif removed:
            self._policies.get(vhost, {}).pop(name, None)
        self._apply_policies(vhost)

    def _apply_retired(self, vhost: str, name: str, record: object, removed: bool) -> None:
        if isinstance(record, RetiredSubscription):
            self._retired[(vhost, record.subscription)] = record
        elif removed:
            self._retired.pop((vhost, name), None)

    _APPLY_RECORD: ClassVar[dict[str, Callable[[TopologyCache, str, str, object, bool], None]]] = {
        "exchanges": _apply_exchange,
        "queues": _apply_queue,
        "policies": _apply_policy,
        "retired": _apply_retired,
    }

    def _apply_e2e(
        self, key: tuple[str, str], destination: str, record: object, removed: bool
    ) -> None:
        if isinstance(record, ExchangeBinding):
            self._e2e.setdefault(key, {})[destination] = record
        elif removed:
            bindings = self._e2e.get(key, {})
            bindings.pop(destination, None)
            if not bindings:
                self._e2e.pop(key, None)

    def _put_binding_set(self, vhost: str, path_key: str, record: BindingSet) -> None:
        exchange_key = (vhost, record.exchange)
        set_key = (record.queue, record.topic)
        self._sets_by_exchange.setdefault(exchange_key, {})[set_key] = record
        self._set_keys[path_key] = (exchange_key, set_key)
        routes = self._routes.get(exchange_key)
        if routes is None:
            routes = self._routes[exchange_key] = ExchangeRoutes(record.exchange_type)
        routes.put(set_key, _active_bindings(record))
        readers = self._exchange_topic_readers
        if record.binding_topic:
            self._active_binding_topics.add(record.binding_topic)
            if record.made:
                self._unmade_binding_topics.discard(record.binding_topic)
            else:
                self._unmade_binding_topics.add(record.binding_topic)
            _forget(readers, exchange_key, set_key)
        else:
            readers.setdefault(exchange_key, set()).add(set_key)
        queue_sets = self._sets_by_queue.setdefault((vhost, record.queue), {})
        if record.topic not in queue_sets:
            self._note_share(
                (vhost, record.subscription_topic),
                (record.queue, record.topic),
                self._queue_share(vhost, record.queue),
            )
        queue_sets[record.topic] = record

    def _drop_binding_set(self, vhost: str, path_key: str) -> None:
        exchange_key, set_key = self._set_keys.pop(path_key)
        queue_sets = self._sets_by_queue.get((vhost, set_key[0]), {})
        gone = queue_sets.pop(set_key[1], None)
        if gone is not None:
            self._active_binding_topics.discard(gone.binding_topic)
            self._unmade_binding_topics.discard(gone.binding_topic)
            read = (vhost, gone.subscription_topic)
            self._note_share(read, (set_key[0], gone.topic), None, gone=True)
        if not queue_sets:
            self._sets_by_queue.pop((vhost, set_key[0]), None)
        sets = self._sets_by_exchange.get(exchange_key, {})
        sets.pop(set_key, None)
        routes = self._routes.get(exchange_key)
        if routes is not None:
            routes.remove(set_key)
        _forget(self._exchange_topic_readers, exchange_key, set_key)
        if not sets:
            self._sets_by_exchange.pop(exchange_key, None)
            self._routes.pop(exchange_key, None)

    # ---- policies (called with the lock held) -----------------------------------------------

    def _apply_queue_policy(self, vhost: str, declared: Queue) -> None:
        policy = matching_policy(self._policies.get(vhost, {}).values(), "queues", declared.name)
        queue = declared
        if policy is not None:
            arguments = effective_queue_arguments(declared.arguments, policy.definition)
            queue = replace(declared, arguments=arguments)
        self._queues[(vhost, queue.name)] = queue
        _index(self._limited, vhost, queue.name, LengthLimit.of(queue.arguments))
        _index(self._prioritised, vhost, queue.name, max_priority_of(queue.arguments))

    def _apply_exchange_policy(self, vhost: str, declared: Exchange) -> None:
        policies = self._policies.get(vhost, {}).values()
        policy = matching_policy(policies, "exchanges", declared.name)
        exchange = declared
        if policy is not None:
            arguments = effective_exchange_arguments(declared.arguments, policy.definition)
            exchange = replace(declared, arguments=arguments)
        self._exchanges[(vhost, exchange.name)] = exchange

    def _apply_policies(self, vhost: str) -> None:
        """A policy of `vhost` changed: every queue and exchange there may now have
        another."""
        if not self._policies.get(vhost, True):
            del self._policies[vhost]
        for (each, _), queue in list(self._declared_queues.items()):
            if each == vhost:
                self._apply_queue_policy(vhost, queue)
        for (each, _), exchange in list(self._declared_exchanges.items()):
            if each == vhost:
                self._apply_exchange_policy(vhost, exchange)


def _forget(index: dict[tuple[str, str], set[tuple[str, str]]], key: Any, member: Any) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(member)
        if not members:
            del index[key]


def _active_bindings(binding_set: BindingSet) -> list[tuple[str, dict[str, Any]]]:
    return [(e.routing_key, e.arguments) for e in binding_set.active_entries]


def _index(index: dict[str, dict[str, V]], vhost: str, name: str, value: V | None) -> None:
    """Set (or, with None, remove) a queue's entry in a per-vhost index. Copied on write:
    readers get a dict nobody changes afterwards."""
    current = index.get(vhost, {})
    if value is None and name not in current:
        return
    updated = {q: x for q, x in current.items() if q != name}
    if value is not None:
        updated[name] = value
    if updated:
        index[vhost] = updated
    else:
        index.pop(vhost, None)


def _touched_queue(parts: list[str]) -> QueueChange:
    """The queue a change at `parts` concerns (see TopologyCache.on_change)."""
    if len(parts) >= 3 and parts[1] == "queues":
        return (name_of(parts[0]), name_of(parts[2]))
    return None


def _indexed(parts: list[str]) -> bool:
    """Whether a path (split below the vhosts znode) is one the cache indexes: exchanges,
    queues, policies, retired subscriptions, binding sets and exchange-to-exchange bindings."""
    if len(parts) == 1:
        return True  # a vhost record
    if len(parts) == 3:
        return parts[1] in ("exchanges", "queues", "retired", "policies")
    if len(parts) != 5:
        return False
    return (parts[1], parts[3]) in (("queues", "bindings"), ("exchanges", "e2e"))
