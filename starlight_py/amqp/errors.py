"""AMQP 0-9-1 reply codes and the exceptions that carry them.

Every error a client can see is one of these classes. `reply_code` and `reply_name` are class
attributes (as in h11/h2). `ChannelLevelError` subclasses close only the channel they happened
on (RabbitMQ's "soft" errors); `ConnectionLevelError` subclasses close the connection ("hard").
A soft error raised where there is no channel (during the handshake, on channel 0) closes the
connection: `starlight_py.amqp.connection.AMQPConnection.fail` is the one place that decides.

`reply_text` follows RabbitMQ's format, `"NOT_FOUND - no queue 'q' in vhost '/'"`, because
clients and operators grep for it.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar


class ReplyCode(IntEnum):
    REPLY_SUCCESS = 200
    CONTENT_TOO_LARGE = 311
    NO_ROUTE = 312
    NO_CONSUMERS = 313
    CONNECTION_FORCED = 320
    INVALID_PATH = 402
    ACCESS_REFUSED = 403
    NOT_FOUND = 404
    RESOURCE_LOCKED = 405
    PRECONDITION_FAILED = 406
    FRAME_ERROR = 501
    SYNTAX_ERROR = 502
    COMMAND_INVALID = 503
    CHANNEL_ERROR = 504
    UNEXPECTED_FRAME = 505
    RESOURCE_ERROR = 506
    NOT_ALLOWED = 530
    NOT_IMPLEMENTED = 540
    INTERNAL_ERROR = 541


class AMQPError(Exception):
    """Base of every error that becomes a `channel.close` or `connection.close`.

    `method` is the (class_id, method_id) of the method that caused the error, sent back in
    the close frame so clients can tell which call failed; (0, 0) when no method did.
    """

    reply_code: ClassVar[ReplyCode]
    closes_connection: ClassVar[bool]

    def __init__(self, text: str, method: tuple[int, int] = (0, 0)) -> None:
        super().__init__(text)
        self.text = text
        self.method = method

    @property
    def reply_text(self) -> str:
        # AMQP shortstr: at most 255 bytes on the wire.
        full = f"{self.reply_code.name} - {self.text}"
        return full.encode("utf-8")[:255].decode("utf-8", "ignore")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reply_text!r})"


class ChannelLevelError(AMQPError):
    """The peer did something wrong on one channel; only that channel closes."""

    closes_connection = False


class ConnectionLevelError(AMQPError):
    """The peer broke the protocol or the connection cannot go on; the connection closes."""

    closes_connection = True


class ContentTooLarge(ChannelLevelError):
    reply_code = ReplyCode.CONTENT_TOO_LARGE


class AccessRefused(ChannelLevelError):
    reply_code = ReplyCode.ACCESS_REFUSED


class NotFound(ChannelLevelError):
    reply_code = ReplyCode.NOT_FOUND


class ResourceLocked(ChannelLevelError):
    reply_code = ReplyCode.RESOURCE_LOCKED


class PreconditionFailed(ChannelLevelError):
    reply_code = ReplyCode.PRECONDITION_FAILED


class ConnectionForced(ConnectionLevelError):
    reply_code = ReplyCode.CONNECTION_FORCED


class InvalidPath(ConnectionLevelError):
    reply_code = ReplyCode.INVALID_PATH


class FrameError(ConnectionLevelError):
    reply_code = ReplyCode.FRAME_ERROR


class AMQPSyntaxError(ConnectionLevelError):
    reply_code = ReplyCode.SYNTAX_ERROR


class CommandInvalid(ConnectionLevelError):
    reply_code = ReplyCode.COMMAND_INVALID


class ChannelStateError(ConnectionLevelError):
    """504 CHANNEL_ERROR: a frame for a channel that is not open, or a second channel.open."""

    reply_code = ReplyCode.CHANNEL_ERROR


class UnexpectedFrame(ConnectionLevelError):
    reply_code = ReplyCode.UNEXPECTED_FRAME


class ResourceError(ConnectionLevelError):
    reply_code = ReplyCode.RESOURCE_ERROR


class NotAllowed(ConnectionLevelError):
    reply_code = ReplyCode.NOT_ALLOWED


class NotImplementedMethod(ConnectionLevelError):
    reply_code = ReplyCode.NOT_IMPLEMENTED


class InternalError(ConnectionLevelError):
    """Our fault, not the peer's: a bug or an unavailable backend (ZooKeeper, Pulsar)."""

    reply_code = ReplyCode.INTERNAL_ERROR


class ConnectionAccessRefused(ConnectionLevelError):
    """403 at connection level: authentication failed at start-ok."""

    reply_code = ReplyCode.ACCESS_REFUSED
