"""Heartbeats both ways; a silent client is disconnected after two missed intervals."""

from __future__ import annotations

import time

import pika

from tests.integration.conftest import Broker, ProxyFactory
from tests.support.raw_amqp import RawClient


def test_silent_client_is_disconnected_and_server_sends_heartbeats(broker: Broker) -> None:
    client = broker.raw()
    client.handshake(heartbeat=1)
    heartbeats = 0
    started = time.monotonic()
    try:
        while True:
            _, frame = client.read_frame(timeout=30)
            if type(frame).__name__ == "Heartbeat":
                heartbeats += 1
    except EOFError:
        pass
    waited = time.monotonic() - started
    client.close()
    # Closed by the server (not our 30 s read timeout), after beating at us meanwhile.
    assert waited < 30
    assert heartbeats >= 1


def test_client_that_beats_stays_connected(broker: Broker) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url(heartbeat=1)))
    channel = connection.channel()
    connection.sleep(4.5)  # pika answers heartbeats while it sleeps
    assert connection.is_open and channel.is_open
    assert connection.channel().is_open
    connection.close()


def test_silent_handshake_is_cut_off(start_proxy: ProxyFactory) -> None:
    proxy = start_proxy(amqpHandshakeTimeoutMillis="1000")
    client = RawClient("127.0.0.1", proxy.port)
    assert client.wait_closed(timeout=20) < 20
    client.close()
