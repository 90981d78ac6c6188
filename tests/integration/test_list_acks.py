"""Acknowledgements in lists, ungrouped (backend/list_acks.py, native/src/pulsar_ack_list.rs,
native/src/acknowledge_list.cpp), against the real Pulsar: the proxy's listened consumers
keep no grouping timer, and what they acknowledge is settled, exactly, at once."""

from __future__ import annotations

import threading
import time
from typing import Any

import pulsar

from starlight_py.backend import list_acks
from starlight_py.backend.pulsar_admin import PulsarAdmin
from starlight_py.backend.pulsar_client import ConsumerHandle, PulsarBackend
from starlight_py.local import ServiceEndpoints
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import TopicName
from tests.support.amqp_fixtures import unique

NAMESPACE = NamespaceName("public", "default")


class Received:
    """What a listened consumer handed over, from its reader thread."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.lock = threading.Lock()

    def __call__(self, handle: ConsumerHandle, batch: list[Any]) -> None:
        with self.lock:
            self.messages.extend(batch)

    def wait_for(self, count: int) -> list[Any]:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.messages) >= count:
                    return list(self.messages)
            time.sleep(0.02)
        raise AssertionError(f"{len(self.messages)} of {count} messages arrived")


def _produce(pulsar_client: pulsar.Client, topic: TopicName, total: int) -> None:
    producer = pulsar_client.create_producer(
        str(topic), batching_enabled=True, batching_max_publish_delay_ms=5
    )
    for number in range(total):
        producer.send_async(b"%d" % number, None)
        if number % 500 == 499:
            producer.flush()
    producer.flush()
    producer.close()


def _left_on(pulsar_client: pulsar.Client, topic: TopicName, subscription: str) -> list[int]:
    again = pulsar_client.subscribe(
        str(topic),
        subscription,
        consumer_type=pulsar.ConsumerType.Shared,
        batch_index_ack_enabled=True,
    )
    left = []
    while True:
        try:
            message = again.receive(3000)
        except pulsar.Timeout:
            break
        left.append(int(message.data()))
        again.acknowledge(message)
    again.close()
    return sorted(left)


def test_this_installation_acknowledges_in_lists() -> None:
    assert list_acks.available() is None


def test_list_acknowledgements_settle_exactly_the_messages_acknowledged_at_once(
    services: ServiceEndpoints, pulsar_client: pulsar.Client
) -> None:
    """Batched messages, every tenth left unacknowledged, the others acknowledged a hundred
    per list: the backlog shows only those at once (no grouping), and after the consumer
    closes the subscription gives back those and nothing else."""
    topic = TopicName(NAMESPACE, unique("list-acks", "topic"))
    admin = PulsarAdmin(services.pulsar_web_url)
    admin.create_subscription(topic, "s")
    backend = PulsarBackend(services.pulsar_service_url, batching=True)
    received = Received()
    try:
        handle = backend.subscribe(topic, "s", "list-acks", 1000, received)
        assert (handle.acks_in_lists, handle.ack_grouping_ms) == (True, 0)
        total = 3000
        _produce(pulsar_client, topic, total)
        messages = received.wait_for(total)
        acked = [m for m in messages if int(m.body) % 10 != 3]
        for start in range(0, len(acked), 100):
            handle.acknowledge_all(acked[start : start + 100])
        # Settled without a consumer close: the backlog in messages (the brokers'
        # starlight-backlog plugin) is what was left unacknowledged. (Pulsar's own
        # `unackedMessages` cannot tell: it goes below zero with batch-index acknowledgements,
        # grouped or not.)
        deadline = time.monotonic() + 5
        backlog = None
        while time.monotonic() < deadline:
            counts = admin.subscription_counts(topic)
            assert counts is not None  # the local Pulsar loads the plugin
            backlog = counts["s"].backlog
            if backlog == total // 10:
                break
            time.sleep(0.05)
        assert backlog == total // 10
        handle.close()
    finally:
        backend.close()
    assert _left_on(pulsar_client, topic, "s") == [n for n in range(total) if n % 10 == 3]


def test_acknowledgements_gathered_and_not_sent_yet_are_sent_by_the_close(
    services: ServiceEndpoints, pulsar_client: pulsar.Client
) -> None:
    """A channel that acknowledges and closes in one socket read: the gathered list goes
    to the broker before the consumer closes, so nothing acknowledged comes back."""
    topic = TopicName(NAMESPACE, unique("list-acks-close", "topic"))
    PulsarAdmin(services.pulsar_web_url).create_subscription(topic, "s")
    backend = PulsarBackend(services.pulsar_service_url, batching=True)
    received = Received()
    try:
        handle = backend.subscribe(topic, "s", "list-acks", 1000, received)
        _produce(pulsar_client, topic, 50)
        messages = received.wait_for(50)
        assert handle.gather_acks(messages[:20])  # the first gathered: the caller sends
        assert not handle.gather_acks(messages[20:40])
        handle.close()
    finally:
        backend.close()
    assert _left_on(pulsar_client, topic, "s") == list(range(40, 50))
