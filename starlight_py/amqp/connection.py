"""The server side of one AMQP 0-9-1 connection, without I/O (sans-IO, like h11).

Theory of operation
-------------------
Bytes in, events out: the I/O shell calls `receive_data(bytes)` and gets a list of events;
it calls methods (`accept_login`, `send_method`, `fail`, ...) for what it decided, and sends
whatever `data_to_send()` returns, once per wake-up. This module never blocks and never reads
a clock: heartbeat timers and close timeouts belong to the shell.

The handshake is a fixed sequence, kept as data in `_HANDSHAKE`: in each state exactly one
method is acceptable and anything else is a protocol error. Steps that need the outside
world (checking credentials, resolving the vhost) park the connection in a waiting state
until the shell answers, so nothing is sent out of order.

Channels have their own small state: OPEN, CLOSING (we sent channel.close and discard all
but close/close-ok, as the spec says) and CLIENT_CLOSING (the client sent channel.close and
the shell is releasing the channel). Content (basic.publish + header + bodies) is assembled
per channel and handed out as one `ContentReceived`.

Errors: `fail(error, channel)` is the only place an `AMQPError` becomes `channel.close` or
`connection.close`; protocol errors found here go through it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any

from pamqp import commands
from pamqp.base import Frame as PamqpMethod
from pamqp.common import FieldTable

from starlight_py.amqp import events as ev
from starlight_py.amqp import framing
from starlight_py.amqp.errors import (
    AMQPError,
    ChannelStateError,
    CommandInvalid,
    NotAllowed,
    PreconditionFailed,
    ResourceError,
    UnexpectedFrame,
)
from starlight_py.amqp.hot_frames import Publish

FRAME_MIN_SIZE = 4096
CHANNEL_MIN = 1


@dataclass(frozen=True)
class ServerSettings:
    """What the server proposes in connection.start and connection.tune."""

    channel_max: int
    frame_max: int
    heartbeat: int
    max_message_size: int
    mechanisms: tuple[str, ...] = ("PLAIN", "AMQPLAIN")
    server_properties: FieldTable = field(default_factory=dict)


# Clients cut a body into frames of frame_max - 8 bytes (frame_max is at least 4096). Far
# smaller frames, or empty ones, only cost CPU without progress: past this many, the
# connection is closed with 506 RESOURCE_ERROR.
BODY_FRAME_MIN_AVERAGE = 256
BODY_FRAME_ALLOWANCE = 64


def max_body_frames(body_size: int) -> int:
    """The most body frames one message of `body_size` bytes may come in."""
    return body_size // BODY_FRAME_MIN_AVERAGE + BODY_FRAME_ALLOWANCE


class ConnectionState(Enum):
    AWAITING_HEADER = auto()
    AWAITING_START_OK = auto()
    AUTHENTICATING = auto()
    AWAITING_TUNE_OK = auto()
    AWAITING_OPEN = auto()
    OPENING = auto()
    OPEN = auto()
    CLIENT_CLOSING = auto()
    CLOSING = auto()
    CLOSED = auto()


# The one method each handshake state accepts, and the state it leads to (set by the handler).
_HANDSHAKE: dict[ConnectionState, str] = {
    ConnectionState.AWAITING_START_OK: "Connection.StartOk",
    ConnectionState.AWAITING_TUNE_OK: "Connection.TuneOk",
    ConnectionState.AWAITING_OPEN: "Connection.Open",
}


# The states in which the shell decides what comes next: later frames wait for its answer.
# A tuple, not a set: `in` then compares by identity in C, where a set would call Enum's
# __hash__, written in Python, for every frame.
_WAITING = (ConnectionState.AUTHENTICATING, ConnectionState.OPENING)


class ChannelState(Enum):
    OPEN = auto()
    CLOSING = auto()
    CLIENT_CLOSING = auto()


@dataclass
class _PartialContent:
    method: Publish
    properties: commands.Basic.Properties | None = None
    raw_properties: bytes = b""
    body_size: int = 0
    # The first body frame is kept as is (most messages fit in one, and need no copy); from
    # the second on, bytes are appended to one bytearray, so what is held is what was
    # received: a list of chunks cost far more than their bytes for tiny or empty frames.
    body: bytes | bytearray = b""
    received: int = 0
    frames: int = 0


@dataclass
class _Channel:
    state: ChannelState = ChannelState.OPEN
    content: _PartialContent | None = None


class AMQPConnection:
    """Protocol state of one client connection. See the module docstring."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.state = ConnectionState.AWAITING_HEADER
        self.channel_max = settings.channel_max
        self.frame_max = settings.frame_max
        self.heartbeat = settings.heartbeat
        self.virtual_host = ""
        self.client_properties: FieldTable = {}
        self._header = bytearray()
        # Until tune-ok only minimum-size frames are allowed (as RabbitMQ): a client that has
        # not logged in cannot make us buffer more than 4 KiB.
        self._decoder = framing.FrameDecoder(min(FRAME_MIN_SIZE, settings.frame_max))
        self._input_broken = False
        # Frames received while the shell checks a login or opens the vhost (see resume).
        self._parked: list[tuple[int, int, bytes]] = []
        self._parked_error: AMQPError | None = None
        self._channels: dict[int, _Channel] = {}
        self._out: list[bytes] = []
        self.pending_output = 0  # bytes queued and not yet taken by data_to_send

    # ---- what the shell asks ------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once the socket should be closed (after flushing `data_to_send`)."""
        return self.state is ConnectionState.CLOSED

    @property
    def is_open(self) -> bool:
        return self.state is ConnectionState.OPEN

    def channel_is_open(self, channel: int) -> bool:
        ch = self._channels.get(channel)
        return ch is not None and ch.state is ChannelState.OPEN

    def discards_input_of(self, channel: int) -> bool:
        """True once an error closed the channel (or the connection) on our side: what the
        client sent after the failing method is ignored, even when it was read with it. A
        channel the client is closing still takes what it sent before its channel.close."""
        if self.state in (ConnectionState.CLOSING, ConnectionState.CLOSED):
            return True
        ch = self._channels.get(channel)
        return ch is None or ch.state is ChannelState.CLOSING

    @property
    def open_channels(self) -> list[int]:
        return [n for n, ch in self._channels.items() if ch.state is ChannelState.OPEN]

    @property
    def mid_frame(self) -> bool:
        """Whether the input so far ends inside a frame (the next bytes continue it)."""
        return self._decoder.buffered > 0

    @property
    def buffered_input(self) -> int:
        """Bytes held for partial frames and partial messages (bounded by frame_max and
        max_message_size per channel); exposed for memory tests and metrics."""
        partial = sum(
            ch.content.received for ch in self._channels.values() if ch.content is not None
        )
        return self._decoder.buffered + partial

    def data_to_send(self) -> bytes:
        """Everything queued for the client since the last call."""
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out.clear()
        self.pending_output = 0
        return data

    # ---- input --------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray) -> list[ev.Event]:
        """Feed bytes from the socket; returns the events they complete. Never raises for
        anything the peer sends: protocol errors become close frames via `fail`."""
        events: list[ev.Event] = []
        if self.state is ConnectionState.CLOSED or self._input_broken:
            return events
        if self.state is ConnectionState.AWAITING_HEADER:
            data = self._receive_header(data)
            if not data:
                return events
        frames, error = self._decoder.feed_joined(data, self.settings.max_message_size)
        if self.state in _WAITING:
            self._park(frames, error)
            return events
        return self._process(frames, error, events)

    def resume(self) -> list[ev.Event]:
        """The events of frames that came while the shell was checking a login or opening
        the vhost (a client may send tune-ok, connection.open and channel frames without
        waiting for the replies, as RabbitMQ accepts): call after `accept_login` /
        `accept_open`, until it returns nothing."""
        if self.state in _WAITING or not (self._parked or self._parked_error):
            return []
        frames, error = self._parked, self._parked_error
        self._parked, self._parked_error = [], None
        if self.closed or self.state is ConnectionState.CLOSING:
            return []  # the login or open was refused: what followed is noise
        return self._process(frames, error, [])

    def _park(self, frames: list[tuple[Any, ...]], error: AMQPError | None) -> None:
        self._parked.extend(frames)
        if error is not None and self._parked_error is None:
            self._parked_error = error

    def _process(
        self, frames: list[tuple[Any, ...]], error: AMQPError | None, events: list[ev.Event]
    ) -> list[ev.Event]:
        joined = framing.FRAME_MESSAGE
        for index, frame in enumerate(frames):
            if self.state in _WAITING:
                # The shell must answer before the rest can be handled: kept for `resume`.
                self._park(frames[index:], error)
                return events
            if frame[0] == joined:
                # A whole publish, joined by the decoder: one event when its channel is
                # open and waits for no content, else its frames, one by one, next.
                if not self._joined_publish(frame, events):
                    frames[index + 1 : index + 1] = framing.unjoin(frame)
                continue
            frame_type, number, payload = frame
            # Decoding: what does not decode breaks the stream.
            try:
                item = _decode_item(frame_type, number, payload)
            except AMQPError as e:
                self._decoder.reset()
                error = e
                break
            try:
                self._dispatch(frame_type, number, item, events)
            except AMQPError as e:
                events.append(ev.ErrorRaised(number, e))
                self.fail(e, number)
            if self.state is ConnectionState.CLOSED:  # `closed`, without a call per frame
                break
        if error is not None:
            self._input_unparsable(error, events)
        return events

    def _dispatch(self, frame_type: int, number: int, item: Any, events: list[ev.Event]) -> None:
        """Handle a decoded frame: those of open channels (nearly all of them) go straight to
        their handler; everything else through the state checks of _handle_frame."""
        channel = self._channels.get(number) if number else None
        if (
            channel is None
            or channel.state is not ChannelState.OPEN
            or self.state is not ConnectionState.OPEN
        ):
            self._handle_frame(_as_frame(frame_type, number, item), events)
        elif frame_type == framing.FRAME_BODY:
            self._content_body(number, channel, item, events)
        elif frame_type == framing.FRAME_METHOD:
            self._channel_method(number, channel, item, events)
        elif frame_type == framing.FRAME_HEADER:
            self._content_header(number, channel, item, events)
        else:
            self._handle_frame(item, events)

    def _input_unparsable(self, error: AMQPError, events: list[ev.Event]) -> None:
        """The stream cannot be parsed past a frame that did not decode."""
        if self.state is ConnectionState.CLIENT_CLOSING:
            self._input_broken = True  # the client said goodbye; what follows is noise
        elif not self.closed:
            # No close-ok can be read: send connection.close and hang up once it is flushed.
            events.append(ev.ErrorRaised(0, error))
            self.fail(error)
            self._input_broken = True
            self.state = ConnectionState.CLOSED

    def _joined_publish(self, item: tuple[Any, ...], events: list[ev.Event]) -> bool:
        """The event of a publish `FrameDecoder.feed_joined` joined, when the frame-by-frame
        path would make the same of it; False: that path must judge its frames."""
        _, number, exchange, routing_key, bits, raw_properties, _, body = item
        channel = self._channels.get(number)
        if (
            channel is None
            or channel.state is not ChannelState.OPEN
            or channel.content is not None
            or self.state is not ConnectionState.OPEN
        ):
            return False
        properties = framing.known_properties(raw_properties)
        if properties is None:
            return False
        method = Publish(exchange, routing_key, bool(bits & 1), bool(bits & 2))
        events.append(ev.ContentReceived(number, method, properties, body, raw_properties))
        return True

    def _receive_header(self, data: bytes | bytearray) -> bytes | bytearray:
        need = len(framing.PROTOCOL_HEADER) - len(self._header)
        self._header += data[:need]
        rest = data[need:]
        received = bytes(self._header)
        if not any(h.startswith(received) for h in framing.ACCEPTED_PROTOCOL_HEADERS):
            # The spec's answer to a wrong header: our header, then close the socket.
            self._queue(framing.PROTOCOL_HEADER)
            self.state = ConnectionState.CLOSED
            return b""
        if len(self._header) < len(framing.PROTOCOL_HEADER):
            return b""
        self._send(
            0,
            commands.Connection.Start(
                version_major=0,
                version_minor=9,
                server_properties=self.settings.server_properties,
                mechanisms=" ".join(self.settings.mechanisms),
                locales="en_US",
            ),
        )
        self.state = ConnectionState.AWAITING_START_OK
        return rest

    def _handle_frame(self, frame: framing.Frame, events: list[ev.Event]) -> None:
        if isinstance(frame, framing.HeartbeatFrame):
            return
        if self.state is ConnectionState.CLOSING:
            self._while_closing(frame)
            return
        if self.state is ConnectionState.CLIENT_CLOSING:
            return
        if frame.channel == 0:
            if not isinstance(frame, framing.MethodFrame):
                raise UnexpectedFrame("content frame on channel 0")
            self._handle_connection_method(frame.method, events)
            return
        if self.state is not ConnectionState.OPEN:
            raise UnexpectedFrame(
                f"frame on channel {frame.channel} before the connection was opened",
                _ids_of(frame),
            )
        self._handle_channel_frame(frame, events)

    def _while_closing(self, frame: framing.Frame) -> None:
        if frame.channel != 0 or not isinstance(frame, framing.MethodFrame):
            return
        name = frame.method.name
        if name == "Connection.Close":
            self._send(0, commands.Connection.CloseOk())
            self.state = ConnectionState.CLOSED
        elif name == "Connection.CloseOk":
            self.state = ConnectionState.CLOSED

    def _handle_connection_method(self, method: framing.Method, events: list[ev.Event]) -> None:
        name = method.name
        if name == "Connection.Close" and self.state is not ConnectionState.AWAITING_HEADER:
            assert isinstance(method, commands.Connection.Close)
            self.state = ConnectionState.CLIENT_CLOSING
            events.append(
                ev.ConnectionCloseRequested(method.reply_code or 0, method.reply_text or "")
            )
            return
        expected = _HANDSHAKE.get(self.state)
        if expected is None or name != expected:
            if self.state is ConnectionState.OPEN and name == "Connection.UpdateSecret":
                events.append(ev.MethodReceived(0, method))
                return
            # RabbitMQ's answer, in every state: 504 "unexpected method in connection state".
            state = "running" if self.state is ConnectionState.OPEN else self.state.name.lower()
            raise ChannelStateError(
                f"unexpected method in connection state {state}: '{name}'",
                framing.method_ids(method),
            )
        if isinstance(method, commands.Connection.StartOk):
            self._start_ok(method, events)
        elif isinstance(method, commands.Connection.TuneOk):
            self._tune_ok(method)
        elif isinstance(method, commands.Connection.Open):
            self.virtual_host = method.virtual_host
            self.state = ConnectionState.OPENING
            events.append(ev.OpenRequested(method.virtual_host))

    def _start_ok(self, method: commands.Connection.StartOk, events: list[ev.Event]) -> None:
        if method.mechanism not in self.settings.mechanisms:
            raise CommandInvalid(
                f"unknown authentication mechanism '{method.mechanism}'", framing.method_ids(method)
            )
        response = method.response
        raw = response.encode("utf-8") if isinstance(response, str) else bytes(response or b"")
        self.client_properties = method.client_properties or {}
        self.state = ConnectionState.AUTHENTICATING
        events.append(ev.LoginRequested(method.mechanism, raw, self.client_properties))

    def _tune_ok(self, method: commands.Connection.TuneOk) -> None:
        # RabbitMQ's rules: 0 means "no limit", which exceeds any server limit; values
        # below the protocol minimum or above what we proposed are refused with 530.
        self.channel_max = _negotiate(
            "channel_max", method.channel_max, CHANNEL_MIN, self.settings.channel_max, method
        )
        self.frame_max = _negotiate(
            "frame_max", method.frame_max, FRAME_MIN_SIZE, self.settings.frame_max, method
        )
        self._decoder.frame_max = self.frame_max
        self.heartbeat = method.heartbeat
        self.state = ConnectionState.AWAITING_OPEN

    def _handle_channel_frame(self, frame: framing.Frame, events: list[ev.Event]) -> None:
        number = frame.channel
        channel = self._channels.get(number)
        if channel is None:
            if isinstance(frame, framing.MethodFrame) and frame.method.name == "Channel.Open":
                self._open_channel(number, events)
                return
            raise ChannelStateError(f"expected 'channel.open' on channel {number}", _ids_of(frame))
        if channel.state is ChannelState.CLOSING:
            self._channel_while_closing(number, frame, events)
            return
        if channel.state is ChannelState.CLIENT_CLOSING:
            return
        if isinstance(frame, framing.MethodFrame):
            self._channel_method(number, channel, frame.method, events)
        elif isinstance(frame, framing.HeaderFrame):
            self._content_header(number, channel, frame, events)
        elif isinstance(frame, framing.BodyFrame):
            self._content_body(number, channel, frame.payload, events)

    def _open_channel(self, number: int, events: list[ev.Event]) -> None:
        # RabbitMQ 3.10 limits how many channels are open, not their numbers (any of 1-65535).
        opened = len(self._channels)
        if self.channel_max and opened >= self.channel_max:
            raise NotAllowed(
                f"number of channels opened ({opened}) has reached the negotiated "
                f"channel_max ({self.channel_max})"
                # RabbitMQ names no method (class and method id 0) in this close.
            )
        self._channels[number] = _Channel()
        self._send(number, commands.Channel.OpenOk())
        events.append(ev.ChannelOpened(number))

    def _channel_while_closing(
        self, number: int, frame: framing.Frame, events: list[ev.Event]
    ) -> None:
        if not isinstance(frame, framing.MethodFrame):
            return
        name = frame.method.name
        if name == "Channel.Close":
            # The client's close crossed ours: answer it, and the channel goes with the
            # client's close-ok of ours, which follows (as RabbitMQ: a close-ok then is no
            # stray frame on a closed channel).
            self._send(number, commands.Channel.CloseOk())
            return
        if name == "Channel.Open":
            # Still open as far as this side knows (RabbitMQ's 504).
            raise ChannelStateError(
                f"second 'channel.open' seen on channel {number}", _ids_of(frame)
            )
        if name != "Channel.CloseOk":
            return
        del self._channels[number]
        events.append(ev.ChannelClosed(number))

    def _channel_method(
        self, number: int, channel: _Channel, method: framing.Method, events: list[ev.Event]
    ) -> None:
        if channel.content is not None:
            raise UnexpectedFrame(
                f"expected content {'body' if channel.content.properties else 'header'} "
                f"for {channel.content.method.name} on channel {number}, got {method.name}",
                framing.method_ids(method),
            )
        name = method.name
        if name == "Channel.Close":
            assert isinstance(method, commands.Channel.Close)
            channel.state = ChannelState.CLIENT_CLOSING
            events.append(
                ev.ChannelCloseRequested(number, method.reply_code or 0, method.reply_text or "")
            )
        elif name == "Channel.CloseOk":
            # Nothing of ours to confirm; RabbitMQ treats it as an unknown command too.
            raise CommandInvalid("unimplemented method", framing.method_ids(method))
        elif name == "Channel.Open":
            raise ChannelStateError(
                f"second 'channel.open' seen on channel {number}", framing.method_ids(method)
            )
        elif name.startswith("Connection."):
            raise CommandInvalid(
                f"'{name}' is only allowed on channel 0", framing.method_ids(method)
            )
        elif type(method) is Publish:
            channel.content = _PartialContent(method)
        else:
            events.append(ev.MethodReceived(number, method))

    def _content_header(
        self, number: int, channel: _Channel, frame: framing.HeaderFrame, events: list[ev.Event]
    ) -> None:
        content = channel.content
        if content is None or content.properties is not None:
            raise UnexpectedFrame(f"unexpected content header on channel {number}")
        if frame.body_size > self.settings.max_message_size:
            channel.content = None
            raise PreconditionFailed(
                f"message size {frame.body_size} is larger than configured max size "
                f"{self.settings.max_message_size}",
                framing.method_ids(content.method),
            )
        content.properties = frame.properties
        content.raw_properties = frame.raw_properties
        content.body_size = frame.body_size
        if frame.body_size == 0:
            self._content_complete(number, channel, events)

    def _content_body(
        self, number: int, channel: _Channel, payload: bytes, events: list[ev.Event]
    ) -> None:
        content = channel.content
        if content is None or content.properties is None:
            raise UnexpectedFrame(f"unexpected content body on channel {number}")
        content.received += len(payload)
        content.frames += 1
        if content.frames > max_body_frames(content.body_size):
            raise ResourceError(
                f"too many body frames ({content.frames}) for a message of "
                f"{content.body_size} bytes"
            )
        if content.received > content.body_size:
            raise UnexpectedFrame(
                f"content body larger than the {content.body_size} bytes declared in its header"
            )
        if not content.body:
            content.body = payload
        elif payload:
            if isinstance(content.body, bytes):
                content.body = bytearray(content.body)
            content.body += payload
        if content.received == content.body_size:
            self._content_complete(number, channel, events)

    def _content_complete(self, number: int, channel: _Channel, events: list[ev.Event]) -> None:
        content = channel.content
        assert content is not None and content.properties is not None
        channel.content = None
        body = content.body if isinstance(content.body, bytes) else bytes(content.body)
        events.append(
            ev.ContentReceived(
                number, content.method, content.properties, body, content.raw_properties
            )
        )

    # ---- what the shell decided -----------------------------------------------------------

    def accept_login(self) -> None:
        """Credentials are good: propose the tuning parameters."""
        if self.state is not ConnectionState.AUTHENTICATING:
            return
        self._send(
            0,
            commands.Connection.Tune(
                channel_max=self.settings.channel_max,
                frame_max=self.settings.frame_max,
                heartbeat=self.settings.heartbeat,
            ),
        )
        self.state = ConnectionState.AWAITING_TUNE_OK

    def accept_open(self) -> None:
        """The vhost is usable: the connection is open."""
        if self.state is not ConnectionState.OPENING:
            return
        self._send(0, commands.Connection.OpenOk())
        self.state = ConnectionState.OPEN

    def send_method(self, channel: int, method: PamqpMethod) -> None:
        """Queue a method for the client; dropped if its channel is no longer open (the
        client would have to discard it anyway)."""
        if channel == 0:
            if self.state not in (ConnectionState.CLOSED, ConnectionState.CLOSING):
                self._send(0, method)
        elif self.channel_is_open(channel):
            self._send(channel, method)

    def send_content(
        self,
        channel: int,
        method: PamqpMethod,
        properties: commands.Basic.Properties,
        body: bytes,
    ) -> None:
        """Queue basic.deliver / get-ok / return with its header and body frames."""
        if self.channel_is_open(channel):
            self._queue(framing.encode_content(channel, method, properties, body, self.frame_max))

    def send_content_raw(
        self, channel: int, method: PamqpMethod, raw_properties: bytes, body: bytes
    ) -> None:
        """send_content with properties already encoded (delivered byte for byte)."""
        if self.channel_is_open(channel):
            self._queue(
                framing.encode_content_raw(channel, method, raw_properties, body, self.frame_max)
            )

    def write_channel(self, channel: int, data: bytes) -> None:
        """Queue frames already encoded for an open channel (the message core's output);
        dropped once the channel is no longer open."""
        ch = self._channels.get(channel)
        if ch is not None and ch.state is ChannelState.OPEN:
            self._out.append(data)
            self.pending_output += len(data)

    def send_heartbeat(self) -> None:
        if self.state not in (ConnectionState.CLOSED, ConnectionState.AWAITING_HEADER):
            self._queue(framing.encode_heartbeat())

    def finish_channel_close(self, channel: int) -> None:
        """The shell released a channel the client closed: confirm with close-ok."""
        ch = self._channels.get(channel)
        if ch is not None and ch.state is ChannelState.CLIENT_CLOSING:
            del self._channels[channel]
            self._send(channel, commands.Channel.CloseOk())

    def finish_connection_close(self) -> None:
        """The shell released everything after the client's connection.close."""
        if self.state is ConnectionState.CLIENT_CLOSING:
            self._channels.clear()
            self._send(0, commands.Connection.CloseOk())
            self.state = ConnectionState.CLOSED

    def abort(self) -> None:
        """Give up on the connection without a close handshake (peer gone or timed out)."""
        self._channels.clear()
        self.state = ConnectionState.CLOSED

    def fail(self, error: AMQPError, channel: int = 0) -> None:
        """The one place that turns an error into `channel.close` or `connection.close`.

        A channel-level error closes only its channel when it happened on an open channel of
        an open connection; anything else (connection-level errors, errors on channel 0,
        errors during the handshake) closes the connection.
        """
        if self.state in (ConnectionState.CLOSING, ConnectionState.CLOSED):
            return
        class_id, method_id = error.method
        if error.closes_connection or channel == 0 or self.state is not ConnectionState.OPEN:
            self._channels.clear()
            self._send(
                0,
                commands.Connection.Close(
                    reply_code=int(error.reply_code),
                    reply_text=error.reply_text,
                    class_id=class_id,
                    method_id=method_id,
                ),
            )
            self.state = ConnectionState.CLOSING
            return
        ch = self._channels.get(channel)
        if ch is None or ch.state is not ChannelState.OPEN:
            return
        ch.state = ChannelState.CLOSING
        ch.content = None
        self._send(
            channel,
            commands.Channel.Close(
                reply_code=int(error.reply_code),
                reply_text=error.reply_text,
                class_id=class_id,
                method_id=method_id,
            ),
        )

    def _send(self, channel: int, method: PamqpMethod) -> None:
        self._queue(framing.encode_method(channel, method))

    def _queue(self, data: bytes) -> None:
        self._out.append(data)
        self.pending_output += len(data)


def _decode_item(frame_type: int, number: int, payload: Any) -> Any:
    """A frame's payload decoded (a body stays as it is). Raises AMQPError."""
    if frame_type == framing.FRAME_BODY:
        return payload
    if frame_type == framing.FRAME_METHOD:
        return framing.decode_method(payload)
    if frame_type == framing.FRAME_HEADER:
        return framing.decode_header(number, payload)
    return framing.decode_frame(frame_type, number, payload)


def _as_frame(frame_type: int, channel: int, item: Any) -> framing.Frame:
    """The frame object of a decoded payload (the generic path takes frames)."""
    if frame_type == framing.FRAME_BODY:
        return framing.BodyFrame(channel, item)
    if frame_type == framing.FRAME_METHOD:
        return framing.MethodFrame(channel, item)
    frame: framing.Frame = item  # a HeaderFrame or HeartbeatFrame already
    return frame


def _ids_of(frame: framing.Frame) -> tuple[int, int]:
    if isinstance(frame, framing.MethodFrame):
        return framing.method_ids(frame.method)
    return (0, 0)


def _negotiate(name: str, client: int, minimum: int, server: int, method: framing.Method) -> int:
    if client != 0 and client < minimum:
        raise NotAllowed(
            f"negotiated {name} = {client} is lower than the minimum allowed value ({minimum})",
            framing.method_ids(method),
        )
    if server != 0 and (client == 0 or client > server):
        raise NotAllowed(
            f"negotiated {name} = {client} is higher than the maximum allowed value ({server})",
            framing.method_ids(method),
        )
    return client or server
