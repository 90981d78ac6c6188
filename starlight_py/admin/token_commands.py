"""`token create`: a JWT that clients send as the SASL PLAIN password, signed like
`pulsar tokens create` does (HMAC secret key, or an RSA/EC private key)."""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

import jwt
from cryptography.hazmat.primitives.serialization import load_der_private_key, load_pem_private_key

from starlight_py.admin.context import AdminContext
from starlight_py.admin.errors import UsageError
from starlight_py.admin.output import Report
from starlight_py.admin.parsing import Subcommands, add_command, add_group
from starlight_py.auth.tokens import HMAC_ALGORITHMS, KeyMaterialError, read_key_material
from starlight_py.config import TOKEN_PUBLIC_ALGORITHMS

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_DURATION = re.compile(r"(\d+)\s*([smhdwy]?)")


def register(commands: Subcommands) -> None:
    group = add_group(commands, "token", "JWTs for SASL PLAIN (the password is the token)")
    create = add_command(group, "create", "create a signed token for a principal", create_token)
    create.add_argument("--subject", required=True, help="the principal the token names")
    create.add_argument(
        "--expiry", help="lifetime like 30m, 1h, 7d, 1y (default: the token never expires)"
    )
    key = create.add_mutually_exclusive_group(required=True)
    key.add_argument(
        "--secret-key", metavar="data:|file:", help="HMAC key, as tokenSecretKey takes it"
    )
    key.add_argument(
        "--private-key", metavar="data:|file:", help="PEM or DER private key (RSA or EC)"
    )
    create.add_argument(
        "--algorithm",
        choices=(*HMAC_ALGORITHMS, *TOKEN_PUBLIC_ALGORITHMS),
        help="default: HS256 with --secret-key, RS256 with --private-key",
    )


def parse_duration(text: str) -> int:
    """`90`, `90s`, `30m`, `1h`, `7d`, `2w`, `1y` -> seconds; raises UsageError."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or int(match.group(1)) <= 0:
        raise UsageError(f"--expiry: {text!r} is not a duration like 30m, 1h or 7d")
    return int(match.group(1)) * _UNITS[match.group(2) or "s"]


def create_token(ctx: AdminContext, args: argparse.Namespace) -> Report:
    claims: dict[str, Any] = {ctx.config.token_auth_claim: args.subject}
    if args.expiry:
        claims["exp"] = int(time.time()) + parse_duration(args.expiry)
    try:
        if args.secret_key:
            algorithm = args.algorithm or "HS256"
            if algorithm not in HMAC_ALGORITHMS:
                raise UsageError(f"--secret-key signs HS256/HS384/HS512, not {algorithm}")
            key: Any = read_key_material(args.secret_key)
        else:
            algorithm = args.algorithm or "RS256"
            if algorithm in HMAC_ALGORITHMS:
                raise UsageError(f"--private-key signs {', '.join(TOKEN_PUBLIC_ALGORITHMS)}")
            key = _private_key(read_key_material(args.private_key))
    except KeyMaterialError as e:
        raise UsageError(f"key: {e}") from e
    try:
        token = jwt.encode(claims, key, algorithm=algorithm)
    except (ValueError, TypeError, jwt.PyJWTError) as e:
        # Never print the key: only what kind of failure it was.
        raise UsageError(
            f"cannot sign a {algorithm} token with this key ({type(e).__name__})"
        ) from e
    return Report(token, {"token": token, "subject": args.subject, "exp": claims.get("exp")})


def _private_key(material: bytes) -> Any:
    try:
        if material.lstrip().startswith(b"-----BEGIN"):
            return load_pem_private_key(material, password=None)
        return load_der_private_key(material, password=None)
    except (ValueError, TypeError) as e:
        raise UsageError(f"not a PEM or DER private key ({type(e).__name__})") from None
