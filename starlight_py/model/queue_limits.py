"""Queue length limits, as RabbitMQ defines them (pure).

Theory of operation: a queue's `x-max-length` / `x-max-length-bytes` arguments give it a
`LengthLimit`; `x-overflow` says what happens when a publish would take the queue past it.
`reject-publish` (and `reject-publish-dlx`) refuse the new message: RabbitMQ checks whether
the queue *with* the message would be over the limit (`will_overflow`), and so does
`LengthLimit.refuses`. `drop-head` (the default) takes the message and drops the oldest
ready messages until the queue is within the limit again (`LengthLimit.excess`). Only ready
messages count, not delivered-unacked ones. The depth (`QueueDepth`) comes from Pulsar's
subscription stats plus what this proxy published since it read them: how exact that is, is
in docs/mapping.md. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlight_py.model.streams import is_stream

DROP_HEAD = "drop-head"
REJECT_PUBLISH = "reject-publish"
REJECT_PUBLISH_DLX = "reject-publish-dlx"
MAX_LENGTH = "maxlen"  # the x-death reason of a message dropped from the head


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """Ready messages of a queue and their size in bytes."""

    messages: int = 0
    bytes: int = 0

    def plus(self, messages: int, size: int) -> QueueDepth:
        return QueueDepth(self.messages + messages, self.bytes + size)


def _limit(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


@dataclass(frozen=True, slots=True)
class LengthLimit:
    """What a queue's `x-max-length`, `x-max-length-bytes` and `x-overflow` say."""

    max_length: int | None
    max_bytes: int | None
    overflow: str = DROP_HEAD

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> LengthLimit | None:
        """The limit of validated queue arguments; None for a queue without one (a stream's
        x-max-length-bytes is its retention, not a limit on ready messages)."""
        if is_stream(arguments):
            return None
        max_length = _limit(arguments.get("x-max-length"))
        max_bytes = _limit(arguments.get("x-max-length-bytes"))
        if max_length is None and max_bytes is None:
            return None
        overflow = arguments.get("x-overflow", DROP_HEAD)
        if isinstance(overflow, bytes):
            overflow = overflow.decode("utf-8", "replace")
        if overflow not in (DROP_HEAD, REJECT_PUBLISH, REJECT_PUBLISH_DLX):
            overflow = DROP_HEAD
        return cls(max_length, max_bytes, overflow)

    @property
    def rejects_publishes(self) -> bool:
        return self.overflow in (REJECT_PUBLISH, REJECT_PUBLISH_DLX)

    def refuses(self, depth: QueueDepth, size: int) -> bool:
        """Whether a queue at `depth` refuses a new message of `size` body bytes (only for
        the reject overflows; drop-head never refuses)."""
        if not self.rejects_publishes:
            return False
        if self.max_length is not None and depth.messages + 1 > self.max_length:
            return True
        return self.max_bytes is not None and depth.bytes + size > self.max_bytes

    def excess(self, depth: QueueDepth, average_size: float) -> int:
        """How many of the oldest messages drop-head drops from a queue at `depth` (the
        byte limit reckoned with the queue's average message size)."""
        if self.overflow != DROP_HEAD:
            return 0
        over = 0
        if self.max_length is not None:
            over = max(over, depth.messages - self.max_length)
        if self.max_bytes is not None and depth.bytes > self.max_bytes:
            size = max(1.0, average_size)
            over = max(over, min(depth.messages, -int(-(depth.bytes - self.max_bytes) // size)))
        return over
