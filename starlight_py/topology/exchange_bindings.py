"""Exchange-to-exchange bindings (exchange.bind / exchange.unbind) in ZooKeeper.

Each binding is one znode under its source exchange (`e2e/{destination}~~{key}`, an
ExchangeBinding record) plus an empty index znode under its destination
(`e2e-in/{source}~~{key}`), written in one transaction with `Check`s on both exchanges, so a
delete racing a bind leaves the binding whole or not at all. Routing follows them in the
publishing proxy (gateway/publish/exchange_routing.py); nothing in Pulsar changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from starlight_py.amqp.errors import NotFound
from starlight_py.amqp.method_ids import EXCHANGE_BIND
from starlight_py.metadata.cache import name_of
from starlight_py.metadata.records import (
    BindingSet,
    ExchangeBinding,
    Paths,
    decode,
    encode,
    segment,
)
from starlight_py.metadata.zookeeper import (
    Check,
    Create,
    Delete,
    NodeAlreadyExists,
    NodeMissing,
    NodeNotEmpty,
    Op,
    TransactionFailed,
    VersionConflict,
    ZooKeeperClient,
)
from starlight_py.model.routing import binding_matches
from starlight_py.model.topology import Exchange, validate_binding_arguments
from starlight_py.topology.errors import TopologyConflict

log = logging.getLogger("starlight.topology")

MAX_ATTEMPTS = 20


class ExchangeBindings:
    """Reads and writes exchange-to-exchange bindings (synchronous; worker threads)."""

    def __init__(
        self,
        zookeeper: ZooKeeperClient,
        paths: Paths,
        get_exchange: Callable[[str, str], tuple[Exchange, int] | None],
    ) -> None:
        self.zk = zookeeper
        self.paths = paths
        self._get_exchange = get_exchange

    # ---- reading ------------------------------------------------------------------------------

    def bindings_from(self, vhost: str, source: str) -> list[ExchangeBinding]:
        """The bindings whose source is `source`, read from ZooKeeper (the cache may lag)."""
        base = self.paths.exchange_e2e(vhost, source)
        found: list[ExchangeBinding] = []
        for child in sorted(self.zk.children(base)):
            raw = self.zk.get(f"{base}/{child}")
            if raw is None:
                continue
            record = decode(raw[0])
            if isinstance(record, ExchangeBinding):
                found.append(record)
        return found

    def routed_queues(
        self, vhost: str, exchange: Exchange, routing_key: str, headers: dict[str, Any] | None
    ) -> set[str]:
        """The queues `exchange`'s own active bindings route a message to, read from
        ZooKeeper (TopologyCache.routed_queues may lag by milliseconds)."""
        routed: set[str] = set()
        for child in self.zk.children(self.paths.exchange_bound(vhost, exchange.name)):
            queue_segment, _, topic_segment = child.partition("~~")
            raw = self.zk.get(
                f"{self.paths.queues(vhost)}/{queue_segment}/bindings/{topic_segment}"
            )
            if raw is None:
                continue
            binding_set = decode(raw[0])
            if not isinstance(binding_set, BindingSet) or binding_set.queue in routed:
                continue
            for entry in binding_set.active_entries:
                if binding_matches(
                    exchange.routing_type, entry.routing_key, entry.arguments, routing_key, headers
                ):
                    routed.add(binding_set.queue)
                    break
        return routed

    # ---- bind / unbind ------------------------------------------------------------------------

    def bind(
        self,
        vhost: str,
        destination: str,
        source: str,
        routing_key: str,
        arguments: dict[str, Any],
    ) -> ExchangeBinding:
        """Raises NotFound (source or destination), PreconditionFailed (bad headers
        arguments). Binding twice is idempotent."""
        for _ in range(MAX_ATTEMPTS):
            source_exchange = self._require(vhost, source, EXCHANGE_BIND)
            self._require(vhost, destination, EXCHANGE_BIND)
            validate_binding_arguments(source_exchange, arguments)
            binding = ExchangeBinding(source, destination, routing_key, dict(arguments))
            entry = self.paths.exchange_e2e_entry(vhost, binding)
            if self.zk.get(entry) is not None:
                return binding
            ops: list[Op] = [
                Check(self.paths.exchange(vhost, source), -1),
                Check(self.paths.exchange(vhost, destination), -1),
            ]
            for container in (
                self.paths.exchange_e2e(vhost, source),
                self.paths.exchange_e2e_in(vhost, destination),
            ):
                if self.zk.get(container) is None:
                    ops.append(Create(container))
            ops += [
                Create(entry, encode(binding)),
                Create(self.paths.exchange_e2e_in_entry(vhost, binding)),
            ]
            try:
                self.zk.commit(ops)
            except TransactionFailed as e:
                if isinstance(e.cause, NodeMissing) and e.index in (0, 1):
                    missing = source if e.index == 0 else destination
                    raise NotFound(
                        f"no exchange '{missing}' in vhost '{vhost}'", EXCHANGE_BIND
                    ) from e
                if isinstance(e.cause, NodeAlreadyExists | NodeMissing):
                    continue  # a concurrent bind, unbind or delete: read again
                raise
            log.info(
                "bound exchange %r to exchange %r in vhost %r (key %r)",
                destination,
                source,
                vhost,
                routing_key,
            )
            return binding
        raise TopologyConflict("too many concurrent changes; try again")

    def unbind(
        self,
        vhost: str,
        destination: str,
        source: str,
        routing_key: str,
        arguments: dict[str, Any],
    ) -> ExchangeBinding:
        """Unbinding what does not exist (binding or exchanges) is fine, as RabbitMQ 3.x."""
        binding = ExchangeBinding(source, destination, routing_key, dict(arguments))
        for _ in range(MAX_ATTEMPTS):
            entry = self.paths.exchange_e2e_entry(vhost, binding)
            if self.zk.get(entry) is None:
                return binding
            ops: list[Op] = [
                Delete(entry),
                Delete(self.paths.exchange_e2e_in_entry(vhost, binding)),
            ]
            ops = self._auto_delete_ops(vhost, binding) or ops
            try:
                self.zk.commit(ops)
            except TransactionFailed as e:
                if isinstance(e.cause, NodeMissing | NodeNotEmpty | VersionConflict):
                    continue
                raise
            return binding
        raise TopologyConflict("too many concurrent changes; try again")

    # ---- exchange delete ----------------------------------------------------------------------

    def delete_ops(self, vhost: str, name: str) -> list[Op]:
        """The deletes that remove every binding whose source or destination is `name`, and
        its `e2e` / `e2e-in` znodes, to go in the transaction that deletes the exchange."""
        deletes: dict[str, None] = {}
        containers: list[str] = []
        outgoing = self.paths.exchange_e2e(vhost, name)
        if self.zk.get(outgoing) is not None:
            for binding in self.bindings_from(vhost, name):
                deletes[self.paths.exchange_e2e_entry(vhost, binding)] = None
                deletes[self.paths.exchange_e2e_in_entry(vhost, binding)] = None
            for child in self.zk.children(outgoing):
                deletes[f"{outgoing}/{child}"] = None
            containers.append(outgoing)
        incoming = self.paths.exchange_e2e_in(vhost, name)
        if self.zk.get(incoming) is not None:
            for child in self.zk.children(incoming):
                deletes[f"{incoming}/{child}"] = None
                source_segment, _, key = child.partition("~~")
                source_base = f"{self.paths.exchanges(vhost)}/{source_segment}/e2e"
                deletes[f"{source_base}/{segment(name)}~~{key}"] = None
            containers.append(incoming)
        ops: list[Op] = [Delete(path) for path in deletes]
        return ops + [Delete(path) for path in containers]

    def _auto_delete_ops(self, vhost: str, binding: ExchangeBinding) -> list[Op]:
        """When `binding` is the last binding of an auto-delete source exchange (RabbitMQ
        deletes such an exchange with its last binding): the ops that unbind it and delete
        the exchange; empty otherwise."""
        found = self._get_exchange(vhost, binding.source)
        if found is None or not found[0].auto_delete:
            return []
        if self.zk.children(self.paths.exchange_bound(vhost, binding.source)):
            return []
        if self.zk.children(self.paths.exchange_e2e(vhost, binding.source)) != [binding.entry_name]:
            return []
        return unique_deletes(
            [
                *self.exchange_delete_ops(vhost, binding.source, found[1]),
                *self.cascade_ops(vhost, {binding.source}),
            ]
        )

    def exchange_delete_ops(self, vhost: str, name: str, version: int) -> list[Op]:
        """The deletes of an exchange's record (at `version`), its bound folder and every
        exchange-to-exchange binding it is part of."""
        return [
            *self.delete_ops(vhost, name),
            Delete(self.paths.exchange_bound(vhost, name)),
            Delete(self.paths.exchange(vhost, name), version),
        ]

    def cascade_ops(self, vhost: str, deleted: set[str]) -> list[Op]:
        """RabbitMQ deletes an auto-delete exchange with its last binding, also when that
        binding goes because its destination exchange does: the ops that delete, with the
        exchanges in `deleted`, every auto-delete source exchange all of whose bindings lead
        to them, and so on up the chain (`deleted` grows by those)."""
        ops: list[Op] = []
        pending = list(deleted)
        while pending:
            destination = pending.pop()
            for child in self.zk.children(self.paths.exchange_e2e_in(vhost, destination)):
                source = name_of(child.partition("~~")[0])
                if source in deleted:
                    continue
                found = self._get_exchange(vhost, source)
                if found is None or not found[0].auto_delete:
                    continue
                if self.zk.children(self.paths.exchange_bound(vhost, source)):
                    continue
                outgoing = self.zk.children(self.paths.exchange_e2e(vhost, source))
                if any(name_of(c.partition("~~")[0]) not in deleted for c in outgoing):
                    continue
                deleted.add(source)
                pending.append(source)
                ops += self.exchange_delete_ops(vhost, source, found[1])
        return ops

    def in_use_as_source(self, vhost: str, name: str) -> bool:
        return bool(self.zk.children(self.paths.exchange_e2e(vhost, name)))

    def _require(self, vhost: str, name: str, method: tuple[int, int]) -> Exchange:
        found = self._get_exchange(vhost, name)
        if found is None:
            raise NotFound(f"no exchange '{name}' in vhost '{vhost}'", method)
        return found[0]


def unique_deletes(ops: list[Op]) -> list[Op]:
    """`ops` without a second Delete of a path (one transaction cannot delete a znode
    twice; the deletes of exchanges bound to each other overlap)."""
    seen: set[str] = set()
    kept: list[Op] = []
    for op in ops:
        if isinstance(op, Delete):
            if op.path in seen:
                continue
            seen.add(op.path)
        kept.append(op)
    return kept
