"""Dead-lettering, TTL and delivery-limit rules (starlight_py/model/dead_letters.py).

The expected x-death shapes were read from RabbitMQ 3.10.8: a new entry's keys in the order
count, reason, queue, time, exchange, routing-keys[, original-expiration]; a merged entry's
keys sorted, its count incremented and its first time/exchange/routing-keys kept.
"""

from __future__ import annotations

import datetime

import pytest
from pamqp import commands

from starlight_py.gateway import dead_lettering
from starlight_py.model.dead_letters import (
    DELIVERY_LIMIT,
    EXPIRED,
    REJECTED,
    Death,
    MessagePolicy,
    dead_letter_routing_key,
    dead_lettered_headers,
    dead_lettered_properties,
    death_at_delivery,
    death_routing_keys,
    expires_at_ms,
    is_automatic_cycle,
    message_expiration_ms,
    next_expiry_look,
)
from starlight_py.model.topology import Queue

T1 = datetime.datetime(2026, 11, 22, 8, 0, 0, tzinfo=datetime.UTC)
T2 = datetime.datetime(2026, 11, 22, 9, 0, 0, tzinfo=datetime.UTC)


def death(reason: str = REJECTED, queue: str = "q", when: datetime.datetime = T1) -> Death:
    return Death(reason, queue, "x", ("k",), when)


# ---- policy ------------------------------------------------------------------------------------


def test_policy_reads_the_queue_arguments() -> None:
    policy = MessagePolicy.of(
        {
            "x-dead-letter-exchange": b"dlx",
            "x-dead-letter-routing-key": "dead",
            "x-message-ttl": 1500,
            "x-delivery-limit": 3,
        }
    )
    assert policy == MessagePolicy("dlx", "dead", 1500, 3)
    assert policy.checks_deliveries


def test_policy_of_plain_queue_checks_nothing() -> None:
    policy = MessagePolicy.of({"x-max-length": 5})
    assert policy == MessagePolicy()
    assert not policy.checks_deliveries


def test_empty_dead_letter_exchange_is_the_default_exchange_not_none() -> None:
    assert MessagePolicy.of({"x-dead-letter-exchange": ""}).dead_letter_exchange == ""


def test_dead_letter_routing_key_overrides_the_message_key() -> None:
    assert dead_letter_routing_key(MessagePolicy("dlx", "dead"), "orig") == "dead"
    assert dead_letter_routing_key(MessagePolicy("dlx"), "orig") == "orig"


# ---- TTL ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1000", 1000),
        (b"0", 0),
        ("+25", 25),
        (" 25", None),
        ("-1", None),
        ("1.5", None),
        ("", None),
        (None, None),
    ],
)
def test_message_expiration_is_whole_milliseconds(
    text: str | bytes | None, expected: int | None
) -> None:
    assert message_expiration_ms(text) == expected


def test_expiry_is_the_smaller_ttl() -> None:
    assert expires_at_ms(10_000, 500, None) == 10_500
    assert expires_at_ms(10_000, None, 200) == 10_200
    assert expires_at_ms(10_000, 500, 200) == 10_200
    assert expires_at_ms(10_000, 100, 200) == 10_100
    assert expires_at_ms(10_000, None, None) is None


def test_expired_only_after_the_deadline() -> None:
    policy = MessagePolicy(message_ttl_ms=1000)
    assert death_at_delivery(policy, 10_000, None, 0, 11_000) is None
    assert death_at_delivery(policy, 10_000, None, 0, 11_001) == EXPIRED


def test_per_message_expiration_applies_without_queue_ttl() -> None:
    assert death_at_delivery(MessagePolicy(), 10_000, "50", 0, 10_051) == EXPIRED
    assert death_at_delivery(MessagePolicy(), 10_000, "50", 0, 10_040) is None


def test_unknown_publish_time_never_expires() -> None:
    assert death_at_delivery(MessagePolicy(message_ttl_ms=0), 0, "0", 0, 10**12) is None


# ---- delivery limit ---------------------------------------------------------------------------


def test_delivery_limit_allows_that_many_returns() -> None:
    policy = MessagePolicy(delivery_limit=2)
    assert [death_at_delivery(policy, 1, None, count, 2) for count in range(4)] == [
        None,
        None,
        None,
        DELIVERY_LIMIT,
    ]


def test_delivery_limit_zero_allows_no_return() -> None:
    policy = MessagePolicy(delivery_limit=0)
    assert death_at_delivery(policy, 1, None, 0, 2) is None
    assert death_at_delivery(policy, 1, None, 1, 2) == DELIVERY_LIMIT


def test_expiry_wins_over_delivery_limit() -> None:
    policy = MessagePolicy(message_ttl_ms=10, delivery_limit=0)
    assert death_at_delivery(policy, 1000, None, 5, 2000) == EXPIRED


# ---- x-death -----------------------------------------------------------------------------------


def test_first_death_makes_the_headers() -> None:
    headers = dead_lettered_headers({"app": 1}, death(), "60000")
    assert headers == {
        "app": 1,
        "x-death": [
            {
                "count": 1,
                "reason": "rejected",
                "queue": "q",
                "time": T1,
                "exchange": "x",
                "routing-keys": ["k"],
                "original-expiration": "60000",
            }
        ],
        "x-first-death-reason": "rejected",
        "x-first-death-queue": "q",
        "x-first-death-exchange": "x",
    }
    assert list(headers["x-death"][0]) == [
        "count",
        "reason",
        "queue",
        "time",
        "exchange",
        "routing-keys",
        "original-expiration",
    ]


def test_same_queue_and_reason_increments_the_count_and_keeps_the_first_fields() -> None:
    first = dead_lettered_headers(None, death(), None)
    second = dead_lettered_headers(first, Death(REJECTED, "q", "other", ("z",), T2), None)
    (entry,) = second["x-death"]
    assert entry == {
        "count": 2,
        "exchange": "x",
        "queue": "q",
        "reason": "rejected",
        "routing-keys": ["k"],
        "time": T1,
    }
    assert list(entry) == sorted(entry)


def test_other_queue_or_reason_adds_an_entry_in_front() -> None:
    headers = dead_lettered_headers(None, death(queue="a"), None)
    headers = dead_lettered_headers(headers, death(queue="b", when=T2), None)
    headers = dead_lettered_headers(headers, death(reason=EXPIRED, queue="b", when=T2), None)
    assert [(d["queue"], d["reason"], d["count"]) for d in headers["x-death"]] == [
        ("b", "expired", 1),
        ("b", "rejected", 1),
        ("a", "rejected", 1),
    ]
    assert headers["x-first-death-queue"] == "a"
    assert headers["x-first-death-reason"] == "rejected"


def test_a_repeated_death_moves_to_the_front() -> None:
    headers = dead_lettered_headers(None, death(queue="a"), None)
    headers = dead_lettered_headers(headers, death(queue="b"), None)
    headers = dead_lettered_headers(headers, death(queue="a", when=T2), None)
    assert [(d["queue"], d["count"]) for d in headers["x-death"]] == [("a", 2), ("b", 1)]


def test_entries_from_the_wire_may_hold_bytes() -> None:
    wire = {"x-death": [{"count": 3, "queue": b"q", "reason": b"rejected"}]}
    (entry,) = dead_lettered_headers(wire, death(), None)["x-death"]
    assert entry["count"] == 4


def test_routing_keys_include_cc_and_cc_goes_with_a_dead_letter_routing_key() -> None:
    headers = {"CC": ["c1", b"c2"], "BCC": ["hidden"]}
    assert death_routing_keys("k", headers) == ("k", "c1", "c2")
    assert "CC" not in dead_lettered_headers(headers, death(), None, drop_cc=True)
    assert "CC" in dead_lettered_headers(headers, death(), None)


def test_properties_lose_expiration_and_keep_the_rest() -> None:
    properties = commands.Basic.Properties(
        content_type="text/plain",
        expiration="5000",
        message_id="m1",
        delivery_mode=2,
        headers={"a": "b"},
    )
    result = dead_lettered_properties(properties, death())
    assert result.expiration is None
    assert result.content_type == "text/plain"
    assert result.message_id == "m1"
    assert result.delivery_mode == 2
    assert result.headers is not None
    assert result.headers["a"] == "b"
    assert result.headers["x-death"][0]["original-expiration"] == "5000"


# ---- cycles ------------------------------------------------------------------------------------


def test_automatic_cycle_back_to_the_same_queue_is_detected() -> None:
    headers = dead_lettered_headers(None, death(EXPIRED, "q"), None)
    assert is_automatic_cycle(headers, "q", EXPIRED)
    assert not is_automatic_cycle(headers, "other", EXPIRED)


def test_a_rejection_in_the_cycle_makes_it_no_cycle() -> None:
    headers = dead_lettered_headers(None, death(EXPIRED, "q"), None)
    headers = dead_lettered_headers(headers, death(REJECTED, "work"), None)
    assert not is_automatic_cycle(headers, "q", EXPIRED)
    assert not is_automatic_cycle(None, "q", EXPIRED)
    # Rejecting is never a cycle: the consumer decides.
    assert not is_automatic_cycle(dead_lettered_headers(None, death(), None), "q", REJECTED)


def test_policy_cache_keeps_a_bounded_number_of_queue_records() -> None:
    # Every basic.get reads a fresh Queue record; the cache must not keep them all.
    for i in range(3 * dead_lettering._MAX_POLICIES):
        queue = Queue("q", arguments={"x-message-ttl": i})
        assert dead_lettering.policy_of(queue).message_ttl_ms == i
        assert len(dead_lettering._POLICIES) <= dead_lettering._MAX_POLICIES


# ---- when the expiry reaper looks at a queue again ----------------------------------------


def test_next_look_is_just_after_the_earliest_head_expires() -> None:
    assert next_expiry_look(10_000, [10_500, None, 12_000], 60_000, False) == 0.501


def test_next_look_at_an_overdue_head_is_now() -> None:
    assert next_expiry_look(10_000, [9_000], None, False) == 0.0


def test_an_empty_queue_with_a_ttl_is_looked_at_one_ttl_later() -> None:
    assert next_expiry_look(10_000, [], 2_500, True) == 2.5


def test_no_expiry_in_sight_without_a_ttl_or_with_heads_that_never_expire() -> None:
    assert next_expiry_look(10_000, [], None, True) is None
    assert next_expiry_look(10_000, [None, None], None, False) is None
