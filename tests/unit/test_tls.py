"""The server TLS context (versions, client certificates, reload) and the bounded handshake,
over trio's in-memory streams: no sockets, no services."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from starlight_py.auth.certificates import certificate_principal
from starlight_py.gateway.connection.tls import (
    ReloadingServerContext,
    TlsSettings,
    TlsSetupError,
    build_server_context,
    complete_handshake,
    peer_certificate,
)
from tests.support.pki import Issued, TestPKI


@pytest.fixture
def pki(tmp_path: Path) -> TestPKI:
    return TestPKI(tmp_path / "pki")


def settings(pki: TestPKI, server: Issued, **changes: Any) -> TlsSettings:
    values: dict[str, Any] = {
        "certificate_file": str(server.cert_file),
        "key_file": str(server.key_file),
        "trust_certs_file": str(pki.ca_file),
        **changes,
    }
    return TlsSettings(**values)


# ---- building the context --------------------------------------------------------------------


def test_tls_1_2_and_up_by_default_and_client_certificates_optional(pki: TestPKI) -> None:
    context = build_server_context(settings(pki, pki.server()))
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.maximum_version == ssl.TLSVersion.TLSv1_3
    assert context.verify_mode == ssl.CERT_OPTIONAL


def test_mutual_tls_requires_a_certificate_and_no_trust_asks_for_none(pki: TestPKI) -> None:
    server = pki.server()
    assert (
        build_server_context(settings(pki, server, require_client_cert=True)).verify_mode
        == ssl.CERT_REQUIRED
    )
    assert (
        build_server_context(settings(pki, server, trust_certs_file="")).verify_mode
        == ssl.CERT_NONE
    )


def test_protocol_range(pki: TestPKI) -> None:
    context = build_server_context(settings(pki, pki.server(), protocols=("TLSv1.3",)))
    assert context.minimum_version == ssl.TLSVersion.TLSv1_3


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"ciphers": ("NO-SUCH-CIPHER",)}, "tlsCiphers"),
        ({"key_file": "/no/such/key.pem"}, "tlsCertificateFilePath"),
        ({"trust_certs_file": "/no/such/ca.pem"}, "tlsTrustCertsFilePath"),
    ],
)
def test_unusable_settings_name_the_key(pki: TestPKI, changes: dict[str, Any], key: str) -> None:
    with pytest.raises(TlsSetupError) as info:
        build_server_context(settings(pki, pki.server(), **changes))
    assert info.value.key == key


def test_key_that_does_not_match_the_certificate(pki: TestPKI) -> None:
    first, second = pki.server("one"), pki.server("two")
    mismatched = settings(pki, first, key_file=str(second.key_file))
    with pytest.raises(TlsSetupError) as info:
        build_server_context(mismatched)
    assert info.value.key == "tlsCertificateFilePath"


# ---- reload ----------------------------------------------------------------------------------


def test_changed_files_give_new_connections_a_new_context(
    pki: TestPKI, caplog: pytest.LogCaptureFixture
) -> None:
    server = pki.server()

    async def scenario() -> None:
        contexts = ReloadingServerContext(settings(pki, server, refresh_interval=0))
        first = contexts.current()
        assert contexts.current() is first
        replacement = pki.server("replacement")
        server.cert_file.write_bytes(replacement.cert_file.read_bytes())
        server.key_file.write_bytes(replacement.key_file.read_bytes())
        second = contexts.current()
        assert second is not first and contexts.reloads == 1
        # A half-written certificate is not used: the previous context stays.
        server.cert_file.write_bytes(b"-----BEGIN CERTIFICATE-----\ntrunc")
        with caplog.at_level(logging.WARNING, logger="starlight.tls"):
            assert contexts.current() is second
        assert "cannot be used" in caplog.text
        assert contexts.reloads == 1

    trio.run(scenario)


def test_files_are_looked_at_only_every_refresh_interval(pki: TestPKI) -> None:
    server = pki.server()

    async def scenario() -> None:
        contexts = ReloadingServerContext(settings(pki, server, refresh_interval=60))
        first = contexts.current()
        replacement = pki.server("replacement")
        server.cert_file.write_bytes(replacement.cert_file.read_bytes())
        server.key_file.write_bytes(replacement.key_file.read_bytes())
        assert contexts.current() is first
        await trio.sleep(61)
        assert contexts.current() is not first

    trio.run(scenario, clock=trio.testing.MockClock(autojump_threshold=0))


# ---- handshakes over memory streams ----------------------------------------------------------


async def handshake(
    server_context: ssl.SSLContext, client_context: ssl.SSLContext, timeout: float = 5.0
) -> tuple[bool, bytes | None]:
    client_transport, server_transport = trio.testing.memory_stream_pair()
    server = trio.SSLStream(server_transport, server_context, server_side=True)
    client = trio.SSLStream(client_transport, client_context, server_hostname="localhost")
    result: list[bool] = []

    async def client_side() -> None:
        try:
            await client.do_handshake()
            # TLS 1.3: a refused client certificate is reported after the client's handshake.
            await client.receive_some(1)
        except trio.BrokenResourceError:
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client_side)
        result.append(await complete_handshake(server, timeout, "test-peer"))
        if result[0]:
            await server.send_all(b"x")
    return result[0], peer_certificate(server) if result[0] else None


def test_client_certificate_signed_by_the_ca_is_seen(pki: TestPKI) -> None:
    context = build_server_context(settings(pki, pki.server(), require_client_cert=True))
    client = pki.client("alice")
    ok, der = trio.run(handshake, context, pki.client_context(client))
    assert ok and der is not None
    assert certificate_principal(der) == "alice"


def test_optional_client_certificate_may_be_absent(pki: TestPKI) -> None:
    context = build_server_context(settings(pki, pki.server()))
    assert trio.run(handshake, context, pki.client_context()) == (True, None)


@pytest.mark.parametrize("who", ["nobody", "self-signed"])
def test_mutual_tls_refuses_missing_and_untrusted_certificates(pki: TestPKI, who: str) -> None:
    context = build_server_context(settings(pki, pki.server(), require_client_cert=True))
    client = pki.self_signed_client("mallory") if who == "self-signed" else None
    ok, _ = trio.run(handshake, context, pki.client_context(client))
    assert not ok


def test_untrusted_certificate_is_refused_even_when_optional(pki: TestPKI) -> None:
    context = build_server_context(settings(pki, pki.server()))
    ok, _ = trio.run(handshake, context, pki.client_context(pki.self_signed_client("eve")))
    assert not ok


def test_silent_client_is_dropped_after_the_timeout(
    pki: TestPKI, caplog: pytest.LogCaptureFixture
) -> None:
    context = build_server_context(settings(pki, pki.server()))

    async def scenario() -> tuple[bool, float]:
        _, server_transport = trio.testing.memory_stream_pair()
        server = trio.SSLStream(server_transport, context, server_side=True)
        start = trio.current_time()
        ok = await complete_handshake(server, 2.5, "silent-peer")
        return ok, trio.current_time() - start

    with caplog.at_level(logging.INFO, logger="starlight.tls"):
        ok, waited = trio.run(scenario, clock=trio.testing.MockClock(autojump_threshold=0))
    assert not ok
    assert waited == pytest.approx(2.5)
    assert "no TLS handshake within 2.5 s" in caplog.text
