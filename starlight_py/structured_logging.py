"""Log output of the proxy: readable text lines or JSON lines (`logFormat`), with the id of
the client connection a record belongs to.

The connection id travels in a context variable: `ClientConnection.run` sets it, and trio
gives every task of that connection's nursery a copy of its context, so records logged by
the publishing and consuming code on behalf of a connection carry its id without passing
it around. Records logged through a `LoggerAdapter` with `{"conn": id}` carry it too.

Secrets are kept out of logs at the source (credentials are never formatted into
messages); nothing here tries to scrub them afterwards.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

current_connection: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "current_connection", default=None
)

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s %(message)s"


class ConnectionIdFilter(logging.Filter):
    """Puts the connection id (or None) on every record as `record.connection`."""

    def filter(self, record: logging.LogRecord) -> bool:
        connection = getattr(record, "conn", None) or current_connection.get()
        record.connection = connection
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: timestamp (UTC, ISO 8601), level, logger, message, and
    connection / exception / stack when there are any."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        connection = getattr(record, "connection", None)
        if connection:
            entry["connection"] = connection
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str, stream: TextIO | None = None) -> None:
    """Send every logger's records to `stream` (stderr) at `level` in `log_format`
    (text or json), replacing handlers set before. Raises ValueError for another format."""
    if log_format not in ("text", "json"):
        raise ValueError(f"unknown log format {log_format!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(ConnectionIdFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
