"""One Pulsar message, as the pulsar-spark connector hands it over, -> one row of AMQP columns.

Plain Python with no Spark import: Spark ships these functions to its executors inside a
UDF, and unit tests call them directly. The AMQP view comes from the proxy's own codec
(`message_codec.decode`), so Spark sees exactly what an AMQP consumer would: every basic
property, typed headers, and sensible defaults for messages from Pulsar-native producers.
For a queue, the proxy's own routing rule (`any_binding_routes`) decides which messages of a
shared exchange topic the queue got.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Mapping
from typing import Any

from starlight_py.backend import message_codec
from starlight_py.backend.message_ids import position_from_bytes
from starlight_py.metadata.records import BindingSet
from starlight_py.model import naming
from starlight_py.model.field_values import table_to_json
from starlight_py.model.positions import MessageIdRecord
from starlight_py.model.routing import any_binding_routes

AMQP_COLUMNS = (
    "exchange",
    "routing_key",
    "content_type",
    "content_encoding",
    "headers",
    "headers_json",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
    "body",
    "pulsar_position",
)
"""The values `amqp_row` returns, in order (`frames.AMQP_STRUCT` gives their Spark types)."""

AmqpRow = tuple[Any, ...]


class QueueRoutes:
    """Which messages of its topics a queue got: those that one of its bindings on the topic
    routed while it was bound (positions are compared with the binding's start and end)."""

    def __init__(self, binding_sets: Iterable[BindingSet]) -> None:
        self.binding_sets = tuple(binding_sets)
        self._by_topic: dict[str, list[BindingSet]] = {}
        for binding_set in self.binding_sets:
            self._by_topic.setdefault(binding_set.subscription_topic, []).append(binding_set)

    def routes(
        self,
        topic_local: str,
        routing_key: str,
        headers: Mapping[str, Any] | None,
        position: MessageIdRecord | None,
        skipped_by: frozenset[str] = frozenset(),
    ) -> bool:
        """Whether the queue got the message; never a copy its queue skips (refused at its
        length limit, or read from a priority band instead)."""
        if self.binding_sets and self.binding_sets[0].queue in skipped_by:
            return False
        return any(
            any_binding_routes(
                binding_set.exchange_type, binding_set.entries, routing_key, headers, position
            )
            for binding_set in self._by_topic.get(topic_local, ())
        )


def local_name(topic: str) -> str:
    """`orders` from `persistent://public/default/orders` (the connector's `__topic`)."""
    _, separator, rest = topic.partition("://")
    if not separator:
        return topic
    parts = rest.split("/", 2)
    return parts[2] if len(parts) == 3 else rest


def readable_headers(
    pulsar_properties: Mapping[str, str], headers: Mapping[str, Any] | None
) -> dict[str, str] | None:
    """Each header as text: the codec's readable copy (`amqp.header.<name>`) when the
    message has one, else the value itself (Pulsar-native messages' headers are strings)."""
    if headers is None:
        return None
    return {
        name: pulsar_properties.get(message_codec.HEADER_PREFIX + name, _plain_text(value))
        for name, value in headers.items()
    }


def _plain_text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _utc(value: datetime.datetime | None) -> datetime.datetime | None:
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=datetime.UTC)


def amqp_row(
    topic: str,
    pulsar_properties: Mapping[str, str] | None,
    body: bytes | bytearray | None,
    message_id: bytes | bytearray | None,
    routes: QueueRoutes | None = None,
) -> AmqpRow | None:
    """The `AMQP_COLUMNS` of one message, or None when `routes` is given and says the queue
    did not get it. Never raises for a foreign message or topic: what cannot be decoded gets
    the codec's defaults (exchange and routing key from the topic name when it is one of
    ours, else empty)."""
    properties = dict(pulsar_properties or {})
    if routes is None and message_codec.FURTHER_COPY_KEY in properties:
        return None  # read whole, an exchange shows each message once (its first copy)
    local = local_name(topic)
    exchange, routing_key = naming.exchange_and_key_of_topic(local)
    decoded = message_codec.decode(properties, bytes(body or b""), exchange, routing_key or "")
    amqp = decoded.properties
    position: MessageIdRecord | None = None
    if message_id:
        try:
            position = position_from_bytes(bytes(message_id))
        except ValueError:
            position = None
    if routes is not None and not routes.routes(
        local, decoded.routing_key, amqp.headers, position, message_codec.skipped_by(properties)
    ):
        return None
    return (
        decoded.exchange,
        decoded.routing_key,
        amqp.content_type,
        amqp.content_encoding,
        readable_headers(properties, amqp.headers),
        json.dumps(table_to_json(amqp.headers)) if amqp.headers is not None else None,
        amqp.delivery_mode,
        amqp.priority,
        amqp.correlation_id,
        amqp.reply_to,
        amqp.expiration,
        amqp.message_id,
        _utc(amqp.timestamp),
        amqp.message_type,
        amqp.user_id,
        amqp.app_id,
        amqp.cluster_id or None,  # pamqp reads an unset (deprecated) cluster-id as ""
        decoded.body,
        str(position) if position is not None else None,
    )
