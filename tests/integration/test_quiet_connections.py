"""Quiet connections (gateway/connection/quiet_sockets.py), on a proxy whose connections
go quiet after 0.3 s of nothing but heartbeats (from the first heartbeat after that): the
heartbeats the timers read keep the connection open, the first frame after a quiet spell
is served, a quiet consumer gets every message and its acks count, a client that hangs up
while quiet is let go."""

from __future__ import annotations

import time
import urllib.request
import uuid

import pika
import pytest

from starlight_py.local.ports import free_port
from tests.integration.conftest import ProxyFactory
from tests.integration.test_ops_metrics import sample
from tests.support.proxy_runner import ProxyThread

QUIET_MS = "300"
WAIT = 20.0


@pytest.fixture
def quiet_proxy(start_proxy: ProxyFactory) -> tuple[ProxyThread, str]:
    port = free_port()
    proxy = start_proxy(
        amqpQuietConnectionAfterMillis=QUIET_MS, metricsListener=f"http://127.0.0.1:{port}"
    )
    return proxy, f"http://127.0.0.1:{port}/metrics"


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return sample(answer.read().decode(), name)


def wait_for_metric(url: str, name: str, at_least: float) -> float:
    deadline = time.monotonic() + WAIT
    value = metric(url, name)
    while value < at_least and time.monotonic() < deadline:
        time.sleep(0.1)
        value = metric(url, name)
    return value


def test_a_quiet_connection_lives_on_heartbeats_and_serves_its_next_frames(
    quiet_proxy: tuple[ProxyThread, str],
) -> None:
    proxy, metrics = quiet_proxy
    connection = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url(heartbeat=1)))
    try:
        channel = connection.channel()
        queue = f"quiet-{uuid.uuid4().hex[:8]}"
        channel.queue_declare(queue)
        # pika beats every half second while it sleeps; a missed heartbeat closes after 2 s.
        connection.sleep(1.0)
        assert wait_for_metric(metrics, "starlight_quiet_connections", 1) == 1
        connection.sleep(4.0)
        assert connection.is_open and channel.is_open
        assert metric(metrics, "starlight_quiet_heartbeats_total") >= 4
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"after the quiet spell")
        method, _, body = channel.basic_get(queue, auto_ack=True)
        assert method is not None and body == b"after the quiet spell"
        assert channel.queue_delete(queue).method.message_count == 0
    finally:
        connection.close()


def test_a_quiet_consumer_gets_every_message_and_its_acks_count(
    quiet_proxy: tuple[ProxyThread, str],
) -> None:
    proxy, metrics = quiet_proxy
    consuming = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url(heartbeat=1)))
    publishing = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))
    try:
        queue = f"quiet-{uuid.uuid4().hex[:8]}"
        consumer = consuming.channel()
        consumer.queue_declare(queue)
        consumer.basic_qos(prefetch_count=1)
        got: list[bytes] = []

        def on_message(ch: object, method: object, _props: object, body: bytes) -> None:
            got.append(body)
            consumer.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]

        consumer.basic_consume(queue, on_message)
        publisher = publishing.channel()
        publisher.confirm_delivery()
        sent = [f"m{n}".encode() for n in range(5)]
        for n, body in enumerate(sent):
            # Quiet long enough for the consumer to go quiet before each message (the
            # publisher, without heartbeats this soon, never does).
            deadline = time.monotonic() + WAIT
            while metric(metrics, "starlight_quiet_connections") < 1:
                assert time.monotonic() < deadline
                consuming.sleep(0.2)
            publisher.basic_publish("", queue, body)
            deadline = time.monotonic() + WAIT
            while len(got) <= n and time.monotonic() < deadline:
                consuming.process_data_events(0.05)
        assert got == sent
        deadline = time.monotonic() + WAIT
        count = publisher.queue_declare(queue, passive=True).method.message_count
        while count and time.monotonic() < deadline:
            time.sleep(0.1)
            count = publisher.queue_declare(queue, passive=True).method.message_count
        assert count == 0
        publisher.queue_delete(queue)
    finally:
        consuming.close()
        publishing.close()


def test_a_client_that_hangs_up_while_quiet_is_let_go(
    quiet_proxy: tuple[ProxyThread, str],
) -> None:
    proxy, metrics = quiet_proxy
    before = metric(metrics, "starlight_connections")
    connection = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url(heartbeat=1)))
    connection.channel()
    connection.sleep(2.0)  # it beats: quiet after the first heartbeat 0.3 s on
    assert wait_for_metric(metrics, "starlight_quiet_connections", 1) >= 1
    connection._impl._transport._sock.close()  # no close frame: the socket just goes
    deadline = time.monotonic() + WAIT
    while metric(metrics, "starlight_connections") > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(metrics, "starlight_connections") == before
    assert metric(metrics, "starlight_quiet_connections") == 0
