"""Which Pulsar topics hold the messages of an exchange or a queue, as connector options.

The names come from `naming.exchange_topic` and the metadata the proxies keep in ZooKeeper
(docs/mapping.md), never from a second copy of the rules:

- a fanout exchange is one topic; a topic or headers exchange is its topic and its
  bindings' own topics (a pattern), where a message routed to several queues has one copy
  per queue: rows come from the first copy only;
- a direct exchange (and the default exchange) has one topic per routing key, so the job
  reads every topic whose name starts with the exchange's prefix (`topicsPattern`); a
  streaming job also picks up routing keys first used after it started;
- a queue reads the topics of its bindings (active ones and unbound ones still draining),
  and keeps only the messages its bindings routed (`rows.QueueRoutes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from starlight_py.admin.context import AdminContext
from starlight_py.admin.errors import AdminError
from starlight_py.config import StarlightConfig
from starlight_py.metadata.records import BindingSet
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.topology import Exchange


class SelectionError(Exception):
    """The vhost, exchange or queue does not exist, or the queue reads no topic."""


@dataclass(frozen=True)
class TopicSelection:
    """What one job reads: topics by name or by pattern, and for a queue its binding sets
    (empty for an exchange: every message of its topics)."""

    description: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    binding_sets: tuple[BindingSet, ...] = ()
    is_queue: bool = False

    def connector_options(self) -> dict[str, str]:
        """`topic`, `topics` or `topicsPattern`, as the pulsar-spark connector wants them."""
        if self.pattern is not None:
            return {"topicsPattern": self.pattern}
        if len(self.topics) == 1:
            return {"topic": self.topics[0]}
        # Escaped names never contain a comma, so the list splits back unambiguously.
        return {"topics": ",".join(self.topics)}


def _prefix_pattern(namespace: NamespaceName, local_prefix: str) -> str:
    # The connector lists the pattern's namespace and keeps the topics whose full name the
    # Java regex matches. \Q..\E quotes the escaped name (it can never contain `\E`); the
    # namespace stays unquoted because the connector parses it out of the pattern.
    return f"persistent://{namespace}/\\Q{local_prefix}\\E.*"


def exchange_selection(vhost: str, namespace: NamespaceName, exchange: Exchange) -> TopicSelection:
    """The topics of `exchange` in the vhost's namespace. Raises nothing."""
    # With an empty routing key, a direct exchange's topic name is exactly the prefix every
    # routing key's topic starts with (`E(exchange)~~`).
    # `routing_type`, not `type`: an x-delayed-message exchange is named by its delayed type.
    kind = exchange.routing_type
    first = naming.exchange_topic(namespace, exchange.name, kind, "")
    description = f"exchange '{exchange.name}' ({exchange.type}) in vhost '{vhost}'"
    if exchange.name == "" or kind == naming.DIRECT_EXCHANGE_TYPE:
        return TopicSelection(description, pattern=_prefix_pattern(namespace, first.local))
    if kind in naming.OWN_TOPIC_EXCHANGE_TYPES:
        # Its bindings' own topics (`E(exchange)~~E(queue)~~id`), and the exchange's topic
        # (what Pulsar-native producers and bindings older than binding topics use).
        return TopicSelection(
            description, pattern=f"persistent://{namespace}/\\Q{first.local}\\E(~~.*)?"
        )
    return TopicSelection(description, topics=(str(first),))


def queue_selection(
    vhost: str, namespace: NamespaceName, queue: str, binding_sets: list[BindingSet]
) -> TopicSelection:
    """The topics `queue`'s binding sets read. Raises SelectionError when there is none."""
    topics = sorted({str(naming.TopicName(namespace, b.subscription_topic)) for b in binding_sets})
    if not topics:
        raise SelectionError(f"queue '{queue}' in vhost '{vhost}' has no binding: nothing to read")
    return TopicSelection(
        f"queue '{queue}' in vhost '{vhost}'",
        topics=tuple(topics),
        binding_sets=tuple(binding_sets),
        is_queue=True,
    )


def resolve_selection(
    config: StarlightConfig, vhost: str, exchange: str | None = None, queue: str | None = None
) -> TopicSelection:
    """Look the exchange or the queue up in the proxies' metadata (ZooKeeper).

    Raises:
        SelectionError: no such vhost, exchange or queue, or both/neither were given.
        MetadataUnavailable: ZooKeeper cannot be reached.
    """
    if (exchange is None) == (queue is None):
        raise SelectionError("give exactly one of an exchange or a queue")
    ctx = AdminContext(config)
    try:
        try:
            record = ctx.vhost(vhost)
        except AdminError as e:
            raise SelectionError(str(e)) from e
        if exchange is not None:
            found = ctx.topology.get_exchange(vhost, exchange)
            if found is None:
                raise SelectionError(f"no exchange '{exchange}' in vhost '{vhost}'")
            return exchange_selection(vhost, record.namespace, found[0])
        assert queue is not None
        if ctx.topology.get_queue(vhost, queue) is None:
            raise SelectionError(f"no queue '{queue}' in vhost '{vhost}'")
        binding_sets = [b for b, _ in ctx.topology.binding_sets(vhost, queue)]
        return queue_selection(vhost, record.namespace, queue, binding_sets)
    finally:
        ctx.close()
