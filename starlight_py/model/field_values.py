"""AMQP field-table values <-> JSON, for metadata (queue and binding arguments).

Plain JSON types stay plain (str, bool, int, float, None, lists, objects) so the znodes stay
readable; the AMQP types JSON lacks are single-key objects: `{"$bytes": base64}`,
`{"$decimal": "1.50"}`, `{"$timestamp": epoch_seconds}`. A table whose only key starts with
`$` is wrapped as `{"$table": {...}}` so it cannot be mistaken for one of those. Integer
width is not kept (a short 5 and a long 5 are both 5): equivalence checks compare values.
"""

from __future__ import annotations

import base64
import datetime
import decimal
from typing import Any

FieldValue = Any
JSONValue = Any


def to_json(value: FieldValue) -> JSONValue:
    """Raises TypeError for values that are not AMQP field values."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, datetime.datetime):
        stamp = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        return {"$timestamp": int(stamp.timestamp())}
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    if isinstance(value, dict):
        table = {str(k): to_json(v) for k, v in value.items()}
        if len(table) == 1 and next(iter(table)).startswith("$"):
            return {"$table": table}
        return table
    raise TypeError(f"not an AMQP field value: {type(value).__name__}")


def from_json(value: JSONValue) -> FieldValue:
    """Inverse of `to_json`; raises ValueError for malformed tagged values."""
    if isinstance(value, list):
        return [from_json(item) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((key, inner),) = value.items()
        try:
            if key == "$bytes":
                return base64.b64decode(inner)
            if key == "$decimal":
                return decimal.Decimal(inner)
            if key == "$timestamp":
                return datetime.datetime.fromtimestamp(int(inner), tz=datetime.UTC)
            if key == "$table":
                return {k: from_json(v) for k, v in inner.items()}
        # decimal.InvalidOperation and OverflowError are ArithmeticErrors, not ValueErrors.
        except (ArithmeticError, AttributeError, TypeError) as e:
            raise ValueError(f"malformed {key} value {inner!r}: {e}") from e
    return {k: from_json(v) for k, v in value.items()}


def table_to_json(table: dict[str, FieldValue] | None) -> dict[str, JSONValue]:
    result = to_json(dict(table or {}))
    assert isinstance(result, dict)
    if set(result) == {"$table"}:
        inner: dict[str, JSONValue] = result["$table"]
        return inner
    return result


def table_from_json(data: dict[str, JSONValue] | None) -> dict[str, FieldValue]:
    return {k: from_json(v) for k, v in (data or {}).items()}
