"""amqps:// listeners with certificates the tests make: pika and aio-pika over TLS and mutual
TLS, SASL EXTERNAL, refusals at the TLS layer, the handshake timeout, certificate reload."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
import uuid
from collections.abc import Callable, Iterator

import aio_pika
import aiormq.exceptions
import pika
import pika.credentials
import pika.exceptions
import pytest
from cryptography import x509
from pamqp import commands

from tests.integration.conftest import ProxyFactory
from tests.support.amqp_fixtures import get_one
from tests.support.pki import Issued, TestPKI, tls_overrides
from tests.support.raw_amqp import PROTOCOL_HEADER, RawClient


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    return TestPKI(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def server(pki: TestPKI) -> Issued:
    return pki.server()


@pytest.fixture(scope="module")
def alice(pki: TestPKI) -> Issued:
    return pki.client("alice", dns_names=("alice.example.com",), emails=("alice@example.com",))


@pytest.fixture(autouse=True)
def permitted(grant_all: Callable[..., None]) -> None:
    # With authentication on, only principals with permissions in a vhost may open it.
    grant_all("alice", "alice@example.com")


@pytest.fixture
def caplog_info(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.INFO, logger="starlight"):
        yield caplog


def tls_params(
    port: int,
    context: ssl.SSLContext,
    credentials: pika.credentials.PlainCredentials
    | pika.credentials.ExternalCredentials
    | None = None,
) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        host="127.0.0.1",
        port=port,
        ssl_options=pika.SSLOptions(context, "localhost"),
        credentials=credentials or pika.PlainCredentials("guest", "guest"),
        connection_attempts=1,
        socket_timeout=10,
    )


def pika_round_trip(params: pika.ConnectionParameters) -> bytes:
    connection = pika.BlockingConnection(params)
    try:
        channel = connection.channel()
        queue = f"tls-{uuid.uuid4().hex[:12]}"
        channel.queue_declare(queue, exclusive=True)
        channel.basic_publish("", queue, b"over tls")
        _, _, body = get_one(channel, queue, auto_ack=True)
        return body
    finally:
        connection.close()


async def aio_pika_round_trip(url: str, context: ssl.SSLContext) -> bytes:
    connection = await aio_pika.connect(url, ssl_context=context, timeout=10)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(f"tls-aio-{uuid.uuid4().hex[:12]}", exclusive=True)
        await channel.default_exchange.publish(aio_pika.Message(b"aio over tls"), queue.name)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            message = await queue.get(no_ack=True, fail=False)
            if message is not None:
                return message.body
            await asyncio.sleep(0.05)
        raise AssertionError("no message")


def served_certificate(port: int, pki: TestPKI) -> x509.Certificate:
    context = pki.client_context()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def refused_at_tls_layer(port: int, context: ssl.SSLContext) -> str:
    """Connect and send the AMQP header; the server must hang up in TLS, never answer AMQP.
    Returns what the client saw."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                # TLS 1.3: the client's handshake completes before the server checks its
                # certificate; the refusal arrives as an alert on the first read.
                tls.sendall(PROTOCOL_HEADER)
                data = tls.recv(1024)
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as e:
            return type(e).__name__ + ": " + str(e)
    assert not data.startswith(b"\x01"), "the server answered AMQP"
    return "closed"


# ---- TLS without client certificates ---------------------------------------------------------


def test_pika_over_tls(start_proxy: ProxyFactory, pki: TestPKI, server: Issued) -> None:
    proxy = start_proxy(**tls_overrides(pki, server))
    assert proxy.url.startswith("amqps://")
    assert pika_round_trip(tls_params(proxy.port, pki.client_context())) == b"over tls"


def test_aio_pika_over_tls(start_proxy: ProxyFactory, pki: TestPKI, server: Issued) -> None:
    proxy = start_proxy(**tls_overrides(pki, server))
    url = f"amqps://guest:guest@127.0.0.1:{proxy.port}/"
    assert asyncio.run(aio_pika_round_trip(url, pki.client_context())) == b"aio over tls"


def test_plain_and_tls_listeners_side_by_side(
    start_proxy: ProxyFactory, pki: TestPKI, server: Issued
) -> None:
    overrides = tls_overrides(pki, server)
    overrides["amqpListeners"] = "amqp://127.0.0.1:0,amqps://127.0.0.1:0"
    proxy = start_proxy(**overrides)
    tls_port, plain_port = proxy.port_of("amqps"), proxy.port_of("amqp")
    assert pika_round_trip(tls_params(tls_port, pki.client_context())) == b"over tls"
    params = pika.ConnectionParameters("127.0.0.1", plain_port, connection_attempts=1)
    assert pika_round_trip(params) == b"over tls"
    # Auth disabled: EXTERNAL is offered over TLS only (RabbitMQ's rule).
    plain = RawClient("127.0.0.1", plain_port)
    assert isinstance(plain.login(), commands.Connection.Tune)
    assert plain.mechanisms == ["PLAIN", "AMQPLAIN"]
    plain.close()
    tls = RawClient("127.0.0.1", tls_port, tls=pki.client_context())
    assert isinstance(tls.login(), commands.Connection.Tune)
    assert tls.mechanisms == ["PLAIN", "AMQPLAIN", "EXTERNAL"]
    tls.close()


def test_client_that_does_not_trust_the_server_gives_up(
    start_proxy: ProxyFactory,
    pki: TestPKI,
    server: Issued,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    proxy = start_proxy(**tls_overrides(pki, server))
    stranger = TestPKI(tmp_path_factory.mktemp("other-ca"), "another CA")
    with pytest.raises(ssl.SSLCertVerificationError):
        pika.BlockingConnection(tls_params(proxy.port, stranger.client_context()))


def test_plain_amqp_on_the_tls_port_gets_no_amqp_answer(
    start_proxy: ProxyFactory, pki: TestPKI, server: Issued
) -> None:
    proxy = start_proxy(**tls_overrides(pki, server))
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as raw:
        raw.sendall(PROTOCOL_HEADER)
        data = b""
        try:
            while chunk := raw.recv(4096):
                data += chunk
        except ConnectionResetError:
            pass
    assert not data.startswith(b"AMQP") and b"\x01\x00\x00" not in data[:3]


def test_tls_versions_follow_tls_protocols(
    start_proxy: ProxyFactory, pki: TestPKI, server: Issued
) -> None:
    tls12 = pki.client_context()
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    default = start_proxy(**tls_overrides(pki, server))
    client = RawClient("127.0.0.1", default.port, tls=tls12)
    assert client.sock.version() == "TLSv1.2"  # type: ignore[attr-defined]
    client.handshake()
    client.close()
    only_13 = start_proxy(**tls_overrides(pki, server), tlsProtocols="TLSv1.3")
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        RawClient("127.0.0.1", only_13.port, tls=tls12)
    client = RawClient("127.0.0.1", only_13.port, tls=pki.client_context())
    assert client.sock.version() == "TLSv1.3"  # type: ignore[attr-defined]
    client.close()


# ---- mutual TLS ------------------------------------------------------------------------------


def test_pika_and_aio_pika_over_mutual_tls(
    start_proxy: ProxyFactory, pki: TestPKI, server: Issued, alice: Issued
) -> None:
    proxy = start_proxy(**tls_overrides(pki, server, mutual=True))
    context = pki.client_context(alice)
    assert pika_round_trip(tls_params(proxy.port, context)) == b"over tls"
    url = f"amqps://guest:guest@127.0.0.1:{proxy.port}/"
    assert asyncio.run(aio_pika_round_trip(url, context)) == b"aio over tls"


def test_mutual_tls_without_a_client_certificate_is_refused_at_the_tls_layer(
    start_proxy: ProxyFactory, pki: TestPKI, server: Issued
) -> None:
    proxy = start_proxy(**tls_overrides(pki, server, mutual=True))
    assert refused_at_tls_layer(proxy.port, pki.client_context()) != ""
    with pytest.raises(pika.exceptions.AMQPConnectionError) as info:
        pika.BlockingConnection(tls_params(proxy.port, pki.client_context()))
    # Refused by TLS, before any AMQP login could be refused.
    assert not isinstance(info.value, pika.exceptions.ProbableAuthenticationError)


def test_self_signed_client_certificate_is_refused_at_the_tls_layer(
    start_proxy: ProxyFactory, pki: TestPKI, server: Issued
) -> None:
    proxy = start_proxy(**tls_overrides(pki, server, mutual=True))
    impostor = pki.client_context(pki.self_signed_client("alice"))
    assert refused_at_tls_layer(proxy.port, impostor) != ""

    async def aio() -> None:
        await aio_pika.connect(f"amqps://127.0.0.1:{proxy.port}/", ssl_context=impostor)

    with pytest.raises((aiormq.exceptions.AMQPConnectionError, ConnectionError, ssl.SSLError)):
        asyncio.run(aio())


# ---- SASL EXTERNAL ---------------------------------------------------------------------------


def external_proxy(
    start_proxy: ProxyFactory, pki: TestPKI, server: Issued, *, mutual: bool, **extra: str
) -> int:
    proxy = start_proxy(
        **tls_overrides(pki, server, mutual=mutual),
        authenticationEnabled="true",
        authenticationProviders="tls",
        **extra,
    )
    return proxy.port


def test_external_login_takes_the_certificate_common_name(
    start_proxy: ProxyFactory,
    pki: TestPKI,
    server: Issued,
    alice: Issued,
    caplog_info: pytest.LogCaptureFixture,
) -> None:
    port = external_proxy(start_proxy, pki, server, mutual=True)
    params = tls_params(port, pki.client_context(alice), pika.credentials.ExternalCredentials())
    assert pika_round_trip(params) == b"over tls"
    assert "alice opened vhost" in caplog_info.text


def test_aio_pika_external_login(
    start_proxy: ProxyFactory,
    pki: TestPKI,
    server: Issued,
    alice: Issued,
    caplog_info: pytest.LogCaptureFixture,
) -> None:
    port = external_proxy(start_proxy, pki, server, mutual=True)
    url = f"amqps://127.0.0.1:{port}/?auth=external"
    assert asyncio.run(aio_pika_round_trip(url, pki.client_context(alice))) == b"aio over tls"
    assert "alice opened vhost" in caplog_info.text


def test_external_principal_from_a_subject_alternative_name(
    start_proxy: ProxyFactory,
    pki: TestPKI,
    server: Issued,
    alice: Issued,
    caplog_info: pytest.LogCaptureFixture,
) -> None:
    port = external_proxy(
        start_proxy, pki, server, mutual=True, tlsExternalPrincipalFrom="san_email"
    )
    params = tls_params(port, pki.client_context(alice), pika.credentials.ExternalCredentials())
    connection = pika.BlockingConnection(params)
    connection.close()
    assert "alice@example.com opened vhost" in caplog_info.text


def test_external_without_a_client_certificate_is_refused_with_403(
    start_proxy: ProxyFactory, pki: TestPKI, server: Issued
) -> None:
    # Client certificates optional: the TLS handshake passes, the EXTERNAL login cannot.
    port = external_proxy(start_proxy, pki, server, mutual=False)
    params = tls_params(port, pki.client_context(), pika.credentials.ExternalCredentials())
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(params)
    assert "403" in str(info.value) and "ACCESS_REFUSED" in str(info.value)

    client = RawClient("127.0.0.1", port, tls=pki.client_context())
    close = client.login("EXTERNAL", "")
    assert client.mechanisms == ["EXTERNAL"]
    assert isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (403, 10, 11)
    assert close.reply_text == (
        "ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL. "
        "For details see the broker logfile."
    )
    client.close()


def test_external_is_not_offered_on_a_plain_listener(
    start_proxy: ProxyFactory, pki: TestPKI, server: Issued, alice: Issued
) -> None:
    overrides = tls_overrides(pki, server)
    overrides["amqpListeners"] = "amqp://127.0.0.1:0,amqps://127.0.0.1:0"
    proxy = start_proxy(
        **overrides,
        authenticationEnabled="true",
        authenticationProviders="tls,token",
        tokenSecretKey="data:;base64,c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=",
    )
    plain = RawClient("127.0.0.1", proxy.port_of("amqp"))
    close = plain.login("EXTERNAL", "")
    assert plain.mechanisms == ["PLAIN", "AMQPLAIN"]
    assert isinstance(close, commands.Connection.Close) and close.reply_code == 503
    plain.close()
    tls = RawClient("127.0.0.1", proxy.port_of("amqps"), tls=pki.client_context(alice))
    assert isinstance(tls.login("EXTERNAL", ""), commands.Connection.Tune)
    assert tls.mechanisms == ["PLAIN", "AMQPLAIN", "EXTERNAL"]
    tls.close()


# ---- handshake timeout and certificate reload ------------------------------------------------


def test_silent_tls_clients_are_dropped_after_the_timeout_and_others_are_served(
    start_proxy: ProxyFactory, pki: TestPKI, server: Issued
) -> None:
    timeout = 3.0
    proxy = start_proxy(
        **tls_overrides(pki, server), tlsHandshakeTimeoutMillis=str(int(timeout * 1000))
    )
    opened = time.monotonic()
    silent = socket.create_connection(("127.0.0.1", proxy.port), timeout=15)
    # A ClientHello record header that promises 200 bytes and never sends them.
    stalled = socket.create_connection(("127.0.0.1", proxy.port), timeout=15)
    stalled.sendall(b"\x16\x03\x01\x00\xc8\x01")
    try:
        connection = pika.BlockingConnection(tls_params(proxy.port, pki.client_context()))
        served_after = time.monotonic() - opened
        assert connection.channel().is_open
        connection.close()
        assert served_after < timeout, "the silent clients held up another client"
        for sock in (silent, stalled):
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(1024) == b""
            elapsed = time.monotonic() - opened
            assert timeout - 0.5 <= elapsed <= timeout + 5, elapsed
    finally:
        silent.close()
        stalled.close()
    # The listener still serves after dropping them.
    assert pika_round_trip(tls_params(proxy.port, pki.client_context())) == b"over tls"


def test_renewed_certificate_is_used_for_new_connections(
    start_proxy: ProxyFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    pki = TestPKI(tmp_path_factory.mktemp("renewal"))
    server = pki.server()
    proxy = start_proxy(**tls_overrides(pki, server), tlsCertRefreshCheckDurationSec="0")
    assert served_certificate(proxy.port, pki).serial_number == server.cert.serial_number
    before = pika.BlockingConnection(tls_params(proxy.port, pki.client_context()))
    renewed = pki.server("renewed")
    server.key_file.write_bytes(renewed.key_file.read_bytes())
    server.cert_file.write_bytes(renewed.cert_file.read_bytes())
    deadline = time.monotonic() + 10
    while served_certificate(proxy.port, pki).serial_number != renewed.cert.serial_number:
        assert time.monotonic() < deadline, "the renewed certificate was not picked up"
        time.sleep(0.1)
    # Connections made before the renewal carry on.
    assert before.channel().is_open
    before.close()
    assert pika_round_trip(tls_params(proxy.port, pki.client_context())) == b"over tls"


def test_tls_listener_with_unusable_files_does_not_start(
    start_proxy: ProxyFactory,
    pki: TestPKI,
    server: Issued,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    overrides = tls_overrides(pki, server)
    overrides["tlsKeyFilePath"] = str(tmp_path_factory.mktemp("missing") / "no.key")
    with pytest.raises(RuntimeError) as info:
        start_proxy(**overrides)
    # Refused before listening, naming the setting and the file (inside trio's group).
    assert "tlsCertificateFilePath" in repr(info.value.__cause__)
    assert "no.key" in repr(info.value.__cause__)
