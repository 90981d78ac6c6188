"""basic.*, confirm.select, tx.* and channel.flow: the message-flow methods of one connection,
dispatched to its Publisher, Consumers and Transactions."""

from __future__ import annotations

from pamqp import commands
from pamqp.base import Frame as PamqpMethod

from starlight_py.amqp.connection import AMQPConnection
from starlight_py.amqp.errors import NotImplementedMethod
from starlight_py.amqp.framing import method_ids
from starlight_py.gateway.channel_session import ChannelSession
from starlight_py.gateway.consuming import Consumers
from starlight_py.gateway.publishing import Publisher
from starlight_py.gateway.topology_methods import VhostContext, resolve_queue_name
from starlight_py.gateway.transactions import Transactions
from starlight_py.model.permissions import Access


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


class MessageMethods:
    def __init__(
        self,
        conn: AMQPConnection,
        ctx: VhostContext,
        publisher: Publisher,
        consumers: Consumers,
    ) -> None:
        self.conn = conn
        self.ctx = ctx
        self.publisher = publisher
        self.consumers = consumers
        self.transactions = Transactions(conn, publisher, consumers)

    async def handle(self, session: ChannelSession, method: PamqpMethod) -> bool:
        """Carry out a message-flow method; False when `method` is not one."""
        number = session.number
        if await self.transactions.handle(session, method):
            return True
        if isinstance(method, commands.Basic.Ack):
            self.consumers.ack(number, method.delivery_tag or 0, bool(method.multiple))
        elif isinstance(method, commands.Basic.Nack):
            self.consumers.reject(
                number,
                method.delivery_tag or 0,
                bool(method.multiple),
                bool(method.requeue),
                (60, 120),
            )
        elif isinstance(method, commands.Basic.Reject):
            tag = method.delivery_tag or 0
            self.consumers.reject(number, tag, False, bool(method.requeue), (60, 90))
        elif isinstance(method, commands.Basic.Consume):
            queue = resolve_queue_name(self.ctx, session, _text(method.queue), (60, 20))
            await self.ctx.access.check_queue(Access.READ, queue, (60, 20))
            await self.consumers.consume(number, queue, method)
        elif isinstance(method, commands.Basic.Cancel):
            await self.consumers.cancel(number, _text(method.consumer_tag), bool(method.nowait))
        elif isinstance(method, commands.Basic.Get):
            queue = resolve_queue_name(self.ctx, session, _text(method.queue), (60, 70))
            await self.ctx.access.check_queue(Access.READ, queue, (60, 70))
            await self.consumers.get(number, queue, bool(method.no_ack))
        elif isinstance(method, commands.Basic.Recover):
            if not method.requeue:
                # RabbitMQ: redelivery to the same consumer is not supported either.
                raise NotImplementedMethod("requeue=false", (60, 110))
            self.consumers.recover(number)
            self.conn.send_method(number, commands.Basic.RecoverOk())
        elif isinstance(method, commands.Basic.Qos):
            if method.prefetch_size:
                # As RabbitMQ: byte-based prefetch is not supported.
                raise NotImplementedMethod(
                    f"prefetch_size!=0 ({method.prefetch_size})", method_ids(method)
                )
            self.consumers.qos(number, method.prefetch_count, bool(method.global_))
            self.conn.send_method(number, commands.Basic.QosOk())
        elif isinstance(method, commands.Confirm.Select):
            self.publisher.confirm_select(number)
            if not method.nowait:
                self.conn.send_method(number, commands.Confirm.SelectOk())
        elif isinstance(method, commands.Channel.Flow):
            # RabbitMQ answers flow(active=true) and refuses to stop delivery this way.
            if not method.active:
                raise NotImplementedMethod("active=false", method_ids(method))
            self.conn.send_method(number, commands.Channel.FlowOk(active=True))
        else:
            return False
        return True

    async def publish(
        self,
        session: ChannelSession,
        method: commands.Basic.Publish,
        properties: commands.Basic.Properties,
        body: bytes,
        raw_properties: bytes = b"",
    ) -> None:
        if self.transactions.active(session.number):
            await self.transactions.publish(session, method, properties, body, raw_properties)
            return
        await self.publisher.publish(session, method, properties, body, raw_properties)

    async def channel_closed(self, number: int) -> None:
        self.transactions.channel_closed(number)
        self.publisher.channel_closed(number)
        await self.consumers.close_channel(number)

    async def close(self) -> None:
        self.publisher.close()
        await self.consumers.close_all()
