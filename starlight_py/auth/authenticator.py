"""Who is connecting: turns a SASL mechanism + response into a Principal, or refuses.

Two policies:
- `AcceptAnyAuthenticator` (authenticationEnabled=false): every login succeeds;
- `ConfiguredAuthenticator`: the `token` provider (PLAIN/AMQPLAIN whose password is a JWT,
  as Starlight for RabbitMQ and RabbitMQ's OAuth 2 backend do; the username is ignored) and
  the `tls` provider (EXTERNAL: the client certificate the TLS layer verified).

Which mechanisms connection.start offers depends on the transport: EXTERNAL only on TLS
(like RabbitMQ, also when the client sent no certificate; the login is then refused).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from starlight_py.auth.certificates import certificate_principal
from starlight_py.auth.errors import AuthenticationFailed
from starlight_py.auth.sasl import MalformedResponse, parse_credentials
from starlight_py.auth.tokens import (
    KeyMaterialError,
    TokenSettings,
    TokenVerifier,
    load_public_key,
    read_key_material,
)
from starlight_py.config import ConfigError, StarlightConfig

__all__ = [
    "AcceptAnyAuthenticator",
    "AuthenticationFailed",
    "Authenticator",
    "ConfiguredAuthenticator",
    "Principal",
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


class Authenticator(Protocol):
    def mechanisms(self, tls: bool) -> tuple[str, ...]:
        """What connection.start offers on a connection (TLS or not)."""
        ...

    def authenticate(
        self, mechanism: str, response: bytes, peer_certificate: bytes | None = None
    ) -> Principal:
        """`peer_certificate` is the verified client certificate (DER), if any.
        Raises AuthenticationFailed."""
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
        self, mechanism: str, response: bytes, peer_certificate: bytes | None = None
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
    set for the tls provider."""

    def __init__(
        self, tokens: TokenVerifier | None, external_principal_from: str | None = None
    ) -> None:
        self.tokens = tokens
        self.external_principal_from = external_principal_from

    def mechanisms(self, tls: bool) -> tuple[str, ...]:
        offered: tuple[str, ...] = PASSWORD_MECHANISMS if self.tokens is not None else ()
        if tls and self.external_principal_from is not None:
            offered = (*offered, EXTERNAL)
        return offered

    def authenticate(
        self, mechanism: str, response: bytes, peer_certificate: bytes | None = None
    ) -> Principal:
        if mechanism == EXTERNAL and self.external_principal_from is not None:
            if peer_certificate is None:
                raise AuthenticationFailed("EXTERNAL login without a client certificate")
            return Principal(
                certificate_principal(peer_certificate, self.external_principal_from), mechanism
            )
        if mechanism in PASSWORD_MECHANISMS and self.tokens is not None:
            try:
                password = parse_credentials(mechanism, response).password
            except MalformedResponse:
                # The parser's details could quote bytes of the password.
                raise AuthenticationFailed(f"malformed {mechanism} response") from None
            verified = self.tokens.verify(password)
            return Principal(verified.principal, mechanism, verified.expires_at)
        raise AuthenticationFailed(f"mechanism {mechanism} is not enabled")

    def update_secret(self, principal: Principal, secret: bytes) -> Principal:
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


def build_authenticator(config: StarlightConfig) -> Authenticator:
    """The authenticator the configuration asks for, with its keys loaded.

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
    return ConfiguredAuthenticator(tokens, external)
