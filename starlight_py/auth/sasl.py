"""SASL responses carried in connection.start-ok (pure parsing, no policy)."""

from __future__ import annotations

from dataclasses import dataclass

from pamqp import decode

from starlight_py.model.text import as_text


class MalformedResponse(ValueError):
    """The start-ok response does not have the shape its mechanism requires."""


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str


def parse_plain(response: bytes) -> Credentials:
    """RFC 4616: `[authzid] NUL authcid NUL passwd`. Raises MalformedResponse."""
    parts = response.split(b"\x00")
    if len(parts) != 3:
        raise MalformedResponse("PLAIN response must be authzid NUL user NUL password")
    try:
        return Credentials(parts[1].decode("utf-8"), parts[2].decode("utf-8"))
    except UnicodeDecodeError as e:
        raise MalformedResponse("PLAIN credentials are not UTF-8") from e


def parse_amqplain(response: bytes) -> Credentials:
    """AMQPLAIN: a field table without its length prefix holding LOGIN and PASSWORD (what
    py-amqp and kombu send by default). Raises MalformedResponse."""
    try:
        _, table = decode.field_table(len(response).to_bytes(4, "big") + response)
    except Exception as e:  # pamqp raises struct.error, ValueError, KeyError...
        raise MalformedResponse(f"AMQPLAIN response is not a field table: {e}") from e
    login, password = table.get("LOGIN"), table.get("PASSWORD")
    if not isinstance(login, str | bytes) or not isinstance(password, str | bytes):
        raise MalformedResponse("AMQPLAIN response needs LOGIN and PASSWORD strings")
    return Credentials(as_text(login), as_text(password))


def parse_credentials(mechanism: str, response: bytes) -> Credentials:
    """Credentials for PLAIN or AMQPLAIN; raises MalformedResponse for other mechanisms."""
    if mechanism == "PLAIN":
        return parse_plain(response)
    if mechanism == "AMQPLAIN":
        return parse_amqplain(response)
    raise MalformedResponse(f"mechanism {mechanism} carries no username/password")
