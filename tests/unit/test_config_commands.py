"""`starlight-proxy config print` and `config check`, through the real CLI entry point."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from starlight_py.cli import main
from starlight_py.config import CONFIG_KEYS, StarlightConfig, env_var_for, load_config
from starlight_py.config_commands import MASK, is_secret

REPO_ROOT = Path(__file__).resolve().parents[2]
SECRET_BYTES = b"hmac-key-that-must-never-be-printed-0123456789"
SECRET_KEY = "data:;base64," + base64.b64encode(SECRET_BYTES).decode()
BROKER_TOKEN = "eyJhbGciOiJIUzI1NiJ9.BROKER-TOKEN-NEVER-PRINTED.c2ln"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() reads os.environ: no STARLIGHT_* of the machine running the tests."""
    for name in list(os.environ):
        if name.startswith("STARLIGHT_"):
            monkeypatch.delenv(name)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def write_conf(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proxy.conf"
    path.write_text(text, encoding="utf-8")
    return path


def printed_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, str]]:
    code, out, err = run(["config", "print", "--format", "json", *argv], capsys)
    assert (code, err) == (0, "")
    document: dict[str, dict[str, str]] = json.loads(out)
    return document


# ---- config print --------------------------------------------------------------------------


def test_print_names_the_source_of_every_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = write_conf(
        tmp_path,
        "amqpDefaultTenant=file-tenant\nlogLevel=DEBUG\namqpMaxNoOfChannels=100\n",
    )
    monkeypatch.setenv("STARLIGHT_AMQP_DEFAULT_NAMESPACE", "env-ns")
    monkeypatch.setenv("STARLIGHT_AMQP_MAX_NO_OF_CHANNELS", "200")
    printed = printed_json(
        ["-c", str(conf), "--set", "amqpMaxNoOfChannels=300", "--set", "shutdownDrainMillis=2500"],
        capsys,
    )
    assert set(printed) == set(CONFIG_KEYS)
    assert printed["amqpDefaultTenant"] == {
        "value": "file-tenant",
        "source": "file",
        "origin": str(conf),
        "secret": False,
    }
    assert printed["logLevel"]["value"] == "DEBUG"
    assert printed["amqpDefaultNamespace"]["source"] == "environment"
    assert printed["amqpDefaultNamespace"]["origin"] == "STARLIGHT_AMQP_DEFAULT_NAMESPACE"
    # The command line beats the environment, which beats the file.
    assert printed["amqpMaxNoOfChannels"]["value"] == "300"
    assert printed["amqpMaxNoOfChannels"]["source"] == "command line"
    assert printed["shutdownDrainMillis"]["value"] == "2500"
    assert printed["amqpMaxFrameSize"] == {
        "value": "131072",
        "source": "default",
        "origin": "",
        "secret": False,
    }


def test_printed_values_load_back_to_the_same_configuration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    overrides = {
        "amqpListeners": "amqp://0.0.0.0:5673,amqp://127.0.0.1:5674",
        "amqpHeartbeatDelay": "15",
        "amqpHandshakeTimeoutMillis": "1500",
        "tlsCiphers": "ECDHE-RSA-AES256-GCM-SHA384, ECDHE-ECDSA-AES256-GCM-SHA384",
        "subscriptionCleanerEnabled": "false",
        "logFormat": "json",
    }
    argv = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    printed = printed_json(argv, capsys)
    values = {key: entry["value"] for key, entry in printed.items()}
    assert load_config(overrides=values) == load_config(overrides=overrides)
    assert load_config(overrides=values) != StarlightConfig()


def test_print_masks_secrets_in_both_formats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = write_conf(tmp_path, f"tokenSecretKey={SECRET_KEY}\n")
    monkeypatch.setenv(env_var_for("brokerClientAuthenticationPlugin"), "token")
    monkeypatch.setenv(env_var_for("brokerClientAuthenticationParameters"), f"token:{BROKER_TOKEN}")
    argv = ["-c", str(conf)]
    code, text, _ = run(["config", "print", *argv], capsys)
    assert code == 0
    printed = printed_json(argv, capsys)
    for output in (text, json.dumps(printed)):
        assert SECRET_KEY not in output
        assert base64.b64encode(SECRET_BYTES).decode() not in output
        assert BROKER_TOKEN not in output
    assert printed["tokenSecretKey"] == {
        "value": MASK,
        "source": "file",
        "origin": str(conf),
        "secret": True,
    }
    assert printed["brokerClientAuthenticationParameters"]["value"] == MASK
    assert printed["brokerClientAuthenticationParameters"]["source"] == "environment"
    assert printed["brokerClientAuthenticationPlugin"]["value"] == "token"
    tokens_line = next(line for line in text.splitlines() if line.startswith("tokenSecretKey "))
    assert MASK in tokens_line and f"file ({conf})" in tokens_line


def test_secret_file_references_are_shown(capsys: pytest.CaptureFixture[str]) -> None:
    # A path is no secret, and operators need to check it.
    printed = printed_json(["--set", "tokenSecretKey=file:///etc/starlight/secret.key"], capsys)
    assert printed["tokenSecretKey"]["value"] == "file:///etc/starlight/secret.key"


def test_credential_keys_are_secret_and_others_are_not() -> None:
    assert is_secret("tokenSecretKey")
    assert is_secret("brokerClientAuthenticationParameters")
    assert not is_secret("tokenPublicKey")
    assert not is_secret("amqpListeners")
    assert not is_secret("tokenAudience")


def test_print_text_format_has_one_line_per_key(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["config", "print", "--set", "amqpDefaultTenant=flag-t"], capsys)
    assert code == 0
    lines = [line for line in out.splitlines() if not line.startswith("#")]
    assert [line.split()[0] for line in lines] == list(CONFIG_KEYS)
    tenant = next(line for line in lines if line.startswith("amqpDefaultTenant "))
    assert tenant.split()[1:] == ["flag-t", "[command", "line", "(--set", "amqpDefaultTenant)]"]


def test_print_refuses_an_invalid_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["config", "print", "--set", "amqpMaxFrameSize=100"], capsys)
    assert code == 2
    assert out == ""
    assert "amqpMaxFrameSize" in err


# ---- config check --------------------------------------------------------------------------


def test_check_accepts_the_shipped_conf_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["config", "check", "-c", str(REPO_ROOT / "conf/starlight.conf")], capsys)
    assert (code, out, err) == (0, "configuration OK\n", "")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("amqpMaxFrameSize=100\n", "amqpMaxFrameSize"),
        ("amqpListner=amqp://0.0.0.0:5672\n", "amqpListner"),
        ("logFormat=xml\n", "logFormat"),
        ("shutdownDrainMillis=-5\n", "shutdownDrainMillis"),
        ("authenticationEnabled=true\nauthenticationProviders=token\n", "tokenSecretKey"),
    ],
)
def test_check_names_the_offending_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, key: str
) -> None:
    code, out, err = run(["config", "check", "--config", str(write_conf(tmp_path, text))], capsys)
    assert code == 2
    assert out == ""
    assert err.startswith(f"starlight-proxy: configuration error: {key}: ")


def test_check_reads_the_key_files_the_proxy_would_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-key"
    settings = [
        "--set",
        "authenticationEnabled=true",
        "--set",
        "authenticationProviders=token",
        "--set",
        f"tokenSecretKey=file://{missing}",
    ]
    code, _, err = run(["config", "check", *settings], capsys)
    assert code == 2
    assert "configuration error: tokenSecretKey: " in err
    missing.write_bytes(SECRET_BYTES)
    assert run(["config", "check", *settings], capsys)[:2] == (0, "configuration OK\n")


def test_check_names_an_unusable_tls_certificate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cert.pem").write_text("not a certificate")
    (tmp_path / "key.pem").write_text("not a key")
    code, _, err = run(
        [
            "config",
            "check",
            "--set",
            "amqpListeners=amqps://127.0.0.1:5671",
            "--set",
            f"tlsCertificateFilePath={tmp_path / 'cert.pem'}",
            "--set",
            f"tlsKeyFilePath={tmp_path / 'key.pem'}",
        ],
        capsys,
    )
    assert code == 2
    assert "configuration error: tls" in err


def test_check_reads_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STARLIGHT_LOG_FORMAT", "yaml")
    code, _, err = run(["config", "check"], capsys)
    assert code == 2
    assert "logFormat" in err


def test_config_commands_as_an_installed_user_runs_them(tmp_path: Path) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("STARLIGHT_")}
    environment["PYTHONPATH"] = str(REPO_ROOT)
    ok = subprocess.run(
        [sys.executable, "-m", "starlight_py", "config", "check"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
        check=False,
    )
    assert (ok.returncode, ok.stdout) == (0, "configuration OK\n")
    bad = subprocess.run(
        [sys.executable, "-m", "starlight_py", "config", "check", "--set", "logLevel=LOUD"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert "logLevel" in bad.stderr


def test_standalone_refuses_a_malformed_pulsar_setting_before_starting_anything(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(
        ["standalone", "--data-dir", str(tmp_path), "--pulsar-set", "journalSyncData"], capsys
    )
    assert code == 2
    assert "--pulsar-set takes KEY=VALUE" in err
    assert list(tmp_path.iterdir()) == []
