"""The log output of a real proxy process: JSON lines with the connection id when
logFormat=json, readable lines otherwise, and never a password, token or key in either."""

from __future__ import annotations

import base64
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
from pamqp import commands

from starlight_py.local import ServiceEndpoints
from starlight_py.local.proxy import ProxyProcess
from tests.support.raw_amqp import RawClient

KEY_BYTES = b"logging-test-hmac-key-RECOGNIZABLE-0123456789abcdef0123456789"
SECRET_KEY = "data:;base64," + base64.b64encode(KEY_BYTES).decode()
WRONG_PASSWORD = "hunter2-PASSWORD-MUST-NOT-BE-LOGGED-5f1c"


@pytest.fixture(params=["text", "json"])
def log_format(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def proxy(services: ServiceEndpoints, tmp_path: Path, log_format: str) -> Iterator[ProxyProcess]:
    """A proxy at DEBUG with token authentication: the most it ever logs about a login."""
    process = ProxyProcess(
        "logging proxy",
        tmp_path / "proxy.log",
        {
            "configurationStoreServers": services.zookeeper,
            "brokerServiceURL": services.pulsar_service_url,
            "brokerWebServiceURL": services.pulsar_web_url,
            "amqpAutoCreateNamespaces": "true",
            "authenticationEnabled": "true",
            "authenticationProviders": "token",
            "tokenSecretKey": SECRET_KEY,
            "logLevel": "DEBUG",
            "logFormat": log_format,
        },
    )
    process.start()
    yield process
    process.stop()


def stopped_log(proxy: ProxyProcess) -> str:
    proxy.send_signal(signal.SIGTERM)
    assert proxy.wait_exited(60) == 0
    return proxy.log_path.read_text(encoding="utf-8")


def log_in_twice(proxy: ProxyProcess) -> str:
    """A refused PLAIN login with a recognizable password, then an accepted one with a
    token (the vhost is then refused: the user has no permissions). Returns the token."""
    refused = RawClient("127.0.0.1", proxy.port)
    answer = refused.login(response=f"\x00alice\x00{WRONG_PASSWORD}")
    assert isinstance(answer, commands.Connection.Close) and answer.reply_code == 403
    refused.close()

    token = jwt.encode({"sub": "alice", "exp": int(time.time()) + 600}, KEY_BYTES, "HS256")
    accepted = RawClient("127.0.0.1", proxy.port)
    tune = accepted.login(response=f"\x00alice\x00{token}")
    assert isinstance(tune, commands.Connection.Tune)
    accepted.send_method(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
    accepted.send_method(0, commands.Connection.Open(virtual_host="/"))
    closed = accepted.expect_connection_close()
    assert closed.reply_code in (403, 530)
    accepted.wait_closed()
    accepted.close()
    return token


def test_secrets_never_reach_the_log(proxy: ProxyProcess) -> None:
    token = log_in_twice(proxy)
    text = stopped_log(proxy)
    assert "login refused" in text  # the logins were logged, only without secrets
    for secret in (
        WRONG_PASSWORD,
        token,
        token.split(".")[2],  # the signature alone
        SECRET_KEY,
        base64.b64encode(KEY_BYTES).decode(),
        KEY_BYTES.decode(),
    ):
        assert secret not in text


def test_json_lines_carry_the_connection_id(proxy: ProxyProcess, log_format: str) -> None:
    log_in_twice(proxy)
    text = stopped_log(proxy)
    lines = [line for line in text.splitlines() if line and not line.startswith("=====")]
    if log_format == "text":
        # Readable lines: "<date> <time> LEVEL logger message".
        assert all(not line.startswith("{") for line in lines)
        assert any(" WARNING starlight.connection conn-" in line for line in lines)
        return
    records = [json.loads(line) for line in lines]
    assert all({"timestamp", "level", "logger", "message"} <= set(r) for r in records)
    refused = [r for r in records if "login refused" in r["message"]]
    assert len(refused) == 1
    assert refused[0]["level"] == "WARNING"
    assert refused[0]["logger"] == "starlight.connection"
    assert refused[0]["connection"].startswith("conn-")
    assert refused[0]["timestamp"].endswith("+00:00")
    # Both connections are told apart.
    ids = {r["connection"] for r in records if "connection" in r}
    assert len(ids) >= 2
    assert any(r["logger"] == "starlight.shutdown" for r in records)
