"""The PROXY protocol (HAProxy's, versions 1 and 2): the header a load balancer sends first
on a connection, naming the client's real address. Pure parsing; the gateway reads the bytes.

`parse(data)` looks at what arrived so far and answers one of: need more bytes, a parsed
header with how many bytes it took, or ProxyProtocolError for anything that is not a valid
header (the connection must then be closed: with PROXY protocol on, every connection must
start with one).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V1_PREFIX = b"PROXY "
V1_MAX = 107  # the longest valid v1 line, CRLF included
V2_HEADER = 16
V2_MAX_PAYLOAD = 4096  # addresses + TLVs; far above anything a balancer sends


class ProxyProtocolError(ValueError):
    """Not a valid PROXY protocol header."""


@dataclass(frozen=True)
class ProxyHeader:
    # None for LOCAL (v2, a health check from the balancer itself) or UNKNOWN (v1): use
    # the socket's own peer address.
    source: tuple[str, int] | None
    destination: tuple[str, int] | None
    length: int  # bytes of the header; what follows is the client's own data


def parse(data: bytes) -> ProxyHeader | None:
    """The header at the start of `data`, or None when more bytes are needed. Raises
    ProxyProtocolError."""
    if data[: len(V2_SIGNATURE)] == V2_SIGNATURE[: len(data)] and len(data) < V2_HEADER:
        return None  # could still become a v2 header
    if data.startswith(V2_SIGNATURE):
        return _parse_v2(data)
    if V1_PREFIX.startswith(data[: len(V1_PREFIX)]):
        return _parse_v1(data)
    raise ProxyProtocolError("connection does not start with a PROXY protocol header")


def _parse_v1(data: bytes) -> ProxyHeader | None:
    end = data.find(b"\r\n")
    if end < 0:
        if len(data) >= V1_MAX:
            raise ProxyProtocolError("PROXY v1 line longer than 107 bytes")
        return None
    line = data[:end].decode("ascii", "replace")
    parts = line.split(" ")
    length = end + 2
    if len(parts) >= 2 and parts[1] == "UNKNOWN":
        return ProxyHeader(None, None, length)
    if len(parts) != 6 or parts[1] not in ("TCP4", "TCP6"):
        raise ProxyProtocolError(f"malformed PROXY v1 line {line[:60]!r}")
    _, family, source, destination, source_port, destination_port = parts
    version = 4 if family == "TCP4" else 6
    return ProxyHeader(
        (_address(source, version), _port(source_port)),
        (_address(destination, version), _port(destination_port)),
        length,
    )


def _address(text: str, version: int) -> str:
    try:
        address = ipaddress.ip_address(text)
    except ValueError as e:
        raise ProxyProtocolError(f"bad address {text[:45]!r} in PROXY header") from e
    if address.version != version:
        raise ProxyProtocolError(f"address {text!r} is not IPv{version}")
    return str(address)


def _port(text: str) -> int:
    if not text.isdigit() or len(text) > 5 or int(text) > 65535:
        raise ProxyProtocolError(f"bad port {text[:8]!r} in PROXY header")
    return int(text)


def _parse_v2(data: bytes) -> ProxyHeader | None:
    version_command, family = data[12], data[13]
    if version_command >> 4 != 2:
        raise ProxyProtocolError("PROXY v2 header with an unknown version")
    command = version_command & 0x0F
    if command not in (0, 1):
        raise ProxyProtocolError("PROXY v2 header with an unknown command")
    payload = int.from_bytes(data[14:16], "big")
    if payload > V2_MAX_PAYLOAD:
        raise ProxyProtocolError("PROXY v2 header too long")
    length = V2_HEADER + payload
    if len(data) < length:
        return None
    if command == 0:  # LOCAL
        return ProxyHeader(None, None, length)
    body = data[V2_HEADER:length]
    if family == 0x11:  # TCP over IPv4
        if payload < 12:
            raise ProxyProtocolError("PROXY v2 IPv4 addresses truncated")
        return ProxyHeader(
            (str(ipaddress.IPv4Address(body[0:4])), int.from_bytes(body[8:10], "big")),
            (str(ipaddress.IPv4Address(body[4:8])), int.from_bytes(body[10:12], "big")),
            length,
        )
    if family == 0x21:  # TCP over IPv6
        if payload < 36:
            raise ProxyProtocolError("PROXY v2 IPv6 addresses truncated")
        return ProxyHeader(
            (str(ipaddress.IPv6Address(body[0:16])), int.from_bytes(body[32:34], "big")),
            (str(ipaddress.IPv6Address(body[16:32])), int.from_bytes(body[34:36], "big")),
            length,
        )
    # UNSPEC, UDP or UNIX sockets: no TCP address to report.
    return ProxyHeader(None, None, length)
