"""model/counts.py: RabbitMQ's ready count from Pulsar's numbers and the proxies'."""

from __future__ import annotations

from starlight_py.model.counts import QueueFlow, ready_messages


def test_what_a_proxy_read_ahead_is_ready() -> None:
    # 30 in the backlog, Pulsar dispatched 20 to the proxy, the client holds 10 of them.
    assert ready_messages(waiting=30, undispatched=10, held=10, settling=0) == 20


def test_an_acknowledgement_pulsar_has_not_heard_of_yet_is_taken_out() -> None:
    # 5 in the backlog of which 2 were acked a moment ago (Pulsar still counts them).
    assert ready_messages(waiting=5, undispatched=3, held=0, settling=2) == 3


def test_once_pulsar_heard_of_it_the_undispatched_messages_are_the_floor() -> None:
    # The same 2 acks, now in Pulsar's backlog as well, still within the settling window.
    assert ready_messages(waiting=3, undispatched=3, held=0, settling=2) == 3


def test_never_negative() -> None:
    assert ready_messages(waiting=1, undispatched=0, held=4, settling=0) == 0


def test_queue_flow_adds_up_over_a_queues_topics_and_shapes_message_stats() -> None:
    first = QueueFlow(published=10, publish_rate=2.5, delivered=7, deliver_rate=1.0)
    second = QueueFlow(published=5, delivered=5, ack_rate=0.25, redeliver_rate=0.04)
    total = first.plus(second)
    assert total == QueueFlow(15, 2.5, 12, 1.0, 0.25, 0.04)
    assert total.message_stats() == {
        "publish": 15,
        "publish_details": {"rate": 2.5},
        "deliver_get_details": {"rate": 1.0},
        "ack_details": {"rate": 0.2},
        "redeliver_details": {"rate": 0.0},
    }
    assert QueueFlow().message_stats()["publish"] == 0
