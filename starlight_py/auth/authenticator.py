"""Who is connecting: turns a SASL mechanism + response into a Principal, or refuses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from starlight_py.auth.sasl import MalformedResponse, parse_credentials


class AuthenticationFailed(Exception):
    """The credentials were refused; the message is for logs, never for the client."""


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    mechanism: str


class Authenticator(Protocol):
    def authenticate(self, mechanism: str, response: bytes) -> Principal:
        """Raises AuthenticationFailed."""
        ...


class AcceptAnyAuthenticator:
    """Authentication disabled: any credentials are accepted and the username (when the
    mechanism carries one) becomes the principal, so logs still say who connected."""

    def authenticate(self, mechanism: str, response: bytes) -> Principal:
        try:
            name = parse_credentials(mechanism, response).username or "anonymous"
        except MalformedResponse:
            name = "anonymous"
        return Principal(name, mechanism)
