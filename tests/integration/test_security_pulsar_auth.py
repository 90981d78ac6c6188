"""Proxy -> Pulsar security with a real Pulsar standalone that demands authentication and
serves TLS: the proxy reaches it over pulsar+ssl:// and https:// with a token or a client
certificate, and a proxy with a wrong, missing or untrusted setting fails fast and says why,
without crashing.

The proxies here are given unreachable plain URLs (brokerServiceURL / brokerWebServiceURL)
next to the TLS ones, so a round trip can only have gone through TLS."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from starlight_py.backend.broker_auth import BrokerClientSettings
from starlight_py.backend.pulsar_admin import PulsarAdmin, PulsarAuthenticationRefused
from starlight_py.local import ZooKeeperServer
from starlight_py.local.ports import free_port
from tests.support.pki import TestPKI
from tests.support.proxy_runner import ProxyThread, proxy_config
from tests.support.secure_pulsar import (
    PROXY_TLS_ROLE,
    TOKEN_PLUGIN,
    SecurePulsar,
    hs256_token,
    start_secure_pulsar,
)

# Nothing listens there: a proxy that used the plain URLs could not work at all.
UNREACHABLE_SERVICE_URL = "pulsar://127.0.0.1:9"
UNREACHABLE_WEB_URL = "http://127.0.0.1:9"

# How long a refused proxy may take to answer a client: an error, never a hang.
ANSWER_WITHIN = 20.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    return TestPKI(tmp_path_factory.mktemp("pulsar-pki"))


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory: pytest.TempPathFactory, pulsar_distribution: Path) -> Iterator[str]:
    server = ZooKeeperServer(
        tmp_path_factory.mktemp("secure-zookeeper"), distribution=pulsar_distribution
    )
    server.start()
    try:
        yield server.connect_string
    finally:
        server.stop()


@pytest.fixture(scope="module")
def secure_pulsar(
    tmp_path_factory: pytest.TempPathFactory, pulsar_distribution: Path, pki: TestPKI
) -> Iterator[SecurePulsar]:
    pulsar = start_secure_pulsar(
        tmp_path_factory.mktemp("secure-pulsar"), pki, distribution=pulsar_distribution
    )
    try:
        yield pulsar
    finally:
        pulsar.standalone.stop()


ProxyFactory = Callable[..., ProxyThread]


@pytest.fixture
def start_proxy(zookeeper: str, secure_pulsar: SecurePulsar) -> Iterator[ProxyFactory]:
    """A proxy aimed at the TLS ports of `secure_pulsar` (plain URLs unreachable), trusting
    the test CA, with conf-key overrides; stopped after the test."""
    started: list[ProxyThread] = []

    def start(**overrides: str) -> ProxyThread:
        settings = {
            "tlsEnabledWithBroker": "true",
            "brokerServiceURLTLS": secure_pulsar.tls_service_url,
            "brokerWebServiceURLTLS": secure_pulsar.tls_web_url,
            "brokerClientTrustCertsFilePath": str(secure_pulsar.pki.ca_file),
            "metricsListener": f"http://127.0.0.1:{free_port()}",
            # Every test uses its own root: no topology shared between proxies of
            # different credentials.
            "starlightMetadataRoot": f"/pulsar-auth-{uuid.uuid4().hex[:8]}",
            **overrides,
        }
        config = proxy_config(zookeeper, UNREACHABLE_SERVICE_URL, UNREACHABLE_WEB_URL, **settings)
        proxy = ProxyThread(config).start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


@pytest.fixture
def starlight_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG, logger="starlight"):
        yield caplog


def readyz(proxy: ProxyThread) -> tuple[int, list[str]]:
    """/readyz's status and problems."""
    url = f"{proxy.config.metrics_listener}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            status, answer = reply.status, json.load(reply)
    except urllib.error.HTTPError as e:
        status, answer = e.code, json.loads(e.read())
    return status, [str(problem) for problem in answer["problems"]]


def round_trip(proxy: ProxyThread, count: int = 20) -> None:
    """Declare a queue (admin REST API), publish with confirms, consume every message."""
    connection = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))
    try:
        channel = connection.channel()
        queue = f"pulsar-auth-{uuid.uuid4().hex[:10]}"
        channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        sent = [f"message {i} over TLS".encode() for i in range(count)]
        for body in sent:
            channel.basic_publish(
                "",
                queue,
                body,
                pika.BasicProperties(content_type="text/plain", headers={"n": len(body)}),
                mandatory=True,
            )
        received: list[bytes] = []
        channel.basic_qos(prefetch_count=count)
        deadline = time.monotonic() + 60
        for method, properties, body in channel.consume(queue, inactivity_timeout=1):
            if method is not None:
                assert properties.content_type == "text/plain"
                assert properties.headers == {"n": len(body)}
                channel.basic_ack(method.delivery_tag)
                received.append(body)
            if len(received) == count or time.monotonic() > deadline:
                break
        channel.cancel()
        assert sorted(received) == sorted(sent)
        # Pulsar's stats see the acknowledgements a moment later (pulsar-client groups them).
        deadline = time.monotonic() + 5
        while channel.queue_declare(queue, passive=True).method.message_count:
            assert time.monotonic() < deadline, "acknowledged messages still counted"
            time.sleep(0.05)
        channel.queue_delete(queue)
    finally:
        connection.close()


def refused_open(proxy: ProxyThread) -> tuple[int, str]:
    """Connect with pika, expect the proxy to close the connection at connection.open;
    returns its reply code and text (fast, or the test fails)."""
    started = time.monotonic()
    # The close comes during the handshake, so pika reports it as a probable access
    # denial carrying the broker's close: `ConnectionClosedByBroker: (541) "text"`.
    with pytest.raises(pika.exceptions.AMQPConnectionError) as raised:
        connection = pika.BlockingConnection(
            pika.URLParameters(proxy.amqp_url(socket_timeout=30, connection_attempts=1))
        )
        connection.close()
    assert time.monotonic() - started < ANSWER_WITHIN
    found = re.search(r"ConnectionClosedByBroker: \((\d+)\) \"(.*)\"", str(raised.value))
    assert found is not None, repr(raised.value)
    return int(found.group(1)), found.group(2)


def assert_no_secret_logged(caplog: pytest.LogCaptureFixture, *secrets: str) -> None:
    for record in caplog.records:
        text = record.getMessage() + (record.exc_text or "")
        for secret in secrets:
            assert secret not in text, f"secret in log record {record.name}: {text[:200]}"


# --- working configurations ------------------------------------------------------------


def test_token_over_tls_round_trip(
    start_proxy: ProxyFactory,
    secure_pulsar: SecurePulsar,
    starlight_logs: pytest.LogCaptureFixture,
) -> None:
    token = secure_pulsar.token()
    proxy = start_proxy(
        brokerClientAuthenticationPlugin=TOKEN_PLUGIN,
        brokerClientAuthenticationParameters=f"token:{token}",
    )
    settings = BrokerClientSettings.from_config(proxy.config)
    assert settings.service_url == secure_pulsar.tls_service_url
    assert settings.service_url.startswith("pulsar+ssl://")
    assert settings.web_url.startswith("https://")
    round_trip(proxy)
    status, problems = readyz(proxy)
    assert (status, problems) == (200, [])
    assert any("Pulsar connection: pulsar+ssl://" in r.getMessage() for r in starlight_logs.records)
    assert_no_secret_logged(starlight_logs, token)
    assert token not in repr(proxy.config)


def test_token_file_and_json_forms(
    start_proxy: ProxyFactory, secure_pulsar: SecurePulsar, tmp_path: Path
) -> None:
    token_file = tmp_path / "proxy.token"
    token_file.write_text(secure_pulsar.token() + "\n")
    proxy = start_proxy(
        brokerClientAuthenticationPlugin="token",
        brokerClientAuthenticationParameters=token_file.as_uri(),
    )
    round_trip(proxy, count=5)
    proxy = start_proxy(
        brokerClientAuthenticationPlugin=TOKEN_PLUGIN,
        brokerClientAuthenticationParameters=json.dumps({"token": secure_pulsar.token()}),
    )
    round_trip(proxy, count=5)


def test_token_file_rotation_is_picked_up(secure_pulsar: SecurePulsar, tmp_path: Path) -> None:
    # The admin client reads the file at each request: a bad token is refused, the
    # rewritten good one works, without building a new client.
    token_file = tmp_path / "rotating.token"
    token_file.write_text(hs256_token(b"not the secret, not the secret!!", "starlight-proxy"))
    config = proxy_config(
        "127.0.0.1:1",
        UNREACHABLE_SERVICE_URL,
        UNREACHABLE_WEB_URL,
        tlsEnabledWithBroker="true",
        brokerServiceURLTLS=secure_pulsar.tls_service_url,
        brokerWebServiceURLTLS=secure_pulsar.tls_web_url,
        brokerClientTrustCertsFilePath=str(secure_pulsar.pki.ca_file),
        brokerClientAuthenticationPlugin="token",
        brokerClientAuthenticationParameters=token_file.as_uri(),
    )
    admin = PulsarAdmin.from_config(config)
    with pytest.raises(PulsarAuthenticationRefused, match="Pulsar refused authentication"):
        admin.clusters()
    token_file.write_text(secure_pulsar.token())
    assert admin.clusters() == ["standalone"]


def test_tls_client_certificate_round_trip(
    start_proxy: ProxyFactory, secure_pulsar: SecurePulsar
) -> None:
    # Pulsar takes the role from the certificate's CN (a super-user here).
    client = secure_pulsar.pki.client(PROXY_TLS_ROLE)
    proxy = start_proxy(
        brokerClientAuthenticationPlugin="org.apache.pulsar.client.impl.auth.AuthenticationTls",
        brokerClientAuthenticationParameters=(
            f"tlsCertFile:{client.cert_file},tlsKeyFile:{client.key_file}"
        ),
    )
    round_trip(proxy, count=5)


# --- refusals: fast, explained, and the proxy keeps running -----------------------------


@pytest.mark.parametrize(
    "parameters",
    [
        pytest.param("wrong-key", id="signed-with-another-key"),
        pytest.param("expired", id="expired"),
        pytest.param("garbage", id="not-a-jwt"),
    ],
)
def test_wrong_token_is_refused_clearly(
    start_proxy: ProxyFactory,
    secure_pulsar: SecurePulsar,
    starlight_logs: pytest.LogCaptureFixture,
    parameters: str,
) -> None:
    token = {
        "wrong-key": hs256_token(b"another secret of thirty-two b!!", "starlight-proxy"),
        "expired": hs256_token(secure_pulsar.secret, "starlight-proxy", lifetime=-60),
        "garbage": "not.a.jwt",
    }[parameters]
    proxy = start_proxy(
        brokerClientAuthenticationPlugin=TOKEN_PLUGIN,
        brokerClientAuthenticationParameters=f"token:{token}",
    )
    code, text = refused_open(proxy)
    assert code == 541
    assert "Pulsar refused authentication" in text
    assert any(
        r.levelno == logging.ERROR and "Pulsar refused authentication" in r.getMessage()
        for r in starlight_logs.records
    )
    status, problems = readyz(proxy)
    assert status == 503
    assert any("Pulsar refused authentication" in str(p) for p in problems)
    # Still serving: the next client gets the same clean answer.
    assert refused_open(proxy)[0] == 541
    assert_no_secret_logged(starlight_logs, token)


def test_missing_credentials_are_refused_clearly(
    start_proxy: ProxyFactory, starlight_logs: pytest.LogCaptureFixture
) -> None:
    proxy = start_proxy()
    code, text = refused_open(proxy)
    assert code == 541
    assert "Pulsar refused authentication" in text
    assert "no authentication" in text
    assert readyz(proxy)[0] == 503


def test_untrusted_broker_certificate_is_refused(
    start_proxy: ProxyFactory,
    secure_pulsar: SecurePulsar,
    tmp_path: Path,
) -> None:
    # A CA that did not sign Pulsar's certificate: the TLS handshake must fail, so the
    # token is never sent to what could be an impostor.
    other_ca = TestPKI(tmp_path / "other", ca_name="some other CA")
    proxy = start_proxy(
        brokerClientTrustCertsFilePath=str(other_ca.ca_file),
        brokerClientAuthenticationPlugin="token",
        brokerClientAuthenticationParameters=f"token:{secure_pulsar.token()}",
    )
    code, text = refused_open(proxy)
    assert code == 541
    assert "TLS handshake" in text
    assert "CERTIFICATE_VERIFY_FAILED" in text
    status, problems = readyz(proxy)
    assert status == 503
    assert any("TLS handshake" in str(p) for p in problems)


def test_refused_binary_protocol_does_not_hang_publishers(
    start_proxy: ProxyFactory, secure_pulsar: SecurePulsar, tmp_path: Path
) -> None:
    # The namespace check and queue.declare (admin API) succeed, then the token file goes
    # away: the binary protocol, first used by the publish, cannot authenticate. The
    # publisher must get an error, not wait for a confirm forever.
    token_file = tmp_path / "vanishing.token"
    token_file.write_text(secure_pulsar.token())
    proxy = start_proxy(
        brokerClientAuthenticationPlugin="token",
        brokerClientAuthenticationParameters=token_file.as_uri(),
    )
    connection = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))
    try:
        channel = connection.channel()
        queue = f"pulsar-auth-{uuid.uuid4().hex[:10]}"
        channel.queue_declare(queue)
        channel.confirm_delivery()
        token_file.unlink()
        errors: list[BaseException] = []

        def publish() -> None:
            try:
                channel.basic_publish("", queue, b"never stored")
            except BaseException as e:
                errors.append(e)

        # In a thread: a hang fails the test instead of blocking it.
        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        thread.join(60)
        assert not thread.is_alive(), "the publisher got no answer within 60 s"
        assert len(errors) == 1
        error = errors[0]
        assert isinstance(
            error,
            pika.exceptions.ConnectionClosedByBroker | pika.exceptions.ChannelClosedByBroker,
        ), repr(error)
        assert error.reply_code == 541
        assert "Pulsar" in error.reply_text
    finally:
        if connection.is_open:
            connection.close()
