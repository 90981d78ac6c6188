"""Reads the PROXY protocol header (model.proxy_protocol) off a new connection and hands the
rest of the bytes on, through a stream that returns them first."""

from __future__ import annotations

import trio

from starlight_py.model.proxy_protocol import ProxyHeader, ProxyProtocolError, parse

CHUNK = 4096


class PrefixedStream(trio.abc.HalfCloseableStream):
    """`stream`, with `prefix` (bytes already read from it) returned first."""

    def __init__(self, stream: trio.SocketStream, prefix: bytes) -> None:
        self.stream = stream
        self.socket = stream.socket
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            size = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:size], self._prefix[size:]
            return data
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()


async def read_proxy_header(
    stream: trio.SocketStream, timeout: float
) -> tuple[ProxyHeader, PrefixedStream]:
    """Raises ProxyProtocolError (bad header), trio.TooSlowError (none in time) or
    trio.BrokenResourceError / EOFError (the peer went away)."""
    data = b""
    with trio.fail_after(timeout):
        while True:
            header = parse(data)
            if header is not None:
                return header, PrefixedStream(stream, data[header.length :])
            chunk = await stream.receive_some(CHUNK)
            if not chunk:
                raise EOFError("connection closed before its PROXY protocol header")
            data += chunk
            if len(data) > 16 + 4096 + CHUNK:
                raise ProxyProtocolError("PROXY protocol header too long")
