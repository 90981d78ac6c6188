"""Binding subscriptions made over the binary protocol (the proxy) or through the admin API
(starlight-admin), against a real Pulsar: the same subscription either way."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator

import pulsar
import pytest

from starlight_py.backend.pulsar_admin import PulsarAdmin, PulsarAdminError
from starlight_py.backend.pulsar_client import PulsarBackend
from starlight_py.backend.subscription_maker import SubscriptionMaker
from starlight_py.local import ServiceEndpoints
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import TopicName, exchange_topic

NS = NamespaceName("public", "default")


class CountingAdmin(PulsarAdmin):
    """The admin client, counting the subscriptions it is asked to make."""

    made = 0

    def create_subscription(self, topic: TopicName, subscription: str) -> bool:
        self.made += 1
        return super().create_subscription(topic, subscription)


@pytest.fixture(scope="module")
def backend(services: ServiceEndpoints) -> Iterator[PulsarBackend]:
    made = PulsarBackend(services.pulsar_service_url)
    yield made
    made.close()


@pytest.fixture(scope="module")
def client(services: ServiceEndpoints) -> Iterator[pulsar.Client]:
    made = pulsar.Client(
        services.pulsar_service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
    )
    yield made
    made.close()


@pytest.fixture(params=["binary", "admin"])
def maker(
    request: pytest.FixtureRequest, services: ServiceEndpoints, backend: PulsarBackend
) -> SubscriptionMaker:
    admin = CountingAdmin(services.pulsar_web_url)
    return SubscriptionMaker(admin, backend if request.param == "binary" else None)


def a_topic(namespace: NamespaceName = NS) -> TopicName:
    return exchange_topic(namespace, f"x-{uuid.uuid4().hex[:8]}", "fanout", "")


def send(client: pulsar.Client, topic: TopicName, payload: bytes) -> None:
    producer = client.create_producer(str(topic), batching_enabled=False)
    try:
        producer.send(payload)
    finally:
        producer.close()


def admin_calls(maker: SubscriptionMaker) -> int:
    assert isinstance(maker.admin, CountingAdmin)
    return maker.admin.made


def test_a_subscription_counts_what_is_sent_after_it_and_nothing_before(
    maker: SubscriptionMaker, client: pulsar.Client
) -> None:
    topic = a_topic()
    send(client, topic, b"before")
    maker.create(topic, "sub")
    stats = maker.admin.subscription_stats(topic)["sub"]
    assert (stats.backlog, stats.consumer_names) == (0, ())
    send(client, topic, b"after")
    assert maker.admin.subscription_stats(topic)["sub"].backlog == 1
    consumer = client.subscribe(str(topic), "sub", consumer_type=pulsar.ConsumerType.Shared)
    try:
        assert consumer.receive(10_000).data() == b"after"
    finally:
        consumer.close()
    # The proxy's maker does not need the admin API for a topic the broker may create.
    assert admin_calls(maker) == (0 if maker.backend is not None else 1)


def test_a_new_topic_is_made_with_its_subscription(maker: SubscriptionMaker) -> None:
    topic = a_topic()
    maker.create(topic, "sub")
    assert set(maker.admin.subscription_stats(topic)) == {"sub"}
    assert maker.admin.last_message_id(topic) is None


def test_an_existing_subscription_keeps_its_cursor(
    maker: SubscriptionMaker, client: pulsar.Client
) -> None:
    topic = a_topic()
    maker.create(topic, "sub")
    send(client, topic, b"kept")
    maker.create(topic, "sub")
    assert maker.admin.subscription_stats(topic)["sub"].backlog == 1


def test_where_topics_are_not_auto_created_the_admin_api_makes_it(
    maker: SubscriptionMaker, services: ServiceEndpoints
) -> None:
    namespace = NamespaceName("public", f"noauto-{uuid.uuid4().hex[:8]}")
    maker.admin.create_namespace(namespace.tenant, namespace.namespace)
    request = urllib.request.Request(
        f"{services.pulsar_web_url}/admin/v2/namespaces/{namespace}/autoTopicCreation",
        data=json.dumps({"allowAutoTopicCreation": False}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).close()
    topic = a_topic(namespace)
    maker.create(topic, "sub")
    assert set(maker.admin.subscription_stats(topic)) == {"sub"}
    assert admin_calls(maker) == 1


def test_a_missing_namespace_is_the_admin_api_s_404(maker: SubscriptionMaker) -> None:
    topic = a_topic(NamespaceName("public", f"missing-{uuid.uuid4().hex[:8]}"))
    with pytest.raises(PulsarAdminError) as raised:
        maker.create(topic, "sub")
    assert raised.value.status == 404
    assert maker.delete(topic, "sub") is False
