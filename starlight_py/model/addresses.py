"""Client addresses as the proxy writes them (`host:port`, `[v6]:port`, and behind the PROXY
protocol `client:port (via balancer:port)`)."""

from __future__ import annotations


def host_port(address: str) -> tuple[str, int | None]:
    """The client's host and port of such an address (port None when it has none)."""
    address = address.split(" (via ", 1)[0]
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port) if port.isdigit() else None
