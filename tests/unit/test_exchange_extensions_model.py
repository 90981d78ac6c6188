"""The pure rules of alternate exchanges (the chain a message follows) and of
x-delayed-message exchanges (declaration checks, routing type, the x-delay header)."""

from __future__ import annotations

from typing import Any

import pytest

from starlight_py.amqp.errors import CommandInvalid, PreconditionFailed
from starlight_py.model.routing import route_with_alternates
from starlight_py.model.topology import Exchange, message_delay_ms, validate_exchange

VHOST = "/"


def chain(*exchanges: Exchange) -> dict[str, Exchange]:
    return {x.name: x for x in exchanges}


def ae(name: str, alternate: str | None = None, kind: str = "direct") -> Exchange:
    arguments = {} if alternate is None else {"alternate-exchange": alternate}
    return Exchange(name, kind, arguments=arguments)


def route(start: str, exchanges: dict[str, Exchange], routing: set[str]) -> list[str]:
    tried: list[str] = []

    def routes(x: Exchange) -> bool:
        tried.append(x.name)
        return x.name in routing

    path = route_with_alternates(exchanges[start], exchanges.get, routes)
    assert tried == [x.name for x in path] or not path
    return [x.name for x in path]


def test_a_routing_exchange_is_the_whole_path() -> None:
    exchanges = chain(ae("x", "ae"), ae("ae"))
    assert route("x", exchanges, {"x", "ae"}) == ["x"]


def test_the_alternates_are_followed_until_one_routes() -> None:
    exchanges = chain(ae("x", "a1"), ae("a1", "a2"), ae("a2", "a3"), ae("a3"))
    assert route("x", exchanges, {"a2", "a3"}) == ["x", "a1", "a2"]


@pytest.mark.parametrize(
    "exchanges",
    [
        chain(ae("x")),  # no alternate
        chain(ae("x", "missing")),  # an alternate that does not exist
        chain(ae("x", "x")),  # itself
        chain(ae("x", "a"), ae("a", "b"), ae("b", "a")),  # a cycle further on
    ],
)
def test_unroutable_chains_end(exchanges: dict[str, Exchange]) -> None:
    assert route("x", exchanges, set()) == []


def test_each_exchange_of_a_cycle_is_tried_once() -> None:
    tried: list[str] = []
    exchanges = chain(ae("x", "a"), ae("a", "x"))

    def routes(x: Exchange) -> bool:
        tried.append(x.name)
        return False

    assert route_with_alternates(exchanges["x"], exchanges.get, routes) == ()
    assert tried == ["x", "a"]


def test_alternate_exchange_argument_as_bytes_is_read_as_text() -> None:
    assert ae("x", "alt").alternate_exchange == "alt"
    assert Exchange("x", "direct", arguments={"alternate-exchange": b"alt"}).alternate_exchange == (
        "alt"
    )
    assert ae("x").alternate_exchange is None


@pytest.mark.parametrize("value", [5, True, 1.5, {"a": 1}])
def test_an_alternate_exchange_that_is_not_a_string_is_406(value: Any) -> None:
    with pytest.raises(PreconditionFailed) as info:
        validate_exchange(Exchange("x", "direct", arguments={"alternate-exchange": value}), VHOST)
    assert "for arg 'alternate-exchange' in exchange 'x' in vhost '/'" in info.value.text


# ---- x-delayed-message ---------------------------------------------------------------------


def delayed(routing_type: Any) -> Exchange:
    return Exchange("d", "x-delayed-message", arguments={"x-delayed-type": routing_type})


@pytest.mark.parametrize("routing_type", ["direct", "fanout", "topic", "headers", b"topic"])
def test_a_delayed_exchange_routes_as_its_x_delayed_type(routing_type: Any) -> None:
    exchange = delayed(routing_type)
    validate_exchange(exchange, VHOST)
    expected = routing_type.decode() if isinstance(routing_type, bytes) else routing_type
    assert exchange.routing_type == expected
    assert exchange.delays_messages


def test_other_exchanges_route_as_their_type_and_do_not_delay() -> None:
    exchange = Exchange("t", "topic", arguments={"x-delayed-type": "direct"})
    assert exchange.routing_type == "topic"
    assert not exchange.delays_messages


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({}, "must be an existing exchange type"),
        ({"x-delayed-type": 1}, "must be an existing exchange type"),
        ({"x-delayed-type": "x-delayed-message"}, "can't be 'x-delayed-message'"),
    ],
)
def test_a_delayed_exchange_without_a_usable_x_delayed_type_is_406(
    arguments: dict[str, Any], text: str
) -> None:
    with pytest.raises(PreconditionFailed) as info:
        validate_exchange(Exchange("d", "x-delayed-message", arguments=arguments), VHOST)
    assert text in info.value.text
    assert info.value.method == (40, 10)


def test_an_unknown_x_delayed_type_is_503_like_an_unknown_type() -> None:
    with pytest.raises(CommandInvalid) as info:
        validate_exchange(delayed("x-consistent-hash"), VHOST)
    assert info.value.text == "unknown exchange type 'x-consistent-hash'"


def test_redeclaring_with_another_x_delayed_type_is_406() -> None:
    with pytest.raises(PreconditionFailed) as info:
        delayed("direct").check_equivalent(delayed("topic"), VHOST)
    assert "inequivalent arg 'x-delayed-type'" in info.value.text
    delayed("direct").check_equivalent(delayed("direct"), VHOST)


@pytest.mark.parametrize(
    ("headers", "delay"),
    [
        (None, 0),
        ({}, 0),
        ({"x-delay": 1500}, 1500),
        ({"x-delay": 0}, 0),
        ({"x-delay": -20}, 0),
        ({"x-delay": 3 * 24 * 3600 * 1000}, 3 * 24 * 3600 * 1000),
        ({"x-delay": "1500"}, 0),
        ({"x-delay": b"1500"}, 0),
        ({"x-delay": True}, 0),
        ({"x-delay": 1.5}, 0),
    ],
)
def test_x_delay_is_a_whole_number_of_milliseconds(headers: Any, delay: int) -> None:
    assert message_delay_ms(headers) == delay
