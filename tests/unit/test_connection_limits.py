"""The connection counts behind amqpMaxConnections / amqpMaxConnectionsPerIp."""

from __future__ import annotations

from starlight_py.gateway.connection.connection_limits import (
    REFUSING_AT_ONCE,
    Admission,
    ConnectionLimits,
)


def test_no_limits_admit_everyone() -> None:
    limits = ConnectionLimits()
    tickets = [limits.admit("10.0.0.1") for _ in range(1000)]
    assert {t.admission for t in tickets} == {Admission.ADMITTED}
    for ticket in tickets:
        limits.release(ticket)
    assert (limits.admitted, limits.per_address) == (0, {})


def test_global_limit_refuses_then_admits_once_a_place_is_free() -> None:
    limits = ConnectionLimits(max_connections=2)
    first, second = limits.admit("a"), limits.admit("b")
    third = limits.admit("c")
    assert third.admission is Admission.REFUSE
    assert third.reason == "connection refused: proxy connection limit (2) is reached"
    limits.release(third)
    limits.release(first)
    assert limits.admit("c").admission is Admission.ADMITTED
    assert second.admission is Admission.ADMITTED


def test_per_address_limit_counts_each_address_apart() -> None:
    limits = ConnectionLimits(max_per_address=2)
    assert [limits.admit("a").admission for _ in range(2)] == [Admission.ADMITTED] * 2
    refused = limits.admit("a")
    assert refused.admission is Admission.REFUSE
    assert "per client address (2) is reached for a" in refused.reason
    assert limits.admit("b").admission is Admission.ADMITTED
    assert limits.per_address == {"a": 2, "b": 1}


def test_refusals_in_progress_are_bounded_the_rest_are_dropped() -> None:
    limits = ConnectionLimits(max_connections=1)
    limits.admit("a")
    over = [limits.admit("flood") for _ in range(REFUSING_AT_ONCE + 5)]
    kinds = [t.admission for t in over]
    assert kinds == [Admission.REFUSE] * REFUSING_AT_ONCE + [Admission.DROP] * 5
    for ticket in over:
        limits.release(ticket)  # dropped ones hold nothing
    assert limits.refusing == 0
    assert limits.admit("b").admission is Admission.REFUSE  # still full


def test_release_forgets_addresses_with_nothing_left() -> None:
    limits = ConnectionLimits(max_per_address=5)
    tickets = [limits.admit("a"), limits.admit("a"), limits.admit("b")]
    for ticket in tickets:
        limits.release(ticket)
    assert limits.per_address == {}
    assert limits.admitted == 0
