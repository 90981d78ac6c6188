"""Loopback ports for the servers we launch."""

from __future__ import annotations

import errno
import socket

from starlight_py.local.errors import LocalInfraError

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now.

    The port is only reserved until this function returns, so another process could take it
    before our server binds it; the server then fails to start with a clear log.

    Raises:
        OSError: the loopback interface refuses to bind (a broken network setup).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


def ensure_port_free(port: int, what: str) -> None:
    """Check that a server could listen on ``127.0.0.1:port``.

    ``what`` names the server for the message, e.g. ``"Pulsar broker"``.

    Raises:
        LocalInfraError: something already listens on the port, or it cannot be bound.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # The JVM servers we start bind with SO_REUSEADDR, so connections of a previous run
        # lingering in TIME_WAIT do not stop them; only a live listener does. Probe the same
        # way, or a quick restart would be refused for no reason.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((LOOPBACK, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise LocalInfraError(
                    f"port {port} ({what}) is already in use on {LOOPBACK}; stop the process "
                    f"that holds it (`ss -ltnp 'sport = :{port}'` shows it) or choose another "
                    "port"
                ) from e
            raise LocalInfraError(
                f"cannot bind port {port} ({what}) on {LOOPBACK}: {e.strerror}"
            ) from e
