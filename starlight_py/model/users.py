"""Users with passwords, as RabbitMQ's internal authentication backend keeps them.

A password is stored as RabbitMQ 3.6+ stores it (`rabbit_password_hashing_sha256`):

    password_hash = base64(salt + sha256(salt + utf8(password)))     salt: 4 random bytes

so the `password_hash` of a RabbitMQ definitions export logs in here unchanged, and one
written here logs in on RabbitMQ. `rabbit_password_hashing_md5` (RabbitMQ before 3.6, same
layout with MD5) and `rabbit_password_hashing_sha512` are verified too, for imports.

A user whose hash is empty has no password and cannot log in with one (RabbitMQ's
`clear_password`); an empty password never logs in (RabbitMQ refuses it even when it is the
hashed one). Pure: no I/O besides `secrets` for new salts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

SHA256 = "rabbit_password_hashing_sha256"
SHA512 = "rabbit_password_hashing_sha512"
MD5 = "rabbit_password_hashing_md5"
HASHING_ALGORITHMS = {SHA256: hashlib.sha256, SHA512: hashlib.sha512, MD5: hashlib.md5}
SALT_BYTES = 4

ADMINISTRATOR_TAG = "administrator"
MANAGEMENT_TAGS = frozenset({"management", "policymaker", "monitoring", ADMINISTRATOR_TAG})
"""The tags that let a user into the management API (RabbitMQ's)."""
DEFAULT_USER = "guest"
DEFAULT_PASSWORD = "guest"


class InvalidUser(ValueError):
    """A user definition that cannot be stored: the text says which field and why."""


def hash_password(password: str, salt: bytes | None = None, algorithm: str = SHA256) -> str:
    """RabbitMQ's salted hash of `password`, base64 (a new random salt unless given)."""
    if salt is None:
        salt = secrets.token_bytes(SALT_BYTES)
    digest = HASHING_ALGORITHMS[algorithm](salt + password.encode("utf-8")).digest()
    return base64.b64encode(salt + digest).decode("ascii")


def validate_hash(password_hash: str, algorithm: str) -> None:
    """Raises InvalidUser unless `password_hash` is empty or base64 of salt + digest."""
    if algorithm not in HASHING_ALGORITHMS:
        raise InvalidUser(
            f"unknown hashing_algorithm {algorithm!r}; use one of {', '.join(HASHING_ALGORITHMS)}"
        )
    if password_hash == "":
        return
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidUser(f"password_hash {password_hash!r} is not base64") from None
    if len(raw) != SALT_BYTES + HASHING_ALGORITHMS[algorithm]().digest_size:
        raise InvalidUser(f"password_hash is not a salted {algorithm.rsplit('_', 1)[1]} hash")


def parse_tags(value: Any) -> tuple[str, ...]:
    """Tags as RabbitMQ accepts them: a comma-separated string or a list of strings.
    Raises InvalidUser."""
    if value is None:
        return ()
    if isinstance(value, str):
        parts: Iterable[Any] = value.split(",")
    elif isinstance(value, list | tuple):
        parts = value
    else:
        raise InvalidUser("tags must be a comma-separated string or a list of strings")
    tags = []
    for part in parts:
        if not isinstance(part, str):
            raise InvalidUser("tags must be strings")
        tag = part.strip()
        if tag and tag not in tags:
            tags.append(tag)
    return tuple(tags)


@dataclass(frozen=True)
class User:
    """A user: name, stored password hash and tags (`administrator`, `management`, ...).

    Raises InvalidUser when built with an empty name or an unusable hash."""

    name: str
    password_hash: str = ""
    hashing_algorithm: str = SHA256
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidUser("a user needs a name")
        validate_hash(self.password_hash, self.hashing_algorithm)

    @classmethod
    def with_password(cls, name: str, password: str, tags: tuple[str, ...] = ()) -> User:
        return cls(name, hash_password(password), SHA256, tags)

    def with_new_password(self, password: str) -> User:
        return User(self.name, hash_password(password), SHA256, self.tags)

    def check_password(self, password: str) -> bool:
        """Whether `password` is this user's (constant time in the digest comparison)."""
        if not self.password_hash or not password:
            return False
        raw = base64.b64decode(self.password_hash)
        salt, digest = raw[:SALT_BYTES], raw[SALT_BYTES:]
        hasher = HASHING_ALGORITHMS[self.hashing_algorithm]
        return hmac.compare_digest(hasher(salt + password.encode("utf-8")).digest(), digest)

    @property
    def administrator(self) -> bool:
        return ADMINISTRATOR_TAG in self.tags

    def to_json(self) -> dict[str, Any]:
        """RabbitMQ 3.10's shape (GET /api/users/{name}, definitions export)."""
        return {
            "name": self.name,
            "password_hash": self.password_hash,
            "hashing_algorithm": self.hashing_algorithm,
            "tags": list(self.tags),
            "limits": {},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> User:
        """A user of a definitions file. Raises InvalidUser."""
        name = data.get("name")
        if not isinstance(name, str):
            raise InvalidUser("a user needs a name")
        password_hash = data.get("password_hash", "")
        algorithm = data.get("hashing_algorithm") or SHA256
        if not isinstance(password_hash, str) or not isinstance(algorithm, str):
            raise InvalidUser(f"user '{name}': password_hash and hashing_algorithm are strings")
        return cls(name, password_hash, algorithm, parse_tags(data.get("tags")))


def is_loopback(host: str) -> bool:
    """Whether `host` (an address, maybe IPv4-mapped IPv6) is a loopback address."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host == "localhost"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def may_connect_from(user: str, host: str | None, loopback_users: tuple[str, ...]) -> bool:
    """RabbitMQ's `loopback_users`: the users named there log in only from loopback
    addresses (`host` None: the address is unknown, e.g. an in-process caller)."""
    return user not in loopback_users or host is None or is_loopback(host)
