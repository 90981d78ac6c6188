"""How AMQP names become Pulsar topic and subscription names.

This format is public: Spark jobs and Pulsar-native consumers find an exchange's messages by
these names, and docs/mapping.md is written from these docstrings. Change it and their
topics move.

Theory of operation. Every AMQP name is escaped (`escape`) into the alphabet
`[A-Za-z0-9_.~-]`, which Pulsar accepts in a topic's local name and which needs no
percent-encoding in a URL. The escape never produces `~~`, so `~~` is free to join two
escaped names into one: a direct exchange's topic is `E(exchange)~~E(routing key)`, a binding
subscription is `E(queue)~~<binding set id>`, and both split back unambiguously at the first
`~~`. Pulsar reads a topic name ending in `-partition-<N>` as partition N of a partitioned
topic, so the escape also hides every `-` that starts `-partition-`.

Length. AMQP names are at most 255 bytes; escaped, at most 765 characters. A direct
exchange's topic is then at most 765 + 2 + 765 = 1532 characters and a subscription name at
most 765 + 2 + 12 = 779: long, but valid Pulsar names (Pulsar limits neither; the
integration tests create both through the broker).
"""

from __future__ import annotations

import functools
import re
import secrets
from dataclasses import dataclass

from starlight_py.model.namespaces import NamespaceName

DEFAULT_EXCHANGE_TOPIC_NAME = "amq.default"
"""How the default exchange `""` is named in topics. Users cannot declare `amq.*` exchanges
(RabbitMQ answers 403), so no declared exchange escapes to this name."""

SEPARATOR = "~~"
"""Joins two escaped names; `escape` never produces it."""

DIRECT_EXCHANGE_TYPE = "direct"

_KEPT = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
# One entry per byte value, so escaping is a table lookup per byte.
_ESCAPED_BYTE = tuple(chr(b) if b in _KEPT else f"~{b:02X}" for b in range(256))
# The lookahead finds overlapping occurrences too: in `-partition-partition-1` both dashes.
_PARTITION_DASH = re.compile(r"-(?=partition-)")
_ESCAPE_TOKEN = re.compile(r"~([0-9A-F]{2})|[A-Za-z0-9_.-]+")
_BINDING_SET_ID = re.compile(r"[0-9a-f]{12}")
# RFC 3986 unreserved characters: never percent-encoded in a URL path.
_URL_UNRESERVED = _KEPT | frozenset(b"~")
# Names repeat (every message of a queue carries the same topic): escaping and parsing are
# cached, bounded so that many distinct routing keys cannot grow memory without end.
_NAME_CACHE_SIZE = 4096


@functools.lru_cache(maxsize=_NAME_CACHE_SIZE)
def escape(name: str) -> str:
    """The Pulsar-safe form of an AMQP name.

    The name's UTF-8 bytes; bytes of `A-Z a-z 0-9 _ . -` are kept, every other byte
    (including `~`) becomes `~` and two uppercase hex digits. Then every `-` that starts the
    substring `-partition-` becomes `~2D`, so Pulsar never mistakes the name for a partition:
    `a-partition-1` -> `a~2Dpartition-1`, `ex with space` -> `ex~20with~20space`.

    The result contains only `[A-Za-z0-9_.~-]` and never `~~` (a `~` is always followed by
    two hex digits). Total: a str with lone surrogates, which AMQP never produces (field
    names are strict UTF-8), is encoded with their surrogate code points' UTF-8 bytes.
    """
    escaped = "".join(_ESCAPED_BYTE[b] for b in name.encode("utf-8", "surrogatepass"))
    return _PARTITION_DASH.sub("~2D", escaped)


@functools.lru_cache(maxsize=_NAME_CACHE_SIZE)
def unescape(text: str) -> str:
    """The AMQP name that `escape` turned into `text`.

    Raises ValueError when `text` is not something `escape` produces: a character outside
    `[A-Za-z0-9_.~-]`, a `~` not followed by two uppercase hex digits, bytes that are not
    UTF-8, or a non-canonical spelling (`~41` for `A`, or a bare `-partition-`), so that
    distinct names never parse to the same AMQP name.
    """
    decoded = bytearray()
    position = 0
    while position < len(text):
        token = _ESCAPE_TOKEN.match(text, position)
        if token is None:
            raise ValueError(
                f"{text!r} is not an escaped name: unexpected {text[position]!r} at {position}"
            )
        if token.group(1) is not None:
            decoded.append(int(token.group(1), 16))
        else:
            decoded += token.group(0).encode("ascii")
        position = token.end()
    try:
        name = decoded.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as e:
        raise ValueError(f"{text!r} is not an escaped name: the bytes are not UTF-8") from e
    if escape(name) != text:
        raise ValueError(f"{text!r} is not an escaped name: the canonical form is {escape(name)!r}")
    return name


@dataclass(frozen=True, slots=True)
class TopicName:
    """A persistent topic: `persistent://tenant/namespace/local`."""

    namespace: NamespaceName
    local: str

    def __str__(self) -> str:
        return f"persistent://{self.namespace}/{self.local}"

    @property
    def rest_path(self) -> str:
        """The topic as the admin REST API wants it after `/admin/v2/`:
        `persistent/tenant/namespace/<local, percent-encoded>`."""
        return f"persistent/{self.namespace}/{quote_path_segment(self.local)}"


def quote_path_segment(text: str) -> str:
    """Percent-encode `text` for one URL path segment, keeping only RFC 3986 unreserved
    characters (`A-Z a-z 0-9 _ . - ~`); like `urllib.parse.quote(text, safe="~-._")`."""
    return "".join(
        chr(b) if b in _URL_UNRESERVED else f"%{b:02X}"
        for b in text.encode("utf-8", "surrogatepass")
    )


def exchange_topic(
    namespace: NamespaceName, exchange: str, exchange_type: str, routing_key: str
) -> TopicName:
    """The topic that holds the messages published to `exchange` with `routing_key`.

    Direct exchanges (and the default exchange `""`, which is direct whatever
    `exchange_type` says) have one topic per routing key: `E(exchange)~~E(routing_key)`, with
    `amq.default` for the default exchange's name. Every other type (fanout, topic, headers,
    plugins' types) has one topic per exchange, `E(exchange)`, and the routing key is not in
    the name: the proxy filters per binding when it reads.
    """
    if exchange == "":
        return TopicName(namespace, DEFAULT_EXCHANGE_TOPIC_NAME + SEPARATOR + escape(routing_key))
    if exchange_type == DIRECT_EXCHANGE_TYPE:
        return TopicName(namespace, escape(exchange) + SEPARATOR + escape(routing_key))
    return TopicName(namespace, escape(exchange))


@functools.lru_cache(maxsize=_NAME_CACHE_SIZE)
def parse_exchange_topic(local: str) -> tuple[str, str | None]:
    """(exchange, routing key) from a topic's local name; the key is None for a topic of a
    whole exchange (fanout, topic, headers). Splits at the first `~~`; `amq.default` is the
    default exchange `""`.

    Raises ValueError when `local` is not a name `exchange_topic` makes.
    """
    exchange_part, separator, key_part = local.partition(SEPARATOR)
    if exchange_part == DEFAULT_EXCHANGE_TOPIC_NAME:
        exchange = ""
    elif exchange_part == "":
        raise ValueError(f"{local!r} is not an exchange topic: no exchange name")
    else:
        exchange = unescape(exchange_part)
    return exchange, (unescape(key_part) if separator else None)


PRIORITY_BAND_TOPIC_PREFIX = "amq.priority"
"""How priority band topics start: `amq.priority~~E(queue)~~<band>`. No exchange topic
starts with it (users cannot declare `amq.*` exchanges and no built-in one has this name),
and `parse_exchange_topic` rejects the name (`~~` is not in an escaped key)."""


def priority_band_topic(namespace: NamespaceName, queue: str, band: int) -> TopicName:
    """The topic of one priority band of a priority queue (model/priorities.py): the proxy
    writes a message routed to the queue there, in the band of its priority."""
    return TopicName(
        namespace, PRIORITY_BAND_TOPIC_PREFIX + SEPARATOR + escape(queue) + SEPARATOR + str(band)
    )


def parse_priority_band_topic(local: str) -> tuple[str, int] | None:
    """(queue, band) from a band topic's local name; None for any other topic."""
    prefix, _, rest = local.partition(SEPARATOR)
    if prefix != PRIORITY_BAND_TOPIC_PREFIX:
        return None
    queue_part, separator, band = rest.partition(SEPARATOR)
    if not separator or not band.isdigit() or band != str(int(band)):
        return None
    try:
        return unescape(queue_part), int(band)
    except ValueError:
        return None


@functools.lru_cache(maxsize=_NAME_CACHE_SIZE)
def exchange_and_key_of_topic(local: str) -> tuple[str, str | None]:
    """Like `parse_exchange_topic`, but (exchange, None) for a binding topic
    (`binding_topic`), and ("", None) for a topic that is not an exchange's (a priority
    band, a Pulsar-native topic): the message's own properties say then."""
    binding = parse_binding_topic(local)
    if binding is not None:
        return binding[0], None
    try:
        return parse_exchange_topic(local)
    except ValueError:
        return "", None


OWN_TOPIC_EXCHANGE_TYPES = frozenset({"topic", "headers"})
"""Exchange types whose bindings each get a topic of their own (`binding_topic`): the
publishing proxy evaluates the bindings and writes a message only to the topics of the
queues it routes to, so the work per message does not grow with the number of bindings.
Direct exchanges already have a topic per routing key, and a fanout routes every message
to every binding, so one topic read by every binding's subscription wastes nothing there."""


def binding_topic(
    namespace: NamespaceName, exchange: str, queue: str, binding_set_id: str
) -> TopicName:
    """The topic of one queue's bindings to a topic or headers exchange:
    `E(exchange)~~E(queue)~~<binding set id>`, the id being the one in the binding's
    subscription name (`subscription_name`), new each time the queue is bound again after
    an unbind. Every message written there was routed to that queue by one of those
    bindings. Raises ValueError for an id that is not 12 lowercase hex characters."""
    if not _BINDING_SET_ID.fullmatch(binding_set_id):
        raise ValueError(f"binding set id {binding_set_id!r} is not 12 lowercase hex characters")
    return TopicName(
        namespace, escape(exchange) + SEPARATOR + escape(queue) + SEPARATOR + binding_set_id
    )


@functools.lru_cache(maxsize=_NAME_CACHE_SIZE)
def parse_binding_topic(local: str) -> tuple[str, str, str] | None:
    """(exchange, queue, binding set id) from a local name `binding_topic` makes; None for
    any other name (a direct exchange's `E(x)~~E(k)` has one separator, a priority band
    starts with `amq.priority`)."""
    parts = local.split(SEPARATOR)
    if len(parts) != 3 or parts[0] in ("", PRIORITY_BAND_TOPIC_PREFIX, DEFAULT_EXCHANGE_TOPIC_NAME):
        return None
    if not _BINDING_SET_ID.fullmatch(parts[2]):
        return None
    try:
        return unescape(parts[0]), unescape(parts[1]), parts[2]
    except ValueError:
        return None


def new_binding_set_id() -> str:
    """A fresh binding set id: 12 random lowercase hex characters (48 bits)."""
    return secrets.token_hex(6)


def subscription_name(queue: str, binding_set_id: str) -> str:
    """The Pulsar subscription of `queue`'s bindings on one topic: `E(queue)~~<id>`.

    The id changes when the queue is bound again after an unbind, so the new binding does
    not inherit the old subscription's cursor. Raises ValueError when `binding_set_id` is
    not 12 lowercase hex characters.
    """
    if not _BINDING_SET_ID.fullmatch(binding_set_id):
        raise ValueError(f"binding set id {binding_set_id!r} is not 12 lowercase hex characters")
    return escape(queue) + SEPARATOR + binding_set_id


def parse_subscription_name(name: str) -> tuple[str, str]:
    """(queue, binding set id) from a subscription name made by `subscription_name`.

    Raises ValueError for any other name (Pulsar's own `__compaction`, a Pulsar-native
    consumer's subscription).
    """
    queue_part, separator, binding_set_id = name.partition(SEPARATOR)
    if not separator or not _BINDING_SET_ID.fullmatch(binding_set_id):
        raise ValueError(f"{name!r} is not a binding subscription name (queue~~<12 hex>)")
    return unescape(queue_part), binding_set_id
