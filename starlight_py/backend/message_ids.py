"""Pulsar message ids in their serialized form (what `MessageId.serialize()` and the Java
client's `toByteArray()` produce, and what the pulsar-spark connector puts in `__messageId`)
as :class:`MessageIdRecord` values."""

from __future__ import annotations

import pulsar

from starlight_py.model.positions import MessageIdRecord


def position_from_bytes(data: bytes) -> MessageIdRecord:
    """The position a serialized message id names.

    Raises ValueError when `data` is not a serialized message id.
    """
    # The binding raises ValueError itself ("Failed to parse serialized message id").
    message_id = pulsar.MessageId.deserialize(bytes(data))
    return MessageIdRecord(
        message_id.ledger_id(),
        message_id.entry_id(),
        message_id.batch_index(),
        message_id.partition(),
    )
