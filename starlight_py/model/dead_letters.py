"""Dead-lettering, message TTL and delivery limits, as RabbitMQ defines them (pure).

Theory of operation: a queue's arguments give it a `MessagePolicy` (dead-letter exchange and
routing key, `x-message-ttl`, `x-delivery-limit`). When a message is read for delivery, the
gateway asks `death_at_delivery` whether it died meanwhile (expired, or returned more often
than the limit allows); a message rejected without requeue dies with reason `rejected`. A
dead message goes to the dead-letter exchange with the properties `dead_lettered_properties`
computes (RabbitMQ's `x-death` and `x-first-death-*` headers, expiration removed), or is
dropped when the queue has no dead-letter exchange. Nothing here does I/O.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pamqp import commands

from starlight_py.model.text import as_text

REJECTED = "rejected"
EXPIRED = "expired"
DELIVERY_LIMIT = "delivery_limit"

DEATH_HEADER = "x-death"
FIRST_DEATH_REASON = "x-first-death-reason"
FIRST_DEATH_QUEUE = "x-first-death-queue"
FIRST_DEATH_EXCHANGE = "x-first-death-exchange"
# Publishers add routing keys with these headers (RabbitMQ's sender-selected distribution).
CC_HEADER = "CC"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _non_negative(value: Any) -> int | None:
    return value if _is_int(value) and value >= 0 else None


@dataclass(frozen=True, slots=True)
class MessagePolicy:
    """What a queue's arguments say about the end of its messages."""

    dead_letter_exchange: str | None = None  # "" is the default exchange
    dead_letter_routing_key: str | None = None
    message_ttl_ms: int | None = None
    delivery_limit: int | None = None

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> MessagePolicy:
        """The policy of validated queue arguments (values of the wrong type are ignored)."""
        exchange = arguments.get("x-dead-letter-exchange")
        key = arguments.get("x-dead-letter-routing-key")
        return cls(
            as_text(exchange) if isinstance(exchange, str | bytes) else None,
            as_text(key) if isinstance(key, str | bytes) else None,
            _non_negative(arguments.get("x-message-ttl")),
            _non_negative(arguments.get("x-delivery-limit")),
        )

    @property
    def checks_deliveries(self) -> bool:
        """Whether a delivery must be checked against the queue's TTL or delivery limit
        (per-message expiration is checked for every queue)."""
        return self.message_ttl_ms is not None or self.delivery_limit is not None


NO_POLICY = MessagePolicy()


def message_expiration_ms(expiration: str | bytes | None) -> int | None:
    """The per-message TTL of an `expiration` property (a string of milliseconds); None when
    absent or not a non-negative integer (RabbitMQ refuses those at publish)."""
    if expiration is None or expiration_problem(expiration) is not None:
        return None
    return int(as_text(expiration))


def expiration_problem(expiration: str | bytes) -> str | None:
    """Why RabbitMQ refuses an `expiration` property at publish (406 "invalid expiration
    '...': <this>"), in its words; None for a valid one (digits, maybe signed)."""
    text = as_text(expiration)
    sign = 1 if text[:1] != "-" else -1
    digits = text[1:] if text[:1] in "+-" and text else text
    count = len(digits) - len(digits.lstrip("0123456789"))
    if count == 0:
        return "no_integer"
    value = sign * int(digits[:count])
    if count < len(digits):
        return f'{{leftover_string,"{digits[count:]}"}}'
    if value < 0:
        return f"{{value_negative,{value}}}"
    return None


def expires_at_ms(
    published_ms: int, queue_ttl_ms: int | None, expiration_ms: int | None
) -> int | None:
    """When a message published at `published_ms` (epoch ms) expires: the smaller of the
    queue's TTL and the message's own; None when neither applies."""
    ttls = [t for t in (queue_ttl_ms, expiration_ms) if t is not None]
    return published_ms + min(ttls) if ttls else None


def death_at_delivery(
    policy: MessagePolicy,
    published_ms: int,
    expiration: str | bytes | None,
    redelivery_count: int,
    now_ms: int,
) -> str | None:
    """The reason a message read for delivery is dead (`expired`, `delivery_limit`), or None
    when it may be delivered. `published_ms` 0 means unknown (never expired by the queue's
    TTL). A delivery limit of N allows N returns: the message dies when it comes back the
    (N+1)th time, as on RabbitMQ's quorum queues."""
    if published_ms > 0:
        deadline = expires_at_ms(
            published_ms, policy.message_ttl_ms, message_expiration_ms(expiration)
        )
        if deadline is not None and now_ms > deadline:
            return EXPIRED
    if policy.delivery_limit is not None and redelivery_count > policy.delivery_limit:
        return DELIVERY_LIMIT
    return None


def next_expiry_look(
    now_ms: int, heads: list[int | None], ttl_ms: int | None, queue_empty: bool
) -> float | None:
    """Seconds until the queue must be looked at again, from the expiry times (ms, None for
    a head that never expires) of its subscriptions' heads; None: no expiry in sight (the
    caller decides whether to poll). An empty queue with a TTL: one TTL from now, since
    nothing published after this look can expire sooner."""
    due = [at for at in heads if at is not None]
    if due:
        return max(0.0, (min(due) + 1 - now_ms) / 1000)
    if queue_empty and ttl_ms is not None:
        return ttl_ms / 1000
    return None


def over_limit_when_returned(policy: MessagePolicy, redelivery_count: int) -> bool:
    """Whether a message delivered after `redelivery_count` returns dies (reason
    `delivery_limit`) when it is returned once more (nack or reject with requeue,
    basic.recover): quorum queues dead-letter it at that return, not at a later delivery."""
    return policy.delivery_limit is not None and redelivery_count + 1 > policy.delivery_limit


# ---- x-death ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Death:
    """One dead-lettering of a message: why, from which queue, and how it had been routed."""

    reason: str
    queue: str
    exchange: str  # the exchange the message had been published to
    routing_keys: tuple[str, ...]
    time: datetime.datetime  # whole seconds: AMQP timestamps have no fraction


def death_routing_keys(routing_key: str, headers: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The routing keys x-death records: the message's own plus its `CC` header's."""
    cc = (headers or {}).get(CC_HEADER)
    extra = [as_text(k) for k in cc if isinstance(k, str | bytes)] if isinstance(cc, list) else []
    return (routing_key, *extra)


def _same(value: Any, text: str) -> bool:
    return isinstance(value, str | bytes) and as_text(value) == text


def _count(value: Any) -> int:
    return value if _is_int(value) else 0


def dead_lettered_headers(
    headers: Mapping[str, Any] | None,
    death: Death,
    original_expiration: str | None,
    drop_cc: bool = False,
) -> dict[str, Any]:
    """The headers of a message dead-lettered for `death` (RabbitMQ 3.10's rules):

    - `x-death` is an array of tables, most recent first, one per (queue, reason): a death
      already recorded for the same queue and reason has its `count` incremented and moves
      to the front (its other fields stay as first recorded, keys in sorted order); a new
      one is `count` 1, `reason`, `queue`, `time`, `exchange`, `routing-keys` and, when the
      message had an expiration, `original-expiration`;
    - `x-first-death-reason/queue/exchange` are set by the first dead-lettering only;
    - with `drop_cc` (the queue has a dead-letter routing key) the `CC` header goes.
    """
    result = dict(headers or {})
    if drop_cc:
        result.pop(CC_HEADER, None)
    previous = result.get(DEATH_HEADER)
    deaths = [d for d in previous if isinstance(d, dict)] if isinstance(previous, list) else []
    entry: dict[str, Any] | None = None
    others = []
    for item in deaths:
        if (
            entry is None
            and _same(item.get("queue"), death.queue)
            and _same(item.get("reason"), death.reason)
        ):
            merged = {**item, "count": _count(item.get("count")) + 1}
            entry = {key: merged[key] for key in sorted(merged)}
        else:
            others.append(item)
    if entry is None:
        entry = {
            "count": 1,
            "reason": death.reason,
            "queue": death.queue,
            "time": death.time,
            "exchange": death.exchange,
            "routing-keys": list(death.routing_keys),
        }
        if original_expiration is not None:
            entry["original-expiration"] = original_expiration
    result[DEATH_HEADER] = [entry, *others]
    result.setdefault(FIRST_DEATH_REASON, death.reason)
    result.setdefault(FIRST_DEATH_QUEUE, death.queue)
    result.setdefault(FIRST_DEATH_EXCHANGE, death.exchange)
    return result


def dead_lettered_properties(
    properties: commands.Basic.Properties, death: Death, drop_cc: bool = False
) -> commands.Basic.Properties:
    """The properties a dead-lettered message is republished with: every property kept but
    `expiration` (removed, recorded in x-death as `original-expiration`), headers as
    `dead_lettered_headers` makes them."""
    expiration = properties.expiration
    original = as_text(expiration) if expiration is not None else None
    return commands.Basic.Properties(
        content_type=properties.content_type,
        content_encoding=properties.content_encoding,
        headers=dead_lettered_headers(properties.headers, death, original, drop_cc),
        delivery_mode=properties.delivery_mode,
        priority=properties.priority,
        correlation_id=properties.correlation_id,
        reply_to=properties.reply_to,
        expiration=None,
        message_id=properties.message_id,
        timestamp=properties.timestamp,
        message_type=properties.message_type,
        user_id=properties.user_id,
        app_id=properties.app_id,
        cluster_id=properties.cluster_id,
    )


def is_automatic_cycle(headers: Mapping[str, Any] | None, queue: str, reason: str) -> bool:
    """Whether dead-lettering from `queue` for `reason` would go round a cycle with no
    rejection in it (the message already died in `queue`, and every death since, this one
    included, was automatic): RabbitMQ drops such messages rather than loop for ever."""
    if reason == REJECTED:
        return False
    previous = (headers or {}).get(DEATH_HEADER)
    if not isinstance(previous, list):
        return False
    for item in previous:
        if not isinstance(item, dict):
            continue
        if _same(item.get("reason"), REJECTED):
            return False
        if _same(item.get("queue"), queue):
            return True
    return False


def dead_letter_routing_key(policy: MessagePolicy, routing_key: str) -> str:
    """The key a dead letter is published with: the queue's dead-letter routing key, else
    the message's own."""
    if policy.dead_letter_routing_key is not None:
        return policy.dead_letter_routing_key
    return routing_key
