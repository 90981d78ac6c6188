"""Which handler answers a request: paths are matched segment by segment after each segment
is %-decoded on its own, so `/api/queues/%2F/q` names the queue `q` in the vhost `/` (as
RabbitMQ's API has it). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from starlight_py.management.errors import MethodNotAllowed, ObjectNotFound

H = TypeVar("H")


@dataclass(frozen=True)
class Target:
    """A request target, decoded."""

    segments: tuple[str, ...]
    query: Mapping[str, str] = field(default_factory=dict)


def parse_target(target: str) -> Target:
    """`/api/queues/%2F/my%20q?columns=name` -> ("api", "queues", "/", "my q"), {columns}.
    Empty segments (a trailing slash) are dropped."""
    parts = urlsplit(target)
    segments = tuple(unquote(s) for s in parts.path.split("/") if s)
    return Target(segments, dict(parse_qsl(parts.query, keep_blank_values=True)))


@dataclass(frozen=True)
class Matched(Generic[H]):
    handler: H
    params: Mapping[str, str]


class Router(Generic[H]):
    """Patterns like "/api/queues/{vhost}/{name}" with a handler per HTTP method."""

    def __init__(self) -> None:
        self._routes: list[tuple[tuple[str, ...], dict[str, H]]] = []

    def add(self, pattern: str, **handlers: H) -> None:
        """`router.add("/api/queues/{vhost}", GET=list_queues)`."""
        self._routes.append((tuple(s for s in pattern.split("/") if s), dict(handlers)))

    def match(self, method: str, segments: tuple[str, ...]) -> Matched[H]:
        """Raises ObjectNotFound (no pattern matches) or MethodNotAllowed (one matches, not
        for this method). HEAD is answered by GET's handler."""
        allowed_elsewhere = False
        for pattern, handlers in self._routes:
            params = _bind(pattern, segments)
            if params is None:
                continue
            handler = handlers.get(method) or (handlers.get("GET") if method == "HEAD" else None)
            if handler is not None:
                return Matched(handler, params)
            allowed_elsewhere = True
        if allowed_elsewhere:
            raise MethodNotAllowed()
        raise ObjectNotFound()


def _bind(pattern: tuple[str, ...], segments: tuple[str, ...]) -> dict[str, str] | None:
    if len(pattern) != len(segments):
        return None
    params = {}
    for expected, actual in zip(pattern, segments, strict=True):
        if expected.startswith("{") and expected.endswith("}"):
            params[expected[1:-1]] = actual
        elif expected != actual:
            return None
    return params
