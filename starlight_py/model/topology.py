"""Exchanges, queues and bindings as values, with RabbitMQ's rules for them.

The rules live here, not in the gateway: name validation (the `amq.` prefix is reserved),
equivalence of a redeclaration (406 PRECONDITION_FAILED "inequivalent arg ..."), and the
validation of queue arguments (`x-message-ttl`, `x-expires`, ...), with RabbitMQ's reply
texts so that clients and operators see what they would see on RabbitMQ.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlight_py.amqp.errors import (
    AccessRefused,
    CommandInvalid,
    PreconditionFailed,
    ResourceLocked,
)
from starlight_py.amqp.method_ids import (
    EXCHANGE_DECLARE,
    EXCHANGE_DELETE,
    QUEUE_BIND,
    QUEUE_DECLARE,
)
from starlight_py.model.streams import (
    check_stream_declare,
    duration_seconds,
    is_stream,
)
from starlight_py.model.text import as_text

FieldTable = dict[str, Any]

# The types that route; x-delayed-message (RabbitMQ's delayed-message plugin) routes like
# the type named by its `x-delayed-type` argument, after the message's `x-delay`.
ROUTING_EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
DELAYED_EXCHANGE_TYPE = "x-delayed-message"
EXCHANGE_TYPES = (*ROUTING_EXCHANGE_TYPES, DELAYED_EXCHANGE_TYPE)
ALTERNATE_EXCHANGE_ARGUMENT = "alternate-exchange"
DELAYED_TYPE_ARGUMENT = "x-delayed-type"
# Created with every vhost, as RabbitMQ does.
PREDECLARED_EXCHANGES = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)
RESERVED_PREFIX = "amq."
DEFAULT_EXCHANGE = ""


def _bool(value: bool) -> str:
    return "true" if value else "false"


@dataclass(frozen=True)
class Exchange:
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: FieldTable = field(default_factory=dict)

    @property
    def routing_type(self) -> str:
        """The type whose rules route this exchange's messages and name its topics: the
        type itself, or the `x-delayed-type` of an x-delayed-message exchange."""
        if self.type == DELAYED_EXCHANGE_TYPE:
            return as_text(self.arguments.get(DELAYED_TYPE_ARGUMENT, ""))
        return self.type

    @property
    def delays_messages(self) -> bool:
        """Messages published to it wait for their `x-delay` header (milliseconds)."""
        return self.type == DELAYED_EXCHANGE_TYPE

    @property
    def alternate_exchange(self) -> str | None:
        """Where messages it cannot route go (its `alternate-exchange` argument)."""
        value = self.arguments.get(ALTERNATE_EXCHANGE_ARGUMENT)
        return as_text(value) if isinstance(value, str | bytes) else None

    def check_equivalent(self, other: Exchange, vhost: str) -> None:
        """Raises PreconditionFailed when `other` (a redeclaration) differs from this one."""
        pairs = (
            ("type", other.type, self.type),
            ("durable", _bool(other.durable), _bool(self.durable)),
            ("auto_delete", _bool(other.auto_delete), _bool(self.auto_delete)),
            ("internal", _bool(other.internal), _bool(self.internal)),
        )
        for arg, received, current in pairs:
            if received != current:
                raise PreconditionFailed(
                    f"inequivalent arg '{arg}' for exchange '{self.name}' in vhost '{vhost}': "
                    f"received '{received}' but current is '{current}'",
                    EXCHANGE_DECLARE,
                )
        _check_args_equivalent(
            "exchange",
            self.name,
            vhost,
            (ALTERNATE_EXCHANGE_ARGUMENT, DELAYED_TYPE_ARGUMENT),
            other.arguments,
            self.arguments,
            EXCHANGE_DECLARE,
        )


@dataclass(frozen=True)
class Queue:
    name: str
    durable: bool = True
    exclusive: bool = False
    auto_delete: bool = False
    arguments: FieldTable = field(default_factory=dict)
    # The connection that owns an exclusive queue ("proxy-id/conn-id"); None otherwise.
    owner: str | None = None

    def check_equivalent(self, other: Queue, vhost: str) -> None:
        """Raises PreconditionFailed when `other` (a redeclaration) differs from this one."""
        if other.exclusive != self.exclusive:
            raise queue_locked(self.name, vhost, QUEUE_DECLARE)
        pairs = (
            ("durable", other.durable, self.durable),
            ("auto_delete", other.auto_delete, self.auto_delete),
        )
        for arg, received, current in pairs:
            if received != current:
                raise PreconditionFailed(
                    f"inequivalent arg '{arg}' for queue '{self.name}' in vhost '{vhost}': "
                    f"received '{_bool(received)}' but current is '{_bool(current)}'",
                    QUEUE_DECLARE,
                )
        _check_args_equivalent(
            "queue",
            self.name,
            vhost,
            tuple(QUEUE_ARGUMENTS),
            other.arguments,
            self.arguments,
            QUEUE_DECLARE,
        )


def queue_locked(name: str, vhost: str, method: tuple[int, int]) -> ResourceLocked:
    return ResourceLocked(
        f"cannot obtain exclusive access to locked queue '{name}' in vhost '{vhost}'. It could "
        "be originally declared on another connection or the exclusive property value does "
        "not match that of the original declaration.",
        method,
    )


def _check_args_equivalent(
    kind: str,
    name: str,
    vhost: str,
    keys: tuple[str, ...],
    received: Mapping[str, Any],
    current: Mapping[str, Any],
    method: tuple[int, int],
) -> None:
    # RabbitMQ compares only the arguments it knows; an unknown x-foo may differ freely.
    for key in keys:
        # The default counts when comparing; the reply text shows what was really sent.
        default = ARGUMENT_DEFAULTS.get(key)
        new, old = received.get(key), current.get(key)
        if _normalise(default if new is None else new) == _normalise(
            default if old is None else old
        ):
            continue
        if new is not None and old is not None:
            detail = f"received '{_show(new)}' but current is '{_show(old)}'"
        elif new is not None:
            detail = (
                f"received the value '{_show(new)}' of type '{wire_type(new)}' but current is none"
            )
        else:
            detail = (
                f"received none but current is the value '{_show(old)}' of type '{wire_type(old)}'"
            )
        raise PreconditionFailed(
            f"inequivalent arg '{key}' for {kind} '{name}' in vhost '{vhost}': {detail}", method
        )


# RabbitMQ treats an absent argument like its default when comparing declarations.
ARGUMENT_DEFAULTS: dict[str, Any] = {"x-queue-type": "classic"}


def _normalise(value: Any) -> Any:
    # A longstr and a binary (bytearray) with the same bytes are equivalent to RabbitMQ.
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8", "replace")
    return value


def _show(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, bool):
        return _bool(value)
    return str(value)


def wire_type(value: Any) -> str:
    """The AMQP field type name RabbitMQ reports for a value (as pika/pamqp encode it)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, bytearray):
        return "binary"  # pamqp decodes the byte-array type 'x' to a bytearray
    if isinstance(value, str | bytes):
        return "longstr"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, float):
        return "double"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "void"
    return type(value).__name__.lower()


# ---- names ----------------------------------------------------------------------------------


def check_not_default_exchange(name: str, method: tuple[int, int]) -> None:
    if name == DEFAULT_EXCHANGE:
        raise AccessRefused("operation not permitted on the default exchange", method)


def check_exchange_name_creatable(name: str) -> None:
    """Raises AccessRefused for a new exchange with the reserved prefix (an existing amq.*
    exchange may be redeclared equivalently, as on RabbitMQ)."""
    if name.startswith(RESERVED_PREFIX):
        raise AccessRefused(
            f"exchange name '{name}' contains reserved prefix '{RESERVED_PREFIX}*'",
            EXCHANGE_DECLARE,
        )


def check_exchange_deletable(name: str, vhost: str) -> None:
    check_not_default_exchange(name, EXCHANGE_DELETE)
    if name.startswith(RESERVED_PREFIX):
        raise AccessRefused(
            f"deletion of system exchange '{name}' in vhost '{vhost}' not allowed", EXCHANGE_DELETE
        )


def check_queue_name_declarable(name: str) -> None:
    if name.startswith(RESERVED_PREFIX):
        raise AccessRefused(
            f"queue name '{name}' contains reserved prefix '{RESERVED_PREFIX}*'", QUEUE_DECLARE
        )


def check_exchange_type(type_name: str) -> None:
    """Raises CommandInvalid (503, a connection error as in RabbitMQ) for unknown types."""
    if type_name not in EXCHANGE_TYPES:
        raise CommandInvalid(f"unknown exchange type '{type_name}'", EXCHANGE_DECLARE)


def validate_exchange(exchange: Exchange, vhost: str) -> None:
    """The checks RabbitMQ makes of a declared exchange's type and arguments (the delayed
    message plugin's for x-delayed-message). Raises CommandInvalid (unknown type, also as
    x-delayed-type) or PreconditionFailed (a bad argument)."""
    check_exchange_type(exchange.type)
    alternate = exchange.arguments.get(ALTERNATE_EXCHANGE_ARGUMENT)
    if alternate is not None and not isinstance(alternate, str | bytes):
        raise PreconditionFailed(
            f"invalid type '{wire_type(alternate)}' for arg '{ALTERNATE_EXCHANGE_ARGUMENT}' in "
            f"exchange '{exchange.name}' in vhost '{vhost}'",
            EXCHANGE_DECLARE,
        )
    if not exchange.delays_messages:
        return
    delayed_type = exchange.arguments.get(DELAYED_TYPE_ARGUMENT)
    if not isinstance(delayed_type, str | bytes):
        raise PreconditionFailed(
            f"Invalid argument, '{DELAYED_TYPE_ARGUMENT}' must be an existing exchange type",
            EXCHANGE_DECLARE,
        )
    if as_text(delayed_type) == DELAYED_EXCHANGE_TYPE:
        raise PreconditionFailed(
            f"Invalid argument, '{DELAYED_TYPE_ARGUMENT}' can't be '{DELAYED_EXCHANGE_TYPE}'",
            EXCHANGE_DECLARE,
        )
    if as_text(delayed_type) not in ROUTING_EXCHANGE_TYPES:
        raise CommandInvalid(f"unknown exchange type '{as_text(delayed_type)}'", EXCHANGE_DECLARE)


# RabbitMQ's delayed-message plugin reads the delay from this header, in milliseconds.
DELAY_HEADER = "x-delay"


def message_delay_ms(headers: Mapping[str, Any] | None) -> int:
    """The delay a message asks of an x-delayed-message exchange: its integer `x-delay`
    header in milliseconds; 0 (deliver now) when absent, negative or not an integer."""
    # As the plugin: a string such as "500" is no delay.
    value: Any = (headers or {}).get(DELAY_HEADER)
    return max(0, int(value)) if _is_int(value) else 0


# ---- queue arguments (RabbitMQ's declare_args) ------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# RabbitMQ's limit for x-message-ttl and x-expires: ten years, in milliseconds.
MAX_EXPIRY = 315_360_000_000


def _unacceptable_type(value: Any) -> str:
    return f"{{unacceptable_type,{wire_type(value)}}}"


def _integer(value: Any) -> str | None:
    if not _is_int(value):
        return f'"expected integer, got {wire_type(value)}"'
    if value < 0:
        return f"{{value_negative,{value}}}"
    return None


def _expiry(value: Any) -> str | None:
    problem = _integer(value)
    if problem is None and value > MAX_EXPIRY:
        return f"{{value_too_large,{value}}}"
    return problem


def _positive_expiry(value: Any) -> str | None:
    if _is_int(value) and value == 0:
        return "{value_zero,0}"
    return _expiry(value)


def _string(value: Any) -> str | None:
    return None if isinstance(value, str | bytes) else _unacceptable_type(value)


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else _unacceptable_type(value)


def _max_priority(value: Any) -> str | None:
    problem = _integer(value)
    if problem is None and value > 255:
        return f"{{max_value_exceeded,{value}}}"
    return problem


def _max_age(value: Any) -> str | None:
    if not isinstance(value, str | bytes):
        return _unacceptable_type(value)
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return None if duration_seconds(text) is not None else "invalid_max_age"


def _one_of(reason: str, *allowed: str) -> Callable[[Any], str | None]:
    """`reason` is the text for a value not allowed; `{}` in it stands for the value."""

    def check(value: Any) -> str | None:
        if not isinstance(value, str | bytes):
            return _unacceptable_type(value)
        text = value.decode() if isinstance(value, bytes) else value
        return None if text in allowed else reason.format(text)

    return check


QUEUE_ARGUMENTS: dict[str, Callable[[Any], str | None]] = {
    "x-expires": _positive_expiry,
    "x-message-ttl": _expiry,
    "x-dead-letter-exchange": _string,
    "x-dead-letter-routing-key": _string,
    "x-max-length": _integer,
    "x-max-length-bytes": _integer,
    "x-max-priority": _max_priority,
    "x-overflow": _one_of("invalid_overflow", "drop-head", "reject-publish", "reject-publish-dlx"),
    "x-queue-mode": _one_of("\"unsupported queue mode '{}'\"", "default", "lazy"),
    "x-queue-type": _one_of("\"unsupported queue type '{}'\"", "classic", "quorum", "stream"),
    "x-max-age": _max_age,
    "x-stream-max-segment-size-bytes": _integer,
    "x-single-active-consumer": _boolean,
    "x-delivery-limit": _integer,
}


def validate_queue_arguments(name: str, vhost: str, arguments: Mapping[str, Any]) -> None:
    """Raises PreconditionFailed with RabbitMQ 3.10's text for an argument it would refuse."""
    # RabbitMQ's channel checks the dead-letter exchange's type first, in its own words; the
    # queue then checks the arguments in QUEUE_ARGUMENTS' order.
    dead_letter_exchange = arguments.get("x-dead-letter-exchange", "")
    if not isinstance(dead_letter_exchange, str | bytes):
        raise PreconditionFailed(
            f"invalid type '{wire_type(dead_letter_exchange)}' for arg 'x-dead-letter-exchange' "
            f"in queue '{name}' in vhost '{vhost}'",
            QUEUE_DECLARE,
        )
    for key, check in QUEUE_ARGUMENTS.items():
        if key not in arguments:
            continue
        problem = check(arguments[key])
        if (
            problem is None
            and key == "x-dead-letter-routing-key"
            and "x-dead-letter-exchange" not in arguments
        ):
            problem = "routing_key_but_no_dlx_defined"
        if problem is not None:
            raise PreconditionFailed(
                f"invalid arg '{key}' for queue '{name}' in vhost '{vhost}': {problem}",
                QUEUE_DECLARE,
            )


def validate_queue(queue: Queue, vhost: str) -> None:
    """Every check RabbitMQ makes of a declared queue: its arguments one by one, then what
    its type refuses (a stream's other arguments and properties). Raises
    PreconditionFailed."""
    validate_queue_arguments(queue.name, vhost, queue.arguments)
    if is_stream(queue.arguments):
        check_stream_declare(
            queue.name,
            vhost,
            queue.durable,
            queue.exclusive,
            queue.auto_delete,
            queue.arguments,
        )


HEADERS_MATCH_VALUES = ("all", "any", "all-with-x", "any-with-x")


def validate_binding_arguments(exchange: Exchange, arguments: Mapping[str, Any]) -> None:
    """Headers exchanges accept only the x-match values RabbitMQ knows."""
    if exchange.routing_type != "headers" or "x-match" not in arguments:
        return
    value = arguments["x-match"]
    if not isinstance(value, str | bytes):
        raise PreconditionFailed(
            f"Invalid x-match field type {wire_type(value)} (value {_show(value)}); "
            "expected longstr",
            QUEUE_BIND,
        )
    text = value.decode() if isinstance(value, bytes) else value
    if text not in HEADERS_MATCH_VALUES:
        raise PreconditionFailed(
            f'Invalid x-match field value <<"{text}">>; expected all, any, all-with-x, '
            "or any-with-x",
            QUEUE_BIND,
        )
