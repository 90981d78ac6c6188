"""AMQP transactions (tx.select / commit / rollback) on one channel, as RabbitMQ does them. Pure.

Theory of operation: tx.select makes a channel transactional for the rest of its life (a
second select is a no-op; there is no way back, and confirm mode and tx mode exclude each
other). On a transactional channel:

- basic.publish is checked at once (exchange, permissions: errors close the channel then)
  but only buffered; tx.commit sends the buffered publishes in order, tx.rollback drops them.
- basic.ack / nack / reject are checked at once against the channel's unacked deliveries
  (an unknown tag, or a tag already settled in this transaction, is 406 at once) and
  recorded; the messages stay unacked (and keep counting against prefetch) until commit
  applies the settlements in order. Rollback forgets them: the messages are unacked again,
  to be acked later or requeued when the channel closes. Rollback never requeues.
- consuming and basic.get are not transactional: deliveries happen as usual.

The buffer is bounded (`TransactionLimit`): a transaction's publishes are held in the
proxy's memory until commit, unlike RabbitMQ, which hands them to its queues at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pamqp import commands

from starlight_py.amqp.errors import PreconditionFailed
from starlight_py.amqp.hot_frames import Publish
from starlight_py.amqp.method_ids import (
    BASIC_PUBLISH,
)

# Each buffered publish also costs its frame objects: charged to the limit as this much.
PUBLISH_OVERHEAD = 256
# The limit of one connection's buffered publishes, in units of amqpMaxMessageSize.
TRANSACTION_SIZE_IN_MESSAGES = 16
# ... and at most this many bytes (what 16 messages of the 4 MiB limit of old came to).
TRANSACTION_BUFFER_CAP = 64 * 1024 * 1024


@dataclass(frozen=True)
class BufferedPublish:
    method: Publish
    properties: commands.Basic.Properties
    body: bytes
    raw_properties: bytes

    @property
    def size(self) -> int:
        """What it counts against the transaction limit."""
        return len(self.body) + len(self.raw_properties) + PUBLISH_OVERHEAD


@dataclass(frozen=True)
class BufferedSettlement:
    """An ack (`requeue` None), or a nack/reject with its requeue flag, of the delivery
    tags it covered when it was received (`multiple` resolved then, as RabbitMQ does)."""

    tags: tuple[int, ...]
    requeue: bool | None
    method: tuple[int, int]


@dataclass(frozen=True)
class TransactionLimit:
    """Most bytes (`BufferedPublish.size`) the transactions of one connection may buffer."""

    max_bytes: int

    @classmethod
    def for_message_size(cls, max_message_size: int) -> TransactionLimit:
        """TRANSACTION_SIZE_IN_MESSAGES messages of the largest size, up to
        TRANSACTION_BUFFER_CAP (but always room for one of the largest messages)."""
        room = TRANSACTION_SIZE_IN_MESSAGES * max_message_size
        return cls(min(room, max(TRANSACTION_BUFFER_CAP, max_message_size + PUBLISH_OVERHEAD)))


@dataclass
class ChannelTransaction:
    """What one transactional channel has buffered since its last commit or rollback."""

    publishes: list[BufferedPublish] = field(default_factory=list)
    settlements: list[BufferedSettlement] = field(default_factory=list)
    settled_tags: set[int] = field(default_factory=set)
    size: int = 0

    def add_publish(
        self, publish: BufferedPublish, limit: TransactionLimit, elsewhere: int
    ) -> None:
        """Buffer a publish; `elsewhere` is what the connection's other transactions hold.
        Raises PreconditionFailed when the connection's buffered publishes would exceed the
        limit (the channel closes; its transaction is lost)."""
        if elsewhere + self.size + publish.size > limit.max_bytes:
            raise PreconditionFailed(
                f"transaction too large: the publishes buffered by this connection's "
                f"transactions would exceed {limit.max_bytes} bytes "
                f"({TRANSACTION_SIZE_IN_MESSAGES} x amqpMaxMessageSize); commit more often",
                BASIC_PUBLISH,
            )
        self.publishes.append(publish)
        self.size += publish.size

    def add_settlement(
        self,
        unacked: Iterable[int],
        tag: int,
        multiple: bool,
        requeue: bool | None,
        method: tuple[int, int],
    ) -> None:
        """Record an ack/nack/reject of `tag` given the channel's unacked delivery tags.
        Raises PreconditionFailed for an unknown tag or one already settled in this
        transaction (the same rules, and text, as outside a transaction)."""
        open_tags = [t for t in unacked if t not in self.settled_tags]
        if multiple:
            tags = [t for t in open_tags if tag == 0 or t <= tag]
            if tag != 0 and not tags and tag not in open_tags:
                raise PreconditionFailed(f"unknown delivery tag {tag}", method)
        else:
            if tag not in open_tags:
                raise PreconditionFailed(f"unknown delivery tag {tag}", method)
            tags = [tag]
        if not tags:
            return  # ack 0 with multiple and nothing outstanding: fine, nothing to do
        self.settled_tags.update(tags)
        self.settlements.append(BufferedSettlement(tuple(sorted(tags)), requeue, method))

    def take(self) -> tuple[list[BufferedPublish], list[BufferedSettlement]]:
        """What a commit carries out; the transaction starts afresh."""
        publishes, settlements = self.publishes, self.settlements
        self.discard()
        return publishes, settlements

    def discard(self) -> None:
        """tx.rollback: forget every buffered publish and settlement."""
        self.publishes = []
        self.settlements = []
        self.settled_tags = set()
        self.size = 0
