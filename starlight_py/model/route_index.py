"""Which bindings of one exchange route a message, without looking at every binding.

The publishing proxy decides, for each message, which queues its exchange routes it to
(with topic and headers exchanges, it then writes the message only to those queues' binding
topics: model/naming.py). Exchanges with thousands of bindings are common, so this must not
cost one match per binding:

- direct exchanges: a dictionary from routing key to the bindings with that key;
- fanout exchanges: every binding;
- topic exchanges: a trie of the binding patterns' words, walked with the routing key's
  words (`*` one word, `#` zero or more), so a message costs about as many steps as its
  key has words, whatever the number of patterns;
- headers exchanges (and types the proxy does not know): each binding's arguments matched in
  turn (RabbitMQ does the same for headers; topologies with thousands of headers bindings on
  one exchange are rare).

Bindings are kept by a key of the caller's choice (a binding set: a queue's bindings to the
exchange) and `routed` answers with the keys. Pure data; the topology cache keeps one index
per exchange and updates it as binding sets change.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from starlight_py.model.routing import binding_matches, topic_words

K = TypeVar("K", bound=Hashable)


@dataclass
class _Node(Generic[K]):
    children: dict[str, _Node[K]] = field(default_factory=dict)
    # Keys whose patterns end at this node, with how many of their patterns do.
    keys: dict[K, int] = field(default_factory=dict)


class TopicTrie(Generic[K]):
    """RabbitMQ's topic matching for many patterns at once."""

    def __init__(self) -> None:
        self._root: _Node[K] = _Node()

    def add(self, pattern: str, key: K) -> None:
        node = self._root
        for word in topic_words(pattern):
            node = node.children.setdefault(word, _Node())
        node.keys[key] = node.keys.get(key, 0) + 1

    def remove(self, pattern: str, key: K) -> None:
        """Remove one `add` of (pattern, key); nothing when there was none."""
        path = [self._root]
        for word in topic_words(pattern):
            child = path[-1].children.get(word)
            if child is None:
                return
            path.append(child)
        last = path[-1]
        count = last.keys.get(key, 0)
        if count <= 1:
            last.keys.pop(key, None)
        else:
            last.keys[key] = count - 1
        # Prune the nodes left empty, from the leaf up.
        words = topic_words(pattern)
        for depth in range(len(words), 0, -1):
            node = path[depth]
            if node.keys or node.children:
                break
            del path[depth - 1].children[words[depth - 1]]

    def match(self, routing_key: str) -> set[K]:
        found: set[K] = set()
        self._walk(self._root, topic_words(routing_key), 0, found, set())
        return found

    def _walk(
        self,
        node: _Node[K],
        words: tuple[str, ...],
        at: int,
        found: set[K],
        seen: set[tuple[int, int]],
    ) -> None:
        # `seen`: (node, position) pairs already walked; several `#` can reach the same.
        mark = (id(node), at)
        if mark in seen:
            return
        seen.add(mark)
        children = node.children
        hash_child = children.get("#")
        if at == len(words):
            found.update(node.keys)
            if hash_child is not None:
                self._walk(hash_child, words, at, found, seen)  # `#` matching no word
            return
        exact = children.get(words[at])
        if exact is not None:
            self._walk(exact, words, at + 1, found, seen)
        star = children.get("*")
        if star is not None and star is not exact:
            self._walk(star, words, at + 1, found, seen)
        if hash_child is not None:
            for rest in range(at, len(words) + 1):
                self._walk(hash_child, words, rest, found, seen)

    def __bool__(self) -> bool:
        return bool(self._root.children or self._root.keys)


class ExchangeRoutes(Generic[K]):
    """The active bindings of one exchange, by key (one key per queue's binding set), and
    which keys a message is routed to."""

    def __init__(self, routing_type: str) -> None:
        self.routing_type = routing_type
        # key -> its bindings as (routing key, arguments)
        self._bindings: dict[K, tuple[tuple[str, Mapping[str, Any]], ...]] = {}
        self._trie: TopicTrie[K] = TopicTrie()
        self._by_key: dict[str, dict[K, int]] = {}

    def put(self, key: K, bindings: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
        """Set the bindings of `key` (replacing what it had); none removes it."""
        self.remove(key)
        kept = tuple(bindings)
        if not kept:
            return
        self._bindings[key] = kept
        for routing_key, _ in kept:
            if self.routing_type == "topic":
                self._trie.add(routing_key, key)
            elif self.routing_type == "direct":
                counts = self._by_key.setdefault(routing_key, {})
                counts[key] = counts.get(key, 0) + 1

    def remove(self, key: K) -> None:
        old = self._bindings.pop(key, None)
        if old is None:
            return
        for routing_key, _ in old:
            if self.routing_type == "topic":
                self._trie.remove(routing_key, key)
            elif self.routing_type == "direct":
                counts = self._by_key.get(routing_key, {})
                left = counts.get(key, 0) - 1
                if left > 0:
                    counts[key] = left
                else:
                    counts.pop(key, None)
                if not counts:
                    self._by_key.pop(routing_key, None)

    def routed(self, routing_key: str, headers: Mapping[str, Any] | None) -> set[K]:
        """The keys one of whose bindings routes a message with this key and headers."""
        kind = self.routing_type
        if kind == "topic":
            return self._trie.match(routing_key)
        if kind == "direct":
            return set(self._by_key.get(routing_key, ()))
        if kind == "fanout":
            return set(self._bindings)
        return {
            key
            for key, bindings in self._bindings.items()
            if any(
                binding_matches(kind, binding_key, arguments, routing_key, headers)
                for binding_key, arguments in bindings
            )
        }

    def __len__(self) -> int:
        return len(self._bindings)
