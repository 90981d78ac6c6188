"""exchange.* and queue.* methods: AMQP arguments in, TopologyService calls (in a worker
thread), AMQP replies out. RabbitMQ's name rules and reply texts come from model.topology."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio
from pamqp import commands
from pamqp.base import Frame as PamqpMethod

from starlight_py.amqp.errors import AccessRefused, NotFound
from starlight_py.amqp.field_codec import unvalidated
from starlight_py.amqp.method_ids import (
    EXCHANGE_BIND,
    EXCHANGE_DECLARE,
    EXCHANGE_DELETE,
    EXCHANGE_UNBIND,
    QUEUE_BIND,
    QUEUE_DECLARE,
    QUEUE_DELETE,
    QUEUE_PURGE,
    QUEUE_UNBIND,
)
from starlight_py.gateway.channel_session import ChannelSession
from starlight_py.gateway.connection.authorization import ALLOW_ALL, AccessControl
from starlight_py.gateway.publish.message_copies import has_own_topics
from starlight_py.metadata.cache import TopologyCache
from starlight_py.metadata.records import BindingSet, ExchangeBinding
from starlight_py.metadata.routing_barrier import RoutingBarrier
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.permissions import Access
from starlight_py.model.streams import is_stream, server_named_refused
from starlight_py.model.text import as_text
from starlight_py.model.topology import (
    DEFAULT_EXCHANGE,
    Exchange,
    Queue,
    check_exchange_deletable,
    check_exchange_type,
    check_not_default_exchange,
    check_queue_name_declarable,
)
from starlight_py.topology.service import TopologyService, server_named_queue

T = TypeVar("T")
CACHE_WAIT = 2.0  # seconds
Reply = Callable[[PamqpMethod], None]


@dataclass
class VhostContext:
    """What one open connection knows about its vhost and itself."""

    vhost: str
    namespace: NamespaceName
    owner: str  # "proxy-id/connection-id", the owner of exclusive queues
    user: str = ""  # the authenticated principal (basic.publish checks user_id against it)
    exclusive_queues: set[str] = field(default_factory=set)
    # The user's permissions in the vhost (ALLOW_ALL when authentication is disabled).
    access: AccessControl = ALLOW_ALL


def resolve_queue_name(
    ctx: VhostContext, session: ChannelSession, name: str, method: tuple[int, int]
) -> str:
    """AMQP: an empty queue name means the last queue declared on this channel."""
    if name:
        return name
    if session.last_queue is None:
        raise NotFound(f"no previously declared queue in vhost '{ctx.vhost}'", method)
    return session.last_queue


class TopologyMethods:
    def __init__(
        self,
        service: TopologyService,
        flush_publishes: Callable[[], None] = lambda: None,
        cache: TopologyCache | None = None,
        barrier: RoutingBarrier | None = None,
    ) -> None:
        self.service = service
        # Binding changes of topic and headers exchanges wait until the other proxies
        # route by them too (metadata/routing_barrier.py).
        self.barrier = barrier
        # Before an unbind or a delete: publishes made before it must be written first.
        self.flush_publishes = flush_publishes
        # Publishes follow exchange-to-exchange bindings by this cache: (un)bind-ok waits
        # until it shows the change, so this proxy's next publish sees it.
        self.cache = cache
        # Waits for a drop-head trim of the queue running on this proxy (QueueLengths).
        self.trimmed: Callable[[str, str], Awaitable[None]] | None = None
        # A queue (vhost, name) was deleted here: this proxy's consumers of it are cancelled,
        # but for those of the channel given (None: all of them).
        self.queue_deleted: Callable[[str, str, ChannelSession | None], None] | None = None

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(call, *args)

    async def handle(
        self, ctx: VhostContext, session: ChannelSession, method: object, reply: Reply
    ) -> bool:
        """Carry out `method` if it is a topology method; False when it is not one."""
        handler = _HANDLERS.get(type(method))
        if handler is None:
            return False
        await handler(self, ctx, session, method, reply)
        return True

    async def _queue_purge(
        self,
        ctx: VhostContext,
        session: ChannelSession,
        method: commands.Queue.Purge,
        reply: Reply,
    ) -> None:
        name = self._queue_name(ctx, session, as_text(method.queue or ""), QUEUE_PURGE)
        await ctx.access.check_queue(Access.READ, name, QUEUE_PURGE)
        count = await self._run(self.service.purge_queue, ctx.vhost, ctx.namespace, name, ctx.owner)
        if not method.nowait:
            reply(commands.Queue.PurgeOk(count))

    async def _exchange_declare(
        self,
        ctx: VhostContext,
        session: ChannelSession,
        method: commands.Exchange.Declare,
        reply: Reply,
    ) -> None:
        name = as_text(method.exchange or "")
        check_not_default_exchange(name, EXCHANGE_DECLARE)
        if not method.passive:
            await ctx.access.check_exchange(Access.CONFIGURE, name, EXCHANGE_DECLARE)
            await self._check_argument_exchange(ctx, method.arguments, name, EXCHANGE_DECLARE)
            check_exchange_type(as_text(method.exchange_type or ""))
        wanted = Exchange(
            name,
            as_text(method.exchange_type or ""),
            bool(method.durable),
            bool(method.auto_delete),
            bool(method.internal),
            dict(method.arguments or {}),
        )
        await self._run(self.service.declare_exchange, ctx.vhost, wanted, bool(method.passive))
        if not method.nowait:
            reply(commands.Exchange.DeclareOk())

    async def _exchange_delete(
        self,
        ctx: VhostContext,
        session: ChannelSession,
        method: commands.Exchange.Delete,
        reply: Reply,
    ) -> None:
        name = as_text(method.exchange or "")
        check_exchange_deletable(name, ctx.vhost)
        await ctx.access.check_exchange(Access.CONFIGURE, name, EXCHANGE_DELETE)
        await self._run(self.flush_publishes)
        await self._run(self.service.delete_exchange, ctx.vhost, name, bool(method.if_unused))
        if not method.nowait:
            reply(commands.Exchange.DeleteOk())

    async def _check_argument_exchange(
        self, ctx: VhostContext, arguments: Any, name: str, method: tuple[int, int]
    ) -> None:
        """RabbitMQ: declaring a queue with a dead-letter exchange, or an exchange with an
        alternate exchange, also needs read on what is declared and write on that exchange
        (a way to publish to it)."""
        table = dict(arguments or {})
        is_queue = method[0] == 50
        key = "x-dead-letter-exchange" if is_queue else "alternate-exchange"
        target = table.get(key)
        if not isinstance(target, str | bytes) or not ctx.access.enforced:
            return  # absent, or the wrong type, which the declare itself refuses
        if is_queue:
            await ctx.access.check_queue(Access.READ, name, method)
        else:
            await ctx.access.check_exchange(Access.READ, name, method)
        await ctx.access.check_exchange(Access.WRITE, as_text(target or ""), method)

    def _queue_name(
        self, ctx: VhostContext, session: ChannelSession, name: str, method: tuple[int, int]
    ) -> str:
        return resolve_queue_name(ctx, session, name, method)

    async def _queue_declare(
        self,
        ctx: VhostContext,
        session: ChannelSession,
        method: commands.Queue.Declare,
        reply: Reply,
    ) -> None:
        name = as_text(method.queue or "")
        passive = bool(method.passive)
        arguments = dict(method.arguments or {})
        if passive:
            name = self._queue_name(ctx, session, name, QUEUE_DECLARE)
        elif not name:
            if is_stream(arguments):
                raise server_named_refused()
            name = server_named_queue()
        else:
            check_queue_name_declarable(name)
        if not passive:
            await ctx.access.check_queue(Access.CONFIGURE, name, QUEUE_DECLARE)
            await self._check_argument_exchange(ctx, arguments, name, QUEUE_DECLARE)
        exclusive = bool(method.exclusive)
        wanted = Queue(
            name,
            bool(method.durable),
            exclusive,
            bool(method.auto_delete),
            arguments,
            owner=ctx.owner if exclusive else None,
        )
        if self.trimmed is not None:
            await self.trimmed(ctx.vhost, name)
        counts = await self._run(
            self.service.declare_queue, ctx.vhost, ctx.namespace, wanted, passive, ctx.owner
        )
        if exclusive and not passive:
            ctx.exclusive_queues.add(name)
        session.last_queue = name
        if not method.nowait:
            reply(
                unvalidated(
                    commands.Queue.DeclareOk,
                    queue=name,
                    message_count=counts.message_count,
                    consumer_count=counts.consumer_count,
                )
            )

    async def _queue_delete(
        self,
        ctx: VhostContext,
        session: ChannelSession,
        method: commands.Queue.Delete,
        reply: Reply,
    ) -> None:
        name = self._queue_name(ctx, session, as_text(method.queue or ""), QUEUE_DELETE)
        await ctx.access.check_queue(Access.CONFIGURE, name, QUEUE_DELETE)
        session.deleting.add(name)
        cache = self.cache
        default_topic = naming.exchange_topic(ctx.namespace, "", "direct", name).local
        made = None if cache is None else cache.binding_set(ctx.vhost, name, default_topic)
        try:
            count = await self._run(
                self.service.delete_queue,
                ctx.vhost,
                ctx.namespace,
                name,
                bool(method.if_unused),
                bool(method.if_empty),
                ctx.owner,
            )
            ctx.exclusive_queues.discard(name)
            # Still marked deleting while the caches catch up: this channel's own
            # consumers hear the cancel after the delete-ok, not from the cache watcher.
            await self._routed_nowhere(ctx.vhost, name, default_topic, made)
        finally:
            session.deleting.discard(name)
        # RabbitMQ's order: the consumers of other channels hear basic.cancel before the
        # delete-ok (their channel processes see the queue go at once), those of the deleting
        # channel after it (that channel answers the delete first). A client waiting for the
        # delete-ok on a channel with a consumer (kombu) would otherwise see the cancel first.
        cancel = self.queue_deleted
        if cancel is not None:
            cancel(ctx.vhost, name, session)
        if not method.nowait:
            reply(commands.Queue.DeleteOk(count))
        if cancel is not None:
            cancel(ctx.vhost, name, None)

    async def _queue_bind(
        self,
        ctx: VhostContext,
        session: ChannelSession,
        method: commands.Queue.Bind,
        reply: Reply,
    ) -> None:
        exchange = as_text(method.exchange or "")
        queue = self._queue_name(ctx, session, as_text(method.queue or ""), QUEUE_BIND)
        # RabbitMQ's order: write on the queue, the default exchange, read on the exchange.
        await ctx.access.check_queue(Access.WRITE, queue, QUEUE_BIND)
        if exchange == DEFAULT_EXCHANGE:
            raise AccessRefused("operation not permitted on the default exchange", QUEUE_BIND)
        await ctx.access.check_exchange(Access.READ, exchange, QUEUE_BIND)
        routing_key, arguments = as_text(method.routing_key or ""), dict(method.arguments or {})
        await self._run(
            self.service.bind,
            ctx.vhost,
            ctx.namespace,
            queue,
            exchange,
            routing_key,
            arguments,
            ctx.owner,
        )
        await self._cache_routes(ctx.vhost, queue, exchange, routing_key, arguments, True)
        if not method.nowait:
            reply(commands.Queue.BindOk())

    async def _queue_unbind(
        self,
        ctx: VhostContext,
        session: ChannelSession,
        method: commands.Queue.Unbind,
        reply: Reply,
    ) -> None:
        exchange = as_text(method.exchange or "")
        queue = self._queue_name(ctx, session, as_text(method.queue or ""), QUEUE_UNBIND)
        await ctx.access.check_queue(Access.WRITE, queue, QUEUE_UNBIND)
        check_not_default_exchange(exchange, QUEUE_UNBIND)
        await ctx.access.check_exchange(Access.READ, exchange, QUEUE_UNBIND)
        await self._run(self.flush_publishes)
        routing_key, arguments = as_text(method.routing_key or ""), dict(method.arguments or {})
        await self._run(
            self.service.unbind,
            ctx.vhost,
            ctx.namespace,
            queue,
            exchange,
            routing_key,
            arguments,
            ctx.owner,
        )
        await self._cache_routes(ctx.vhost, queue, exchange, routing_key, arguments, False)
        reply(commands.Queue.UnbindOk())

    async def _exchange_binding(
        self, ctx: VhostContext, method: commands.Exchange.Bind | commands.Exchange.Unbind
    ) -> tuple[str, str, str, dict[str, Any]]:
        """(destination, source, routing key, arguments) of an exchange.bind or unbind,
        after RabbitMQ's checks in its order: write on the destination, neither may be the
        default exchange, read on the source."""
        ids = EXCHANGE_BIND if isinstance(method, commands.Exchange.Bind) else EXCHANGE_UNBIND
        destination, source = as_text(method.destination or ""), as_text(method.source or "")
        await ctx.access.check_exchange(Access.WRITE, destination, ids)
        if DEFAULT_EXCHANGE in (destination, source):
            raise AccessRefused("operation not permitted on the default exchange", ids)
        await ctx.access.check_exchange(Access.READ, source, ids)
        return destination, source, as_text(method.routing_key or ""), dict(method.arguments or {})

    async def _exchange_bind(
        self,
        ctx: VhostContext,
        session: ChannelSession,
        method: commands.Exchange.Bind,
        reply: Reply,
    ) -> None:
        destination, source, key, arguments = await self._exchange_binding(ctx, method)
        binding = await self._run(
            self.service.exchange_bindings.bind, ctx.vhost, destination, source, key, arguments
        )
        await self._cache_shows(ctx.vhost, binding, True)
        if not method.nowait:
            reply(commands.Exchange.BindOk())

    async def _exchange_unbind(
        self,
        ctx: VhostContext,
        session: ChannelSession,
        method: commands.Exchange.Unbind,
        reply: Reply,
    ) -> None:
        destination, source, key, arguments = await self._exchange_binding(ctx, method)
        await self._run(self.flush_publishes)
        binding = await self._run(
            self.service.exchange_bindings.unbind, ctx.vhost, destination, source, key, arguments
        )
        await self._cache_shows(ctx.vhost, binding, False)
        if not method.nowait:
            reply(commands.Exchange.UnbindOk())

    async def _cache_routes(
        self,
        vhost: str,
        queue: str,
        exchange: str,
        routing_key: str,
        arguments: dict[str, Any],
        present: bool,
    ) -> None:
        """Wait (at most CACHE_WAIT seconds) until this proxy's cache routes by (or no longer
        by) a queue's binding to a topic or headers exchange. Their publishes are written
        only to the topics of the bindings the cache knows, so a publish right after
        bind-ok on this proxy must find the binding there. Other exchanges' messages go
        to topics every binding subscription of them reads anyway."""
        cache = self.cache
        if cache is None:
            return

        def shown() -> bool:
            known = cache.exchange(vhost, exchange)
            if known is None or not has_own_topics(known):
                return True
            bound = any(
                b.exchange == exchange
                and any(e.same_binding(routing_key, arguments) for e in b.active_entries)
                for b in cache.binding_sets_of_queue(vhost, queue)
            )
            return bound == present

        if not shown():
            await self._run(cache.wait_until, shown, CACHE_WAIT)
        known = cache.exchange(vhost, exchange)
        if self.barrier is not None and (known is None or has_own_topics(known)):
            await self._run(self.barrier.routed_everywhere, vhost)

    async def _routed_nowhere(
        self, vhost: str, queue: str, default_topic: str, made: BindingSet | None
    ) -> None:
        """After a queue's delete: wait (at most CACHE_WAIT seconds) until this proxy's
        cache no longer has its default-exchange binding `made`, then until every proxy's
        cache has caught up with the delete (the routing barrier). A queue declared again
        under the name gets its default-exchange subscription from its first publish
        (topology/default_bindings.py); a proxy still routing by the deleted queue's would
        write that publish to the topic without making it, and the new queue would miss
        it. RabbitMQ's promise holds: a message published after the new declare-ok
        reaches the new queue."""
        cache = self.cache
        if cache is None:
            return
        if made is not None:

            def gone() -> bool:
                return cache.binding_set(vhost, queue, default_topic) is not made

            if not gone():
                await self._run(cache.wait_until, gone, CACHE_WAIT)
        if self.barrier is not None:
            await self._run(self.barrier.routed_everywhere, vhost)

    async def _cache_shows(self, vhost: str, binding: ExchangeBinding, present: bool) -> None:
        """Wait (at most CACHE_WAIT seconds) until this proxy's cache has (or no longer has)
        the binding."""
        cache = self.cache
        if cache is None:
            return

        def shown() -> bool:
            name = binding.entry_name
            bindings = cache.exchange_bindings_from(vhost, binding.source)
            return any(b.entry_name == name for b in bindings) == present

        if not shown():
            await self._run(cache.wait_until, shown, CACHE_WAIT)

    async def release_connection(self, ctx: VhostContext) -> None:
        """The connection closed: its exclusive queues go with it."""
        try:
            for name in sorted(ctx.exclusive_queues):
                await self._run(
                    self.service.delete_queue,
                    ctx.vhost,
                    ctx.namespace,
                    name,
                    False,
                    False,
                    ctx.owner,
                )
                ctx.exclusive_queues.discard(name)
        finally:
            # What could not be deleted (ZooKeeper or Pulsar down) loses its owner znode,
            # so the SubscriptionCleaner deletes it later.
            for name in sorted(ctx.exclusive_queues):
                with contextlib.suppress(Exception):
                    await self._run(self.service.consumers.release_owner, ctx.vhost, name)
            ctx.exclusive_queues.clear()


_HANDLERS: dict[type, Callable[..., Awaitable[None]]] = {
    commands.Exchange.Declare: TopologyMethods._exchange_declare,
    commands.Exchange.Delete: TopologyMethods._exchange_delete,
    commands.Exchange.Bind: TopologyMethods._exchange_bind,
    commands.Exchange.Unbind: TopologyMethods._exchange_unbind,
    commands.Queue.Declare: TopologyMethods._queue_declare,
    commands.Queue.Delete: TopologyMethods._queue_delete,
    commands.Queue.Bind: TopologyMethods._queue_bind,
    commands.Queue.Unbind: TopologyMethods._queue_unbind,
    commands.Queue.Purge: TopologyMethods._queue_purge,
}
