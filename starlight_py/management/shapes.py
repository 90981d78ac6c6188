"""JSON shapes of RabbitMQ's management API (3.10), from our topology values; and the
listing options every list endpoint takes (`columns`, `sort`, `sort_reverse`). Pure."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from starlight_py.admin.definitions import json_value
from starlight_py.management.errors import BadRequest
from starlight_py.model.policies import Policy
from starlight_py.model.topology import Exchange, Queue

NODE = "starlight@proxy"  # what RabbitMQ calls the node: one name for the whole cluster


def queue_json(
    vhost: str,
    queue: Queue,
    ready: int,
    unacked: int,
    consumers: int,
    rates: Mapping[str, float] | None = None,
    policy: Policy | None = None,
) -> dict[str, Any]:
    """A queue as GET /api/queues lists it: counts, and how fast they change (`rates` by
    count name, management/rates.py; `message_stats` are added by the caller, from
    Pulsar's stats), the policy that applies to it. `arguments` are the declared ones, as
    on RabbitMQ."""
    total = ready + unacked
    rates = rates or {}
    return {
        "arguments": json_value(queue.arguments),
        "auto_delete": queue.auto_delete,
        "durable": queue.durable,
        "exclusive": queue.exclusive,
        "exclusive_consumer_tag": None,
        "name": queue.name,
        "node": NODE,
        "policy": None if policy is None else policy.name,
        "effective_policy_definition": {} if policy is None else dict(policy.definition),
        "operator_policy": None,
        "state": "running",
        "type": "classic",
        "vhost": vhost,
        "consumers": consumers,
        "messages": total,
        "messages_details": {"rate": rates.get("messages", 0.0)},
        "messages_ready": ready,
        "messages_ready_details": {"rate": rates.get("messages_ready", 0.0)},
        "messages_unacknowledged": unacked,
        "messages_unacknowledged_details": {"rate": rates.get("messages_unacknowledged", 0.0)},
    }


def exchange_json(vhost: str, exchange: Exchange, policy: Policy | None = None) -> dict[str, Any]:
    """An exchange as GET /api/exchanges lists it; `policy` only when one applies, as
    RabbitMQ's."""
    shaped = {
        "arguments": json_value(exchange.arguments),
        "auto_delete": exchange.auto_delete,
        "durable": exchange.durable,
        "internal": exchange.internal,
        "name": exchange.name,
        "type": exchange.type,
        "user_who_performed_action": "",
        "vhost": vhost,
    }
    if policy is not None:
        shaped["policy"] = policy.name
    return shaped


def properties_key(routing_key: str, arguments: Mapping[str, Any]) -> str:
    """How RabbitMQ names a binding in URLs: the %-quoted routing key, and with arguments
    `~` and a digest of them (RabbitMQ hashes the Erlang term; ours hashes canonical JSON,
    so the keys differ from RabbitMQ's for bindings with arguments but round-trip here)."""
    key = quote(routing_key, safe="")
    if not arguments:
        return key
    canonical = json.dumps(json_value(dict(arguments)), sort_keys=True).encode()
    digest = base64.urlsafe_b64encode(hashlib.md5(canonical).digest()).decode().rstrip("=")
    return f"{key}~{digest}"


def binding_json(
    vhost: str,
    source: str,
    destination: str,
    destination_type: str,
    routing_key: str,
    arguments: Mapping[str, Any],
) -> dict[str, Any]:
    return {
        "source": source,
        "vhost": vhost,
        "destination": destination,
        "destination_type": destination_type,
        "routing_key": routing_key,
        "arguments": json_value(dict(arguments)),
        "properties_key": properties_key(routing_key, arguments),
    }


def vhost_json(name: str, namespace: str) -> dict[str, Any]:
    description = "Default virtual host" if name == "/" else ""
    return {
        "name": name,
        "description": description,
        "metadata": {"description": description, "tags": []},
        "tags": [],
        "tracing": False,
        "default_queue_type": "undefined",
        "cluster_state": {NODE: "running"},
        "starlight_namespace": namespace,
    }


# ---- request bodies -----------------------------------------------------------------------


def flag(body: Mapping[str, Any], key: str, default: bool) -> bool:
    """A boolean field; rabbitmqadmin sends "true"/"false" strings, which RabbitMQ takes.
    Raises BadRequest for anything else."""
    value = body.get(key, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise BadRequest(f"{key} must be true or false, not {value!r}")


def integer(body: Mapping[str, Any], key: str, default: int) -> int:
    """An integer field (rabbitmqadmin sends numbers as strings). Raises BadRequest."""
    value = body.get(key, default)
    if isinstance(value, bool):
        raise BadRequest(f"{key} must be an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise BadRequest(f"{key} must be an integer, not {value!r}")


def arguments_of(body: Mapping[str, Any]) -> dict[str, Any]:
    """The `arguments` object of a declare or bind body. Raises BadRequest."""
    value = body.get("arguments") or {}
    if not isinstance(value, dict):
        raise BadRequest("arguments must be a JSON object")
    return value


def json_body(data: bytes) -> dict[str, Any]:
    """The request body as a JSON object (empty body: {}). Raises BadRequest("not_json")
    as RabbitMQ does."""
    if not data.strip():
        return {}
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("not_json") from None
    if not isinstance(value, dict):
        raise BadRequest("not_json")
    return value


# ---- listing options ----------------------------------------------------------------------


def listed(items: list[dict[str, Any]], query: Mapping[str, str]) -> list[dict[str, Any]]:
    """Sorted (`sort`, a dotted key; `sort_reverse=true`) and cut to `columns` (dotted keys,
    comma separated), as RabbitMQ lists."""
    sort = query.get("sort")
    if sort:
        items = sorted(items, key=lambda item: _sort_key(_dig(item, sort)))
    if query.get("sort_reverse") == "true":
        items = list(reversed(items))
    columns = [c for c in query.get("columns", "").split(",") if c]
    if columns:
        items = [only_columns(item, columns) for item in items]
    return items


def only_columns(item: Mapping[str, Any], columns: list[str]) -> dict[str, Any]:
    """`item` with only the dotted `columns` (missing ones left out, as RabbitMQ does)."""
    result: dict[str, Any] = {}
    for column in columns:
        path = column.split(".")
        value: Any = item
        for part in path:
            if not isinstance(value, Mapping) or part not in value:
                break
            value = value[part]
        else:
            target = result
            for part in path[:-1]:
                target = target.setdefault(part, {})
            target[path[-1]] = value
    return result


def _dig(item: Mapping[str, Any], dotted: str) -> Any:
    value: Any = item
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _sort_key(value: Any) -> tuple[int, Any]:
    if value is None:
        return (0, 0)
    if isinstance(value, bool | int | float):
        return (1, value)
    return (2, str(value))
