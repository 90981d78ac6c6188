"""Quiet connections (gateway/connection/quiet_sockets.py), on a proxy whose connections
go quiet after 0.3 s of nothing but heartbeats (from the first heartbeat after that): the
heartbeats the timers read keep the connection open, the first frame after a quiet spell
is served, a quiet consumer gets every message and its acks count, a client that hangs up
while quiet is let go. Quiet connections with no channel park (parking.py): they keep
beating both ways with no task, resume for their next frame, are closed when their client
falls silent, and are let go when it hangs up."""

from __future__ import annotations

import time
import urllib.request
import uuid
from collections.abc import Callable

import pika
import pytest
from pamqp import commands, frame, heartbeat

from starlight_py.local.ports import free_port
from tests.integration.conftest import ProxyFactory
from tests.integration.test_ops_metrics import sample
from tests.support.proxy_runner import ProxyThread
from tests.support.raw_amqp import RawClient

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


def wait_for_metric_back(url: str, name: str, value: float) -> None:
    deadline = time.monotonic() + WAIT
    while metric(url, name) > value:
        assert time.monotonic() < deadline, f"{name} stayed above {value}"
        time.sleep(0.1)


def beat_until(client: RawClient, condition: Callable[[], bool], seconds: float) -> int:
    """Send a heartbeat every 0.3 s and read the proxy's until `condition` holds and
    `seconds` have passed; how many heartbeats the proxy sent meanwhile."""
    received = 0
    deadline = time.monotonic() + seconds
    give_up = deadline + WAIT
    while time.monotonic() < deadline or not condition():
        assert time.monotonic() < give_up, "the condition never held"
        client.send(HEARTBEAT)
        try:
            _, value = client.read_frame(timeout=0.3)
        except TimeoutError:
            continue
        assert isinstance(value, heartbeat.Heartbeat), value
        received += 1
    return received


HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"


def test_a_parked_connection_beats_both_ways_and_resumes_for_its_next_frame(
    quiet_proxy: tuple[ProxyThread, str],
) -> None:
    proxy, metrics = quiet_proxy
    before = metric(metrics, "starlight_parked_connections")
    client = RawClient("127.0.0.1", proxy.port_of("amqp"))
    try:
        client.handshake(heartbeat=1)
        resumed = metric(metrics, "starlight_connections_resumed_total")
        # Parked with no task for 3 s: the proxy's heartbeats go on, the client's count.
        beats = beat_until(
            client, lambda: metric(metrics, "starlight_parked_connections") == before + 1, 3.0
        )
        assert beats >= 3
        assert metric(metrics, "starlight_parked_connections") == before + 1
        assert metric(metrics, "starlight_connections_resumed_total") == resumed
        # A frame resumes it, and it is served at once; the heartbeat before it in the same
        # segment is read by the lot, the frame handed on to the connection's new task.
        client.send(HEARTBEAT + frame.marshal(commands.Channel.Open(), 1))
        assert isinstance(client.read_method()[1], commands.Channel.OpenOk)
        assert metric(metrics, "starlight_parked_connections") == before
        assert metric(metrics, "starlight_connections_resumed_total") == resumed + 1
        queue = f"parked-{uuid.uuid4().hex[:8]}"
        client.send_method(1, commands.Queue.Declare(queue=queue))
        assert isinstance(client.read_method()[1], commands.Queue.DeclareOk)
        client.send_method(1, commands.Queue.Delete(queue=queue))
        assert isinstance(client.read_method()[1], commands.Queue.DeleteOk)
        client.send_method(0, commands.Connection.Close(200, "bye", 0, 0))
        assert isinstance(client.read_method()[1], commands.Connection.CloseOk)
    finally:
        client.close()


def test_a_parked_connection_whose_client_falls_silent_is_closed(
    quiet_proxy: tuple[ProxyThread, str],
) -> None:
    proxy, metrics = quiet_proxy
    connections = metric(metrics, "starlight_connections")
    parked = metric(metrics, "starlight_parked_connections")
    quiet = metric(metrics, "starlight_quiet_connections")
    client = RawClient("127.0.0.1", proxy.port_of("amqp"))
    try:
        client.handshake(heartbeat=1)
        beat_until(client, lambda: metric(metrics, "starlight_parked_connections") > parked, 0)
        # Silent from now on: two missed intervals and the proxy hangs up.
        assert client.wait_closed(timeout=WAIT) < WAIT
        wait_for_metric_back(metrics, "starlight_connections", connections)
        assert metric(metrics, "starlight_parked_connections") == parked
        assert metric(metrics, "starlight_quiet_connections") == quiet
    finally:
        client.close()


def test_a_client_that_hangs_up_while_parked_is_let_go(
    quiet_proxy: tuple[ProxyThread, str],
) -> None:
    proxy, metrics = quiet_proxy
    connections = metric(metrics, "starlight_connections")
    parked = metric(metrics, "starlight_parked_connections")
    clients = [RawClient("127.0.0.1", proxy.port_of("amqp")) for _ in range(20)]
    for client in clients:
        client.handshake(heartbeat=5)
    assert wait_for_metric(metrics, "starlight_parked_connections", parked + len(clients)) == (
        parked + len(clients)
    )
    for client in clients:
        client.close()  # no close frame: the socket just goes
    wait_for_metric_back(metrics, "starlight_connections", connections)
    assert metric(metrics, "starlight_parked_connections") == parked
