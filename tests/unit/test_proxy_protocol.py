"""PROXY protocol header parsing (v1 text, v2 binary)."""

from __future__ import annotations

from pathlib import Path

import pytest

from starlight_py.local.haproxy import haproxy_config
from starlight_py.model.proxy_protocol import (
    V2_SIGNATURE,
    ProxyHeader,
    ProxyProtocolError,
    parse,
)

AMQP = b"AMQP\x00\x00\x09\x01"


def v2(command: int, family: int, body: bytes) -> bytes:
    return V2_SIGNATURE + bytes([0x20 | command, family]) + len(body).to_bytes(2, "big") + body


def test_v1_tcp4_names_the_client_and_leaves_the_rest() -> None:
    data = b"PROXY TCP4 192.0.2.7 10.0.0.1 51234 5672\r\n" + AMQP
    header = parse(data)
    assert header == ProxyHeader(("192.0.2.7", 51234), ("10.0.0.1", 5672), len(data) - 8)
    assert data[header.length :] == AMQP


def test_v1_tcp6_and_unknown() -> None:
    header = parse(b"PROXY TCP6 2001:db8::1 ::1 40000 5672\r\n")
    assert header is not None and header.source == ("2001:db8::1", 40000)
    assert parse(b"PROXY UNKNOWN\r\n") == ProxyHeader(None, None, 15)


@pytest.mark.parametrize("cut", range(1, 40))
def test_an_incomplete_header_asks_for_more(cut: int) -> None:
    assert parse(b"PROXY TCP4 192.0.2.7 10.0.0.1 51234 5672\r\n"[:cut]) is None


def test_v2_proxy_ipv4_with_tlvs() -> None:
    body = bytes([203, 0, 113, 9, 10, 0, 0, 2]) + (6000).to_bytes(2, "big")
    body += (5672).to_bytes(2, "big") + b"\x04\x00\x01x"  # a NOOP TLV
    data = v2(1, 0x11, body) + AMQP
    header = parse(data)
    assert header == ProxyHeader(("203.0.113.9", 6000), ("10.0.0.2", 5672), 16 + len(body))
    for cut in range(1, header.length):
        assert parse(data[:cut]) is None


def test_v2_ipv6_local_and_unspec() -> None:
    body = (
        bytes(15) + b"\x01" + bytes(15) + b"\x02" + (1).to_bytes(2, "big") + (2).to_bytes(2, "big")
    )
    header = parse(v2(1, 0x21, body))
    assert header is not None and header.source == ("::1", 1) and header.destination == ("::2", 2)
    assert parse(v2(0, 0x00, b"")) == ProxyHeader(None, None, 16)  # LOCAL: health check
    assert parse(v2(1, 0x00, b"")) == ProxyHeader(None, None, 16)


@pytest.mark.parametrize(
    "data",
    [
        AMQP,  # a client that does not go through the balancer
        b"GET / HTTP/1.1\r\n",
        b"PROXY TCP4 999.0.0.1 10.0.0.1 1 2\r\n",
        b"PROXY TCP4 ::1 10.0.0.1 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 10.0.0.1 70000 2\r\n",
        b"PROXY TCP5 1.2.3.4 10.0.0.1 1 2\r\n",
        b"PROXY " + b"x" * 200,
        V2_SIGNATURE + b"\x31\x11\x00\x00",  # version 3
        V2_SIGNATURE + b"\x22\x11\x00\x00",  # command 2
        V2_SIGNATURE + b"\x21\x11\x00\x04" + bytes(4),  # IPv4 addresses cut short
        V2_SIGNATURE + b"\x21\x11\xff\xff",  # longer than any balancer sends
    ],
)
def test_anything_else_is_refused(data: bytes) -> None:
    with pytest.raises(ProxyProtocolError):
        parse(data)


def test_haproxy_config_sends_the_header_on_traffic_and_health_checks() -> None:
    with_header = haproxy_config(5672, [5673], Path("/tmp/s"), send_proxy=True)
    assert "send-proxy-v2 check-send-proxy" in with_header
    assert "tcp-check connect send-proxy" in with_header
    plain = haproxy_config(5672, [5673], Path("/tmp/s"))
    assert "send-proxy" not in plain
