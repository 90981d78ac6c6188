"""What is stored in ZooKeeper, where, and how it is encoded (see docs/metadata.md).

Layout under the root (default `/starlight`), version 1:

    {root}/v1/vhosts/{vhost}                          VhostRecord
    {root}/v1/vhosts/{vhost}/exchanges/{name}         Exchange
    {root}/v1/vhosts/{vhost}/exchanges/{name}/bound/{queue}~~{topic}   (empty: index of bindings)
    {root}/v1/vhosts/{vhost}/exchanges/{source}/e2e/{destination}~~{key}  ExchangeBinding
    {root}/v1/vhosts/{vhost}/exchanges/{destination}/e2e-in/{source}~~{key}  (empty: index)
    {root}/v1/vhosts/{vhost}/queues/{name}            Queue
    {root}/v1/vhosts/{vhost}/queues/{name}/bindings/{topic}           BindingSet
    {root}/v1/vhosts/{vhost}/queues/{name}/consumers/{consumer}  (ephemeral, per AMQP consumer)
    {root}/v1/vhosts/{vhost}/queues/{name}/owner      (ephemeral: exclusive queue's connection)
    {root}/v1/vhosts/{vhost}/queues/{name}/consumed   (empty: an auto-delete queue had a consumer)
    {root}/v1/vhosts/{vhost}/queues/{name}/used       (x-expires queues: written when used)
    {root}/v1/vhosts/{vhost}/retired/{subscription}   RetiredSubscription
    {root}/v1/vhosts/{vhost}/policies/{name}          Policy
    {root}/v1/permissions/{vhost}                     (empty: the vhost's principals)
    {root}/v1/permissions/{vhost}/{principal}         PermissionRecord
    {root}/v1/users/{name}                            User (password users, model/users.py)
    {root}/v1/proxies/{proxy-id}                      ProxyRecord (ephemeral)
    {root}/v1/cleaner/candidate-{sequence}            (ephemeral: SubscriptionCleaner election)

Permissions live outside `{root}/v1/vhosts`, so they can be set before a vhost exists (as
with `rabbitmqctl set_permissions`) and survive its deletion.

Each vhost is its own subtree, so writes to one vhost never touch another's znodes, and no
znode's data grows with the number of queues or bindings (lists are children, not data).
Path segments are `naming.escape`d names (never `/`, never `.` or `..` alone). Every record is
JSON with `"schema": 1`.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

from starlight_py.model.field_values import table_from_json, table_to_json
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import escape
from starlight_py.model.permissions import Permission
from starlight_py.model.policies import Policy
from starlight_py.model.positions import MessageIdRecord
from starlight_py.model.topology import Exchange, Queue
from starlight_py.model.users import User

SCHEMA_VERSION = 1


class RecordError(ValueError):
    """A znode holds data this version cannot read (corrupt, or a newer schema)."""


def segment(name: str) -> str:
    """A ZooKeeper path segment for any AMQP name."""
    text = escape(name)
    if not text:
        return "~"  # the default exchange or empty vhost; escape() never yields a bare ~
    if text in (".", ".."):
        return text.replace(".", "~2E")
    return text


def topic_segment(local_topic: str) -> str:
    """A path segment for a local topic name, which `naming` already made path-safe."""
    if local_topic in (".", ".."):
        return local_topic.replace(".", "~2E")
    return local_topic


@dataclass(frozen=True)
class Paths:
    root: str

    @property
    def vhosts(self) -> str:
        return f"{self.root}/v1/vhosts"

    def vhost(self, vhost: str) -> str:
        return f"{self.vhosts}/{segment(vhost)}"

    def exchanges(self, vhost: str) -> str:
        return f"{self.vhost(vhost)}/exchanges"

    def exchange(self, vhost: str, name: str) -> str:
        return f"{self.exchanges(vhost)}/{segment(name)}"

    def exchange_bound(self, vhost: str, name: str) -> str:
        return f"{self.exchange(vhost, name)}/bound"

    def exchange_bound_entry(self, vhost: str, exchange: str, queue: str, topic: str) -> str:
        return f"{self.exchange_bound(vhost, exchange)}/{segment(queue)}~~{topic_segment(topic)}"

    def exchange_e2e(self, vhost: str, source: str) -> str:
        """The exchange-to-exchange bindings whose source is `source`."""
        return f"{self.exchange(vhost, source)}/e2e"

    def exchange_e2e_entry(self, vhost: str, binding: ExchangeBinding) -> str:
        return f"{self.exchange_e2e(vhost, binding.source)}/{binding.entry_name}"

    def exchange_e2e_in(self, vhost: str, destination: str) -> str:
        """Index of the exchange-to-exchange bindings whose destination is `destination`."""
        return f"{self.exchange(vhost, destination)}/e2e-in"

    def exchange_e2e_in_entry(self, vhost: str, binding: ExchangeBinding) -> str:
        return f"{self.exchange_e2e_in(vhost, binding.destination)}/{binding.index_name}"

    def queues(self, vhost: str) -> str:
        return f"{self.vhost(vhost)}/queues"

    def queue(self, vhost: str, name: str) -> str:
        return f"{self.queues(vhost)}/{segment(name)}"

    def queue_bindings(self, vhost: str, queue: str) -> str:
        return f"{self.queue(vhost, queue)}/bindings"

    def binding_set(self, vhost: str, queue: str, topic: str) -> str:
        return f"{self.queue_bindings(vhost, queue)}/{topic_segment(topic)}"

    def queue_consumers(self, vhost: str, queue: str) -> str:
        return f"{self.queue(vhost, queue)}/consumers"

    def queue_consumer(self, vhost: str, queue: str, consumer: str) -> str:
        return f"{self.queue_consumers(vhost, queue)}/{segment(consumer)}"

    def queue_single_active(self, vhost: str, queue: str) -> str:
        """`x-single-active-consumer` queues: one ephemeral sequential znode per consumer,
        in the order they came; the first is the active one."""
        return f"{self.queue(vhost, queue)}/active"

    def queue_owner(self, vhost: str, queue: str) -> str:
        return f"{self.queue(vhost, queue)}/owner"

    def queue_consumed(self, vhost: str, queue: str) -> str:
        return f"{self.queue(vhost, queue)}/consumed"

    def queue_used(self, vhost: str, queue: str) -> str:
        return f"{self.queue(vhost, queue)}/used"

    @property
    def permissions(self) -> str:
        return f"{self.root}/v1/permissions"

    def vhost_permissions(self, vhost: str) -> str:
        return f"{self.permissions}/{segment(vhost)}"

    def permission(self, vhost: str, principal: str) -> str:
        return f"{self.vhost_permissions(vhost)}/{segment(principal)}"

    @property
    def users(self) -> str:
        return f"{self.root}/v1/users"

    def user(self, name: str) -> str:
        return f"{self.users}/{segment(name)}"

    @property
    def proxies(self) -> str:
        return f"{self.root}/v1/proxies"

    def proxy(self, proxy_id: str) -> str:
        return f"{self.proxies}/{segment(proxy_id)}"

    @property
    def connection_reports(self) -> str:
        """What each proxy reports of its AMQP connections (cluster/connection_reports.py),
        for the management API."""
        return f"{self.root}/v1/connections"

    def connection_report(self, proxy_id: str) -> str:
        return f"{self.connection_reports}/{segment(proxy_id)}"

    def close_requests(self, proxy_id: str) -> str:
        """Requests to close connections of one proxy (DELETE /api/connections/{name})."""
        return f"{self.root}/v1/connection-closes/{segment(proxy_id)}"

    def close_request(self, proxy_id: str, connection: str) -> str:
        return f"{self.close_requests(proxy_id)}/{segment(connection)}"

    @property
    def held_root(self) -> str:
        """Unacked deliveries by queue and proxy (gateway/consume/held_messages.py): outside
        `vhosts`, so the topology cache does not follow their frequent changes."""
        return f"{self.root}/v1/held"

    def held(self, vhost: str, queue: str) -> str:
        return f"{self.held_root}/{segment(vhost)}/{segment(queue)}"

    def held_by(self, vhost: str, queue: str, proxy_id: str) -> str:
        return f"{self.held(vhost, queue)}/{segment(proxy_id)}"

    @property
    def cleaner_election(self) -> str:
        return f"{self.root}/v1/cleaner"

    def policies(self, vhost: str) -> str:
        """The vhost's policies: inside its subtree, so the topology cache watches them and
        they go with the vhost, as in RabbitMQ."""
        return f"{self.vhost(vhost)}/policies"

    def policy(self, vhost: str, name: str) -> str:
        return f"{self.policies(vhost)}/{segment(name)}"

    def retired(self, vhost: str) -> str:
        return f"{self.vhost(vhost)}/retired"

    def retired_subscription(self, vhost: str, subscription: str) -> str:
        return f"{self.retired(vhost)}/{segment(subscription)}"


@dataclass(frozen=True)
class VhostRecord:
    name: str
    namespace: NamespaceName
    # True when an operator mapped it (starlight-admin); False when made by the rules.
    explicit: bool = False


@dataclass(frozen=True)
class PermissionRecord:
    """What `principal` may configure, write and read in `vhost`."""

    vhost: str
    principal: str
    permission: Permission


@dataclass(frozen=True)
class BindingEntry:
    """One queue.bind of a queue to an exchange topic. `start`/`end` bound the messages it
    routes: only messages after `start` (None: since the subscription was created) and, once
    `unbound`, up to `end` (None: the topic had no message yet, so nothing)."""

    routing_key: str
    arguments: dict[str, Any] = field(default_factory=dict)
    start: MessageIdRecord | None = None
    end: MessageIdRecord | None = None
    unbound: bool = False

    @property
    def active(self) -> bool:
        return not self.unbound

    def same_binding(self, routing_key: str, arguments: dict[str, Any]) -> bool:
        return self.routing_key == routing_key and self.arguments == arguments


@dataclass(frozen=True)
class BindingSet:
    """The bindings of one queue to one exchange topic, read through one shared Pulsar
    subscription (docs/mapping.md)."""

    queue: str
    exchange: str
    topic: str  # local topic name in the vhost's namespace
    subscription: str
    entries: tuple[BindingEntry, ...] = ()
    created: float = 0.0
    exchange_type: str = "direct"
    # Bindings to topic and headers exchanges made since routing at publish: the local
    # name of the set's own topic (model.naming.binding_topic), which only messages routed
    # to the queue reach. Empty: the subscription reads the exchange's `topic`.
    binding_topic: str = ""
    # False while a set with its own topic has neither topic nor subscription: they are made
    # by the first publish it routes (topology/binding_topics.py). Sets written before
    # that existed are made.
    made: bool = True

    @property
    def subscription_topic(self) -> str:
        """The local name of the topic the set's subscription is on."""
        return self.binding_topic or self.topic

    @property
    def active_entries(self) -> tuple[BindingEntry, ...]:
        return tuple(e for e in self.entries if e.active)

    def with_entries(self, entries: tuple[BindingEntry, ...]) -> BindingSet:
        return replace(self, entries=entries)


@dataclass(frozen=True)
class ExchangeBinding:
    """One exchange.bind: messages `source` routes with this key and these arguments (by
    the source's type) are routed onward by `destination`."""

    source: str
    destination: str
    routing_key: str
    arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """A stable digest of the routing key and arguments (part of the znode names)."""
        text = json.dumps(
            [self.routing_key, table_to_json(self.arguments)], sort_keys=True, default=str
        )
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:20]

    @property
    def entry_name(self) -> str:
        """Its znode's name under the source's `e2e`."""
        return f"{segment(self.destination)}~~{self.key}"

    @property
    def index_name(self) -> str:
        """Its index znode's name under the destination's `e2e-in`."""
        return f"{segment(self.source)}~~{self.key}"


@dataclass(frozen=True)
class RetiredSubscription:
    """A subscription no binding uses any more. `drain`: delete it only once every message
    up to `end` is acknowledged (unbind); otherwise delete at once (queue deleted)."""

    topic: str
    subscription: str
    queue: str
    end: MessageIdRecord | None
    drain: bool
    retired_at: float
    # The bindings as they were at retirement (all unbound): while it drains, the queue
    # still gets the messages they routed before `end`.
    binding_set: BindingSet | None = None
    # `topic` is the binding's own topic (BindingSet.binding_topic): once the subscription
    # is gone, so is the topic.
    owns_topic: bool = False


# ---- JSON codec ---------------------------------------------------------------------------


def _position_to_json(position: MessageIdRecord | None) -> dict[str, int] | None:
    if position is None:
        return None
    return {
        "ledger": position.ledger_id,
        "entry": position.entry_id,
        "batch": position.batch_index,
        "partition": position.partition,
    }


def _position_from_json(data: dict[str, int] | None) -> MessageIdRecord | None:
    if data is None:
        return None
    return MessageIdRecord(
        ledger_id=data["ledger"],
        entry_id=data["entry"],
        batch_index=data.get("batch", -1),
        partition=data.get("partition", -1),
    )


def encode(record: object) -> bytes:
    """Serialise a record; raises TypeError for anything else."""
    body: dict[str, Any]
    if isinstance(record, VhostRecord):
        body = {
            "kind": "vhost",
            "name": record.name,
            "namespace": str(record.namespace),
            "explicit": record.explicit,
        }
    elif isinstance(record, PermissionRecord):
        body = {
            "kind": "permission",
            "vhost": record.vhost,
            "principal": record.principal,
            "permission": record.permission.to_json(),
        }
    elif isinstance(record, User):
        body = {"kind": "user", **record.to_json()}
        del body["limits"]
    elif isinstance(record, Exchange):
        body = {
            "kind": "exchange",
            "name": record.name,
            "type": record.type,
            "durable": record.durable,
            "auto_delete": record.auto_delete,
            "internal": record.internal,
            "arguments": table_to_json(record.arguments),
        }
    elif isinstance(record, Queue):
        body = {
            "kind": "queue",
            "name": record.name,
            "durable": record.durable,
            "exclusive": record.exclusive,
            "auto_delete": record.auto_delete,
            "arguments": table_to_json(record.arguments),
            "owner": record.owner,
        }
    elif isinstance(record, Policy):
        body = {"kind": "policy", **record.to_json()}
    elif isinstance(record, BindingSet):
        body = {
            "kind": "binding_set",
            "queue": record.queue,
            "exchange": record.exchange,
            "topic": record.topic,
            "subscription": record.subscription,
            "created": record.created,
            "exchange_type": record.exchange_type,
            **({"binding_topic": record.binding_topic} if record.binding_topic else {}),
            **({} if record.made else {"made": False}),
            "entries": [
                {
                    "routing_key": e.routing_key,
                    "arguments": table_to_json(e.arguments),
                    "start": _position_to_json(e.start),
                    "end": _position_to_json(e.end),
                    "unbound": e.unbound,
                }
                for e in record.entries
            ],
        }
    elif isinstance(record, ExchangeBinding):
        body = {
            "kind": "exchange_binding",
            "source": record.source,
            "destination": record.destination,
            "routing_key": record.routing_key,
            "arguments": table_to_json(record.arguments),
        }
    elif isinstance(record, RetiredSubscription):
        body = {
            "kind": "retired_subscription",
            "topic": record.topic,
            "subscription": record.subscription,
            "queue": record.queue,
            "end": _position_to_json(record.end),
            "drain": record.drain,
            "retired_at": record.retired_at,
            "binding_set": None
            if record.binding_set is None
            else json.loads(encode(record.binding_set)),
            **({"owns_topic": True} if record.owns_topic else {}),
        }
    else:
        raise TypeError(f"not a metadata record: {type(record).__name__}")
    return json.dumps({"schema": SCHEMA_VERSION, **body}, sort_keys=True).encode("utf-8")


def decode(
    data: bytes,
) -> (
    VhostRecord
    | Exchange
    | Queue
    | BindingSet
    | RetiredSubscription
    | PermissionRecord
    | ExchangeBinding
    | User
    | Policy
):
    """Parse a record; raises RecordError for corrupt data or an unknown schema."""
    try:
        body = json.loads(data)
        if body.get("schema") != SCHEMA_VERSION:
            raise RecordError(f"unsupported metadata schema {body.get('schema')!r}")
        kind = body["kind"]
        if kind == "vhost":
            return VhostRecord(
                body["name"], NamespaceName.parse(body["namespace"]), body["explicit"]
            )
        if kind == "permission":
            return PermissionRecord(
                body["vhost"], body["principal"], Permission.from_json(body["permission"])
            )
        if kind == "user":
            return User.from_json(body)
        if kind == "exchange":
            return Exchange(
                body["name"],
                body["type"],
                body["durable"],
                body["auto_delete"],
                body["internal"],
                table_from_json(body["arguments"]),
            )
        if kind == "queue":
            return Queue(
                body["name"],
                body["durable"],
                body["exclusive"],
                body["auto_delete"],
                table_from_json(body["arguments"]),
                body.get("owner"),
            )
        if kind == "policy":
            return Policy(
                body["vhost"],
                body["name"],
                body["pattern"],
                dict(body["definition"]),
                body["apply-to"],
                body["priority"],
            )
        if kind == "binding_set":
            return BindingSet(
                body["queue"],
                body["exchange"],
                body["topic"],
                body["subscription"],
                tuple(
                    BindingEntry(
                        e["routing_key"],
                        table_from_json(e["arguments"]),
                        _position_from_json(e["start"]),
                        _position_from_json(e["end"]),
                        e.get("unbound", False),
                    )
                    for e in body["entries"]
                ),
                body.get("created", 0.0),
                body.get("exchange_type", "direct"),
                body.get("binding_topic", ""),
                body.get("made", True),
            )
        if kind == "exchange_binding":
            return ExchangeBinding(
                body["source"],
                body["destination"],
                body["routing_key"],
                table_from_json(body["arguments"]),
            )
        if kind == "retired_subscription":
            return RetiredSubscription(
                body["topic"],
                body["subscription"],
                body["queue"],
                _position_from_json(body["end"]),
                body["drain"],
                body["retired_at"],
                None
                if body.get("binding_set") is None
                else _binding_set(json.dumps(body["binding_set"]).encode()),
                body.get("owns_topic", False),
            )
    except RecordError:
        raise
    # AttributeError: JSON that is not an object where one is expected (`[]`, `null`).
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise RecordError(f"corrupt metadata record: {e}") from e
    raise RecordError(f"unknown metadata record kind {kind!r}")


def _binding_set(data: bytes) -> BindingSet:
    record = decode(data)
    if not isinstance(record, BindingSet):
        raise RecordError("retired subscription holds no binding set")
    return record


def now() -> float:
    return time.time()
