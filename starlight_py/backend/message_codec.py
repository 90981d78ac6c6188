"""AMQP message <-> Pulsar message (docs/mapping.md lists the property keys).

The Pulsar payload is the AMQP body, untouched. Pulsar properties (a string map) carry:
- readable copies for Pulsar-native and Spark readers: `amqp.exchange`, `amqp.routing_key`,
  `amqp.content_type`, `amqp.message_id`, `amqp.correlation_id`, ... and each header as
  `amqp.header.<name>` = its value as text;
- `amqp.properties`: the AMQP content-header properties exactly as the client sent them
  (base64 of the AMQP encoding), so every property and field-table type round-trips.

A message without `amqp.properties` came from a Pulsar-native producer: it is delivered with
its Pulsar properties as string headers, `content_type` from a `content-type` property when
present, and exchange / routing key from the topic it was read from.
"""

from __future__ import annotations

import base64
import datetime
import decimal
from dataclasses import dataclass
from typing import Any

from pamqp import commands, header

PROPERTIES_KEY = "amqp.properties"
EXCHANGE_KEY = "amqp.exchange"
ROUTING_KEY_KEY = "amqp.routing_key"
HEADER_PREFIX = "amqp.header."
_READABLE = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "message_type",
    "user_id",
    "app_id",
)


@dataclass(frozen=True, slots=True)
class DecodedMessage:
    exchange: str
    routing_key: str
    properties: commands.Basic.Properties
    body: bytes

    @property
    def headers(self) -> dict[str, Any]:
        return dict(self.properties.headers or {})


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, datetime.datetime):
        return str(int(value.timestamp()))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, decimal.Decimal | int | float | str):
        return str(value)
    return repr(value)


def encode_properties(
    exchange: str, routing_key: str, properties: commands.Basic.Properties
) -> dict[str, str]:
    """The Pulsar property map for an AMQP message."""
    raw = header.ContentHeader(0, 0, properties).marshal()
    result = {
        EXCHANGE_KEY: exchange,
        ROUTING_KEY_KEY: routing_key,
        PROPERTIES_KEY: base64.b64encode(raw).decode("ascii"),
    }
    for name in _READABLE:
        value = getattr(properties, name, None)
        if value is not None:
            result[f"amqp.{name}"] = _text(value)
    for key, value in (properties.headers or {}).items():
        result[HEADER_PREFIX + key] = _text(value)
    return result


def decode(
    pulsar_properties: dict[str, str],
    body: bytes,
    default_exchange: str,
    default_routing_key: str,
) -> DecodedMessage:
    """The AMQP view of a Pulsar message; never raises for a foreign message."""
    encoded = pulsar_properties.get(PROPERTIES_KEY)
    if encoded is not None:
        try:
            content_header = header.ContentHeader()
            content_header.unmarshal(base64.b64decode(encoded))
            return DecodedMessage(
                pulsar_properties.get(EXCHANGE_KEY, default_exchange),
                pulsar_properties.get(ROUTING_KEY_KEY, default_routing_key),
                content_header.properties,
                body,
            )
        except Exception:  # a corrupt or foreign value: fall back to the readable form
            pass
    headers: dict[str, Any] = {
        (k[len(HEADER_PREFIX) :] if k.startswith(HEADER_PREFIX) else k): v
        for k, v in pulsar_properties.items()
        if not k.startswith("amqp.") or k.startswith(HEADER_PREFIX)
    }
    content_type = pulsar_properties.get("amqp.content_type") or pulsar_properties.get(
        "content-type"
    )
    properties = commands.Basic.Properties(
        content_type=content_type,
        headers=headers or None,
        message_id=pulsar_properties.get("amqp.message_id"),
        correlation_id=pulsar_properties.get("amqp.correlation_id"),
    )
    return DecodedMessage(
        pulsar_properties.get(EXCHANGE_KEY, default_exchange),
        pulsar_properties.get(ROUTING_KEY_KEY, default_routing_key),
        properties,
        body,
    )
