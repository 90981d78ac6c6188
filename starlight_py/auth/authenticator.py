"""Who is connecting: turns a SASL mechanism + response into a Principal, or refuses.

Two policies:
- `AcceptAnyAuthenticator` (authenticationEnabled=false): every login succeeds;
- `ConfiguredAuthenticator`: the `password` provider (PLAIN/AMQPLAIN checked against the
  users in ZooKeeper, RabbitMQ's internal backend: model/users.py), the `token` provider
  (PLAIN/AMQPLAIN whose password is a JWT, as Starlight for RabbitMQ and RabbitMQ's OAuth 2
  backend do; the username is ignored) and the `tls` provider (EXTERNAL: the client
  certificate the TLS layer verified). With both password and token on, a username that
  names a stored user is checked by password, any other login's password as a JWT (RabbitMQ
  chains backends the same way: internal first, then OAuth 2).

Which mechanisms connection.start offers depends on the transport: EXTERNAL only on TLS
(like RabbitMQ, also when the client sent no certificate; the login is then refused).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from starlight_py.auth.certificates import certificate_principal
from starlight_py.auth.errors import AuthenticationFailed, LoopbackOnly
from starlight_py.auth.sasl import MalformedResponse, parse_credentials
from starlight_py.auth.tokens import (
    KeyMaterialError,
    TokenSettings,
    TokenVerifier,
    load_public_key,
    read_key_material,
)
from starlight_py.config import ConfigError, StarlightConfig
from starlight_py.metadata.records import RecordError
from starlight_py.metadata.zookeeper import MetadataUnavailable
from starlight_py.model.users import User, may_connect_from

__all__ = [
    "AcceptAnyAuthenticator",
    "AuthenticationFailed",
    "Authenticator",
    "ConfiguredAuthenticator",
    "Principal",
    "UserDirectory",
    "build_authenticator",
]

PASSWORD_MECHANISMS = ("PLAIN", "AMQPLAIN")
EXTERNAL = "EXTERNAL"


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    mechanism: str
    # When the credential stops being valid (seconds since the epoch): the connection is
    # closed then unless connection.update-secret brought a newer one.
    expires_at: float | None = None
    # A password user's tags (`administrator` makes the management API's administrator).
    tags: tuple[str, ...] = ()
    by_password: bool = False


class UserDirectory(Protocol):
    def lookup(self, name: str, fresh: bool = False) -> User | None:
        """The stored user named `name`; `fresh`: as ZooKeeper has it now, not cached.
        May raise MetadataUnavailable."""
        ...


class Authenticator(Protocol):
    def mechanisms(self, tls: bool) -> tuple[str, ...]:
        """What connection.start offers on a connection (TLS or not)."""
        ...

    def authenticate(
        self,
        mechanism: str,
        response: bytes,
        peer_certificate: bytes | None = None,
        peer_host: str | None = None,
    ) -> Principal:
        """`peer_certificate` is the verified client certificate (DER), if any; `peer_host`
        the client's address (None: unknown). May block (a user lookup asks ZooKeeper):
        call from a worker thread. Raises AuthenticationFailed."""
        ...

    def update_secret(self, principal: Principal, secret: bytes) -> Principal:
        """connection.update-secret: the principal with its new credential.
        Raises AuthenticationFailed."""
        ...


class AcceptAnyAuthenticator:
    """Authentication disabled: any credentials are accepted and the username (when the
    mechanism carries one, or the certificate's name for EXTERNAL) becomes the principal,
    so logs still say who connected."""

    def __init__(self, external_principal_from: str = "cn") -> None:
        self.external_principal_from = external_principal_from

    def mechanisms(self, tls: bool) -> tuple[str, ...]:
        return (*PASSWORD_MECHANISMS, EXTERNAL) if tls else PASSWORD_MECHANISMS

    def authenticate(
        self,
        mechanism: str,
        response: bytes,
        peer_certificate: bytes | None = None,
        peer_host: str | None = None,
    ) -> Principal:
        if mechanism == EXTERNAL:
            try:
                if peer_certificate is not None:
                    name = certificate_principal(peer_certificate, self.external_principal_from)
                    return Principal(name, mechanism)
            except AuthenticationFailed:
                pass
            return Principal("anonymous", mechanism)
        try:
            name = parse_credentials(mechanism, response).username or "anonymous"
        except MalformedResponse:
            name = "anonymous"
        return Principal(name, mechanism)

    def update_secret(self, principal: Principal, secret: bytes) -> Principal:
        return principal


class ConfiguredAuthenticator:
    """authenticationEnabled=true: `tokens` set for the token provider, `external_principal_from`
    set for the tls provider, `users` for the password provider (with `loopback_users`, who
    may log in by password only from a loopback address, RabbitMQ's `loopback_users`)."""

    def __init__(
        self,
        tokens: TokenVerifier | None,
        external_principal_from: str | None = None,
        users: UserDirectory | None = None,
        loopback_users: tuple[str, ...] = ("guest",),
    ) -> None:
        self.tokens = tokens
        self.external_principal_from = external_principal_from
        self.users = users
        self.loopback_users = loopback_users

    def mechanisms(self, tls: bool) -> tuple[str, ...]:
        passwords = self.tokens is not None or self.users is not None
        offered: tuple[str, ...] = PASSWORD_MECHANISMS if passwords else ()
        if tls and self.external_principal_from is not None:
            offered = (*offered, EXTERNAL)
        return offered

    def authenticate(
        self,
        mechanism: str,
        response: bytes,
        peer_certificate: bytes | None = None,
        peer_host: str | None = None,
    ) -> Principal:
        if mechanism == EXTERNAL and self.external_principal_from is not None:
            if peer_certificate is None:
                raise AuthenticationFailed("EXTERNAL login without a client certificate")
            return Principal(
                certificate_principal(peer_certificate, self.external_principal_from), mechanism
            )
        if mechanism in PASSWORD_MECHANISMS and (self.tokens is not None or self.users is not None):
            try:
                credentials = parse_credentials(mechanism, response)
            except MalformedResponse:
                # The parser's details could quote bytes of the password.
                raise AuthenticationFailed(f"malformed {mechanism} response") from None
            if self.users is not None:
                user = self._stored_user(credentials.username)
                if user is not None:
                    return self._password_login(user, credentials.password, mechanism, peer_host)
                if self.tokens is None:
                    raise AuthenticationFailed(f"user '{credentials.username}' does not exist")
            assert self.tokens is not None
            verified = self.tokens.verify(credentials.password)
            return Principal(verified.principal, mechanism, verified.expires_at)
        raise AuthenticationFailed(f"mechanism {mechanism} is not enabled")

    def _stored_user(self, name: str) -> User | None:
        """The user named `name` as ZooKeeper has it now: logins are rare next to messages,
        and a password changed or a user deleted a moment ago must count at once. While
        ZooKeeper is away, the watched copy answers."""
        assert self.users is not None
        try:
            return self.users.lookup(name, fresh=True)
        except (MetadataUnavailable, RecordError) as e:  # refuse; the log says why
            raise AuthenticationFailed(f"cannot read user '{name}': {e}") from None

    def _password_login(
        self, user: User, password: str, mechanism: str, peer_host: str | None
    ) -> Principal:
        if not user.check_password(password):
            raise AuthenticationFailed(f"invalid credentials for user '{user.name}'")
        if not may_connect_from(user.name, peer_host, self.loopback_users):
            # RabbitMQ's log line for it.
            raise LoopbackOnly(f"user '{user.name}' can only connect via localhost")
        return Principal(user.name, mechanism, tags=user.tags, by_password=True)

    def update_secret(self, principal: Principal, secret: bytes) -> Principal:
        if principal.by_password:
            # RabbitMQ's internal backend re-checks the (same user's) password.
            try:
                password = secret.decode("utf-8")
            except UnicodeDecodeError:
                raise AuthenticationFailed("the new secret is not UTF-8") from None
            user = self._stored_user(principal.name)
            if user is None or not user.check_password(password):
                raise AuthenticationFailed(f"new secret of '{principal.name}' is not its password")
            return replace(principal, tags=user.tags)
        if principal.mechanism not in PASSWORD_MECHANISMS or self.tokens is None:
            raise AuthenticationFailed(
                f"'{principal.name}' logged in with {principal.mechanism}, which has no secret "
                "to update"
            )
        verified = self.tokens.verify(secret)
        if verified.principal != principal.name:
            # A connection keeps its identity: a token for someone else is not a refresh.
            raise AuthenticationFailed(
                f"new token names '{verified.principal}', the connection is '{principal.name}'"
            )
        return replace(principal, expires_at=verified.expires_at)


def build_authenticator(
    config: StarlightConfig, users: UserDirectory | None = None
) -> Authenticator:
    """The authenticator the configuration asks for, with its keys loaded; `users` is where
    the password provider finds users (required when it is on).

    Raises ConfigError naming the key whose value cannot be used."""
    if not config.authentication_enabled:
        return AcceptAnyAuthenticator(config.tls_external_principal_from)
    tokens = None
    if "token" in config.authentication_providers:
        secret = public = None
        try:
            if config.token_secret_key:
                secret = read_key_material(config.token_secret_key)
                if not secret:
                    raise KeyMaterialError("the key is empty")
        except KeyMaterialError as e:
            raise ConfigError("tokenSecretKey", str(e)) from None
        try:
            if config.token_public_key:
                material = read_key_material(config.token_public_key)
                public = load_public_key(material, config.token_public_alg)
        except KeyMaterialError as e:
            raise ConfigError("tokenPublicKey", str(e)) from None
        tokens = TokenVerifier(
            TokenSettings(
                secret_key=secret,
                public_key=public,
                public_algorithm=config.token_public_alg,
                principal_claim=config.token_auth_claim,
                audience_claim=config.token_audience_claim,
                audience=config.token_audience,
                clock_skew=config.token_clock_skew,
            )
        )
    external = (
        config.tls_external_principal_from if "tls" in config.authentication_providers else None
    )
    if "password" not in config.authentication_providers:
        users = None
    elif users is None:
        raise ConfigError("authenticationProviders", "the password provider needs a user store")
    return ConfiguredAuthenticator(tokens, external, users, config.loopback_users)
