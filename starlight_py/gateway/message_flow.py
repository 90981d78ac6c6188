"""basic.*, confirm.*, tx.* and channel.flow for one connection: a table from method class to
handler, each handing the method to the channel's message core (core/channel.py) and the
Pulsar side (publishing, consuming), then carrying out what the core asked for."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import trio
from pamqp import commands

from starlight_py.amqp import hot_frames
from starlight_py.amqp.errors import NotImplementedMethod
from starlight_py.amqp.events import ContentReceived
from starlight_py.amqp.framing import method_ids
from starlight_py.amqp.method_ids import BASIC_CONSUME, BASIC_GET
from starlight_py.amqp.transactions import BufferedPublish
from starlight_py.core.channel import Tally
from starlight_py.gateway import transactions
from starlight_py.gateway.channel_session import ChannelSession
from starlight_py.gateway.consume.consuming import Consumers, new_consumer_tag
from starlight_py.gateway.dead_lettering import DeadLetters
from starlight_py.gateway.publish.publishing import Publisher
from starlight_py.gateway.topology_methods import VhostContext, resolve_queue_name
from starlight_py.model.permissions import Access
from starlight_py.model.text import as_text
from starlight_py.ops.metrics import ProxyMetrics

Handler = Callable[["MessageFlow", ChannelSession, Any], Awaitable[None] | None]


class MessageFlow:
    def __init__(
        self,
        ctx: VhostContext,
        publisher: Publisher,
        consumers: Consumers,
        dead_letters: DeadLetters,
        metrics: ProxyMetrics,
        tally: Tally,
    ) -> None:
        self.ctx = ctx
        self.publisher = publisher
        self.consumers = consumers
        self.dead_letters = dead_letters
        self.metrics = metrics
        self.tally = tally

    def handler(self, method: object) -> Handler | None:
        """The handler of a message-flow method; None when `method` is not one."""
        return _HANDLERS.get(type(method))

    # ---- publish --------------------------------------------------------------------------

    async def publish(self, session: ChannelSession, event: ContentReceived) -> None:
        """Raises what Publisher.admit raises (and PreconditionFailed past a transaction's
        limit)."""
        core = session.core
        if core.in_transaction:
            await self.publisher.admit(event.method, event.properties)
            core.tx_publish(
                BufferedPublish(event.method, event.properties, event.body, event.raw_properties)
            )
            return
        if not self.publisher.publish_now(
            core, event.method, event.properties, event.body, event.raw_properties
        ):
            await self.publisher.publish(
                core,
                event.method,
                event.properties,
                event.body,
                event.raw_properties,
                session.number,
            )

    def settle_now(self, session: ChannelSession, method: object) -> bool:
        """basic.ack / nack / reject, which never await: False for any other method."""
        settle = _SETTLING.get(type(method))
        if settle is None:
            return False
        settle(self, session, method)
        return True

    def end_of_batch(self) -> None:
        """Everything one socket read carried is handled: flush the producers, publish the
        metrics counted meanwhile."""
        self.publisher.flush()
        self.publish_tally()

    def publish_tally(self) -> None:
        tally = self.tally
        if tally.delivered:
            self.metrics.delivered(
                self.ctx.vhost, tally.delivered, tally.delivered_bytes, tally.redelivered
            )
            tally.delivered = tally.delivered_bytes = tally.redelivered = 0

    # ---- settling -------------------------------------------------------------------------

    def _ack(self, session: ChannelSession, method: hot_frames.Ack) -> None:
        session.core.ack(method.delivery_tag, method.multiple)
        self._execute(session)

    def _nack(self, session: ChannelSession, method: hot_frames.Nack) -> None:
        session.core.nack(method.delivery_tag, method.multiple, method.requeue)
        self._execute(session)

    def _reject(self, session: ChannelSession, method: hot_frames.Reject) -> None:
        session.core.reject(method.delivery_tag, method.requeue)
        self._execute(session)

    def _recover(
        self, session: ChannelSession, method: commands.Basic.Recover | commands.Basic.RecoverAsync
    ) -> None:
        session.core.recover(bool(method.requeue), method_ids(method))
        self._execute(session)

    def _execute(self, session: ChannelSession) -> None:
        commands_ = session.core.take_commands()
        if commands_:
            self.consumers.execute(session, commands_)

    # ---- consuming ------------------------------------------------------------------------

    def _qos(self, session: ChannelSession, method: commands.Basic.Qos) -> None:
        if method.prefetch_size:
            # As RabbitMQ: byte-based prefetch is not supported.
            raise NotImplementedMethod(
                f"prefetch_size!=0 ({method.prefetch_size})", method_ids(method)
            )
        session.core.qos(method.prefetch_count, bool(method.global_))
        self._execute(session)

    async def _consume(self, session: ChannelSession, method: commands.Basic.Consume) -> None:
        queue = resolve_queue_name(self.ctx, session, as_text(method.queue or ""), BASIC_CONSUME)
        await self.ctx.access.check_queue(Access.READ, queue, BASIC_CONSUME)
        await self.consumers.consume(
            session,
            queue,
            new_consumer_tag(method.consumer_tag),
            bool(method.no_ack),
            bool(method.exclusive),
            bool(method.nowait),
            method.arguments,
        )

    async def _cancel(self, session: ChannelSession, method: commands.Basic.Cancel) -> None:
        tag = as_text(method.consumer_tag or "")
        await self.consumers.cancel(session, tag)
        if not method.nowait:
            session.core.write_method(commands.Basic.CancelOk(tag))

    async def _get(self, session: ChannelSession, method: commands.Basic.Get) -> None:
        queue = resolve_queue_name(self.ctx, session, as_text(method.queue or ""), BASIC_GET)
        await self.ctx.access.check_queue(Access.READ, queue, BASIC_GET)
        await self._published(session)
        await self.consumers.get(session, queue, bool(method.no_ack))

    async def _published(self, session: ChannelSession) -> None:
        """Wait until Pulsar has stored what this channel published before (RabbitMQ keeps
        a channel's commands in order: a get after a publish sees the message)."""
        core = session.core
        if not core.publishing:
            return
        self.publisher.flush()  # those of this very socket read too
        done = trio.Event()
        core.when_published = done.set
        await done.wait()

    # ---- modes ----------------------------------------------------------------------------

    def _confirm_select(self, session: ChannelSession, method: commands.Confirm.Select) -> None:
        session.core.confirm_select(bool(method.nowait))

    def _flow(self, session: ChannelSession, method: commands.Channel.Flow) -> None:
        # RabbitMQ answers flow(active=true) and refuses to stop delivery this way.
        if not method.active:
            raise NotImplementedMethod("active=false", method_ids(method))
        session.core.write_method(commands.Channel.FlowOk(active=True))

    def _tx_select(self, session: ChannelSession, method: commands.Tx.Select) -> None:
        session.core.tx_select()

    async def _tx_commit(self, session: ChannelSession, method: commands.Tx.Commit) -> None:
        await transactions.commit(session, self.publisher)
        self._execute(session)

    def _tx_rollback(self, session: ChannelSession, method: commands.Tx.Rollback) -> None:
        session.core.tx_rollback()

    # ---- the end --------------------------------------------------------------------------

    async def channel_closed(self, session: ChannelSession) -> None:
        await self.consumers.close_channel(session)

    async def close(self, sessions: Iterable[ChannelSession]) -> None:
        self.publisher.close()
        await self.consumers.close_all(sessions)
        self.dead_letters.close()


_SETTLING: dict[type, Callable[[MessageFlow, ChannelSession, Any], None]] = {
    hot_frames.Ack: MessageFlow._ack,
    hot_frames.Nack: MessageFlow._nack,
    hot_frames.Reject: MessageFlow._reject,
}
_HANDLERS: dict[type, Handler] = {
    hot_frames.Ack: MessageFlow._ack,
    hot_frames.Nack: MessageFlow._nack,
    hot_frames.Reject: MessageFlow._reject,
    commands.Basic.Recover: MessageFlow._recover,
    # Deprecated in 0-9-1 and still accepted by RabbitMQ: basic.recover without recover-ok.
    commands.Basic.RecoverAsync: MessageFlow._recover,
    commands.Basic.Qos: MessageFlow._qos,
    commands.Basic.Consume: MessageFlow._consume,
    commands.Basic.Cancel: MessageFlow._cancel,
    commands.Basic.Get: MessageFlow._get,
    commands.Confirm.Select: MessageFlow._confirm_select,
    commands.Channel.Flow: MessageFlow._flow,
    commands.Tx.Select: MessageFlow._tx_select,
    commands.Tx.Commit: MessageFlow._tx_commit,
    commands.Tx.Rollback: MessageFlow._tx_rollback,
}
