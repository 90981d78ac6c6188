"""A minimal AMQP 0-9-1 client the management API uses to publish and get messages through
this proxy's own AMQP listener, with the HTTP caller's credentials (as RabbitMQ's management
plugin does with its internal client). Messages thus take the one path every AMQP client
takes: routing, permissions, confirms, counts, dead-lettering.

Names go out as the proxy sends them (framing.encode_method, without pamqp's checks, which
refuse names such as `a<b` that RabbitMQ and the proxy accept). One connection, one channel;
closed after each request. Server refusals become the AMQP
errors they name (`LoopbackRefused` carries the reply code and text).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import trio
from pamqp import commands, frame
from pamqp.base import Frame as PamqpMethod
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from starlight_py.amqp.field_codec import unvalidated
from starlight_py.amqp.framing import encode_method
from starlight_py.units import SECONDS

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
TIMEOUT = 30 * SECONDS
CHANNEL = 1


class LoopbackRefused(Exception):
    """The proxy closed the connection or channel: `reply_code`, `reply_text`."""

    def __init__(self, reply_code: int, reply_text: str, connection: bool) -> None:
        super().__init__(f"{reply_code} {reply_text}")
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.connection = connection


@dataclass(frozen=True)
class GotMessage:
    payload: bytes
    properties: commands.Basic.Properties
    exchange: str
    routing_key: str
    redelivered: bool
    message_count: int


class LoopbackClient:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self._frame_max = 131072

    @classmethod
    async def open(
        cls, host: str, port: int, username: str, password: str, vhost: str
    ) -> LoopbackClient:
        """Connect, log in (PLAIN) and open `vhost` and channel 1. Raises LoopbackRefused,
        OSError, trio.TooSlowError."""
        stream = await trio.open_tcp_stream(host, port)
        client = cls(stream)
        try:
            with trio.fail_after(TIMEOUT):
                await client._handshake(username, password, vhost)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return client

    async def aclose(self) -> None:
        try:
            with trio.move_on_after(2 * SECONDS):
                await self._send(0, commands.Connection.Close(200, "Goodbye", 0, 0))
                while True:
                    _, value = await self._read_frame()
                    if isinstance(value, commands.Connection.CloseOk):
                        break
        except (trio.BrokenResourceError, trio.ClosedResourceError, EOFError, LoopbackRefused):
            pass
        finally:
            await trio.aclose_forcefully(self._stream)

    async def _handshake(self, username: str, password: str, vhost: str) -> None:
        await self._stream.send_all(PROTOCOL_HEADER)
        await self._expect(commands.Connection.Start)
        response = f"\x00{username}\x00{password}"
        await self._send(
            0,
            commands.Connection.StartOk(
                client_properties={"product": "starlight-py management"},
                mechanism="PLAIN",
                response=response,
            ),
        )
        tune = await self._expect(commands.Connection.Tune)
        assert isinstance(tune, commands.Connection.Tune)
        self._frame_max = tune.frame_max or self._frame_max
        await self._send(0, commands.Connection.TuneOk(tune.channel_max, self._frame_max, 0))
        await self._send(0, commands.Connection.Open(virtual_host=vhost))
        await self._expect(commands.Connection.OpenOk)
        await self._send(CHANNEL, commands.Channel.Open())
        await self._expect(commands.Channel.OpenOk)

    # ---- operations ---------------------------------------------------------------------------

    async def publish(
        self,
        exchange: str,
        routing_key: str,
        payload: bytes,
        properties: commands.Basic.Properties,
    ) -> bool:
        """Publish with `mandatory` and a confirm; True when some queue took the message.
        Raises LoopbackRefused."""
        with trio.fail_after(TIMEOUT):
            await self._send(CHANNEL, commands.Confirm.Select())
            await self._expect(commands.Confirm.SelectOk)
            method = unvalidated(
                commands.Basic.Publish, exchange=exchange, routing_key=routing_key, mandatory=True
            )
            data = encode_method(CHANNEL, method)
            data += frame.marshal(ContentHeader(0, len(payload), properties), CHANNEL)
            chunk = self._frame_max - 8
            for start in range(0, len(payload), chunk):
                data += frame.marshal(ContentBody(payload[start : start + chunk]), CHANNEL)
            await self._stream.send_all(data)
            routed = True
            while True:
                _, value = await self._read_frame()
                if isinstance(value, commands.Basic.Return):
                    routed = False
                elif isinstance(value, commands.Basic.Ack):
                    return routed
                elif isinstance(value, commands.Basic.Nack):
                    raise LoopbackRefused(541, "INTERNAL_ERROR - the message was not stored", False)

    async def get(self, queue: str, count: int, ack: bool, requeue: bool) -> list[GotMessage]:
        """Up to `count` messages. `ack`: acknowledged (gone); otherwise rejected with
        `requeue`; requeued ones stay held until the connection closes, so one request never
        sees the same message twice (as RabbitMQ's management plugin). Raises
        LoopbackRefused."""
        got: list[GotMessage] = []
        with trio.fail_after(TIMEOUT):
            for _ in range(count):
                await self._send(
                    CHANNEL, unvalidated(commands.Basic.Get, queue=queue, no_ack=False)
                )
                answer = await self._expect(commands.Basic.GetOk, commands.Basic.GetEmpty)
                if isinstance(answer, commands.Basic.GetEmpty):
                    break
                assert isinstance(answer, commands.Basic.GetOk)
                properties, payload = await self._content()
                got.append(
                    GotMessage(
                        payload,
                        properties,
                        answer.exchange,
                        answer.routing_key or "",
                        answer.redelivered,
                        answer.message_count or 0,
                    )
                )
                tag = answer.delivery_tag or 0
                if ack:
                    await self._send(CHANNEL, commands.Basic.Ack(tag))
                elif not requeue:
                    await self._send(CHANNEL, commands.Basic.Reject(tag, requeue=False))
        return got

    # ---- frames -------------------------------------------------------------------------------

    async def _content(self) -> tuple[commands.Basic.Properties, bytes]:
        _, head = await self._read_frame()
        if not isinstance(head, ContentHeader):
            raise LoopbackRefused(505, "UNEXPECTED_FRAME - expected a content header", True)
        body = bytearray()
        while len(body) < head.body_size:
            _, part = await self._read_frame()
            if not isinstance(part, ContentBody):
                raise LoopbackRefused(505, "UNEXPECTED_FRAME - expected a content body", True)
            body += part.value
        return head.properties, bytes(body)

    async def _send(self, channel: int, method: PamqpMethod) -> None:
        await self._stream.send_all(encode_method(channel, method))

    async def _expect(self, *kinds: type[Any]) -> Any:
        while True:
            _, value = await self._read_frame()
            if isinstance(value, kinds):
                return value

    async def _read_frame(self) -> tuple[int, Any]:
        """The next frame; a close from the server raises LoopbackRefused (after answering
        it), the end of the stream EOFError."""
        while True:
            if len(self._buffer) >= 7:
                (size,) = struct.unpack(">I", self._buffer[3:7])
                if len(self._buffer) >= size + 8:
                    used, channel, value = frame.unmarshal(bytes(self._buffer[: size + 8]))
                    del self._buffer[:used]
                    await self._answer_close(channel, value)
                    return channel, value
            data = await self._stream.receive_some(65536)
            if not data:
                raise EOFError("the proxy closed the loopback connection")
            self._buffer += data

    async def _answer_close(self, channel: int, value: object) -> None:
        if isinstance(value, commands.Connection.Close):
            await self._send(0, commands.Connection.CloseOk())
            raise LoopbackRefused(value.reply_code or 0, value.reply_text, True)
        if isinstance(value, commands.Channel.Close):
            await self._send(channel, commands.Channel.CloseOk())
            raise LoopbackRefused(value.reply_code or 0, value.reply_text, False)
