"""What `AMQPConnection.receive_data` reports to the I/O shell.

Events are past tense: they say what the client did. Events that need the outside world
(authentication, vhost lookup, cleanup before close-ok) are answered by calling a method of
the connection (`accept_login`, `accept_open`, `finish_channel_close`, ...); until then the
connection sends nothing for them, which keeps replies in the order RabbitMQ gives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from pamqp import commands
from pamqp.common import FieldTable

from starlight_py.amqp.errors import AMQPError
from starlight_py.amqp.framing import Method
from starlight_py.amqp.hot_frames import Publish


@dataclass(frozen=True, slots=True)
class LoginRequested:
    """connection.start-ok arrived: check `mechanism`/`response`, then `accept_login`."""

    mechanism: str
    response: bytes
    client_properties: FieldTable


@dataclass(frozen=True, slots=True)
class OpenRequested:
    """connection.open arrived: resolve the vhost, then `accept_open`."""

    virtual_host: str


@dataclass(frozen=True, slots=True)
class ChannelOpened:
    """channel.open was answered with open-ok; the channel is ready."""

    channel: int


# The two events of every message are NamedTuples: as immutable as frozen dataclasses, and
# made in a third of the time (one or two of them per message).


class MethodReceived(NamedTuple):
    """A method for the I/O shell to carry out on an open channel (queue.declare, basic.ack...)."""

    channel: int
    method: Method


class ContentReceived(NamedTuple):
    """A complete content-bearing method (basic.publish) with its properties and body."""

    channel: int
    method: Publish
    properties: commands.Basic.Properties
    body: bytes
    raw_properties: bytes = b""  # as the client encoded them (see framing.HeaderFrame)


@dataclass(frozen=True, slots=True)
class ChannelCloseRequested:
    """The client sent channel.close: release the channel, then `finish_channel_close`."""

    channel: int
    reply_code: int
    reply_text: str


@dataclass(frozen=True, slots=True)
class ChannelClosed:
    """The channel is gone (close-ok exchanged either way); release what it held."""

    channel: int


@dataclass(frozen=True, slots=True)
class ConnectionCloseRequested:
    """The client sent connection.close: release everything, then `finish_connection_close`."""

    reply_code: int
    reply_text: str


@dataclass(frozen=True, slots=True)
class ErrorRaised:
    """The connection closed a channel or itself because of `error` (for logs and metrics)."""

    channel: int
    error: AMQPError


Event = (
    LoginRequested
    | OpenRequested
    | ChannelOpened
    | MethodReceived
    | ContentReceived
    | ChannelCloseRequested
    | ChannelClosed
    | ConnectionCloseRequested
    | ErrorRaised
)
