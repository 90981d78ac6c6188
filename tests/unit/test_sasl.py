"""PLAIN and AMQPLAIN start-ok responses, and the accept-any authenticator."""

from __future__ import annotations

import pytest
from pamqp.encode import field_table

from starlight_py.auth.authenticator import (
    AcceptAnyAuthenticator,
    AuthenticationFailed,
    Principal,
)
from starlight_py.auth.sasl import (
    Credentials,
    MalformedResponse,
    parse_amqplain,
    parse_credentials,
    parse_plain,
)


def amqplain(table: dict[str, object]) -> bytes:
    # AMQPLAIN is a field table without its 4-byte length prefix.
    return field_table(table)[4:]  # type: ignore[arg-type]


# ---- PLAIN ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (b"\x00guest\x00secret", Credentials("guest", "secret")),
        (b"admin\x00guest\x00secret", Credentials("guest", "secret")),
        (b"\x00guest\x00", Credentials("guest", "")),
        (b"\x00\x00", Credentials("", "")),
        ("\x00j\u00f6rg\x00p\u00e4ss=:/".encode(), Credentials("j\u00f6rg", "p\u00e4ss=:/")),
        (b"\x00user name\x00pass word", Credentials("user name", "pass word")),
    ],
)
def test_plain(response: bytes, expected: Credentials) -> None:
    assert parse_plain(response) == expected


@pytest.mark.parametrize(
    "response",
    [
        b"",
        b"guest",
        b"guest\x00secret",
        b"\x00guest\x00sec\x00ret",
        b"\x00\x00\x00",
        b"\x00\xff\xfe\x00secret",
        b"\x00guest\x00\xc3",
    ],
)
def test_malformed_plain(response: bytes) -> None:
    with pytest.raises(MalformedResponse):
        parse_plain(response)


# ---- AMQPLAIN ------------------------------------------------------------------------------


def test_amqplain() -> None:
    response = amqplain({"LOGIN": "guest", "PASSWORD": "secret"})
    assert parse_amqplain(response) == Credentials("guest", "secret")


def test_amqplain_in_any_order_with_extra_keys() -> None:
    response = amqplain({"PASSWORD": "p\u00e4ss", "x-extra": 5, "LOGIN": "j\u00f6rg"})
    assert parse_amqplain(response) == Credentials("j\u00f6rg", "p\u00e4ss")


def test_amqplain_long_strings_that_are_not_utf8_are_decoded_leniently() -> None:
    response = b"\x05LOGINS\x00\x00\x00\x05guest\x08PASSWORDS\x00\x00\x00\x03\xffpw"
    assert parse_amqplain(response) == Credentials("guest", "\ufffdpw")


def test_amqplain_empty_strings() -> None:
    assert parse_amqplain(amqplain({"LOGIN": "", "PASSWORD": ""})) == Credentials("", "")


@pytest.mark.parametrize(
    "response",
    [
        b"",
        amqplain({"LOGIN": "guest"}),
        amqplain({"PASSWORD": "secret"}),
        amqplain({"login": "guest", "password": "secret"}),
        amqplain({"LOGIN": 42, "PASSWORD": "secret"}),
        amqplain({"LOGIN": "guest", "PASSWORD": {"nested": "table"}}),
        amqplain({"LOGIN": "guest", "PASSWORD": "secret"})[:-8],  # cut in PASSWORD's length
        # RabbitMQ accepts only long strings, not byte arrays ('x').
        amqplain({"LOGIN": bytearray(b"guest"), "PASSWORD": bytearray(b"secret")}),
        b"\x05LOGINZ\x00\x00\x00\x05guest",  # unknown field type
        b"\xff\xff\xff",
        b"\x00guest\x00secret",  # a PLAIN response sent as AMQPLAIN
    ],
)
def test_malformed_amqplain(response: bytes) -> None:
    with pytest.raises(MalformedResponse):
        parse_amqplain(response)


# ---- dispatch and the authenticator --------------------------------------------------------


def test_parse_credentials_dispatches_on_the_mechanism() -> None:
    assert parse_credentials("PLAIN", b"\x00u\x00p") == Credentials("u", "p")
    response = amqplain({"LOGIN": "u", "PASSWORD": "p"})
    assert parse_credentials("AMQPLAIN", response) == Credentials("u", "p")
    with pytest.raises(MalformedResponse):
        parse_credentials("AMQPLAIN", b"\x00u\x00p")


@pytest.mark.parametrize("mechanism", ["EXTERNAL", "plain", "ANONYMOUS", ""])
def test_other_mechanisms_carry_no_credentials(mechanism: str) -> None:
    with pytest.raises(MalformedResponse):
        parse_credentials(mechanism, b"\x00u\x00p")


@pytest.mark.parametrize(
    ("mechanism", "response", "expected"),
    [
        ("PLAIN", b"\x00guest\x00secret", Principal("guest", "PLAIN")),
        ("AMQPLAIN", amqplain({"LOGIN": "bob", "PASSWORD": "x"}), Principal("bob", "AMQPLAIN")),
        ("PLAIN", b"\x00\x00secret", Principal("anonymous", "PLAIN")),
        ("PLAIN", b"not plain at all", Principal("anonymous", "PLAIN")),
        ("AMQPLAIN", b"\xff", Principal("anonymous", "AMQPLAIN")),
        ("EXTERNAL", b"", Principal("anonymous", "EXTERNAL")),
    ],
)
def test_accept_any_authenticator(mechanism: str, response: bytes, expected: Principal) -> None:
    assert AcceptAnyAuthenticator().authenticate(mechanism, response) == expected


def test_authentication_failed_is_not_a_value_error() -> None:
    # The gateway catches it separately from malformed input.
    assert issubclass(AuthenticationFailed, Exception)
    assert not issubclass(AuthenticationFailed, ValueError)
    assert issubclass(MalformedResponse, ValueError)
