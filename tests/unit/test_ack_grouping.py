"""The acknowledgement grouping time of the proxy's Pulsar consumers, and how long the
proxy's own counts take a settled delivery out of Pulsar's backlog."""

from __future__ import annotations

import pytest

from starlight_py.backend import list_acks
from starlight_py.backend.pulsar_client import (
    CONSUMERS_PER_GROUPING_STEP,
    PULSAR_ACK_GROUPING_MS,
    ConsumerHandle,
    PulsarBackend,
    effective_ack_grouping_ms,
)
from starlight_py.config import StarlightConfig
from starlight_py.gateway.consume.held_messages import settling_time
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import TopicName


def test_the_default_groups_for_a_second_without_batching() -> None:
    config = StarlightConfig()
    assert config.producer_batching  # on by default: pulsar-client's 100 ms then
    assert effective_ack_grouping_ms(config.consumer_ack_grouping_ms, False) == 1000
    assert effective_ack_grouping_ms(config.consumer_ack_grouping_ms, True) == 100


def test_batching_keeps_pulsar_clients_own_grouping_at_most() -> None:
    assert effective_ack_grouping_ms(1000, batching=True) == PULSAR_ACK_GROUPING_MS == 100
    assert effective_ack_grouping_ms(50, batching=True) == 50
    assert effective_ack_grouping_ms(0, batching=True) == 0
    assert effective_ack_grouping_ms(5000, batching=False) == 5000


def test_a_settled_delivery_counts_out_for_the_grouping_time_and_a_round_trip() -> None:
    assert settling_time(1000) == 1.1
    assert settling_time(100) == 0.2  # pulsar-client's default, as before
    assert settling_time(0) == 0.1


def test_with_list_acknowledgements_nothing_is_grouped() -> None:
    made = PulsarBackend("pulsar://127.0.0.1:1", batching=True)
    try:
        assert made.list_acks == (list_acks.available() is None)
        if made.list_acks:
            assert made.ack_grouping_ms == 0
    finally:
        made.close()


def test_a_batching_backend_groups_as_pulsar_client_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(list_acks, "available", lambda: "STARLIGHT_LIST_ACKS=0")
    made = PulsarBackend("pulsar://127.0.0.1:1", batching=True)
    try:
        assert made.ack_grouping_ms == PULSAR_ACK_GROUPING_MS
        made.stop_batching()  # the brokers cannot take batching: the configured time again
        assert (made.batching, made.ack_grouping_ms) == (False, 1000)
    finally:
        made.close()
    made = PulsarBackend("pulsar://127.0.0.1:1")
    try:
        assert made.ack_grouping_ms == 1000
    finally:
        made.close()


def test_the_grouping_grows_a_step_for_each_step_of_consumers_held() -> None:
    step = CONSUMERS_PER_GROUPING_STEP
    assert effective_ack_grouping_ms(1000, True, consumers=0) == 100
    assert effective_ack_grouping_ms(1000, True, consumers=step - 1) == 100
    assert effective_ack_grouping_ms(1000, True, consumers=step) == 200
    assert effective_ack_grouping_ms(1000, True, consumers=10 * step - 1) == 1000
    # Never above the configured time, nor different without batching.
    assert effective_ack_grouping_ms(1000, True, consumers=100 * step) == 1000
    assert effective_ack_grouping_ms(300, True, consumers=100 * step) == 300
    assert effective_ack_grouping_ms(1000, False, consumers=100 * step) == 1000
    # Made one after the other, 2,000 consumers re-arm their timers under 4,000 times a
    # second in all (20,000 with pulsar-client's 100 ms).
    rate = sum(1000 / effective_ack_grouping_ms(1000, True, n) for n in range(2_000))
    assert rate < 4_000


def test_a_backend_counts_the_consumers_it_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    # Grouped consumers only: with list acknowledgements none is grouped.
    monkeypatch.setattr(list_acks, "available", lambda: "STARLIGHT_LIST_ACKS=0")
    made = PulsarBackend("pulsar://127.0.0.1:1", batching=True)
    try:
        namespace = NamespaceName("public", "default")
        handles = [ConsumerHandle(TopicName(namespace, f"t{i}"), "s") for i in range(250)]
        for handle in handles:
            made._count_consumer(handle)
        assert made.ack_grouping_ms == 300
        for handle in handles[:151]:
            handle._on_close()  # type: ignore[misc]
        assert made.ack_grouping_ms == 100
    finally:
        made.close()
