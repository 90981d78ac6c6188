"""Which bindings a message matches: RabbitMQ's rules for direct, fanout, topic and headers
exchanges, plus the position window of each binding (a binding routes only the messages
published after it was made and, once unbound, up to its end).

A publish goes to exactly one Pulsar topic (per routing key for direct exchanges, per
exchange otherwise); these functions decide, when a queue's subscription reads a message,
whether one of the queue's bindings on that topic routes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any, Protocol, TypeVar

from starlight_py.model.positions import MessageIdRecord
from starlight_py.model.priorities import PRIORITY_BAND_TYPE


def topic_words(key: str) -> tuple[str, ...]:
    # RabbitMQ: the empty key has no words; "a..b" has an empty middle word.
    return tuple(key.split(".")) if key else ()


@lru_cache(maxsize=4096)
def _pattern_words(pattern: str) -> tuple[str, ...]:
    return topic_words(pattern)


def topic_matches(pattern: str, routing_key: str) -> bool:
    """`*` matches exactly one word, `#` zero or more words (RabbitMQ's topic exchange)."""
    return _match(_pattern_words(pattern), topic_words(routing_key))


def _match(pattern: Sequence[str], words: Sequence[str]) -> bool:
    # Iterative matcher with backtracking on the last '#', linear in practice.
    p = w = 0
    star_p = star_w = -1
    while w < len(words):
        if p < len(pattern) and pattern[p] == "#":
            star_p, star_w = p, w
            p += 1
        elif p < len(pattern) and (pattern[p] == "*" or pattern[p] == words[w]):
            p += 1
            w += 1
        elif star_p >= 0:
            star_w += 1
            p, w = star_p + 1, star_w
        else:
            return False
    while p < len(pattern) and pattern[p] == "#":
        p += 1
    return p == len(pattern)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    if isinstance(a, bytes):
        a = a.decode("utf-8", "replace")
    if isinstance(b, bytes):
        b = b.decode("utf-8", "replace")
    return bool(a == b)


def headers_match(binding_arguments: Mapping[str, Any], headers: Mapping[str, Any] | None) -> bool:
    """RabbitMQ's headers exchange: x-match all (default) / any / all-with-x / any-with-x.
    A binding argument with no value (void) matches on the header's presence alone."""
    headers = headers or {}
    mode = binding_arguments.get("x-match", "all")
    if isinstance(mode, bytes):
        mode = mode.decode()
    with_x = mode.endswith("-with-x")
    wanted = [
        (k, v)
        for k, v in binding_arguments.items()
        if k != "x-match" and (with_x or not k.startswith("x-"))
    ]

    def one(key: str, value: Any) -> bool:
        if key not in headers:
            return False
        return value is None or _same_value(value, headers[key])

    if mode.startswith("any"):
        return any(one(k, v) for k, v in wanted)
    return all(one(k, v) for k, v in wanted)


def binding_matches(
    exchange_type: str,
    binding_key: str,
    binding_arguments: Mapping[str, Any],
    routing_key: str,
    headers: Mapping[str, Any] | None,
) -> bool:
    """Does one binding route a message (ignoring positions)?"""
    if exchange_type == "fanout":
        return True
    if exchange_type == "topic":
        return topic_matches(binding_key, routing_key)
    if exchange_type == "headers":
        return headers_match(binding_arguments, headers)
    return binding_key == routing_key  # direct and the default exchange


def within_window(
    position: MessageIdRecord | None,
    start: MessageIdRecord | None,
    end: MessageIdRecord | None,
    unbound: bool,
) -> bool:
    """Was the binding in place when the message at `position` was published?"""
    if position is None:
        return not unbound
    if start is not None and position <= start:
        return False
    if unbound:
        return end is not None and position <= end
    return True


def any_binding_routes(
    exchange_type: str,
    entries: Iterable[Any],
    routing_key: str,
    headers: Mapping[str, Any] | None,
    position: MessageIdRecord | Callable[[], MessageIdRecord | None] | None,
) -> bool:
    """True when one of a queue's binding entries (objects with routing_key, arguments,
    start, end, unbound) on this topic routes the message: the queue gets it once. A
    priority band's topic holds only what was routed to the queue: all of it is the
    queue's. `position` may be given as a function: it is asked only when an entry's window
    needs it (most bindings route everything their subscription reads)."""
    if exchange_type == PRIORITY_BAND_TYPE:
        return True
    for e in entries:
        if not binding_matches(exchange_type, e.routing_key, e.arguments, routing_key, headers):
            continue
        if e.start is None and not e.unbound:
            return True  # since the subscription was created: no window to check
        at = position() if callable(position) else position
        if within_window(at, e.start, e.end, e.unbound):
            return True
    return False


class _HasAlternate(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def alternate_exchange(self) -> str | None: ...


_Exchange = TypeVar("_Exchange", bound=_HasAlternate)


def route_with_alternates(
    exchange: _Exchange,
    exchange_named: Callable[[str], _Exchange | None],
    routes: Callable[[_Exchange], bool],
) -> tuple[_Exchange, ...]:
    """The exchanges a message passes through until one routes it: `exchange`, then its
    alternate exchange while the previous one routes nothing, and so on. The last one
    routes the message; empty when none does (an alternate exchange that does not exist,
    or one already tried, ends the chain: RabbitMQ's protection against AE cycles)."""
    path: list[_Exchange] = []
    seen: set[str] = set()
    current: _Exchange | None = exchange
    while current is not None and current.name not in seen:
        path.append(current)
        if routes(current):
            return tuple(path)
        seen.add(current.name)
        alternate = current.alternate_exchange
        current = exchange_named(alternate) if alternate is not None else None
    return ()


class _RoutesOnward(Protocol):
    """An exchange-to-exchange binding as routing sees it."""

    @property
    def destination(self) -> str: ...

    @property
    def routing_key(self) -> str: ...

    @property
    def arguments(self) -> Mapping[str, Any]: ...


class _Routes(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def routing_type(self) -> str: ...

    @property
    def alternate_exchange(self) -> str | None: ...


_Routing = TypeVar("_Routing", bound=_Routes)


def exchanges_reached(
    exchange: _Routing,
    routing_key: str,
    headers: Mapping[str, Any] | None,
    bindings_from: Callable[[str], Iterable[_RoutesOnward]],
    exchange_named: Callable[[str], _Routing | None],
    routes_a_queue: Callable[[_Routing], bool] = lambda _x: False,
) -> tuple[_Routing, ...]:
    """The exchanges a message published to `exchange` reaches through exchange-to-exchange
    bindings (RabbitMQ's exchange.bind), breadth first, `exchange` first: a binding whose
    source routes the message (by the source's type, as a queue binding would) passes it to
    its destination with the same routing key and headers. An exchange that routes the
    message nowhere (no queue binding, `routes_a_queue`, and no exchange binding matches)
    passes it to its alternate exchange, as RabbitMQ's walk does. Each exchange appears
    once, so cycles end; a destination that does not exist is skipped."""
    reached: list[_Routing] = [exchange]
    seen = {exchange.name}
    index = 0

    def reach(name: str) -> None:
        if name in seen:
            return
        destination = exchange_named(name)
        if destination is None:
            return
        seen.add(name)
        reached.append(destination)

    while index < len(reached):
        source = reached[index]
        index += 1
        onward = False
        for binding in bindings_from(source.name):
            if binding_matches(
                source.routing_type, binding.routing_key, binding.arguments, routing_key, headers
            ):
                onward = True
                reach(binding.destination)
        alternate = source.alternate_exchange
        if not onward and alternate is not None and not routes_a_queue(source):
            reach(alternate)
    return tuple(reached)


def assign_queues(
    routed: Sequence[tuple[str, set[str] | frozenset[str]]],
) -> list[tuple[str, frozenset[str]]]:
    """Where a message that reached several exchanges is written, so that each queue gets it
    once: `routed` is each reached exchange (in the order reached) with the queues its own
    bindings route the message to. The result is the exchanges whose topic gets a copy, with
    the queues whose subscriptions on that topic must skip the copy (they get it from an
    exchange reached earlier). Each queue goes to the first exchange that routes it; an
    exchange that routes no queue, or only queues served earlier, gets no copy."""
    assigned: set[str] = set()
    copies: list[tuple[str, frozenset[str]]] = []
    for name, queues in routed:
        if not queues or queues <= assigned:
            continue
        copies.append((name, frozenset(queues & assigned)))
        assigned |= queues
    return copies
