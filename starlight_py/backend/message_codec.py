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
import json
from typing import Any

from pamqp import commands, header

from starlight_py.amqp.errors import AMQPError
from starlight_py.amqp.framing import decode_raw_properties

PROPERTIES_KEY = "amqp.properties"
EXCHANGE_KEY = "amqp.exchange"
ROUTING_KEY_KEY = "amqp.routing_key"
# The routing key in base64, beside ROUTING_KEY_KEY when it holds a NUL: pulsar-client's C
# API reads properties as C strings (backend/listened.py), which end at the first NUL.
ROUTING_KEY_BASE64_KEY = "starlight.routing-key-base64"
HEADER_PREFIX = "amqp.header."
# Queues (a JSON list of names) that refused the message when it was published, being at
# their length limit with x-overflow reject-publish: their subscriptions skip it.
REFUSED_BY_KEY = "starlight.refused-by"
# Priority queues (a JSON list of names) that got the message on their priority band topic
# instead: their subscriptions on the exchange's topic skip this copy.
IN_PRIORITY_BAND_KEY = "starlight.in-priority-band"
# Queues (a JSON list of names) that get this message from the copy on another exchange's
# topic (exchange-to-exchange bindings reach several): their subscriptions skip this copy.
ROUTED_ELSEWHERE_KEY = "starlight.routed-elsewhere"
# On the copies of a message after the first, when a topic or headers exchange routed it
# to several queues (one copy per queue's binding topic): a reader of the whole exchange
# (Spark, a Pulsar-native pattern consumer) keeps only the copies without it.
FURTHER_COPY_KEY = "starlight.further-copy"
# The readable copy of the AMQP expiration: the message's own TTL, checked at delivery.
EXPIRATION_KEY = "amqp.expiration"
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


class DecodedMessage:
    """The AMQP view of a Pulsar message (a value: nothing changes it after it is made; a
    plain class, made once per delivery, is cheaper than a frozen dataclass)."""

    __slots__ = ("body", "decoded_properties", "exchange", "raw_properties", "routing_key")

    def __init__(
        self,
        exchange: str,
        routing_key: str,
        raw_properties: bytes,
        body: bytes,
        decoded_properties: commands.Basic.Properties,
    ) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.raw_properties = raw_properties  # AMQP property flags and values, as they are
        self.body = body
        # The same properties decoded (decode() needs them once to validate the raw bytes).
        self.decoded_properties = decoded_properties

    @property
    def properties(self) -> commands.Basic.Properties:
        """For headers-exchange filtering and tests; deliveries forward the raw bytes."""
        return self.decoded_properties

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DecodedMessage) and (
            self.exchange,
            self.routing_key,
            self.raw_properties,
            self.body,
        ) == (other.exchange, other.routing_key, other.raw_properties, other.body)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"DecodedMessage({self.exchange!r}, {self.routing_key!r}, {len(self.body)} bytes)"


def _property_text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, datetime.datetime):
        return str(int(value.timestamp()))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, decimal.Decimal | int | float | str):
        return str(value)
    return repr(value)


# Most applications send the same property bytes again and again (PerfTest, Celery's
# headers of one task type...): what is derived from them is kept, by those bytes, for a
# while. Bounded in entries and in the size of what is kept.
_CACHE_ENTRIES = 1024
_CACHED_SIZE = 1024
_READABLE_BY_RAW: dict[bytes, dict[str, str]] = {}
_DECODED_BY_ENCODED: dict[str, tuple[bytes, commands.Basic.Properties]] = {}


def encode_properties(
    exchange: str,
    routing_key: str,
    properties: commands.Basic.Properties,
    raw_properties: bytes | None = None,
) -> dict[str, str]:
    """The Pulsar property map for an AMQP message. `raw_properties` (as the client encoded
    them) is stored when given, so headers come back byte for byte; otherwise the
    properties are encoded here."""
    if raw_properties is None:
        raw_properties = header.ContentHeader(0, 0, properties).marshal()[12:]
    readable = _READABLE_BY_RAW.get(raw_properties)
    if readable is None:
        readable = _readable(properties, raw_properties)
        if len(raw_properties) <= _CACHED_SIZE:
            if len(_READABLE_BY_RAW) >= _CACHE_ENTRIES:
                _READABLE_BY_RAW.clear()
            _READABLE_BY_RAW[raw_properties] = readable
    result = readable.copy()
    result[EXCHANGE_KEY] = exchange
    result[ROUTING_KEY_KEY] = routing_key
    if "\x00" in routing_key:
        result[ROUTING_KEY_BASE64_KEY] = base64.b64encode(routing_key.encode()).decode("ascii")
    return result


def _readable(properties: commands.Basic.Properties, raw_properties: bytes) -> dict[str, str]:
    result = {PROPERTIES_KEY: base64.b64encode(raw_properties).decode("ascii")}
    for name in _READABLE:
        value = getattr(properties, name, None)
        if value is not None:
            result[f"amqp.{name}"] = _property_text(value)
    for key, value in (properties.headers or {}).items():
        result[HEADER_PREFIX + key] = _property_text(value)
    return result


def decode(
    pulsar_properties: dict[str, str],
    body: bytes,
    default_exchange: str,
    default_routing_key: str,
) -> DecodedMessage:
    """The AMQP view of a Pulsar message; never raises for a foreign message."""
    exchange = pulsar_properties.get(EXCHANGE_KEY, default_exchange)
    routing_key = _routing_key(pulsar_properties, default_routing_key)
    encoded = pulsar_properties.get(PROPERTIES_KEY)
    if encoded is not None:
        known = _DECODED_BY_ENCODED.get(encoded)
        if known is not None:
            return DecodedMessage(exchange, routing_key, known[0], body, known[1])
        try:
            raw = base64.b64decode(encoded, validate=True)
            # Decoding also validates: a corrupt value falls back to the readable form.
            properties = decode_raw_properties(raw)
        except (ValueError, AMQPError):
            pass
        else:
            if len(encoded) <= _CACHED_SIZE:
                if len(_DECODED_BY_ENCODED) >= _CACHE_ENTRIES:
                    _DECODED_BY_ENCODED.clear()
                _DECODED_BY_ENCODED[encoded] = (raw, properties)
            return DecodedMessage(exchange, routing_key, raw, body, properties)
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
    raw = header.ContentHeader(0, 0, properties).marshal()[12:]
    return DecodedMessage(exchange, routing_key, raw, body, properties)


def _routing_key(pulsar_properties: dict[str, str], default: str) -> str:
    escaped = pulsar_properties.get(ROUTING_KEY_BASE64_KEY)
    if escaped is not None:
        try:
            return base64.b64decode(escaped, validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            pass  # not one the proxy wrote: the plain property
    return pulsar_properties.get(ROUTING_KEY_KEY, default)


def plain_delivery(
    pulsar_properties: dict[str, str], default_exchange: str, default_routing_key: str
) -> tuple[str, str, bytes] | None:
    """(exchange, routing key, AMQP properties as the client sent them) of a message that
    no queue skips (`skipped_by` is empty), that has no expiration of its own nor a routing
    key with a NUL, and whose properties `decode` has seen before; None: `decode` it. What
    most deliveries need, without building a DecodedMessage."""
    if (
        REFUSED_BY_KEY in pulsar_properties
        or IN_PRIORITY_BAND_KEY in pulsar_properties
        or ROUTED_ELSEWHERE_KEY in pulsar_properties
        or EXPIRATION_KEY in pulsar_properties
        or ROUTING_KEY_BASE64_KEY in pulsar_properties
    ):
        return None
    encoded = pulsar_properties.get(PROPERTIES_KEY)
    if encoded is None:
        return None
    known = _DECODED_BY_ENCODED.get(encoded)
    if known is None:
        return None
    return (
        pulsar_properties.get(EXCHANGE_KEY, default_exchange),
        pulsar_properties.get(ROUTING_KEY_KEY, default_routing_key),
        known[0],
    )


def refused_by_value(queues: set[str]) -> str:
    """The REFUSED_BY_KEY (or IN_PRIORITY_BAND_KEY) property for these queues."""
    return json.dumps(sorted(queues), separators=(",", ":"))


def skipped_by(pulsar_properties: dict[str, str]) -> frozenset[str]:
    """The queues whose subscriptions skip this copy of a message: they refused it at
    publish, got it on a priority band, or get it from another exchange's copy (usually
    none, with three dictionary lookups)."""
    if (
        REFUSED_BY_KEY not in pulsar_properties
        and IN_PRIORITY_BAND_KEY not in pulsar_properties
        and ROUTED_ELSEWHERE_KEY not in pulsar_properties
    ):
        return frozenset()
    return (
        refused_by(pulsar_properties)
        | _queue_list(pulsar_properties, IN_PRIORITY_BAND_KEY)
        | _queue_list(pulsar_properties, ROUTED_ELSEWHERE_KEY)
    )


def refused_by(pulsar_properties: dict[str, str]) -> frozenset[str]:
    """The queues that refused the message at publish (usually none)."""
    return _queue_list(pulsar_properties, REFUSED_BY_KEY)


def _queue_list(pulsar_properties: dict[str, str], key: str) -> frozenset[str]:
    raw = pulsar_properties.get(key)
    if raw is None:
        return frozenset()
    try:
        names = json.loads(raw)
    except ValueError:
        return frozenset()
    return (
        frozenset(n for n in names if isinstance(n, str))
        if isinstance(names, list)
        else frozenset()
    )
