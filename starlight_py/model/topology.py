"""Exchanges, queues and bindings as values, with RabbitMQ's rules for them.

The rules live here, not in the gateway: name validation (the `amq.` prefix is reserved),
equivalence of a redeclaration (406 PRECONDITION_FAILED "inequivalent arg ..."), and the
validation of queue arguments (`x-message-ttl`, `x-expires`, ...), with RabbitMQ's reply
texts so that clients and operators see what they would see on RabbitMQ.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlight_py.amqp.errors import (
    AccessRefused,
    CommandInvalid,
    PreconditionFailed,
)

FieldTable = dict[str, Any]

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
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
                    (40, 10),
                )
        _check_args_equivalent(
            "exchange",
            self.name,
            vhost,
            ("alternate-exchange",),
            other.arguments,
            self.arguments,
            (40, 10),
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
        pairs = (
            ("durable", other.durable, self.durable),
            ("exclusive", other.exclusive, self.exclusive),
            ("auto_delete", other.auto_delete, self.auto_delete),
        )
        for arg, received, current in pairs:
            if received != current:
                raise PreconditionFailed(
                    f"inequivalent arg '{arg}' for queue '{self.name}' in vhost '{vhost}': "
                    f"received '{_bool(received)}' but current is '{_bool(current)}'",
                    (50, 10),
                )
        _check_args_equivalent(
            "queue",
            self.name,
            vhost,
            tuple(QUEUE_ARGUMENTS),
            other.arguments,
            self.arguments,
            (50, 10),
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
        new, old = received.get(key), current.get(key)
        if _normalise(new) != _normalise(old):
            shown_new = "none" if new is None else f"the value '{_show(new)}'"
            shown_old = "none" if old is None else f"the value '{_show(old)}'"
            raise PreconditionFailed(
                f"inequivalent arg '{key}' for {kind} '{name}' in vhost '{vhost}': "
                f"received {shown_new} but current is {shown_old}",
                method,
            )


def _normalise(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def _show(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, bool):
        return _bool(value)
    return str(value)


# ---- names ----------------------------------------------------------------------------------


def check_exchange_name_declarable(name: str, method: tuple[int, int]) -> None:
    """Raises AccessRefused for names clients may not declare or delete."""
    if name == DEFAULT_EXCHANGE:
        raise AccessRefused("operation not permitted on the default exchange", method)
    if name.startswith(RESERVED_PREFIX):
        raise AccessRefused(
            f"exchange name '{name}' contains reserved prefix '{RESERVED_PREFIX}*'", method
        )


def check_queue_name_declarable(name: str) -> None:
    if name.startswith(RESERVED_PREFIX):
        raise AccessRefused(
            f"queue name '{name}' contains reserved prefix '{RESERVED_PREFIX}*'", (50, 10)
        )


def check_exchange_type(type_name: str) -> None:
    """Raises CommandInvalid (503, a connection error as in RabbitMQ) for unknown types."""
    if type_name not in EXCHANGE_TYPES:
        raise CommandInvalid(f"unknown exchange type '{type_name}'", (40, 10))


# ---- queue arguments (RabbitMQ's declare_args) ------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _non_negative_int(value: Any) -> str | None:
    if not _is_int(value):
        return f"{{unacceptable_type,{_type_name(value)}}}"
    if value < 0:
        return f"{{value_negative,{value}}}"
    return None


def _positive_int(value: Any) -> str | None:
    problem = _non_negative_int(value)
    if problem is None and value == 0:
        return "{value_zero,0}"
    return problem


def _string(value: Any) -> str | None:
    return None if isinstance(value, str | bytes) else f"{{unacceptable_type,{_type_name(value)}}}"


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"{{unacceptable_type,{_type_name(value)}}}"


def _max_priority(value: Any) -> str | None:
    problem = _non_negative_int(value)
    if problem is None and value > 255:
        return f"{{value_too_large,{value},255}}"
    return problem


def _one_of(*allowed: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if not isinstance(value, str | bytes):
            return f"{{unacceptable_type,{_type_name(value)}}}"
        text = value.decode() if isinstance(value, bytes) else value
        return None if text in allowed else f'{{invalid_value,<<"{text}">>}}'

    return check


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str | bytes):
        return "longstr"
    if isinstance(value, float):
        return "double"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "void"
    return type(value).__name__


QUEUE_ARGUMENTS: dict[str, Callable[[Any], str | None]] = {
    "x-expires": _positive_int,
    "x-message-ttl": _non_negative_int,
    "x-dead-letter-exchange": _string,
    "x-dead-letter-routing-key": _string,
    "x-max-length": _non_negative_int,
    "x-max-length-bytes": _non_negative_int,
    "x-max-priority": _max_priority,
    "x-overflow": _one_of("drop-head", "reject-publish", "reject-publish-dlx"),
    "x-queue-mode": _one_of("default", "lazy"),
    "x-queue-type": _one_of("classic", "quorum"),
    "x-single-active-consumer": _boolean,
    "x-delivery-limit": _non_negative_int,
}


def validate_queue_arguments(name: str, vhost: str, arguments: Mapping[str, Any]) -> None:
    """Raises PreconditionFailed with RabbitMQ's text for an argument it would refuse."""
    for key, check in QUEUE_ARGUMENTS.items():
        if key in arguments:
            problem = check(arguments[key])
            if problem is not None:
                raise PreconditionFailed(
                    f"invalid arg '{key}' for queue '{name}' in vhost '{vhost}': {problem}",
                    (50, 10),
                )
    if "x-dead-letter-routing-key" in arguments and "x-dead-letter-exchange" not in arguments:
        raise PreconditionFailed(
            f"invalid arg 'x-dead-letter-routing-key' for queue '{name}' in vhost '{vhost}': "
            "Key x-dead-letter-exchange should be present",
            (50, 10),
        )


HEADERS_MATCH_VALUES = ("all", "any", "all-with-x", "any-with-x")


def validate_binding_arguments(exchange: Exchange, arguments: Mapping[str, Any]) -> None:
    """Headers exchanges accept only the x-match values RabbitMQ knows."""
    if exchange.type != "headers" or "x-match" not in arguments:
        return
    value = arguments["x-match"]
    text = value.decode() if isinstance(value, bytes) else value
    if text not in HEADERS_MATCH_VALUES:
        raise PreconditionFailed(
            f"Invalid x-match field value {_show(value)!r}; expected all, any, all-with-x, "
            "or any-with-x",
            (50, 20),
        )
