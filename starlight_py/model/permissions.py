"""Per-vhost authorization, RabbitMQ's model (docs/security.md, "Permissions").

A principal has, per vhost, at most one `Permission`: three regular expressions. An
operation on a resource (a queue or an exchange) needs one kind of access to it, and is
allowed when the resource's name matches the pattern of that kind:

    configure   queue.declare, exchange.declare (not passive), queue.delete, exchange.delete
    write       basic.publish (exchange), queue.bind / queue.unbind (queue),
                exchange.bind / exchange.unbind (destination exchange)
    read        basic.consume, basic.get, queue.purge (queue), queue.bind / queue.unbind
                (exchange), exchange.bind / exchange.unbind (source exchange)

Matching is RabbitMQ's: an unanchored search (`a` matches `bar`; write `^a$` for exactly
`a`), except that the empty pattern matches nothing, not everything. The default exchange
`""` is checked under the name `amq.default`, as RabbitMQ does. Having any permission record
for a vhost (even `"" "" ""`) is what grants access to the vhost itself.

Patterns are Python regular expressions. RabbitMQ uses PCRE; the two agree on everything
people write in permissions (`.*`, `^amq\\.gen-.*`, alternations, classes, anchors).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from functools import lru_cache

DEFAULT_EXCHANGE_PERMISSION_NAME = "amq.default"
"""The name the default exchange `""` is checked under (RabbitMQ's)."""


class Access(enum.Enum):
    """The three kinds of access, in RabbitMQ's (and `set_permissions`') order."""

    CONFIGURE = "configure"
    WRITE = "write"
    READ = "read"


class ResourceKind(enum.Enum):
    QUEUE = "queue"
    EXCHANGE = "exchange"


def validate_pattern(pattern: str, access: Access | str = "") -> str:
    """Return `pattern` if it is a valid regular expression; raises ValueError naming the
    pattern (and `access`, when given) otherwise."""
    if not isinstance(pattern, str):
        raise ValueError(f"permission pattern must be a string, not {type(pattern).__name__}")
    try:
        _compiled(pattern)
    except re.error as e:
        kind = access.value if isinstance(access, Access) else access
        label = f"{kind} pattern" if kind else "pattern"
        raise ValueError(f"invalid {label} {pattern!r}: {e}") from e
    return pattern


def pattern_matches(pattern: str, name: str) -> bool:
    """RabbitMQ's matching: '' matches nothing; anything else is an unanchored search.
    Raises ValueError for an invalid pattern."""
    if pattern == "":
        return False
    try:
        return _compiled(pattern).search(name) is not None
    except re.error as e:
        raise ValueError(f"invalid pattern {pattern!r}: {e}") from e


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def permission_name(kind: ResourceKind, name: str) -> str:
    """The name a resource is checked under: the default exchange is `amq.default`."""
    if kind is ResourceKind.EXCHANGE and name == "":
        return DEFAULT_EXCHANGE_PERMISSION_NAME
    return name


@dataclass(frozen=True)
class Permission:
    """A principal's `configure`, `write` and `read` patterns in one vhost.

    Raises ValueError when built with an invalid pattern."""

    configure: str
    write: str
    read: str
    _patterns: tuple[re.Pattern[str] | None, ...] = field(
        init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        patterns = []
        for access in Access:
            pattern = validate_pattern(getattr(self, access.value), access)
            patterns.append(None if pattern == "" else _compiled(pattern))
        object.__setattr__(self, "_patterns", tuple(patterns))

    def pattern(self, access: Access) -> str:
        result: str = getattr(self, access.value)
        return result

    def allows(self, access: Access, kind: ResourceKind, name: str) -> bool:
        """Whether this permission grants `access` to the queue or exchange `name`."""
        compiled = self._patterns[_INDEX[access]]
        if compiled is None:
            return False
        return compiled.search(permission_name(kind, name)) is not None

    def to_json(self) -> dict[str, str]:
        return {"configure": self.configure, "write": self.write, "read": self.read}

    @classmethod
    def from_json(cls, data: dict[str, str]) -> Permission:
        """Raises KeyError for a missing kind, ValueError for an invalid pattern."""
        return cls(data["configure"], data["write"], data["read"])


_INDEX = {access: index for index, access in enumerate(Access)}

FULL_PERMISSION = Permission(".*", ".*", ".*")
"""What `rabbitmqctl set_permissions -p / user ".*" ".*" ".*"` grants."""

NO_PERMISSION = Permission("", "", "")
"""Access to the vhost, and to nothing in it."""


def refusal_text(kind: ResourceKind, name: str, vhost: str, principal: str) -> str:
    """RabbitMQ's ACCESS_REFUSED text (without the `ACCESS_REFUSED - ` prefix)."""
    resource = permission_name(kind, name)
    return f"access to {kind.value} '{resource}' in vhost '{vhost}' refused for user '{principal}'"


def vhost_refusal_text(vhost: str, principal: str) -> str:
    """RabbitMQ's NOT_ALLOWED text for connection.open (without the prefix)."""
    return f"access to vhost '{vhost}' refused for user '{principal}'"
