"""Policies as RabbitMQ 3.10 has them: a named regular expression that gives matching queues
and exchanges of a vhost settings (`message-ttl`, `dead-letter-exchange`, ...) they were not
declared with.

Theory of operation: at most ONE policy applies to a queue or exchange - among the policies
whose `pattern` (a regular expression, searched in the name) matches and whose `apply-to`
fits, the one with the highest `priority`; RabbitMQ leaves ties to the order its table
returns, here the first name in sort order wins. What the object then does is the
combination of its declared arguments and the policy's definition by RabbitMQ's rules
(rabbit_amqqueue_process's `res_min` / `res_arg`): for limits and times the smaller value
wins, for names and modes the declared argument wins. `effective_queue_arguments` writes the
combination as the `x-` arguments the features already read, so they need not know
policies exist; equivalence checks of a redeclaration keep comparing declared arguments
only, as RabbitMQ does.

Validation gives RabbitMQ's texts (its `rabbit_policies:validate_policy0`), as its HTTP API
and `rabbitmqctl set_policy` show them after "Validation failed".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlight_py.model.streams import is_stream
from starlight_py.model.topology import ALTERNATE_EXCHANGE_ARGUMENT

APPLY_TO = ("queues", "exchanges", "all")


class PolicyInvalid(ValueError):
    """A policy RabbitMQ would refuse; the message is RabbitMQ's reason."""


def erlang_term(value: Any) -> str:
    """A JSON value as RabbitMQ's `~p` prints it in its validation messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f'<<"{value}">>'
    if isinstance(value, list):
        return "[" + ",".join(erlang_term(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "[" + ",".join(f"{{{erlang_term(k)},{erlang_term(v)}}}" for k, v in value.items()) + "]"
        )
    return str(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _non_negative(value: Any) -> bool:
    return _is_int(value) and value >= 0


def _positive(value: Any) -> bool:
    return _is_int(value) and value > 0


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _overflow(value: Any) -> bool:
    return value in ("drop-head", "reject-publish", "reject-publish-dlx")


def _queue_mode(value: Any) -> bool:
    return value in ("default", "lazy")


# key -> (is the value valid, RabbitMQ's text for one that is not).
DEFINITION_KEYS: dict[str, tuple[Any, str]] = {
    "alternate-exchange": (_is_text, "is not a valid alternate exchange name"),
    "dead-letter-exchange": (_is_text, "is not a valid dead letter exchange name"),
    "dead-letter-routing-key": (_is_text, "is not a valid dead letter routing key"),
    "message-ttl": (_non_negative, "is not a valid message TTL"),
    "expires": (_positive, "is not a valid queue expiry"),
    "max-length": (_non_negative, "is not a valid maximum length"),
    "max-length-bytes": (_non_negative, "is not a valid maximum length in bytes"),
    "overflow": (_overflow, "is not a valid overflow value"),
    "delivery-limit": (_non_negative, "is not a valid delivery limit"),
    "queue-mode": (_queue_mode, "is not a valid queue-mode value"),
}

# Keys RabbitMQ 3.10 accepts that starlight-py cannot apply (mirroring, federation, stream
# and quorum placement, memory limits): refused with a reason of our own, never ignored.
UNSUPPORTED_KEYS = frozenset(
    {
        "ha-mode",
        "ha-params",
        "ha-sync-mode",
        "ha-sync-batch-size",
        "ha-promote-on-shutdown",
        "ha-promote-on-failure",
        "federation-upstream",
        "federation-upstream-set",
        "queue-master-locator",
        "queue-leader-locator",
        "max-in-memory-length",
        "max-in-memory-bytes",
        "max-age",
        "stream-max-segment-size-bytes",
        "dead-letter-strategy",
        "initial-cluster-size",
        "consumer-timeout",
    }
)

# How a policy key combines with the queue argument it stands for (RabbitMQ 3.10's
# rabbit_amqqueue_process:process_args_policy and rabbit_quorum_queue).
SMALLER_WINS = ("message-ttl", "expires", "max-length", "max-length-bytes", "delivery-limit")
ARGUMENT_WINS = ("dead-letter-exchange", "dead-letter-routing-key", "overflow", "queue-mode")


@dataclass(frozen=True)
class Policy:
    vhost: str
    name: str
    pattern: str
    definition: dict[str, Any] = field(default_factory=dict)
    apply_to: str = "all"
    priority: int | float = 0

    def applies_to(self, kind: str, name: str) -> bool:
        """Does it match a queue (`kind` "queues") or exchange ("exchanges") of this name?"""
        if self.apply_to not in ("all", kind):
            return False
        return re.search(self.pattern, name) is not None

    def to_json(self) -> dict[str, Any]:
        """RabbitMQ's JSON shape (HTTP API and definitions)."""
        return {
            "vhost": self.vhost,
            "name": self.name,
            "pattern": self.pattern,
            "apply-to": self.apply_to,
            "definition": dict(self.definition),
            "priority": self.priority,
        }


def _failed(reason: str) -> PolicyInvalid:
    return PolicyInvalid(f"Validation failed\n\n{reason}\n")


def parse_policy(vhost: str, name: str, body: Mapping[str, Any]) -> Policy:
    """A policy from its JSON (the HTTP API's PUT body, a definitions entry). Raises
    PolicyInvalid with RabbitMQ's reason."""
    missing = [key for key in ("pattern", "definition") if key not in body]
    if missing:
        raise PolicyInvalid("[" + ",".join(f"{{key_missing,{key}}}" for key in missing) + "]")
    pattern, definition = body["pattern"], body["definition"]
    apply_to = body.get("apply-to", "all")
    priority = body.get("priority", 0)
    if not isinstance(pattern, str):
        raise _failed(f"pattern should be a binary but was {erlang_term(pattern)}")
    try:
        re.compile(pattern)
    except re.error as e:
        raise _failed(f"pattern should be regular expression but is invalid: {e}") from e
    if apply_to not in APPLY_TO:
        raise _failed(
            f"apply-to '{apply_to}' unrecognised; should be 'queues', 'exchanges' or 'all'"
        )
    if isinstance(priority, bool) or not isinstance(priority, int | float):
        raise _failed(f"priority should be a number, actually was {erlang_term(priority)}")
    if not isinstance(definition, dict):
        raise _failed(f"{erlang_term(definition)} is not a valid policy definition")
    check_definition(definition)
    return Policy(vhost, name, pattern, dict(definition), apply_to, priority)


def unsupported_keys(definition: Mapping[str, Any]) -> list[str]:
    """The keys of a definition that RabbitMQ knows and starlight-py cannot apply."""
    return sorted(key for key in definition if key in UNSUPPORTED_KEYS)


def check_definition(definition: Mapping[str, Any]) -> None:
    """Raises PolicyInvalid for a definition RabbitMQ refuses (empty, unknown keys, bad
    values) or one starlight-py cannot apply (UNSUPPORTED_KEYS)."""
    if not definition:
        raise _failed("no policy provided")
    unknown = {k: v for k, v in sorted(definition.items()) if k not in DEFINITION_KEYS}
    recognised = {k: v for k, v in unknown.items() if k in UNSUPPORTED_KEYS}
    if len(recognised) < len(unknown):
        strange = {k: v for k, v in unknown.items() if k not in UNSUPPORTED_KEYS}
        raise _failed(f"{erlang_term(strange)} are not recognised policy settings")
    if recognised:
        raise _failed(
            f"{', '.join(recognised)} not supported by starlight-py (docs/mapping.md, Policies)"
        )
    for key, value in definition.items():
        valid, reason = DEFINITION_KEYS[key]
        if not valid(value):
            raise _failed(f"{erlang_term(value)} {reason}")


def matching_policy(policies: Iterable[Policy], kind: str, name: str) -> Policy | None:
    """The one policy that applies to the queue or exchange `name` (`kind` "queues" or
    "exchanges"): the highest priority among those that match; on a tie the first name."""
    best: Policy | None = None
    for policy in policies:
        if not policy.applies_to(kind, name):
            continue
        if (
            best is None
            or policy.priority > best.priority
            or (policy.priority == best.priority and policy.name < best.name)
        ):
            best = policy
    return best


def effective_queue_arguments(
    arguments: Mapping[str, Any], definition: Mapping[str, Any]
) -> dict[str, Any]:
    """The queue's arguments with its policy's definition combined in (as `x-` arguments),
    by RabbitMQ 3.10's precedence."""
    combined = dict(arguments)
    # A stream takes only its retention from a policy (RabbitMQ 3.10's stream queues read
    # max-length-bytes, max-age and segment size; the others do not apply to streams).
    smaller_wins = ("max-length-bytes",) if is_stream(arguments) else SMALLER_WINS
    argument_wins = () if is_stream(arguments) else ARGUMENT_WINS
    for key in smaller_wins:
        if key in definition:
            declared = combined.get(f"x-{key}")
            value = definition[key]
            valid = _is_int(declared)
            combined[f"x-{key}"] = min(declared, value) if valid else value
    for key in argument_wins:
        if key in definition:
            combined.setdefault(f"x-{key}", definition[key])
    return combined


def effective_exchange_arguments(
    arguments: Mapping[str, Any], definition: Mapping[str, Any]
) -> dict[str, Any]:
    """The exchange's arguments with its policy's `alternate-exchange` (the declared
    argument wins, as in RabbitMQ's rabbit_policy:get_arg)."""
    combined = dict(arguments)
    if ALTERNATE_EXCHANGE_ARGUMENT in definition:
        combined.setdefault(ALTERNATE_EXCHANGE_ARGUMENT, definition[ALTERNATE_EXCHANGE_ARGUMENT])
    return combined
