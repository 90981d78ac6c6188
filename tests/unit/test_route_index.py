"""The route index answers as matching every binding in turn would (model/routing.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from starlight_py.model.route_index import ExchangeRoutes, TopicTrie
from starlight_py.model.routing import binding_matches, topic_matches

WORDS = st.sampled_from(["a", "b", "c", "", "*", "#"])
KEY_WORDS = st.sampled_from(["a", "b", "c", "", "*", "#", "d"])
PATTERNS = st.lists(WORDS, max_size=4).map(".".join)
KEYS = st.lists(KEY_WORDS, max_size=5).map(".".join)


def test_trie_matches_examples() -> None:
    trie: TopicTrie[str] = TopicTrie()
    for pattern in ["t.1.*", "t.2.*", "t.#", "#", "*.x", "t.*.y", ""]:
        trie.add(pattern, pattern)
    assert trie.match("t.1.x") == {"t.1.*", "t.#", "#", "t.*.y"} - {"t.*.y"}
    assert trie.match("t.2.y") == {"t.2.*", "t.#", "#", "t.*.y"}
    assert trie.match("q.x") == {"#", "*.x"}
    assert trie.match("") == {"#", ""}
    assert trie.match("t") == {"t.#", "#"}


@settings(max_examples=300)
@given(st.lists(st.tuples(PATTERNS, st.integers(0, 5)), max_size=12), KEYS)
def test_trie_agrees_with_matching_each_pattern(
    bindings: list[tuple[str, int]], routing_key: str
) -> None:
    trie: TopicTrie[int] = TopicTrie()
    for pattern, key in bindings:
        trie.add(pattern, key)
    expected = {key for pattern, key in bindings if topic_matches(pattern, routing_key)}
    assert trie.match(routing_key) == expected


@settings(max_examples=300)
@given(
    st.lists(st.tuples(PATTERNS, st.integers(0, 5)), max_size=12),
    st.lists(st.integers(0, 11), max_size=12),
    KEYS,
)
def test_removing_leaves_what_remains(
    bindings: list[tuple[str, int]], removed: list[int], routing_key: str
) -> None:
    trie: TopicTrie[int] = TopicTrie()
    for pattern, key in bindings:
        trie.add(pattern, key)
    left = list(bindings)
    for index in sorted(set(removed), reverse=True):
        if index < len(bindings):
            pattern, key = bindings[index]
            trie.remove(pattern, key)
            left.remove((pattern, key))
    expected = {key for pattern, key in left if topic_matches(pattern, routing_key)}
    assert trie.match(routing_key) == expected
    if not left:
        assert not trie


@settings(max_examples=200)
@given(
    st.sampled_from(["direct", "topic", "fanout", "headers"]),
    st.dictionaries(
        st.integers(0, 6), st.lists(st.tuples(PATTERNS, st.just({})), max_size=3), max_size=6
    ),
    st.lists(st.integers(0, 6), max_size=4),
    KEYS,
)
def test_exchange_routes_agree_with_binding_matches(
    kind: str,
    sets: dict[int, list[tuple[str, dict[str, object]]]],
    removed: list[int],
    routing_key: str,
) -> None:
    routes: ExchangeRoutes[int] = ExchangeRoutes(kind)
    for key, bindings in sets.items():
        routes.put(key, bindings)
        routes.put(key, bindings)  # putting again replaces, it does not add
    for key in removed:
        routes.remove(key)
        sets.pop(key, None)
    expected = {
        key
        for key, bindings in sets.items()
        if any(binding_matches(kind, k, args, routing_key, None) for k, args in bindings)
    }
    assert routes.routed(routing_key, None) == expected


def test_headers_routes_match_arguments() -> None:
    routes: ExchangeRoutes[str] = ExchangeRoutes("headers")
    routes.put("all", [("", {"x-match": "all", "a": 1, "b": 2})])
    routes.put("any", [("", {"x-match": "any", "a": 1, "b": 2})])
    assert routes.routed("", {"a": 1, "b": 2}) == {"all", "any"}
    assert routes.routed("", {"a": 1}) == {"any"}
    assert routes.routed("", {}) == set()
