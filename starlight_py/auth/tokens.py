"""JWT bearer tokens as Pulsar and Starlight for RabbitMQ use them: the SASL PLAIN password
is a token signed with an HMAC secret (HS256/384/512) or a private key whose public half we
hold (`tokenPublicAlg`, RS256 by default). The principal is one claim (`sub` by default).

Verification is pure (pyjwt + cryptography, the clock passed in) so it can be tested
without a server; only `read_key_material` touches the file system, once, at start.

Nothing here puts a token, or any part of one, in an exception message: messages go to
logs, and a token in a log is a credential anyone with the log can use.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, unquote_to_bytes, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import load_der_public_key, load_pem_public_key

from starlight_py.auth.errors import AuthenticationFailed

HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")
_KEY_TYPES: Mapping[str, type[Any]] = {
    "RS": rsa.RSAPublicKey,
    "PS": rsa.RSAPublicKey,
    "ES": ec.EllipticCurvePublicKey,
}


class InvalidToken(AuthenticationFailed):
    """The token was refused; the message says why without quoting the token."""


class KeyMaterialError(ValueError):
    """A tokenSecretKey/tokenPublicKey value cannot be read or is not a usable key."""


@dataclass(frozen=True, slots=True)
class VerifiedToken:
    principal: str
    expires_at: float | None  # seconds since the epoch; None when the token has no `exp`


@dataclass(frozen=True)
class TokenSettings:
    """How tokens are checked. At least one of the keys must be set."""

    secret_key: bytes | None = None
    public_key: Any = None  # a cryptography public key object
    public_algorithm: str = "RS256"
    principal_claim: str = "sub"
    audience_claim: str = "aud"
    audience: str = ""
    clock_skew: float = 0.0

    def __post_init__(self) -> None:
        if self.secret_key is None and self.public_key is None:
            raise ValueError("a secret key or a public key is required")

    def __repr__(self) -> str:
        # The dataclass repr would print the secret key.
        return (
            f"TokenSettings(secret_key={'<set>' if self.secret_key else None}, "
            f"public_algorithm={self.public_algorithm!r}, "
            f"principal_claim={self.principal_claim!r}, audience={self.audience!r})"
        )


class TokenVerifier:
    """Checks signature, algorithm, expiry, not-before and audience, and names the principal."""

    def __init__(self, settings: TokenSettings) -> None:
        self.settings = settings

    def verify(self, token: str | bytes, now: float | None = None) -> VerifiedToken:
        """The principal and expiry of a valid token. Raises InvalidToken."""
        now = time.time() if now is None else now
        if isinstance(token, bytes):
            try:
                token = token.decode("ascii")
            except UnicodeDecodeError:
                raise InvalidToken("token is not ASCII (not a JWT)") from None
        token = token.strip()
        algorithm = self._algorithm_of(token)
        key = self._key_for(algorithm)
        claims = self._decode(token, key, algorithm)
        principal = claims.get(self.settings.principal_claim)
        if not isinstance(principal, str) or not principal:
            raise InvalidToken(
                f"token has no string claim '{self.settings.principal_claim}' naming the principal"
            )
        expires_at = _time_claim(claims, "exp", principal)
        not_before = _time_claim(claims, "nbf", principal)
        skew = self.settings.clock_skew
        if expires_at is not None and now >= expires_at + skew:
            raise InvalidToken(f"token of '{principal}' expired at {_utc(expires_at)}")
        if not_before is not None and now < not_before - skew:
            raise InvalidToken(f"token of '{principal}' is not valid before {_utc(not_before)}")
        self._check_audience(claims, principal)
        return VerifiedToken(principal, expires_at)

    def _algorithm_of(self, token: str) -> str:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise InvalidToken("token is malformed (not a JWT)") from None
        algorithm = header.get("alg")
        if not isinstance(algorithm, str):
            raise InvalidToken("token header has no algorithm")
        return algorithm

    def _key_for(self, algorithm: str) -> Any:
        # The key follows from the algorithm and the algorithm must be one we configured, so
        # a token cannot pick "none", or HMAC keyed with our public key.
        if algorithm in HMAC_ALGORITHMS and self.settings.secret_key is not None:
            return self.settings.secret_key
        if algorithm == self.settings.public_algorithm and self.settings.public_key is not None:
            return self.settings.public_key
        # repr: the header is not verified yet, so the text is the client's, not the issuer's.
        raise InvalidToken(f"token algorithm {algorithm[:16]!r} is not accepted")

    def _decode(self, token: str, key: Any, algorithm: str) -> dict[str, Any]:
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                # Time and audience claims are checked by us, with our clock and claim names.
                options={
                    "verify_signature": True,
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                    "verify_aud": False,
                    "verify_iss": False,
                    "verify_sub": False,
                    "verify_jti": False,
                },
            )
        except jwt.InvalidSignatureError:
            raise InvalidToken("token signature does not verify") from None
        except jwt.PyJWTError as e:
            # pyjwt's messages can quote parts of the token: only the class name is logged.
            raise InvalidToken(f"token is malformed ({type(e).__name__})") from None
        if not isinstance(claims, dict):
            raise InvalidToken("token payload is not a JSON object")
        return claims

    def _check_audience(self, claims: Mapping[str, Any], principal: str) -> None:
        wanted = self.settings.audience
        if not wanted:
            return
        value = claims.get(self.settings.audience_claim)
        audiences = value if isinstance(value, list) else [value]
        if wanted not in audiences:
            raise InvalidToken(
                f"token of '{principal}' is not for audience '{wanted}' "
                f"(claim '{self.settings.audience_claim}')"
            )


def _time_claim(claims: Mapping[str, Any], name: str, principal: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidToken(f"token of '{principal}' has a non-numeric '{name}' claim")
    return float(value)


def _utc(timestamp: float) -> str:
    try:
        return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return str(timestamp)


# ---- key material ----------------------------------------------------------------------------


def read_key_material(spec: str) -> bytes:
    """The bytes of `data:;base64,<b64>`, `data:,<text>` or `file:///path`, Pulsar's forms.

    Raises KeyMaterialError (never quoting `spec`, which may be the secret itself)."""
    if spec.startswith("data:"):
        meta, sep, data = spec[len("data:") :].partition(",")
        if not sep:
            raise KeyMaterialError("data: URL without ','")
        if meta.endswith(";base64"):
            try:
                return base64.b64decode(data.strip(), validate=True)
            except (binascii.Error, ValueError):
                raise KeyMaterialError("data: URL is not valid base64") from None
        return unquote_to_bytes(data)
    if spec.startswith("file:"):
        parts = urlsplit(spec)
        if parts.netloc not in ("", "localhost"):
            raise KeyMaterialError(f"file: URL names a remote host '{parts.netloc}'")
        path = unquote(parts.path)
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise KeyMaterialError(f"cannot read {path}: {e.strerror}") from e
    raise KeyMaterialError("must start with data: or file:")


def load_public_key(material: bytes, algorithm: str) -> Any:
    """A public key from PEM or DER bytes, checked against the algorithm's key type.

    Raises KeyMaterialError."""
    try:
        if material.lstrip().startswith(b"-----BEGIN"):
            key: Any = load_pem_public_key(material)
        else:
            key = load_der_public_key(material)
    except (ValueError, TypeError) as e:
        raise KeyMaterialError(f"not a PEM or DER public key ({type(e).__name__})") from None
    expected = _KEY_TYPES.get(algorithm[:2])
    if expected is not None and not isinstance(key, expected):
        raise KeyMaterialError(f"a {type(key).__name__} cannot verify {algorithm} signatures")
    return key
