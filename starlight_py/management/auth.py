"""Who is calling the management API, and what they may do: HTTP basic credentials checked
by the proxy's own authenticator (as a SASL PLAIN login: with authentication on, the password
is a JWT; with it off, any credentials get in, as on AMQP), then the principal's permissions
in ZooKeeper (model/permissions.py) for each vhost and resource.

Blocking (permission reads ask ZooKeeper): call from a worker thread.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from starlight_py.auth.authenticator import AuthenticationFailed, Authenticator
from starlight_py.auth.errors import LoopbackOnly
from starlight_py.management.errors import LoginFailed, NotAuthorised
from starlight_py.metadata.permissions import PermissionCache
from starlight_py.model.permissions import (
    Access,
    ResourceKind,
    refusal_text,
    vhost_refusal_text,
)
from starlight_py.model.users import ADMINISTRATOR_TAG, MANAGEMENT_TAGS


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str


def basic_credentials(header: str | None) -> Credentials:
    """The user and password of an `Authorization: Basic ...` header. Raises LoginFailed."""
    if not header:
        raise LoginFailed()
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        raise LoginFailed()
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise LoginFailed() from None
    username, sep, password = decoded.partition(":")
    if not sep:
        raise LoginFailed()
    return Credentials(username, password)


@dataclass(frozen=True)
class ApiUser:
    """A logged-in caller. `permissions` None: authorization is off, everything is allowed."""

    name: str
    credentials: Credentials
    permissions: PermissionCache | None = None
    administrator: bool = True
    # A password user's own tags (RabbitMQ's /api/whoami shows them).
    user_tags: tuple[str, ...] | None = None

    @property
    def tags(self) -> list[str]:
        if self.user_tags is not None:
            return list(self.user_tags)
        return ["administrator"] if self.administrator else ["management"]

    def may_use_vhost(self, vhost: str) -> bool:
        if self.permissions is None or self.administrator:
            return True
        return self.permissions.read(vhost, self.name) is not None

    def require_vhost(self, vhost: str) -> None:
        """Raises NotAuthorised unless the user has permissions in `vhost`."""
        if not self.may_use_vhost(vhost):
            raise NotAuthorised(vhost_refusal_text(vhost, self.name))

    def require(self, vhost: str, access: Access, kind: ResourceKind, name: str) -> None:
        """Raises NotAuthorised unless the user's `access` pattern in `vhost` matches."""
        if self.permissions is None or self.administrator:
            return
        permission = self.permissions.read(vhost, self.name)
        if permission is None or not permission.allows(access, kind, name):
            raise NotAuthorised(refusal_text(kind, name, vhost, self.name))

    def require_administrator(self) -> None:
        """Raises NotAuthorised unless the user may act on the whole cluster."""
        if not self.administrator:
            if self.user_tags is not None:
                raise NotAuthorised("Not administrator user")  # RabbitMQ's text
            raise NotAuthorised(f"'{self.name}' is not in managementAdministrators")


def log_in(
    header: str | None,
    authenticator: Authenticator,
    permissions: PermissionCache | None,
    administrators: tuple[str, ...],
    peer_host: str | None = None,
) -> ApiUser:
    """The caller of a request with this Authorization header, from `peer_host`: an
    administrator when named in `administrators` or, for a password user, tagged
    `administrator`. Blocking (may ask ZooKeeper for the user). Raises LoginFailed, and
    NotAuthorised for a password user without a management tag (as RabbitMQ)."""
    credentials = basic_credentials(header)
    response = b"\x00" + credentials.username.encode() + b"\x00" + credentials.password.encode()
    try:
        principal = authenticator.authenticate("PLAIN", response, None, peer_host)
    except LoopbackOnly:
        raise NotAuthorised("User can only log in via localhost") from None  # RabbitMQ's
    except AuthenticationFailed:
        raise LoginFailed() from None
    tags = principal.tags if principal.by_password else None
    if tags is not None and not MANAGEMENT_TAGS & set(tags):
        raise NotAuthorised("Not management user")  # RabbitMQ's answer, 401
    if permissions is None:
        return ApiUser(principal.name, credentials, user_tags=tags)
    administrator = principal.name in administrators or ADMINISTRATOR_TAG in principal.tags
    return ApiUser(principal.name, credentials, permissions, administrator, tags)
