"""Routing through exchange-to-exchange bindings: which exchanges a message reaches
(model.routing.exchanges_reached), which of them get a copy and which queues skip it
(model.routing.assign_queues, gateway.exchange_routing)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlight_py.backend.message_codec import (
    IN_PRIORITY_BAND_KEY,
    REFUSED_BY_KEY,
    ROUTED_ELSEWHERE_KEY,
    skipped_by,
)
from starlight_py.gateway.publish.exchange_routing import (
    ChainRoute,
    chain_copies,
    copy_destinations,
    written_copies,
)
from starlight_py.metadata.records import BindingEntry, BindingSet, ExchangeBinding
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.routing import assign_queues, binding_matches, exchanges_reached
from starlight_py.model.topology import Exchange

NAMESPACE = NamespaceName("public", "default")


class Topology:
    """Exchanges, exchange-to-exchange bindings and queue bindings, by hand."""

    def __init__(self, **types: str) -> None:
        self.exchanges = {name: Exchange(name, kind) for name, kind in types.items()}
        self.bindings: list[ExchangeBinding] = []
        # exchange -> [(queue, binding key, arguments)]
        self.queues: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}

    def bind(
        self, destination: str, source: str, key: str = "", arguments: dict[str, Any] | None = None
    ) -> Topology:
        self.bindings.append(ExchangeBinding(source, destination, key, arguments or {}))
        return self

    def queue(
        self, queue: str, exchange: str, key: str = "", arguments: dict[str, Any] | None = None
    ) -> Topology:
        self.queues.setdefault(exchange, []).append((queue, key, arguments or {}))
        return self

    def reached(
        self, start: str, key: str = "", headers: dict[str, Any] | None = None
    ) -> list[str]:
        return [
            x.name
            for x in exchanges_reached(
                self.exchanges[start],
                key,
                headers,
                lambda name: [b for b in self.bindings if b.source == name],
                self.exchanges.get,
            )
        ]

    def copies(
        self, start: str, key: str = "", headers: dict[str, Any] | None = None
    ) -> tuple[list[tuple[str, set[str]]], set[str]]:
        def routed(x: Exchange) -> set[str]:
            return {
                q
                for q, k, a in self.queues.get(x.name, [])
                if binding_matches(x.routing_type, k, a, key, headers)
            }

        route = chain_copies(
            self.exchanges[start],
            key,
            headers,
            lambda name: [b for b in self.bindings if b.source == name],
            self.exchanges.get,
            routed,
        )
        return [(x.name, set(skip)) for x, skip in route.copies], route.queues


# ---- exchanges_reached --------------------------------------------------------------------


def test_without_bindings_only_the_exchange_itself_is_reached() -> None:
    assert Topology(a="direct").reached("a", "k") == ["a"]


def test_a_direct_chain_is_followed_with_the_same_key() -> None:
    topology = Topology(a="direct", b="direct", c="fanout").bind("b", "a", "k").bind("c", "b", "k")
    assert topology.reached("a", "k") == ["a", "b", "c"]
    assert topology.reached("a", "other") == ["a"]


def test_the_chain_stops_where_a_binding_does_not_match_by_its_sources_type() -> None:
    topology = Topology(a="fanout", b="direct", c="fanout").bind("b", "a", "x").bind("c", "b", "x")
    assert topology.reached("a", "y") == ["a", "b"]  # fanout ignores keys, direct does not
    assert topology.reached("a", "x") == ["a", "b", "c"]


def test_topic_bindings_match_patterns() -> None:
    topology = Topology(a="topic", b="fanout", c="fanout").bind("b", "a", "a.*").bind("c", "a", "#")
    assert topology.reached("a", "a.b") == ["a", "b", "c"]
    assert topology.reached("a", "a.b.c") == ["a", "c"]


def test_headers_bindings_match_headers() -> None:
    topology = Topology(a="headers", b="fanout").bind("b", "a", "", {"x-match": "any", "h": 1})
    assert topology.reached("a", "", {"h": 1}) == ["a", "b"]
    assert topology.reached("a", "", {"h": 2}) == ["a"]
    assert topology.reached("a", "", None) == ["a"]


def test_cycles_visit_each_exchange_once() -> None:
    topology = Topology(a="fanout", b="fanout", c="fanout")
    topology.bind("b", "a").bind("c", "b").bind("a", "c").bind("a", "a").bind("b", "c")
    assert topology.reached("a") == ["a", "b", "c"]
    assert topology.reached("c") == ["c", "a", "b"]


def test_breadth_first_order() -> None:
    topology = Topology(a="fanout", b="fanout", c="fanout", d="fanout")
    topology.bind("b", "a").bind("d", "b").bind("c", "a")
    assert topology.reached("a") == ["a", "b", "c", "d"]


def test_a_missing_destination_is_skipped() -> None:
    topology = Topology(a="fanout", b="fanout").bind("gone", "a").bind("b", "a")
    assert topology.reached("a") == ["a", "b"]


def test_a_later_matching_binding_to_the_same_destination_counts() -> None:
    topology = Topology(a="direct", b="fanout").bind("b", "a", "x").bind("b", "a", "y")
    assert topology.reached("a", "y") == ["a", "b"]


def test_alternate_exchanges_are_followed_where_an_exchange_routes_nowhere() -> None:
    x = Exchange("x", "direct", arguments={"alternate-exchange": "ax"})
    y = Exchange("y", "direct", arguments={"alternate-exchange": "ay"})
    exchanges = {e.name: e for e in (x, y, Exchange("ax", "fanout"), Exchange("ay", "fanout"))}
    bindings = [ExchangeBinding("x", "y", "k")]

    def reached(key: str, with_queues: set[str]) -> list[str]:
        return [
            e.name
            for e in exchanges_reached(
                x,
                key,
                None,
                lambda n: [b for b in bindings if b.source == n],
                exchanges.get,
                lambda e: e.name in with_queues,
            )
        ]

    # x passes "k" on to y (so not to its alternate); y routes it nowhere: y's alternate.
    assert reached("k", set()) == ["x", "y", "ay"]
    assert reached("k", {"y"}) == ["x", "y"]
    # Nothing matches at x: x's alternate, unless a queue binding of x routes it.
    assert reached("other", set()) == ["x", "ax"]
    assert reached("other", {"x"}) == ["x"]


# ---- assign_queues ------------------------------------------------------------------------


def test_each_queue_goes_to_the_first_exchange_that_routes_it() -> None:
    copies = assign_queues([("a", {"q1"}), ("b", {"q1", "q2"}), ("c", {"q2"}), ("d", set())])
    assert copies == [("a", frozenset()), ("b", frozenset({"q1"}))]


def test_no_copy_for_an_exchange_that_routes_nothing() -> None:
    assert assign_queues([("a", set()), ("b", {"q"})]) == [("b", frozenset())]
    assert assign_queues([("a", set())]) == []


# ---- chain_copies and the copies' properties ----------------------------------------------


def test_a_queue_bound_to_source_and_destination_gets_one_copy() -> None:
    topology = Topology(a="fanout", b="fanout", c="fanout").bind("b", "a").bind("c", "a")
    topology.queue("shared", "a").queue("shared", "b").queue("shared", "c").queue("only", "c")
    copies, queues = topology.copies("a", "k")
    assert copies == [("a", set()), ("c", {"shared"})]
    assert queues == {"shared", "only"}


def test_each_copy_knows_the_queues_it_serves() -> None:
    topology = Topology(a="fanout", b="fanout").bind("b", "a")
    topology.queue("shared", "a").queue("shared", "b").queue("only", "b")
    route = chain_copies(
        topology.exchanges["a"],
        "k",
        None,
        lambda name: [b for b in topology.bindings if b.source == name],
        topology.exchanges.get,
        lambda x: {q for q, _, _ in topology.queues.get(x.name, [])},
    )
    assert route.served == (frozenset({"shared"}), frozenset({"only"}))


def test_nothing_reached_means_no_copies() -> None:
    topology = Topology(a="fanout", b="direct").bind("b", "a").queue("q", "b", "wanted")
    assert topology.copies("a", "other") == ([], set())
    assert topology.copies("a", "wanted") == ([("b", set())], {"q"})


def test_copies_are_written_to_each_exchanges_topic_marking_skipped_queues() -> None:
    a, b = Exchange("a", "fanout"), Exchange("b", "direct")
    written = copy_destinations(
        NAMESPACE, [(a, frozenset()), (b, frozenset({"q1", "q0"}))], "k", {"amqp.exchange": "a"}
    )
    assert [topic for topic, _ in written] == [
        naming.exchange_topic(NAMESPACE, "a", "fanout", "k"),
        naming.exchange_topic(NAMESPACE, "b", "direct", "k"),
    ]
    assert written[0][1] == {"amqp.exchange": "a"}
    assert written[1][1][ROUTED_ELSEWHERE_KEY] == '["q0","q1"]'
    assert skipped_by(written[1][1]) == {"q0", "q1"}
    assert skipped_by(written[0][1]) == frozenset()


def test_a_route_is_complete_when_every_reached_exchange_gets_a_copy() -> None:
    a, b = Exchange("a", "fanout"), Exchange("b", "fanout")
    bindings = [ExchangeBinding("a", "b", "")]
    exchanges = {"a": a, "b": b}

    def route(routed: dict[str, set[str]]) -> bool:
        return chain_copies(
            a,
            "k",
            None,
            lambda n: [x for x in bindings if x.source == n],
            exchanges.get,
            lambda x: routed.get(x.name, set()),
        ).complete

    assert route({"a": {"q1"}, "b": {"q2"}})
    assert not route({"a": {"q1"}, "b": {"q1"}})
    assert not route({"a": {"q1"}})


def test_written_copies_mark_refusing_queues_and_add_priority_bands() -> None:
    a, b = Exchange("a", "fanout"), Exchange("b", "fanout")
    route = ChainRoute(
        [(a, frozenset()), (b, frozenset({"q1"}))],
        {"q1", "full", "prio"},
        2,
        (frozenset({"q1", "full"}), frozenset({"prio"})),
    )
    written = written_copies(
        NoOwnTopics(),  # type: ignore[arg-type]
        NAMESPACE,
        "/",
        route,
        "k",
        None,
        {},
        None,
        {"prio": 10},
        7,
        frozenset({"full"}),
    )
    topics = [topic for topic, _, _ in written]
    assert topics == [
        naming.exchange_topic(NAMESPACE, "a", "fanout", "k"),
        naming.exchange_topic(NAMESPACE, "b", "fanout", "k"),
        naming.priority_band_topic(NAMESPACE, "prio", 7),
    ]
    first, second, band = (properties for _, properties, _ in written)
    assert first[REFUSED_BY_KEY] == '["full"]'
    assert skipped_by(first) == {"full"}
    assert skipped_by(second) == {"q1", "prio"}
    assert second[IN_PRIORITY_BAND_KEY] == '["prio"]'
    assert "prio" not in skipped_by(band)


class NoOwnTopics:
    """A topology cache for exchanges whose bindings read the exchange's topic."""

    def routed_sets(self, *_: object) -> list[BindingSet]:
        raise AssertionError("not asked for fanout exchanges")

    def reads_exchange_topic(self, *_: object) -> bool:
        return True


@dataclass
class OwnTopics:
    """A topology cache whose topic exchange `t` has bindings with topics of their own."""

    sets: list[BindingSet]
    legacy: bool = False

    def routed_sets(
        self, vhost: str, exchange: Exchange, routing_key: str, headers: object
    ) -> list[BindingSet]:
        return [
            b
            for b in self.sets
            if b.exchange == exchange.name
            and any(
                binding_matches("topic", e.routing_key, {}, routing_key, None) for e in b.entries
            )
        ]

    def reads_exchange_topic(self, vhost: str, exchange: str) -> bool:
        return self.legacy


def own_set(queue: str, pattern: str, set_id: str) -> BindingSet:
    return BindingSet(
        queue,
        "t",
        "t",
        naming.subscription_name(queue, set_id),
        (BindingEntry(pattern),),
        exchange_type="topic",
        binding_topic=naming.binding_topic(NAMESPACE, "t", queue, set_id).local,
    )


def test_a_topic_exchange_reached_through_a_binding_writes_to_the_binding_topics() -> None:
    cache = OwnTopics([own_set("q1", "k", "0" * 12), own_set("q2", "#", "1" * 12)])
    route = ChainRoute(
        [(Exchange("t", "topic"), frozenset({"q2"}))], {"q1", "q2"}, 2, (frozenset({"q1"}),)
    )
    written = written_copies(
        cache,  # type: ignore[arg-type]
        NAMESPACE,
        "/",
        route,
        "k",
        None,
        {},
        None,
        {},
        None,
    )
    # q2 gets it from an earlier copy: only q1's binding topic, and not the exchange topic.
    assert [topic for topic, _, _ in written] == [
        naming.binding_topic(NAMESPACE, "t", "q1", "0" * 12)
    ]
    legacy = OwnTopics(cache.sets, legacy=True)
    written = written_copies(
        legacy,  # type: ignore[arg-type]
        NAMESPACE,
        "/",
        route,
        "k",
        None,
        {},
        None,
        {},
        None,
    )
    assert [topic for topic, _, _ in written] == [
        naming.exchange_topic(NAMESPACE, "t", "topic", "k"),
        naming.binding_topic(NAMESPACE, "t", "q1", "0" * 12),
    ]
