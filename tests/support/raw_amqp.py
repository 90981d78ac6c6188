"""A deliberately dumb AMQP client over a plain socket, for tests that must send exactly
the bytes they choose (malformed frames, protocol violations, silence)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import time
from dataclasses import dataclass

from pamqp import commands, frame
from pamqp.base import Frame as PamqpMethod

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


@dataclass
class Tuned:
    channel_max: int
    frame_max: int
    heartbeat: int


class RawClient:
    def __init__(
        self,
        host: str,
        port: int,
        timeout: float = 10.0,
        *,
        tls: ssl.SSLContext | None = None,
        server_hostname: str = "localhost",
    ) -> None:
        sock = socket.create_connection((host, port), timeout=timeout)
        self.sock: socket.socket = (
            tls.wrap_socket(sock, server_hostname=server_hostname) if tls is not None else sock
        )
        self.buffer = b""
        self.mechanisms: list[str] = []  # offered in the last connection.start

    @classmethod
    def from_socket(cls, sock: socket.socket) -> RawClient:
        """Over a socket connected by the caller (e.g. from a chosen source address)."""
        client = cls.__new__(cls)
        client.sock = sock
        client.buffer = b""
        client.mechanisms = []
        return client

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_method(self, channel: int, method: PamqpMethod) -> None:
        self.send(frame.marshal(method, channel))

    def read_frame(self, timeout: float = 10.0) -> tuple[int, object]:
        """Next frame as (channel, pamqp value); raises EOFError when the server hung up."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buffer) >= 7:
                (size,) = struct.unpack(">I", self.buffer[3:7])
                if len(self.buffer) >= size + 8:
                    used, channel, value = frame.unmarshal(self.buffer[: size + 8])
                    self.buffer = self.buffer[used:]
                    return channel, value
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError as e:
                raise EOFError("server reset the connection") from e
            if not chunk:
                raise EOFError("server closed the connection")
            self.buffer += chunk

    def read_method(self, timeout: float = 10.0) -> tuple[int, PamqpMethod]:
        """Next method frame, skipping heartbeats."""
        while True:
            channel, value = self.read_frame(timeout)
            if isinstance(value, PamqpMethod):
                return channel, value

    def read_raw(self, timeout: float = 10.0) -> bytes:
        """Whatever arrives until the server closes or resets (buffered bytes first)."""
        data, self.buffer = self.buffer, b""
        self.sock.settimeout(timeout)
        while True:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk

    def wait_closed(self, timeout: float = 10.0) -> float:
        """Read and drop everything until EOF or reset; returns the seconds it took."""
        start = time.monotonic()
        self.sock.settimeout(timeout)
        with contextlib.suppress(ConnectionResetError):
            while self.sock.recv(65536):
                pass
        return time.monotonic() - start

    def handshake(
        self,
        *,
        channel_max: int | None = None,
        frame_max: int | None = None,
        heartbeat: int | None = None,
        vhost: str = "/",
        mechanism: str = "PLAIN",
        response: str = "\x00guest\x00guest",
        capabilities: dict[str, bool] | None = None,
    ) -> Tuned:
        """Header, start-ok (PLAIN guest/guest unless given), tune-ok (server values unless
        given), open. `capabilities`: the client's, in start-ok's client properties."""
        tune = self.login(mechanism, response, capabilities)
        assert isinstance(tune, commands.Connection.Tune), tune
        tuned = Tuned(
            tune.channel_max if channel_max is None else channel_max,
            tune.frame_max if frame_max is None else frame_max,
            tune.heartbeat if heartbeat is None else heartbeat,
        )
        self.send_method(
            0, commands.Connection.TuneOk(tuned.channel_max, tuned.frame_max, tuned.heartbeat)
        )
        self.send_method(0, commands.Connection.Open(virtual_host=vhost))
        _, open_ok = self.read_method()
        assert isinstance(open_ok, commands.Connection.OpenOk), open_ok
        return tuned

    def login(
        self,
        mechanism: str = "PLAIN",
        response: str = "\x00guest\x00guest",
        capabilities: dict[str, bool] | None = None,
    ) -> PamqpMethod:
        """Header and start-ok; returns the server's answer (tune, or connection.close)."""
        self.send(PROTOCOL_HEADER)
        _, start = self.read_method()
        assert isinstance(start, commands.Connection.Start), start
        self.mechanisms = str(start.mechanisms).split()
        properties: dict[str, object] = {"product": "raw-test"}
        if capabilities:
            properties["capabilities"] = capabilities
        self.send_method(
            0,
            commands.Connection.StartOk(
                client_properties=properties,
                mechanism=mechanism,
                response=response,
            ),
        )
        return self.read_method()[1]

    def open_channel(self, number: int) -> PamqpMethod:
        self.send_method(number, commands.Channel.Open())
        return self.read_method()[1]

    def expect_connection_close(self, timeout: float = 10.0) -> commands.Connection.Close:
        """Skip frames until connection.close; answer close-ok like a polite client."""
        while True:
            _, method = self.read_method(timeout)
            if isinstance(method, commands.Connection.Close):
                with contextlib.suppress(OSError):
                    self.send_method(0, commands.Connection.CloseOk())
                return method
