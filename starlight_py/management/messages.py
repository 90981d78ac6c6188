"""POST /api/exchanges/{vhost}/{name}/publish and POST /api/queues/{vhost}/{name}/get,
through this proxy's own AMQP listener with the caller's credentials (loopback.py).

Message properties travel as RabbitMQ's management JSON has them: `delivery_mode`,
`headers`, `content_type`, ..., `type` for the AMQP `type` property, `timestamp` in seconds.
"""

from __future__ import annotations

import base64
import binascii
import datetime
from typing import Any
from urllib.parse import urlsplit

import trio
from pamqp.commands import Basic

from starlight_py.admin.definitions import json_value
from starlight_py.management.api import Answer, ApiCall
from starlight_py.management.errors import (
    BadRequest,
    NotAuthorised,
    NotFoundError,
    ServiceUnavailable,
)
from starlight_py.management.loopback import GotMessage, LoopbackClient, LoopbackRefused
from starlight_py.management.shapes import integer
from starlight_py.management.vhost_access import usable_vhost

DEFAULT_EXCHANGE_ALIAS = "amq.default"
ACK_MODES = {
    # ackmode: (acknowledge, requeue)
    "ack_requeue_true": (False, True),
    "reject_requeue_true": (False, True),
    "ack_requeue_false": (True, False),
    "reject_requeue_false": (False, False),
}
# The JSON names of the AMQP basic properties, and pamqp's for the one that differs.
PROPERTY_NAMES = {
    "content_type": "content_type",
    "content_encoding": "content_encoding",
    "headers": "headers",
    "delivery_mode": "delivery_mode",
    "priority": "priority",
    "correlation_id": "correlation_id",
    "reply_to": "reply_to",
    "expiration": "expiration",
    "message_id": "message_id",
    "timestamp": "timestamp",
    "type": "message_type",
    "user_id": "user_id",
    "app_id": "app_id",
}


def exchange_name(name: str) -> str:
    """The default exchange is `amq.default` in the API's paths."""
    return "" if name == DEFAULT_EXCHANGE_ALIAS else name


def properties_from_json(value: Any) -> Basic.Properties:
    """Raises BadRequest for unknown or ill-typed properties."""
    if value in (None, [], {}):
        return Basic.Properties()
    if not isinstance(value, dict):
        raise BadRequest("properties must be a JSON object")
    kwargs: dict[str, Any] = {}
    for key, given in value.items():
        item: Any = given
        name = PROPERTY_NAMES.get(key)
        if name is None:
            raise BadRequest(f"unknown message property '{key}'")
        if key in ("delivery_mode", "priority"):
            if not isinstance(item, int) or isinstance(item, bool):
                raise BadRequest(f"{key} must be an integer")
        elif key == "timestamp":
            if not isinstance(item, int) or isinstance(item, bool):
                raise BadRequest("timestamp must be an integer (seconds)")
            item = datetime.datetime.fromtimestamp(item, tz=datetime.UTC)
        elif key == "headers":
            if not isinstance(item, dict):
                raise BadRequest("headers must be a JSON object")
        elif not isinstance(item, str):
            item = str(item)
        kwargs[name] = item
    return Basic.Properties(**kwargs)


def properties_to_json(properties: Basic.Properties) -> dict[str, Any] | list[Any]:
    """RabbitMQ's shape: only the properties set; `[]` when none is (sic)."""
    result: dict[str, Any] = {}
    for key, name in PROPERTY_NAMES.items():
        value = getattr(properties, name, None)
        if value is None or (key == "headers" and not value):
            continue
        if isinstance(value, datetime.datetime):
            value = int(value.timestamp())
        result[key] = json_value(value)
    return result or []


def payload_from_json(body: dict[str, Any]) -> bytes:
    payload = body.get("payload")
    if not isinstance(payload, str):
        raise BadRequest("payload must be a string")
    encoding = body.get("payload_encoding", "string")
    if encoding == "string":
        return payload.encode("utf-8")
    if encoding == "base64":
        try:
            return base64.b64decode(payload, validate=True)
        except binascii.Error:
            raise BadRequest("payload is not valid base64") from None
    raise BadRequest(f"payload_encoding must be string or base64, not {encoding!r}")


def message_json(message: GotMessage, encoding: str, truncate: int | None) -> dict[str, Any]:
    payload = message.payload if truncate is None else message.payload[:truncate]
    text: str | None = None
    if encoding == "auto":
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError:
            text = None
    return {
        "payload_bytes": len(message.payload),
        "redelivered": message.redelivered,
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "message_count": message.message_count,
        "properties": properties_to_json(message.properties),
        "payload": text if text is not None else base64.b64encode(payload).decode(),
        "payload_encoding": "string" if text is not None else "base64",
    }


async def loopback_client(call: ApiCall, vhost: str) -> LoopbackClient:
    """A connection to this proxy's first amqp:// listener, logged in as the caller.
    Raises ServiceUnavailable (no plain listener, or it does not answer), NotAuthorised."""
    url = next((u for u in call.context.amqp_urls if u.startswith("amqp://")), None)
    if url is None:
        raise ServiceUnavailable("publish and get need an amqp:// listener on this proxy")
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    credentials = call.user.credentials
    try:
        return await LoopbackClient.open(
            host, parts.port or 5672, credentials.username, credentials.password, vhost
        )
    except LoopbackRefused as e:
        raise NotAuthorised(e.reply_text) from e
    except (OSError, EOFError, trio.TooSlowError) as e:
        raise ServiceUnavailable(f"the proxy's AMQP listener {url} did not answer: {e}") from e


async def publish(call: ApiCall) -> Answer:
    vhost = call.params["vhost"]
    await trio.to_thread.run_sync(usable_vhost, call, vhost)
    body = call.body()
    routing_key = body.get("routing_key")
    if not isinstance(routing_key, str):
        raise BadRequest("routing_key must be a string")
    payload = payload_from_json(body)
    properties = properties_from_json(body.get("properties"))
    client = await loopback_client(call, vhost)
    try:
        routed = await client.publish(
            exchange_name(call.params["name"]), routing_key, payload, properties
        )
    except LoopbackRefused as e:
        # RabbitMQ: 400 with the code and text of the channel error.
        raise BadRequest(f"{e.reply_code} {e.reply_text}") from e
    finally:
        await client.aclose()
    return Answer(200, {"routed": routed})


async def get(call: ApiCall) -> Answer:
    vhost = call.params["vhost"]
    await trio.to_thread.run_sync(usable_vhost, call, vhost)
    body = call.body()
    count = integer(body, "count", 1)
    mode = body.get("ackmode", "ack_requeue_true")
    if mode not in ACK_MODES:
        raise BadRequest(f"ackmode must be one of {', '.join(ACK_MODES)}")
    encoding = body.get("encoding", "auto")
    if encoding not in ("auto", "base64"):
        raise BadRequest("encoding must be auto or base64")
    truncate = integer(body, "truncate", -1) if "truncate" in body else None
    ack, requeue = ACK_MODES[mode]
    client = await loopback_client(call, vhost)
    try:
        messages = await client.get(call.params["name"], max(count, 0), ack, requeue)
    except LoopbackRefused as e:
        if e.reply_code == 404:
            raise NotFoundError(e.reply_text) from e
        raise BadRequest(f"{e.reply_code} {e.reply_text}") from e
    finally:
        await client.aclose()
    return Answer(200, [message_json(m, encoding, truncate) for m in messages])
