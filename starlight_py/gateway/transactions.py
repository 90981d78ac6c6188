"""tx.select / tx.commit / tx.rollback for one connection (semantics: amqp/transactions.py).

A commit replays the buffered publishes through the Publisher, in order, exactly as if
they were published now (routing, mandatory returns, alternate exchanges happen then), and
waits until Pulsar has written every one of them. Only then are the buffered acks, nacks
and rejects applied, through the Consumers as if received now, and commit-ok sent: a
consume-transform-publish loop that acks in the same transaction never loses a message to
a failed write. A write that fails closes the channel with 406 "partial tx completion" (as
RabbitMQ does when a queue refuses a transactional publish); the acks of that transaction
are then never applied, so its deliveries are requeued with the channel.

How the commit learns of the writes: the Publisher reports the outcome of every publish on
a channel to that channel's confirm tracker (including messages routed nowhere). Confirm
mode and tx mode exclude each other, so during a commit the channel's tracker slot holds a
`CommitWrites`, which collects the outcomes instead of turning them into basic.ack frames.
"""

from __future__ import annotations

import trio
from pamqp import commands
from pamqp.base import Frame as PamqpMethod

from starlight_py.amqp.confirms import ConfirmTracker
from starlight_py.amqp.connection import AMQPConnection
from starlight_py.amqp.errors import PreconditionFailed
from starlight_py.amqp.transactions import (
    CONFIRM_SELECT,
    TX_COMMIT,
    TX_ROLLBACK,
    TX_SELECT,
    BufferedPublish,
    BufferedSettlement,
    ChannelTransaction,
    TransactionLimit,
)
from starlight_py.gateway.channel_session import ChannelSession
from starlight_py.gateway.consuming import Consumers
from starlight_py.gateway.publishing import Publisher


class CommitWrites(ConfirmTracker):
    """The outcomes of one commit's publishes; `written` is set once every publish handed
    over (`all_handed`) has one."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = 0
        self.handed_all = False
        self.written = trio.Event()

    def complete(self, seq: int, ok: bool) -> list[PamqpMethod]:
        super().complete(seq, ok)
        if not ok:
            self.failed += 1
        self._check()
        return []  # nothing goes to the client: it is waiting for commit-ok

    def all_handed(self) -> None:
        self.handed_all = True
        self._check()

    def _check(self) -> None:
        if self.handed_all and self.outstanding == 0:
            self.written.set()


class Transactions:
    """The transactional channels of one connection and their buffers."""

    def __init__(self, conn: AMQPConnection, publisher: Publisher, consumers: Consumers) -> None:
        self.conn = conn
        self.publisher = publisher
        self.consumers = consumers
        self.limit = TransactionLimit.for_message_size(conn.settings.max_message_size)
        self._open: dict[int, ChannelTransaction] = {}

    def active(self, channel: int) -> bool:
        return channel in self._open

    async def handle(self, session: ChannelSession, method: PamqpMethod) -> bool:
        """tx.*, and what a transaction changes (acks, confirm.select, basic.recover);
        False when `method` is none of those or the channel is not transactional. Raises
        PreconditionFailed (mode conflicts, unknown tags, commit/rollback outside a
        transaction, a failed commit)."""
        number = session.number
        if isinstance(method, commands.Tx.Select):
            if number in self.publisher.confirms:
                raise PreconditionFailed("cannot switch from confirm to tx mode", TX_SELECT)
            self._open.setdefault(number, ChannelTransaction())
            self.conn.send_method(number, commands.Tx.SelectOk())
            return True
        if isinstance(method, commands.Tx.Commit | commands.Tx.Rollback):
            ids = TX_COMMIT if isinstance(method, commands.Tx.Commit) else TX_ROLLBACK
            transaction = self._open.get(number)
            if transaction is None:
                raise PreconditionFailed("channel is not transactional", ids)
            if isinstance(method, commands.Tx.Commit):
                await self._commit(session, transaction)
                self.conn.send_method(number, commands.Tx.CommitOk())
            else:
                transaction.discard()
                self.conn.send_method(number, commands.Tx.RollbackOk())
            return True
        transaction = self._open.get(number)
        if transaction is None:
            return False
        if isinstance(method, commands.Confirm.Select):
            raise PreconditionFailed("cannot switch from tx to confirm mode", CONFIRM_SELECT)
        unacked = self.consumers.channel(number).unacked
        if isinstance(method, commands.Basic.Ack):
            tag, multiple = method.delivery_tag or 0, bool(method.multiple)
            transaction.add_settlement(unacked, tag, multiple, None, (60, 80))
        elif isinstance(method, commands.Basic.Nack):
            tag, multiple = method.delivery_tag or 0, bool(method.multiple)
            transaction.add_settlement(unacked, tag, multiple, bool(method.requeue), (60, 120))
        elif isinstance(method, commands.Basic.Reject):
            tag = method.delivery_tag or 0
            transaction.add_settlement(unacked, tag, False, bool(method.requeue), (60, 90))
        elif isinstance(method, commands.Basic.Recover) and method.requeue:
            # Requeues what is unacked, but not what this transaction already settled (it is
            # out of the unacked set until a rollback, as in RabbitMQ).
            for tag in [t for t in unacked if t not in transaction.settled_tags]:
                self.consumers.reject(number, tag, False, True, (60, 110))
            self.conn.send_method(number, commands.Basic.RecoverOk())
        else:
            return False
        return True

    async def publish(
        self,
        session: ChannelSession,
        method: commands.Basic.Publish,
        properties: commands.Basic.Properties,
        body: bytes,
        raw_properties: bytes,
    ) -> None:
        """Check a publish now and buffer it until commit. Raises what Publisher.admit
        raises, and PreconditionFailed past the connection's transaction limit."""
        transaction = self._open[session.number]
        await self.publisher.admit(method, properties)
        elsewhere = sum(t.size for n, t in self._open.items() if n != session.number)
        publish = BufferedPublish(method, properties, body, raw_properties)
        transaction.add_publish(publish, self.limit, elsewhere)

    async def _commit(self, session: ChannelSession, transaction: ChannelTransaction) -> None:
        number = session.number
        publishes, settlements = transaction.take()
        if publishes:
            writes = CommitWrites()
            self.publisher.confirms[number] = writes
            try:
                for publish in publishes:
                    await self.publisher.publish(
                        session,
                        publish.method,
                        publish.properties,
                        publish.body,
                        publish.raw_properties,
                    )
                writes.all_handed()
                await writes.written.wait()
            finally:
                if self.publisher.confirms.get(number) is writes:
                    del self.publisher.confirms[number]
            if writes.failed:
                raise PreconditionFailed(
                    f"partial tx completion: Pulsar did not write {writes.failed} of the "
                    f"{len(publishes)} messages published",
                    TX_COMMIT,
                )
        self._settle(number, settlements)

    def _settle(self, number: int, settlements: list[BufferedSettlement]) -> None:
        unacked = self.consumers.channel(number).unacked
        for settlement in settlements:
            for tag in settlement.tags:
                if tag not in unacked:
                    # Nothing else settles a tag this transaction holds (recover leaves
                    # them alone); should one be gone, the rest of the commit still counts.
                    continue
                if settlement.requeue is None:
                    self.consumers.ack(number, tag, False)
                else:
                    self.consumers.reject(number, tag, False, settlement.requeue, settlement.method)

    def channel_closed(self, channel: int) -> None:
        """The channel's transaction is lost with it (its deliveries are requeued)."""
        self._open.pop(channel, None)
