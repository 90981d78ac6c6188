"""The operators' endpoint (`metricsListener`): Prometheus counts after known traffic,
`/healthz`, and `/readyz` following ZooKeeper's availability."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from starlight_py.local import ServiceEndpoints, ZooKeeperServer
from starlight_py.local.ports import free_port
from tests.integration.conftest import ProxyFactory
from tests.support.amqp_fixtures import unique


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_ready(url: str) -> None:
    """Until /readyz says ready (the topology cache loads in the background at start)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if fetch(url)[0] == 200:
                return
        except urllib.error.URLError:
            pass  # not listening yet
        time.sleep(0.1)
    raise AssertionError(f"{url} not ready within 60 s")


def sample(text: str, name: str, labels: str = "") -> float:
    """The value of one sample in Prometheus text format (0 when absent)."""
    wanted = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key == wanted:
            return float(value)
    return 0.0


def test_a_scrape_after_known_traffic_shows_its_counts(start_proxy: ProxyFactory) -> None:
    port = free_port()
    proxy = start_proxy(metricsListener=f"http://127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"
    assert fetch(f"{base}/healthz") == (200, "ok\n")
    wait_ready(f"{base}/readyz")
    status, body = fetch(f"{base}/readyz")
    assert status == 200 and json.loads(body) == {"ready": True, "problems": []}
    assert fetch(f"{base}/nothing")[0] == 404

    queue = unique("q", "metrics")
    with pika.BlockingConnection(pika.URLParameters(proxy.amqp_url())) as conn:
        channel = conn.channel()
        channel.queue_declare(queue)
        channel.confirm_delivery()
        for _ in range(10):
            channel.basic_publish("", queue, b"x" * 100)
        with pytest.raises(pika.exceptions.UnroutableError):
            channel.basic_publish("", unique("nowhere", "metrics"), b"y" * 7, mandatory=True)
        tags = []
        for method, _, _ in channel.consume(queue, inactivity_timeout=5):
            if method is None:
                break
            channel.basic_ack(method.delivery_tag)
            tags.append(method.delivery_tag)
            if len(tags) == 10:
                break
        _, during = fetch(f"{base}/metrics")
        channel.cancel()
        channel.queue_delete(queue)

    vhost = 'vhost="/"'
    assert sample(during, "starlight_messages_published_total", vhost) == 11
    assert sample(during, "starlight_bytes_published_total", vhost) == 1007
    assert sample(during, "starlight_messages_delivered_total", vhost) == 10
    assert sample(during, "starlight_bytes_delivered_total", vhost) == 1000
    assert sample(during, "starlight_publisher_confirms_total", 'result="ack"') == 10
    assert sample(during, "starlight_publisher_confirms_total", 'result="nack"') == 0
    assert sample(during, "starlight_returns_total") == 1
    assert sample(during, "starlight_publish_confirm_seconds_count") == 10
    assert sample(during, "starlight_connections") == 1
    assert sample(during, "starlight_channels") == 1
    assert sample(during, "starlight_consumers") == 1
    # The proxy sees the client's close a moment after the client has sent it.
    deadline = time.monotonic() + 10
    while sample(fetch(f"{base}/metrics")[1], "starlight_connections") != 0:
        assert time.monotonic() < deadline, "the closed connection is still counted"
        time.sleep(0.05)


def test_queue_metrics_under_rabbitmqs_names_follow_ready_unacked_and_consumers(
    start_proxy: ProxyFactory,
) -> None:
    port = free_port()
    proxy = start_proxy(
        metricsListener=f"http://127.0.0.1:{port}", queueMetricsIntervalMillis="300"
    )
    base = f"http://127.0.0.1:{port}"
    wait_ready(f"{base}/readyz")
    queue = unique("q", "metrics")
    labels = f'queue="{queue}",vhost="/"'

    def wait_for(expected: dict[str, float]) -> str:
        deadline = time.monotonic() + 30
        while True:
            text = fetch(f"{base}/metrics")[1]
            seen = {name: sample(text, name, labels) for name in expected}
            if seen == expected:
                return text
            assert time.monotonic() < deadline, f"metrics {seen}, expected {expected}"
            time.sleep(0.2)

    with pika.BlockingConnection(pika.URLParameters(proxy.amqp_url())) as conn:
        channel = conn.channel()
        channel.queue_declare(queue)
        channel.confirm_delivery()
        for _ in range(5):
            channel.basic_publish("", queue, b"x")
        text = wait_for(
            {
                "rabbitmq_queue_messages_ready": 5,
                "rabbitmq_queue_messages_unacked": 0,
                "rabbitmq_queue_messages": 5,
                "rabbitmq_queue_consumers": 0,
            }
        )
        assert sample(text, "rabbitmq_queues") >= 1
        assert sample(text, "rabbitmq_global_messages_received_total") == 5
        assert sample(text, "rabbitmq_global_messages_confirmed_total") == 5
        assert sample(text, "rabbitmq_connections") == 1
        assert sample(text, "starlight_vhost_connections", 'vhost="/"') == 1
        assert sample(text, "process_resident_memory_bytes") > 0
        # A prefetch-2 consumer holds two (Pulsar has dispatched more to its proxy: they
        # are still ready, as RabbitMQ counts them).
        channel.basic_qos(prefetch_count=2)
        held: list[int] = []
        channel.basic_consume(queue, lambda ch, m, p, b: held.append(m.delivery_tag))
        deadline = time.monotonic() + 10
        while len(held) < 2 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        assert len(held) == 2
        wait_for(
            {
                "rabbitmq_queue_messages_ready": 3,
                "rabbitmq_queue_messages_unacked": 2,
                "rabbitmq_queue_messages": 5,
                "rabbitmq_queue_consumers": 1,
            }
        )
        channel.close()
        conn.channel().queue_delete(queue)
    deadline = time.monotonic() + 30
    while f'queue="{queue}"' in fetch(f"{base}/metrics")[1]:
        assert time.monotonic() < deadline, "a deleted queue is still exported"
        time.sleep(0.2)


@pytest.fixture
def own_zookeeper(tmp_path: Path, pulsar_distribution: Path) -> Iterator[ZooKeeperServer]:
    """A ZooKeeper this test may stop (the session's is shared)."""
    server = ZooKeeperServer(tmp_path / "zookeeper", distribution=pulsar_distribution)
    server.start()
    yield server
    server.stop()


def test_readyz_follows_zookeeper(
    start_proxy: ProxyFactory, services: ServiceEndpoints, own_zookeeper: ZooKeeperServer
) -> None:
    port = free_port()
    start_proxy(
        metricsListener=f"http://127.0.0.1:{port}",
        configurationStoreServers=own_zookeeper.connect_string,
    )
    readyz = f"http://127.0.0.1:{port}/readyz"
    wait_ready(readyz)

    def status() -> tuple[int, dict[str, object]]:
        code, body = fetch(readyz)
        return code, json.loads(body)

    assert status()[0] == 200
    own_zookeeper.stop()
    deadline = time.monotonic() + 30
    while status()[0] != 503 and time.monotonic() < deadline:
        time.sleep(0.2)
    code, body = status()
    assert code == 503 and body["ready"] is False
    assert any("ZooKeeper" in str(p) for p in body["problems"])  # type: ignore[union-attr]
    own_zookeeper.start()
    deadline = time.monotonic() + 30
    while status()[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert status() == (200, {"ready": True, "problems": []})
    assert fetch(f"http://127.0.0.1:{port}/healthz")[0] == 200


def test_idle_producers_are_closed_and_a_later_publish_makes_a_new_one(
    start_proxy: ProxyFactory,
) -> None:
    # RPC: every client's reply queue is a new topic; without closing idle producers the
    # proxy would keep one producer per reply queue ever answered.
    port = free_port()
    proxy = start_proxy(
        metricsListener=f"http://127.0.0.1:{port}", pulsarProducerIdleTimeoutMillis="1500"
    )
    metrics = f"http://127.0.0.1:{port}/metrics"
    wait_ready(f"http://127.0.0.1:{port}/readyz")

    def producers() -> float:
        return sample(fetch(metrics)[1], "starlight_pulsar_producers")

    def wait_for_producers(wanted: float) -> None:
        deadline = time.monotonic() + 20
        while producers() != wanted:
            assert time.monotonic() < deadline, f"{producers()} producers, not {wanted}"
            time.sleep(0.1)

    received: list[bytes] = []
    with pika.BlockingConnection(pika.URLParameters(proxy.amqp_url())) as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        replies = [channel.queue_declare("", exclusive=True).method.queue for _ in range(3)]
        for number, reply_queue in enumerate(replies):
            channel.basic_publish("", reply_queue, f"reply {number}".encode())
        assert producers() == 3
        wait_for_producers(0)
        # The topic is published to again after its producer was closed: a new one.
        channel.basic_publish("", replies[0], b"reply again")
        assert producers() == 1
        deadline = time.monotonic() + 20
        while len(received) < 4 and time.monotonic() < deadline:
            for reply_queue in replies:
                method, _, body = channel.basic_get(reply_queue, auto_ack=True)
                if method is not None:
                    received.append(body)
        wait_for_producers(0)
    assert sorted(received) == [b"reply 0", b"reply 1", b"reply 2", b"reply again"]
