"""starlight-admin without services: argument errors, help, output formatting, tokens."""

from __future__ import annotations

import argparse
import base64
import datetime
import decimal
import json
import sys

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from starlight_py.admin.cli import build_parser, main
from starlight_py.admin.definitions import json_value
from starlight_py.admin.errors import UsageError
from starlight_py.admin.output import Report, Table, emit, render_table
from starlight_py.admin.parsing import parse_arguments
from starlight_py.admin.token_commands import parse_duration
from starlight_py.auth.tokens import TokenSettings, TokenVerifier, load_public_key

SECRET = b"unit-test-secret-of-at-least-32-bytes"
SECRET_SPEC = "data:;base64," + base64.b64encode(SECRET).decode()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def all_commands() -> list[list[str]]:
    """Every command path, e.g. ["vhost", "create"], found by walking the parser."""
    found: list[list[str]] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found.append(path)
        for sub in subs:
            for name, child in sub.choices.items():
                walk(child, [*path, name])

    walk(build_parser(), [])
    return found


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    commands = all_commands()
    assert ["vhost", "create"] in commands
    assert ["definitions", "import"] in commands
    assert ["connection", "close"] in commands and ["health"] in commands
    assert ["policy", "set"] in commands
    assert len(commands) == 35
    for path in commands:
        code, out, _ = run(capsys, *path, "--help")
        assert code == 0
        assert out.startswith(f"usage: starlight-admin {' '.join(path)}")


def test_usage_errors_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        [],
        ["vhost"],
        ["vhost", "create"],
        ["nonsense"],
        ["exchange", "declare", "x", "--type", "bogus"],
        ["topics", "--exchange", "x", "--queue", "q"],
        ["token", "create", "--subject", "s"],
    ):
        code, out, err = run(capsys, *argv)
        assert code == 2, argv
        assert out == ""
        assert len(err.strip().splitlines()) == 1, err
        assert err.startswith("starlight-admin")
        assert "see starlight-admin" in err


def test_configuration_errors_exit_2(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    code, _, err = run(capsys, "--set", "noSuchKey=1", "vhost", "list")
    assert (code, err) == (
        2,
        "starlight-admin: configuration error: noSuchKey: unknown configuration key\n",
    )
    code, _, err = run(capsys, "--set", "configurationStoreServers", "vhost", "list")
    assert code == 2
    assert "--set takes KEY=VALUE" in err
    code, _, err = run(capsys, "--config", str(tmp_path / "missing.conf"), "vhost", "list")
    assert code == 2
    assert "cannot read configuration" in err
    conf = tmp_path / "admin.conf"
    conf.write_text("brokerWebServiceURL=ftp://nope\n")
    code, _, err = run(capsys, "--config", str(conf), "vhost", "list")
    assert code == 2
    assert "brokerWebServiceURL" in err


def test_unreachable_zookeeper_is_a_failure_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(
        capsys,
        "--set",
        "configurationStoreServers=127.0.0.1:9",
        "--set",
        "zooKeeperSessionTimeoutMillis=2000",
        "vhost",
        "list",
    )
    assert code == 1
    assert err == "starlight-admin: cannot connect to ZooKeeper at 127.0.0.1:9\n"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out.startswith("starlight-py ")


# ---- output -------------------------------------------------------------------------------


def test_tables_align_columns_and_show_values_readably() -> None:
    table = Table(
        ("name", "ready", "durable", "arguments"),
        [("orders", 12, True, {"x-max-length": 10}), ("a", 0, False, {})],
    )
    assert render_table(table).splitlines() == [
        "NAME    READY  DURABLE  ARGUMENTS",
        'orders  12     yes      {"x-max-length":10}',
        "a       0      no       {}",
    ]
    assert render_table(Table(("name",), [])) == "NAME\n(none)"


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    emit(Table(("name", "ready"), [("q", 1)]), True, sys.stdout)
    assert json.loads(capsys.readouterr().out) == [{"name": "q", "ready": 1}]
    emit(Report("done", {"created": True}), True, sys.stdout)
    assert json.loads(capsys.readouterr().out) == {"created": True}
    emit(Report("done"), True, sys.stdout)
    assert json.loads(capsys.readouterr().out) == {"message": "done"}
    emit(Report("done", {"created": True}), False, sys.stdout)
    assert capsys.readouterr().out == "done\n"


def test_x_arguments_are_read_as_json_when_they_parse() -> None:
    assert parse_arguments(
        ["x-max-length=10", "x-queue-mode=lazy", "flag=true", "ratio=0.5", 'quoted="7"', "e="]
    ) == {
        "x-max-length": 10,
        "x-queue-mode": "lazy",
        "flag": True,
        "ratio": 0.5,
        "quoted": "7",
        "e": "",
    }
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_arguments(["novalue"])


def test_field_values_export_as_plain_json() -> None:
    assert json_value(
        {
            "b": b"bytes",
            "d": decimal.Decimal("1.5"),
            "t": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
            "n": [1, {"x": bytearray(b"y")}],
        }
    ) == {"b": "bytes", "d": 1.5, "t": 1704067200, "n": [1, {"x": "y"}]}


# ---- tokens -------------------------------------------------------------------------------


def test_durations() -> None:
    assert parse_duration("90") == 90
    assert parse_duration("30m") == 1800
    assert parse_duration("1h") == 3600
    assert parse_duration("7d") == 7 * 86400
    for bad in ("", "h", "1.5h", "-1h", "0s", "1q"):
        with pytest.raises(UsageError):
            parse_duration(bad)


def test_hs256_token_verifies_with_the_proxy_settings(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "--json",
        "token",
        "create",
        "--subject",
        "alice",
        "--expiry",
        "1h",
        "--secret-key",
        SECRET_SPEC,
    )
    assert code == 0
    answer = json.loads(out)
    verified = TokenVerifier(TokenSettings(secret_key=SECRET)).verify(answer["token"])
    assert verified.principal == "alice"
    assert verified.expires_at == answer["exp"]


def test_es256_token_from_a_private_key_file(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    path = tmp_path / "ec.der"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.DER,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    code, out, _ = run(
        capsys,
        "--set",
        "tokenAuthClaim=client_id",
        "token",
        "create",
        "--subject",
        "svc",
        "--private-key",
        f"file://{path}",
        "--algorithm",
        "ES256",
    )
    assert code == 0, out
    public = load_public_key(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
        "ES256",
    )
    settings = TokenSettings(
        public_key=public, public_algorithm="ES256", principal_claim="client_id"
    )
    verified = TokenVerifier(settings).verify(out.strip())
    assert (verified.principal, verified.expires_at) == ("svc", None)


def test_token_key_errors_never_echo_the_key(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    code, _, err = run(capsys, "token", "create", "--subject", "s", "--secret-key", "plain-secret")
    assert code == 2
    assert "plain-secret" not in err
    code, _, err = run(
        capsys,
        "token",
        "create",
        "--subject",
        "s",
        "--secret-key",
        SECRET_SPEC,
        "--algorithm",
        "RS256",
    )
    assert code == 2
    assert "HS256" in err
    bad = tmp_path / "bad.pem"
    bad.write_text("-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n")
    code, _, err = run(
        capsys, "token", "create", "--subject", "s", "--private-key", f"file://{bad}"
    )
    assert code == 2
    assert "not a PEM or DER private key" in err
