"""PROXY protocol (amqpProxyProtocol=true): through HAProxy with `send-proxy-v2` the proxy
logs the real client address; raw v1 headers work too; connections without a header are
closed while others are served."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from starlight_py.local import HAProxy
from tests.integration.conftest import ProxyFactory
from tests.support.amqp_fixtures import unique
from tests.support.proxy_runner import ProxyThread

AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


@pytest.fixture
def proxy_with_header(start_proxy: ProxyFactory) -> ProxyThread:
    return start_proxy(amqpProxyProtocol="true")


@pytest.fixture
def haproxy(tmp_path: Path, proxy_with_header: ProxyThread) -> Iterator[HAProxy]:
    balancer = HAProxy(tmp_path / "haproxy", [proxy_with_header.port], send_proxy=True)
    balancer.start()
    try:
        balancer.wait_until_servers_up(1)  # health checks carry the header too
        yield balancer
    finally:
        balancer.stop()


def opened_from(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "opened vhost" in r.getMessage()]


def test_through_haproxy_send_proxy_v2_the_real_client_address_is_logged(
    haproxy: HAProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="starlight")
    with socket.create_connection(("127.0.0.1", haproxy.port), timeout=10) as client:
        client_port = client.getsockname()[1]
        client.sendall(AMQP_HEADER)
        assert client.recv(4096)[:3] == b"\x01\x00\x00"  # connection.start
    queue = unique("q", "pp")
    with pika.BlockingConnection(pika.URLParameters(haproxy.amqp_url)) as conn:
        channel = conn.channel()
        channel.queue_declare(queue)
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"through the balancer")
        assert channel.basic_get(queue, auto_ack=True)[2] == b"through the balancer"
        channel.queue_delete(queue)
    messages = [r.getMessage() for r in caplog.records]
    # The proxy names the client's own address, then HAProxy's connection to it.
    assert any(f"from 127.0.0.1:{client_port} (via 127.0.0.1:" in m for m in messages), messages[
        -10:
    ]


def test_a_v1_header_is_accepted_and_a_missing_one_is_refused(
    proxy_with_header: ProxyThread, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="starlight")
    with socket.create_connection(("127.0.0.1", proxy_with_header.port), timeout=10) as raw:
        raw.sendall(b"PROXY TCP4 198.51.100.23 127.0.0.1 40404 5672\r\n" + AMQP_HEADER)
        start = raw.recv(4096)
        assert start[:3] == b"\x01\x00\x00"  # connection.start follows
    with socket.create_connection(("127.0.0.1", proxy_with_header.port), timeout=10) as bare:
        bare.sendall(AMQP_HEADER)  # a client that skipped the balancer
        assert bare.recv(4096) == b""  # closed without an answer
    assert any("no valid PROXY protocol header" in r.getMessage() for r in caplog.records)
    # Others are still served.
    with socket.create_connection(("127.0.0.1", proxy_with_header.port), timeout=10) as again:
        again.sendall(b"PROXY TCP4 198.51.100.24 127.0.0.1 40405 5672\r\n" + AMQP_HEADER)
        assert again.recv(4096)[:3] == b"\x01\x00\x00"
