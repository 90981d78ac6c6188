"""The watched topology cache, fed by hand: paths and records in, indexes out.

The cache is built on a ZooKeeperClient that is never started (building a watched tree
does not connect), so these tests need no ZooKeeper; the integration tests run the same
cache against a real one (tests/integration/test_topology_cluster.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import replace

import pytest
from kazoo.recipe.cache import NodeData, TreeEvent

from starlight_py.metadata.cache import TopologyCache, _indexed, consumer_prefetch
from starlight_py.metadata.records import (
    BindingEntry,
    BindingSet,
    ExchangeBinding,
    Paths,
    RetiredSubscription,
    VhostRecord,
    encode,
    segment,
)
from starlight_py.metadata.zookeeper import ZooKeeperClient
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.queue_limits import LengthLimit
from starlight_py.model.topology import Exchange, Queue

PATHS = Paths("/starlight")


@pytest.fixture
def cache() -> Iterator[TopologyCache]:
    # An address nothing listens on; the client is never started, so it never connects.
    zookeeper = ZooKeeperClient("127.0.0.1:1")
    yield TopologyCache(zookeeper, PATHS)
    zookeeper.kazoo.close()


def parts(path: str) -> list[str]:
    """A znode path as `_apply` receives it: the segments below `{root}/v1/vhosts`."""
    prefix = PATHS.vhosts + "/"
    assert path.startswith(prefix)
    return path[len(prefix) :].split("/")


def put(cache: TopologyCache, path: str, record: object) -> None:
    cache._apply(parts(path), encode(record))


def remove(cache: TopologyCache, path: str) -> None:
    cache._apply(parts(path), None)


def binding_set(queue: str, exchange: str, topic: str, *keys: str) -> BindingSet:
    return BindingSet(
        queue=queue,
        exchange=exchange,
        topic=topic,
        subscription=f"{queue}~~0123456789ab",
        entries=tuple(BindingEntry(key) for key in keys),
    )


def event(kind: int, path: str, data: bytes | None = b"") -> TreeEvent:
    return TreeEvent.make(kind, NodeData.make(path, data, None))


# ---- exchanges and queues ---------------------------------------------------------------------


def test_an_empty_cache_knows_nothing(cache: TopologyCache) -> None:
    assert cache.exchange("/", "orders") is None
    assert cache.queue("/", "q1") is None
    assert cache.binding_sets_of_exchange("/", "orders") == []
    assert not cache.ready.is_set()


def test_exchanges_are_added_updated_and_removed(cache: TopologyCache) -> None:
    path = PATHS.exchange("/", "orders")
    put(cache, path, Exchange("orders", "direct"))
    assert cache.exchange("/", "orders") == Exchange("orders", "direct")
    put(cache, path, Exchange("orders", "direct", durable=False, arguments={"a": 1}))
    assert cache.exchange("/", "orders") == Exchange(
        "orders", "direct", durable=False, arguments={"a": 1}
    )
    remove(cache, path)
    assert cache.exchange("/", "orders") is None
    remove(cache, path)  # removing twice (a replayed event) is harmless
    assert cache.exchange("/", "orders") is None


def test_queues_are_added_updated_and_removed(cache: TopologyCache) -> None:
    path = PATHS.queue("/", "q1")
    put(cache, path, Queue("q1"))
    assert cache.queue("/", "q1") == Queue("q1")
    put(cache, path, Queue("q1", exclusive=True, owner="p/1"))
    assert cache.queue("/", "q1") == Queue("q1", exclusive=True, owner="p/1")
    remove(cache, path)
    assert cache.queue("/", "q1") is None


def test_names_are_unescaped_from_the_path(cache: TopologyCache) -> None:
    put(cache, PATHS.exchange("a/b", "ex x"), Exchange("ex x", "fanout"))
    put(cache, PATHS.queue("a/b", "q/1~"), Queue("q/1~"))
    assert cache.exchange("a/b", "ex x") == Exchange("ex x", "fanout")
    assert cache.queue("a/b", "q/1~") == Queue("q/1~")


def test_vhosts_do_not_share_names(cache: TopologyCache) -> None:
    put(cache, PATHS.exchange("/", "x"), Exchange("x", "direct"))
    put(cache, PATHS.exchange("other", "x"), Exchange("x", "topic"))
    remove(cache, PATHS.exchange("/", "x"))
    assert cache.exchange("/", "x") is None
    assert cache.exchange("other", "x") == Exchange("x", "topic")


def test_the_tilde_segment_is_the_empty_name(cache: TopologyCache) -> None:
    assert PATHS.exchange("", "") == "/starlight/v1/vhosts/~/exchanges/~"
    put(cache, PATHS.exchange("", ""), Exchange("", "direct"))
    assert cache.exchange("", "") == Exchange("", "direct")
    assert cache.exchange("/", "") is None


def test_an_exchange_and_a_queue_of_the_same_name_are_different(cache: TopologyCache) -> None:
    put(cache, PATHS.exchange("/", "same"), Exchange("same", "direct"))
    put(cache, PATHS.queue("/", "same"), Queue("same"))
    remove(cache, PATHS.queue("/", "same"))
    assert cache.exchange("/", "same") == Exchange("same", "direct")
    assert cache.queue("/", "same") is None


# ---- binding sets -----------------------------------------------------------------------------


def test_binding_sets_are_indexed_by_their_exchange(cache: TopologyCache) -> None:
    first = binding_set("q1", "events", "events", "a")
    second = binding_set("q2", "events", "events", "b")
    other = binding_set("q1", "orders", "orders~~k", "k")
    put(cache, PATHS.binding_set("/", "q1", "events"), first)
    put(cache, PATHS.binding_set("/", "q2", "events"), second)
    put(cache, PATHS.binding_set("/", "q1", "orders~~k"), other)
    assert sorted(cache.binding_sets_of_exchange("/", "events"), key=lambda s: s.queue) == [
        first,
        second,
    ]
    assert cache.binding_sets_of_exchange("/", "orders") == [other]
    assert cache.binding_sets_of_exchange("other", "events") == []


def test_a_binding_set_update_replaces_it(cache: TopologyCache) -> None:
    path = PATHS.binding_set("/", "q1", "events")
    put(cache, path, binding_set("q1", "events", "events", "a"))
    updated = binding_set("q1", "events", "events", "a", "b")
    put(cache, path, updated)
    assert cache.binding_sets_of_exchange("/", "events") == [updated]
    unbound = updated.with_entries((BindingEntry("a", unbound=True), BindingEntry("b")))
    put(cache, path, unbound)
    [current] = cache.binding_sets_of_exchange("/", "events")
    assert [e.routing_key for e in current.active_entries] == ["b"]


def test_a_binding_topic_is_unmade_until_its_set_says_made(cache: TopologyCache) -> None:
    path = PATHS.binding_set("/", "q1", "events")
    own = "events~~q1~~0123456789ab"
    unmade = replace(
        binding_set("q1", "events", "events", "a.*"),
        exchange_type="topic",
        binding_topic=own,
        made=False,
    )
    put(cache, path, unmade)
    assert cache.binding_topic_unmade(own) and not cache.binding_topic_made(own)
    assert cache.binding_sets_of_queue("/", "q1") == [unmade]  # it routes
    assert cache.made_sets_of_queue("/", "q1") == []  # nothing to read
    assert cache.all_binding_sets(made_only=True) == []
    made = replace(unmade, made=True)
    put(cache, path, made)
    assert cache.binding_topic_made(own) and not cache.binding_topic_unmade(own)
    assert cache.made_sets_of_queue("/", "q1") == [made]
    put(cache, path, unmade)  # (never happens: made is for good) back again
    remove(cache, path)
    assert not cache.binding_topic_unmade(own) and not cache.binding_topic_made(own)


def test_removing_binding_sets_empties_the_index(cache: TopologyCache) -> None:
    first_path = PATHS.binding_set("/", "q1", "events")
    second_path = PATHS.binding_set("/", "q2", "events")
    put(cache, first_path, binding_set("q1", "events", "events", "a"))
    put(cache, second_path, binding_set("q2", "events", "events", "a"))
    remove(cache, first_path)
    assert [s.queue for s in cache.binding_sets_of_exchange("/", "events")] == ["q2"]
    remove(cache, second_path)
    assert cache.binding_sets_of_exchange("/", "events") == []
    remove(cache, second_path)  # a removal the cache never saw added is harmless
    assert cache.binding_sets_of_exchange("/", "events") == []


def test_the_default_exchange_binding_of_a_queue(cache: TopologyCache) -> None:
    implicit = binding_set("q1", "", "amq.default~~q1", "q1")
    path = PATHS.binding_set("/", "q1", "amq.default~~q1")
    put(cache, path, implicit)
    assert cache.binding_sets_of_exchange("/", "") == [implicit]
    remove(cache, path)
    assert cache.binding_sets_of_exchange("/", "") == []


def test_znodes_that_are_not_records_change_nothing(cache: TopologyCache) -> None:
    put(cache, PATHS.exchange("/", "events"), Exchange("events", "fanout"))
    # The vhost itself, the containers and the bound/ index carry no topology for routing.
    put(cache, PATHS.vhost("/"), VhostRecord("/", NamespaceName("public", "default")))
    for path in (
        PATHS.exchanges("/"),
        PATHS.queues("/"),
        PATHS.retired("/"),
        PATHS.exchange_bound("/", "events"),
        PATHS.exchange_bound_entry("/", "events", "q1", "events"),
        PATHS.queue_bindings("/", "q1"),
    ):
        cache._apply(parts(path), b"")
        cache._apply(parts(path), None)
    # An empty znode where a record belongs (not written yet) is not a removal.
    cache._apply(parts(PATHS.exchange("/", "events")), b"")
    assert cache.exchange("/", "events") == Exchange("events", "fanout")
    assert cache.binding_sets_of_exchange("/", "events") == []


def test_a_record_of_the_wrong_kind_is_not_taken(cache: TopologyCache) -> None:
    put(cache, PATHS.exchange("/", "x"), Queue("x"))
    put(cache, PATHS.queue("/", "q"), Exchange("q", "direct"))
    assert cache.exchange("/", "x") is None
    assert cache.queue("/", "q") is None


# ---- events -----------------------------------------------------------------------------------


def test_events_are_applied_and_counted_and_listeners_called(cache: TopologyCache) -> None:
    calls: list[int] = []
    cache.on_change(lambda touched: calls.append(cache.changes))
    path = PATHS.exchange("/", "orders")
    cache._on_event(event(TreeEvent.NODE_ADDED, path, encode(Exchange("orders", "direct"))))
    assert cache.exchange("/", "orders") == Exchange("orders", "direct")
    cache._on_event(event(TreeEvent.NODE_UPDATED, path, encode(Exchange("orders", "topic"))))
    assert cache.exchange("/", "orders") == Exchange("orders", "topic")
    # A removal event still carries the last data; the cache must drop the record anyway.
    cache._on_event(event(TreeEvent.NODE_REMOVED, path, encode(Exchange("orders", "topic"))))
    assert cache.exchange("/", "orders") is None
    assert cache.changes == 3
    assert calls == [1, 2, 3]
    assert cache.last_change > 0


def test_listeners_hear_which_queue_a_change_concerns(cache: TopologyCache) -> None:
    """Connections follow only the queues a change concerns
    (gateway/connection/client_connection.py): the work per change does not grow with the
    queues elsewhere."""
    touched: list[object] = []
    cache.on_change(touched.append)
    put_event = TreeEvent.NODE_ADDED
    cache._on_event(event(put_event, PATHS.queue("/", "q1"), encode(Queue("q1"))))
    orders = binding_set("q2", "orders", "orders-topic", "k")
    cache._on_event(event(put_event, PATHS.binding_set("/", "q2", "orders-topic"), encode(orders)))
    retired = RetiredSubscription("orders-topic", "q3~~1", "q3", None, True, 1.0)
    retired_path = PATHS.retired_subscription("/", "q3~~1")
    cache._on_event(event(put_event, retired_path, encode(retired)))
    # A removal still names the queue of the record it removes.
    cache._on_event(event(TreeEvent.NODE_REMOVED, retired_path, None))
    cache._on_event(
        event(put_event, PATHS.exchange("/", "orders"), encode(Exchange("orders", "topic")))
    )
    assert touched == [("/", "q1"), ("/", "q2"), ("/", "q3"), ("/", "q3"), None]


def test_wait_until_wakes_on_a_change(cache: TopologyCache) -> None:
    result: list[bool] = []
    waiter = threading.Thread(
        target=lambda: result.append(
            cache.wait_until(lambda: cache.queue("/", "late") is not None, 30)
        )
    )
    waiter.start()
    cache._on_event(event(TreeEvent.NODE_ADDED, PATHS.queue("/", "late"), encode(Queue("late"))))
    waiter.join(30)
    assert result == [True]
    assert cache.wait_until(lambda: False, 0.01) is False


def test_initialized_means_ready(cache: TopologyCache) -> None:
    cache._on_event(TreeEvent.make(TreeEvent.INITIALIZED, None))
    assert cache.ready.is_set()
    assert cache.changes == 0


@pytest.mark.parametrize(
    "kind",
    [TreeEvent.CONNECTION_SUSPENDED, TreeEvent.CONNECTION_RECONNECTED, TreeEvent.CONNECTION_LOST],
)
def test_connection_events_change_nothing(cache: TopologyCache, kind: int) -> None:
    cache._on_event(TreeEvent.make(kind, None))
    assert cache.changes == 0
    assert not cache.ready.is_set()


@pytest.mark.parametrize(
    "path", ["/starlight/v1", "/starlight/v1/vhosts", "/elsewhere/v1/vhosts/~2F/exchanges/x"]
)
def test_events_outside_the_vhosts_are_ignored(cache: TopologyCache, path: str) -> None:
    cache._on_event(event(TreeEvent.NODE_ADDED, path, encode(Exchange("x", "direct"))))
    assert cache.changes == 0
    assert cache.exchange("/", "x") is None


BAD_ARGUMENTS = b'"arguments": {"a": {"$decimal": "not a number"}}'


@pytest.mark.parametrize(
    ("path", "data"),
    [
        (PATHS.exchange("/", "x"), b"{not json"),
        (PATHS.exchange("/", "x"), b"[]"),
        (PATHS.exchange("/", "x"), b'{"schema": 2, "kind": "exchange", "name": "x"}'),
        (PATHS.exchange("/", "x"), b'{"schema": 1, "kind": "exchange", "name": "x"}'),
        (PATHS.queue("/", "x"), encode(Queue("x")).replace(b'"arguments": {}', BAD_ARGUMENTS)),
        (PATHS.binding_set("/", "x", "t"), b'{"schema": 1, "kind": "binding_set"}'),
        # Path segments that `naming.escape` never produces.
        ("/starlight/v1/vhosts/~2F/exchanges/a b", encode(Exchange("a b", "direct"))),
        ("/starlight/v1/vhosts/~41/exchanges/x", encode(Exchange("x", "direct"))),
    ],
    ids=[
        "not-json",
        "array",
        "schema-2",
        "missing-keys",
        "bad-arguments",
        "bad-binding-set",
        "unescaped-segment",
        "non-canonical-vhost",
    ],
)
def test_unreadable_znodes_are_ignored_with_a_warning(
    cache: TopologyCache, path: str, data: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[None] = []
    cache.on_change(lambda touched: calls.append(None))
    with caplog.at_level(logging.WARNING, logger="starlight.cache"):
        cache._on_event(event(TreeEvent.NODE_ADDED, path, data))
    assert "ignoring unreadable znode" in caplog.text
    assert path in caplog.text
    assert cache.changes == 0
    assert calls == []
    assert cache.exchange("/", "x") is None
    assert cache.queue("/", "x") is None
    assert cache.binding_sets_of_exchange("/", "x") == []


def test_an_unreadable_update_keeps_the_last_readable_record(cache: TopologyCache) -> None:
    path = PATHS.exchange("/", "orders")
    cache._on_event(event(TreeEvent.NODE_ADDED, path, encode(Exchange("orders", "direct"))))
    cache._on_event(event(TreeEvent.NODE_UPDATED, path, b"garbage"))
    assert cache.exchange("/", "orders") == Exchange("orders", "direct")
    assert cache.changes == 1


def test_names_dot_and_dot_dot_reach_the_cache(cache: TopologyCache) -> None:
    cache._on_event(
        event(TreeEvent.NODE_ADDED, PATHS.exchange("/", "."), encode(Exchange(".", "fanout")))
    )
    assert cache.exchange("/", ".") == Exchange(".", "fanout")


def test_wait_until_polls_until_the_predicate_holds(cache: TopologyCache) -> None:
    assert cache.wait_until(lambda: True, 0)
    assert not cache.wait_until(lambda: False, 0.01)


def test_queues_with_length_limits_are_indexed_per_vhost(cache: TopologyCache) -> None:
    limited = Queue("q1", arguments={"x-max-length": 5, "x-overflow": "reject-publish"})
    put(cache, PATHS.queue("/", "q1"), limited)
    put(cache, PATHS.queue("/", "q2"), Queue("q2"))
    put(cache, PATHS.queue("other", "q3"), Queue("q3", arguments={"x-max-length-bytes": 10}))
    assert cache.length_limits("/") == {"q1": LengthLimit(5, None, "reject-publish")}
    assert cache.length_limits("other") == {"q3": LengthLimit(None, 10, "drop-head")}
    # Redeclared without a limit (after a delete), then removed.
    put(cache, PATHS.queue("other", "q3"), Queue("q3"))
    assert cache.length_limits("other") == {}
    remove(cache, PATHS.queue("/", "q1"))
    assert cache.length_limits("/") == {}


def test_routed_queues_are_those_whose_active_bindings_match(cache: TopologyCache) -> None:
    put(cache, PATHS.exchange("/", "events"), Exchange("events", "topic"))
    put(cache, PATHS.queue("/", "q1"), Queue("q1"))
    both = binding_set("q1", "events", "events", "a.*", "#")
    put(cache, PATHS.binding_set("/", "q1", "events"), both)
    put(cache, PATHS.binding_set("/", "q2", "events"), binding_set("q2", "events", "events", "b.*"))
    events = Exchange("events", "topic")
    assert cache.routed_queues("/", events, "a.x", None) == {"q1"}
    assert cache.routed_queues("/", events, "b.x", None) == {"q1", "q2"}
    default = Exchange("", "direct")
    assert cache.routed_queues("/", default, "q1", None) == {"q1"}
    assert cache.routed_queues("/", default, "missing", None) == set()


def test_priority_queues_are_indexed_per_vhost(cache: TopologyCache) -> None:
    put(cache, PATHS.queue("/", "p"), Queue("p", arguments={"x-max-priority": 5}))
    put(cache, PATHS.queue("/", "zero"), Queue("zero", arguments={"x-max-priority": 0}))
    put(cache, PATHS.queue("/", "plain"), Queue("plain"))
    assert cache.max_priorities("/") == {"p": 5}
    assert cache.max_priorities("other") == {}
    remove(cache, PATHS.queue("/", "p"))
    assert cache.max_priorities("/") == {}


def test_exchange_bindings_are_indexed_by_their_source(cache: TopologyCache) -> None:
    binding = ExchangeBinding("src", "dst", "k")
    other = ExchangeBinding("src", "dst2", "#")
    changes = cache.changes
    assert not cache.has_exchange_bindings("/", "src")
    for each in (binding, other):
        put(cache, PATHS.exchange_e2e_entry("/", each), each)
    # The index znodes under the destination are empty and not records.
    cache._apply(parts(PATHS.exchange_e2e_in_entry("/", binding)), b"")
    assert cache.has_exchange_bindings("/", "src")
    assert not cache.has_exchange_bindings("/", "dst")
    assert sorted(b.destination for b in cache.exchange_bindings_from("/", "src")) == [
        "dst",
        "dst2",
    ]
    remove(cache, PATHS.exchange_e2e_entry("/", binding))
    assert cache.exchange_bindings_from("/", "src") == [other]
    remove(cache, PATHS.exchange_e2e_entry("/", other))
    assert not cache.has_exchange_bindings("/", "src")
    assert cache.changes == changes  # _apply alone does not count; events do


def test_only_exchange_binding_records_are_indexed_below_exchanges() -> None:
    assert _indexed(["~2F", "exchanges", "x", "e2e", "y~~abc"])
    assert not _indexed(["~2F", "exchanges", "x", "e2e-in", "y~~abc"])
    assert not _indexed(["~2F", "exchanges", "x", "bound", "q~~t"])
    assert not _indexed(["~2F", "exchanges", "x", "e2e"])


# ---- consumers: topics a batch may go to ----------------------------------------------------


def test_a_batch_entry_is_no_larger_than_the_prefetch_of_the_consumers_that_read_it(
    cache: TopologyCache,
) -> None:
    """A consumer takes a batch entry whole: one larger than its prefetch would hold
    messages back from the consumers that join the queue later."""
    put(cache, PATHS.binding_set("/", "jobs", "t-jobs"), binding_set("jobs", "", "t-jobs", "jobs"))
    assert cache.batch_limit("/", "t-jobs") == 1  # no consumer: one message per entry
    worker = PATHS.queue_consumer("/", "jobs", "proxy-1/1/ctag!p4")
    cache._on_event(event(TreeEvent.NODE_ADDED, worker))
    assert cache.batch_limit("/", "t-jobs") == 4
    # A second queue reading the topic: the smaller prefetch of the two; unlimited ones
    # (prefetch 0) limit nothing.
    put(cache, PATHS.binding_set("/", "logs", "t-jobs"), binding_set("logs", "x", "t-jobs", "k"))
    assert cache.batch_limit("/", "t-jobs") == 1  # logs has no consumer yet
    logger = PATHS.queue_consumer("/", "logs", "proxy-2/1/tail!p0!x")
    cache._on_event(event(TreeEvent.NODE_ADDED, logger))
    assert cache.batch_limit("/", "t-jobs") == 4
    cache._on_event(event(TreeEvent.NODE_REMOVED, worker))
    cache._on_event(event(TreeEvent.NODE_ADDED, PATHS.queue_consumer("/", "jobs", "p/1/w!p2")))
    assert cache.batch_limit("/", "t-jobs") == 2
    remove(cache, PATHS.binding_set("/", "jobs", "t-jobs"))
    assert cache.batch_limit("/", "t-jobs") is None  # only the unlimited consumer reads it
    # A consumer registered without a prefetch (a proxy of an earlier version) batches
    # nothing.
    cache._on_event(event(TreeEvent.NODE_REMOVED, logger))
    cache._on_event(event(TreeEvent.NODE_ADDED, PATHS.queue_consumer("/", "logs", "old/1/c")))
    assert cache.batch_limit("/", "t-jobs") == 1


def test_consumer_names_carry_their_prefetch() -> None:
    assert consumer_prefetch(segment("proxy/3/ctag!p200")) == 200
    assert consumer_prefetch(segment("proxy/3/ctag!p0!x")) == 0
    assert consumer_prefetch(segment("proxy/3/tag!p7!p1")) == 1  # a tag ending like a mark
    assert consumer_prefetch(segment("proxy/3/ctag")) == 1
    assert consumer_prefetch("not~escaped~") == 1


def test_only_topics_whose_queues_each_have_a_consumer_are_batchable(
    cache: TopologyCache,
) -> None:
    put(cache, PATHS.binding_set("/", "jobs", "t-jobs"), binding_set("jobs", "", "t-jobs", "jobs"))
    put(cache, PATHS.binding_set("/", "logs", "t-logs"), binding_set("logs", "x", "t-logs", "#"))
    assert not cache.batchable("/", "t-jobs")  # no consumer yet: its backlog is spread later
    consumer_a = PATHS.queue_consumer("/", "jobs", "proxy-1/c1!p10")
    consumer_b = PATHS.queue_consumer("/", "jobs", "proxy-2/c1!p10")
    cache._on_event(event(TreeEvent.NODE_ADDED, consumer_a))
    assert cache.batch_limit("/", "t-jobs") == 10  # one consumer: up to its prefetch
    assert not cache.batchable("/", "t-logs")
    cache._on_event(event(TreeEvent.NODE_ADDED, consumer_b))
    assert cache.batch_limit("/", "t-jobs") == 5  # competing consumers: a share each
    # A binding of that queue added later has the same share; a removed one is gone.
    put(cache, PATHS.binding_set("/", "jobs", "t-more"), binding_set("jobs", "x", "t-more", "a"))
    assert cache.batch_limit("/", "t-more") == 5
    remove(cache, PATHS.binding_set("/", "jobs", "t-more"))
    assert not cache.batchable("/", "t-more")
    cache._on_event(event(TreeEvent.NODE_REMOVED, consumer_a))
    assert cache.batch_limit("/", "t-jobs") == 10
    # A topic two queues read is batchable only while each has a consumer.
    put(cache, PATHS.binding_set("/", "logs", "t-jobs"), binding_set("logs", "x", "t-jobs", "k"))
    assert not cache.batchable("/", "t-jobs")
    logger = PATHS.queue_consumer("/", "logs", "p/c!p4")
    cache._on_event(event(TreeEvent.NODE_ADDED, logger))
    assert cache.batch_limit("/", "t-jobs") == 4
    assert cache.batch_limit("/", "t-logs") == 4
    put(cache, PATHS.binding_set("/", "logs", "t-jobs"), binding_set("logs", "x", "t-jobs", "k"))
    assert cache.batch_limit("/", "t-jobs") == 4  # the same binding set again changes nothing
    remove(cache, PATHS.binding_set("/", "logs", "t-jobs"))
    assert cache.batch_limit("/", "t-jobs") == 10
    cache._on_event(event(TreeEvent.NODE_REMOVED, consumer_b))
    assert not cache.batchable("/", "t-jobs")
    remove(cache, PATHS.binding_set("/", "jobs", "t-jobs"))
    cache._on_event(event(TreeEvent.NODE_REMOVED, logger))
    remove(cache, PATHS.binding_set("/", "logs", "t-logs"))
    assert cache._consumers == {}
    assert (cache._shares, cache._batch_limits) == ({}, {})


def test_consumers_do_not_count_as_topology_changes(cache: TopologyCache) -> None:
    before = cache.changes
    cache._on_event(event(TreeEvent.NODE_ADDED, PATHS.queue_consumer("/", "jobs", "c1")))
    cache._on_event(event(TreeEvent.NODE_ADDED, PATHS.queue_consumer("/", "jobs", "c2")))
    assert cache.changes == before  # route plans stay: the publish path asks per message
