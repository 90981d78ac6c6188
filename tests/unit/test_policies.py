"""Policies (model/policies.py): validation with RabbitMQ 3.10's texts (as its HTTP API
answered them), which one policy applies, how a policy combines with declared arguments;
and the topology cache that applies them (metadata/cache.py), fed by hand."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from starlight_py.metadata.cache import TopologyCache
from starlight_py.metadata.records import Paths, decode, encode
from starlight_py.metadata.zookeeper import ZooKeeperClient
from starlight_py.model.policies import (
    Policy,
    PolicyInvalid,
    effective_exchange_arguments,
    effective_queue_arguments,
    erlang_term,
    matching_policy,
    parse_policy,
    unsupported_keys,
)
from starlight_py.model.queue_limits import LengthLimit
from starlight_py.model.topology import Exchange, Queue

PATHS = Paths("/starlight")


def refusal(body: dict[str, Any]) -> str:
    with pytest.raises(PolicyInvalid) as caught:
        parse_policy("/", "p", body)
    return str(caught.value)


# Answers of RabbitMQ 3.10.8's PUT /api/policies/%2F/p1 (reasons unescaped).
@pytest.mark.parametrize(
    ("definition", "reason"),
    [
        ({"message-ttl": -1}, "-1 is not a valid message TTL"),
        ({"message-ttl": "x"}, '<<"x">> is not a valid message TTL'),
        ({"expires": 0}, "0 is not a valid queue expiry"),
        ({"expires": "5"}, '<<"5">> is not a valid queue expiry'),
        ({"max-length": -1}, "-1 is not a valid maximum length"),
        ({"max-length": 1.5}, "1.5 is not a valid maximum length"),
        ({"max-length": True}, "true is not a valid maximum length"),
        ({"max-length-bytes": "a"}, '<<"a">> is not a valid maximum length in bytes'),
        ({"dead-letter-exchange": 5}, "5 is not a valid dead letter exchange name"),
        ({"dead-letter-routing-key": 5}, "5 is not a valid dead letter routing key"),
        ({"overflow": "foo"}, '<<"foo">> is not a valid overflow value'),
        ({"delivery-limit": -2}, "-2 is not a valid delivery limit"),
        ({"alternate-exchange": 1}, "1 is not a valid alternate exchange name"),
        ({"max-priority": 5}, '[{<<"max-priority">>,5}] are not recognised policy settings'),
        (
            {"foo": 1, "bar": 2},
            '[{<<"bar">>,2},{<<"foo">>,1}] are not recognised policy settings',
        ),
        ({}, "no policy provided"),
    ],
)
def test_bad_definitions_are_refused_with_rabbitmq_texts(
    definition: dict[str, Any], reason: str
) -> None:
    assert refusal({"pattern": "^a", "definition": definition}) == (
        f"Validation failed\n\n{reason}\n"
    )


def test_bad_policies_are_refused_with_rabbitmq_texts() -> None:
    ok = {"max-length": 1}
    assert refusal({"definition": ok}) == "[{key_missing,pattern}]"
    assert refusal({"pattern": "^a"}) == "[{key_missing,definition}]"
    assert "pattern should be a binary but was 5" in refusal({"pattern": 5, "definition": ok})
    assert "pattern should be regular expression but is invalid" in refusal(
        {"pattern": "(", "definition": ok}
    )
    assert "apply-to 'foo' unrecognised; should be 'queues', 'exchanges' or 'all'" in refusal(
        {"pattern": "^a", "definition": ok, "apply-to": "foo"}
    )
    assert 'priority should be a number, actually was <<"7">>' in refusal(
        {"pattern": "^a", "definition": ok, "priority": "7"}
    )
    assert "priority should be a number, actually was null" in refusal(
        {"pattern": "^a", "definition": ok, "priority": None}
    )


def test_what_rabbitmq_accepts_is_accepted() -> None:
    # No cross-checks: a routing key without an exchange, overflow for exchanges, a TTL
    # over the ten years an x-message-ttl argument allows, a fractional priority.
    for body in (
        {"pattern": "^a", "definition": {"dead-letter-routing-key": "k"}},
        {"pattern": "^a", "definition": {"overflow": "reject-publish"}, "apply-to": "exchanges"},
        {"pattern": "^a", "definition": {"message-ttl": 315360000001}},
        {"pattern": "^a", "definition": {"queue-mode": "lazy"}, "priority": 1.5},
    ):
        policy = parse_policy("/", "p", body)
        assert policy.definition == body["definition"]
    policy = parse_policy("v", "p", {"pattern": "^a", "definition": {"max-length": 1}})
    assert policy.to_json() == {
        "vhost": "v",
        "name": "p",
        "pattern": "^a",
        "apply-to": "all",
        "definition": {"max-length": 1},
        "priority": 0,
    }
    assert decode(encode(policy)) == policy


def test_keys_starlight_cannot_apply_are_refused_by_name() -> None:
    reason = refusal({"pattern": ".*", "definition": {"ha-mode": "all", "max-length": 1}})
    assert "ha-mode not supported by starlight-py" in reason
    assert unsupported_keys({"ha-mode": "all", "federation-upstream": "x", "expires": 1}) == [
        "federation-upstream",
        "ha-mode",
    ]


def test_erlang_terms() -> None:
    assert erlang_term(None) == "null"
    assert erlang_term(False) == "false"
    assert erlang_term(["a", 1]) == '[<<"a">>,1]'


def policy(name: str, pattern: str, priority: float = 0, apply_to: str = "all") -> Policy:
    return Policy("/", name, pattern, {"max-length": 1}, apply_to, priority)


def test_the_highest_priority_of_the_matching_policies_applies() -> None:
    low, high = policy("low", "^orders", 1), policy("high", "orders", 5)
    other = policy("other", "^invoices", 10)
    assert matching_policy([low, high, other], "queues", "orders.eu") is high
    assert matching_policy([low, other], "queues", "orders.eu") is low
    # The pattern is searched, not anchored.
    assert matching_policy([high], "queues", "new-orders") is high
    assert matching_policy([low, high, other], "queues", "payments") is None
    # Ties: the first name, whatever order they are given in.
    a, b = policy("a", ".*", 3), policy("b", ".*", 3)
    assert matching_policy([b, a], "queues", "x") is a
    assert matching_policy([a, b], "queues", "x") is a


def test_apply_to_picks_queues_or_exchanges() -> None:
    queues, exchanges = policy("q", ".*", 0, "queues"), policy("e", ".*", 0, "exchanges")
    assert matching_policy([queues, exchanges], "queues", "x") is queues
    assert matching_policy([queues, exchanges], "exchanges", "x") is exchanges
    # A higher-priority policy for exchanges does not hide one for queues.
    assert matching_policy([queues, policy("e", ".*", 9, "exchanges")], "queues", "x") is queues


def test_the_smaller_limit_wins_and_declared_names_win() -> None:
    definition = {
        "max-length": 2,
        "message-ttl": 5000,
        "expires": 60000,
        "max-length-bytes": 100,
        "delivery-limit": 3,
        "dead-letter-exchange": "from-policy",
        "dead-letter-routing-key": "policy-key",
        "overflow": "reject-publish",
    }
    declared = {
        "x-max-length": 5,
        "x-message-ttl": 1000,
        "x-dead-letter-exchange": "declared",
        "x-overflow": "drop-head",
    }
    assert effective_queue_arguments(declared, definition) == {
        "x-max-length": 2,  # policy smaller
        "x-message-ttl": 1000,  # argument smaller
        "x-expires": 60000,
        "x-max-length-bytes": 100,
        "x-delivery-limit": 3,
        "x-dead-letter-exchange": "declared",
        "x-dead-letter-routing-key": "policy-key",
        "x-overflow": "drop-head",
    }
    assert effective_queue_arguments({"x-max-length": 1}, {}) == {"x-max-length": 1}
    stream = {"x-queue-type": "stream"}
    assert effective_queue_arguments(stream, definition) == {
        "x-queue-type": "stream",
        "x-max-length-bytes": 100,  # a stream's retention; the rest is not for streams
    }
    assert effective_exchange_arguments({}, {"alternate-exchange": "ae"}) == {
        "alternate-exchange": "ae"
    }
    assert effective_exchange_arguments(
        {"alternate-exchange": "mine"}, {"alternate-exchange": "ae"}
    ) == {"alternate-exchange": "mine"}


@pytest.fixture
def cache() -> Iterator[TopologyCache]:
    zookeeper = ZooKeeperClient("127.0.0.1:1")  # never started: never connects
    yield TopologyCache(zookeeper, PATHS)
    zookeeper.kazoo.close()


def put(cache: TopologyCache, path: str, record: object) -> None:
    cache._apply(path[len(PATHS.vhosts) + 1 :].split("/"), encode(record))


def remove(cache: TopologyCache, path: str) -> None:
    cache._apply(path[len(PATHS.vhosts) + 1 :].split("/"), None)


def test_the_cache_applies_policies_to_existing_and_new_records(cache: TopologyCache) -> None:
    put(cache, PATHS.queue("v", "orders"), Queue("orders", arguments={"x-max-length": 5}))
    put(cache, PATHS.exchange("v", "in"), Exchange("in", "direct"))
    limit = Policy("v", "limit", "^orders", {"max-length": 2, "message-ttl": 100}, "queues")
    put(cache, PATHS.policy("v", "limit"), limit)
    queue = cache.queue("v", "orders")
    assert queue is not None
    assert queue.arguments == {"x-max-length": 2, "x-message-ttl": 100}
    assert cache.length_limits("v") == {"orders": LengthLimit(2, None, "drop-head")}
    assert cache.policy_of("v", "queues", "orders") == limit
    exchange = cache.exchange("v", "in")
    assert exchange is not None and exchange.alternate_exchange is None

    put(cache, PATHS.queue("v", "orders-2"), Queue("orders-2"))
    later = cache.queue("v", "orders-2")
    assert later is not None and later.arguments["x-max-length"] == 2
    unmatched = Queue("payments")
    put(cache, PATHS.queue("v", "payments"), unmatched)
    assert cache.queue("v", "payments") == unmatched
    put(cache, PATHS.policy("w", "all"), Policy("w", "all", ".*", {"max-length": 0}))
    assert cache.queue("v", "payments") == unmatched  # another vhost's policy

    ae = Policy("v", "ae", "^in$", {"alternate-exchange": "spill"}, "exchanges", 1)
    put(cache, PATHS.policy("v", "ae"), ae)
    exchange = cache.exchange("v", "in")
    assert exchange is not None and exchange.alternate_exchange == "spill"

    remove(cache, PATHS.policy("v", "limit"))
    assert cache.queue("v", "orders") == Queue("orders", arguments={"x-max-length": 5})
    assert cache.length_limits("v") == {"orders": LengthLimit(5, None, "drop-head")}
