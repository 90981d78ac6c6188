"""SASL PLAIN with JWTs (HS256 with a secret key, RS256 with a public key file): logins with
pika, aio-pika and kombu; refusals with 403 where pika expects them; connection.update-secret;
a connection closed when its token expires; secrets kept out of the logs; and the loud warning
when authentication is off."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import aiormq.exceptions
import jwt
import kombu
import pika
import pika.exceptions
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pamqp import commands

from tests.integration.conftest import ProxyFactory
from tests.support.amqp_fixtures import get_one
from tests.support.pki import TestPKI, tls_overrides
from tests.support.proxy_runner import ProxyThread
from tests.support.raw_amqp import RawClient

SECRET = b"starlight-integration-test-secret-key-0123456789abcdef0123456789"
AUDIENCE = "starlight-tests"


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def public_key_file(rsa_key: rsa.RSAPrivateKey, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # DER, as `pulsar tokens create-key-pair` writes it.
    path = tmp_path_factory.mktemp("keys") / "public.key"
    path.write_bytes(
        rsa_key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return path


def token_overrides(public_key_file: Path, **extra: str) -> dict[str, str]:
    return {
        "authenticationEnabled": "true",
        "authenticationProviders": "token",
        "tokenSecretKey": "data:;base64," + base64.b64encode(SECRET).decode(),
        "tokenPublicKey": public_key_file.as_uri(),
        **extra,
    }


@pytest.fixture
def token_proxy(start_proxy: ProxyFactory, public_key_file: Path) -> ProxyThread:
    return start_proxy(**token_overrides(public_key_file, tokenAudience=AUDIENCE))


def hs256(sub: str = "alice", ttl: float = 3600, **claims: Any) -> str:
    payload = {"sub": sub, "aud": AUDIENCE, "exp": int(time.time() + ttl), **claims}
    return jwt.encode({k: v for k, v in payload.items() if v is not None}, SECRET, "HS256")


def rs256(key: rsa.RSAPrivateKey, sub: str = "svc-orders", ttl: float = 3600) -> str:
    payload = {"sub": sub, "aud": AUDIENCE, "exp": int(time.time() + ttl)}
    return jwt.encode(payload, key, algorithm="RS256")


def params(proxy: ProxyThread, token: str, user: str = "ignored") -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        "127.0.0.1",
        proxy.port,
        credentials=pika.PlainCredentials(user, token),
        connection_attempts=1,
        heartbeat=0,
    )


def round_trip(connection: pika.BlockingConnection) -> bytes:
    channel = connection.channel()
    queue = f"token-{uuid.uuid4().hex[:12]}"
    channel.queue_declare(queue, exclusive=True)
    channel.basic_publish("", queue, b"with a token")
    return get_one(channel, queue, auto_ack=True)[2]


@pytest.fixture(autouse=True)
def permitted(grant_all: Callable[..., None]) -> None:
    # With authentication on, only principals with permissions in a vhost may open it.
    grant_all("alice", "svc-orders", "svc-billing", "celery-worker")


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG):
        yield caplog


def proxy_log(caplog: pytest.LogCaptureFixture) -> str:
    # The proxy's records only: client libraries log what they send at DEBUG.
    return "\n".join(
        record.getMessage() + (record.exc_text or "")
        for record in caplog.records
        if record.name.startswith("starlight") or record.name in ("trio", "root")
    )


# ---- logins ----------------------------------------------------------------------------------


def test_pika_logs_in_with_an_hs256_token(
    token_proxy: ProxyThread, logs: pytest.LogCaptureFixture
) -> None:
    connection = pika.BlockingConnection(params(token_proxy, hs256("alice"), user="whoever"))
    assert round_trip(connection) == b"with a token"
    connection.close()
    # The principal comes from the token; the username is ignored (as in Starlight).
    assert "alice opened vhost" in proxy_log(logs)
    assert "whoever" not in proxy_log(logs)


def test_pika_and_aio_pika_log_in_with_rs256_tokens(
    token_proxy: ProxyThread, rsa_key: rsa.RSAPrivateKey, logs: pytest.LogCaptureFixture
) -> None:
    connection = pika.BlockingConnection(params(token_proxy, rs256(rsa_key, "svc-orders")))
    assert round_trip(connection) == b"with a token"
    connection.close()

    async def aio() -> bytes:
        url = f"amqp://ignored:{rs256(rsa_key, 'svc-billing')}@127.0.0.1:{token_proxy.port}/"
        async with await aio_pika.connect(url, timeout=10) as conn:
            channel = await conn.channel()
            queue = await channel.declare_queue(f"token-aio-{uuid.uuid4().hex[:8]}", exclusive=True)
            await channel.default_exchange.publish(aio_pika.Message(b"aio"), queue.name)
            for _ in range(100):
                message = await queue.get(no_ack=True, fail=False)
                if message is not None:
                    return message.body
                await asyncio.sleep(0.05)
        raise AssertionError("no message")

    assert asyncio.run(aio()) == b"aio"
    assert "svc-orders opened vhost" in proxy_log(logs)
    assert "svc-billing opened vhost" in proxy_log(logs)


def test_kombu_logs_in_with_amqplain_and_a_token(token_proxy: ProxyThread) -> None:
    url = f"amqp://ignored:{hs256('celery-worker')}@127.0.0.1:{token_proxy.port}//"
    with kombu.Connection(url, connect_timeout=10) as connection:
        connection.connect()
        assert connection.channel().is_open


def test_token_login_over_tls(
    start_proxy: ProxyFactory, public_key_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    pki = TestPKI(tmp_path_factory.mktemp("token-tls"))
    proxy = start_proxy(**tls_overrides(pki, pki.server()), **token_overrides(public_key_file))
    tls = pika.ConnectionParameters(
        "127.0.0.1",
        proxy.port,
        ssl_options=pika.SSLOptions(pki.client_context(), "localhost"),
        credentials=pika.PlainCredentials("", hs256("alice")),
        connection_attempts=1,
    )
    connection = pika.BlockingConnection(tls)
    assert round_trip(connection) == b"with a token"
    connection.close()


# ---- refusals --------------------------------------------------------------------------------


def _other_key_rs256() -> str:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return rs256(other)


REFUSED = {
    "expired": lambda: hs256(ttl=-30),
    "not-yet-valid": lambda: hs256(nbf=int(time.time()) + 3600),
    "wrong-audience": lambda: hs256(aud="somebody-else"),
    "no-audience": lambda: hs256(aud=None),
    "wrong-hmac-secret": lambda: jwt.encode(
        {"sub": "alice", "aud": AUDIENCE}, b"x" * 64, algorithm="HS256"
    ),
    "wrong-rsa-key": _other_key_rs256,
    "alg-none": lambda: jwt.encode({"sub": "alice", "aud": AUDIENCE}, None, algorithm="none"),
    "garbage": lambda: "guest",
    "empty": lambda: "",
    "no-subject": lambda: hs256(sub=None),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_bad_tokens_are_refused_with_403_at_start_ok(
    token_proxy: ProxyThread, case: str, logs: pytest.LogCaptureFixture
) -> None:
    token = REFUSED[case]()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(params(token_proxy, token))
    text = str(info.value)
    assert "403" in text and "ACCESS_REFUSED" in text
    assert "login refused" in proxy_log(logs)
    # The proxy carries on serving good tokens.
    connection = pika.BlockingConnection(params(token_proxy, hs256()))
    assert connection.channel().is_open
    connection.close()


def test_aio_pika_gets_probable_authentication_error(token_proxy: ProxyThread) -> None:
    async def connect() -> None:
        await aio_pika.connect(
            f"amqp://alice:{hs256(ttl=-5)}@127.0.0.1:{token_proxy.port}/", timeout=10
        )

    with pytest.raises(aiormq.exceptions.ProbableAuthenticationError) as info:
        asyncio.run(connect())
    assert "ACCESS_REFUSED" in str(info.value)


def test_refusal_on_the_wire_is_rabbitmqs_connection_close(token_proxy: ProxyThread) -> None:
    client = RawClient("127.0.0.1", token_proxy.port)
    close = client.login("PLAIN", "\x00alice\x00not-a-token")
    assert client.mechanisms == ["PLAIN", "AMQPLAIN"]
    assert isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (403, 10, 11)
    assert close.reply_text == (
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
        "For details see the broker logfile."
    )
    client.send_method(0, commands.Connection.CloseOk())
    assert client.wait_closed(timeout=10) < 10
    client.close()


# ---- update-secret and expiry ----------------------------------------------------------------


def test_update_secret_keeps_a_connection_past_its_first_token(token_proxy: ProxyThread) -> None:
    connection = pika.BlockingConnection(params(token_proxy, hs256("alice", ttl=3)))
    connection.update_secret(hs256("alice", ttl=3600), "token refresh")
    connection.sleep(4.5)  # past the first token's expiry
    assert connection.is_open
    assert round_trip(connection) == b"with a token"
    connection.close()


def test_expired_token_closes_the_connection_with_320(token_proxy: ProxyThread) -> None:
    connection = pika.BlockingConnection(params(token_proxy, hs256("alice", ttl=3)))
    assert connection.channel().is_open
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        connection.sleep(8)
    assert info.value.reply_code == 320
    assert info.value.reply_text == "CONNECTION_FORCED - credential expired"


@pytest.mark.parametrize(
    "new_token",
    [lambda: hs256("alice", ttl=-1), lambda: "garbage", lambda: hs256("mallory")],
    ids=["expired", "garbage", "other-principal"],
)
def test_refused_update_secret_closes_the_connection_with_530(
    token_proxy: ProxyThread, new_token: Any
) -> None:
    connection = pika.BlockingConnection(params(token_proxy, hs256("alice")))
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        connection.update_secret(new_token(), "refresh")
    assert info.value.reply_code == 530
    assert "New secret was refused" in info.value.reply_text


def test_update_secret_in_raw_frames(token_proxy: ProxyThread) -> None:
    client = RawClient("127.0.0.1", token_proxy.port)
    client.handshake(response=f"\x00\x00{hs256('alice', ttl=60)}", heartbeat=0)
    client.send_method(0, commands.Connection.UpdateSecret(hs256("alice"), "refresh"))
    assert isinstance(client.read_method()[1], commands.Connection.UpdateSecretOk)
    assert isinstance(client.open_channel(1), commands.Channel.OpenOk)
    client.close()


def test_update_secret_with_authentication_disabled_is_answered(
    start_proxy: ProxyFactory,
) -> None:
    proxy = start_proxy()
    connection = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))
    connection.update_secret("anything", "rotation")
    assert connection.channel().is_open
    connection.close()


# ---- logs ------------------------------------------------------------------------------------


def test_tokens_never_appear_in_the_logs(
    token_proxy: ProxyThread, logs: pytest.LogCaptureFixture
) -> None:
    expired = hs256("alice", ttl=-10)
    garbage = "not.a-token." + "Z" * 40
    good = hs256("alice")
    renewed = hs256("alice", ttl=7200)
    refused_update = hs256("mallory")
    for bad in (expired, garbage):
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(params(token_proxy, bad))
    connection = pika.BlockingConnection(params(token_proxy, good))
    connection.update_secret(renewed, "refresh")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker):
        connection.update_secret(refused_update, "refresh")
    text = proxy_log(logs)
    assert "login refused" in text and "secret update refused" in text
    assert "alice opened vhost" in text
    for secret in (expired, garbage, good, renewed, refused_update):
        for part in secret.split("."):
            if len(part) > 10:
                assert part not in text
    assert base64.b64encode(SECRET).decode() not in text


def test_disabled_authentication_is_announced_once_and_accepts_anything(
    start_proxy: ProxyFactory, logs: pytest.LogCaptureFixture
) -> None:
    proxy = start_proxy()
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", proxy.port, credentials=pika.PlainCredentials("nobody", "wrong")
        )
    )
    assert connection.channel().is_open
    connection.close()
    warnings = [
        r
        for r in logs.records
        if r.levelno == logging.WARNING and "AUTHENTICATION IS DISABLED" in r.getMessage()
    ]
    assert len(warnings) == 1
    assert "nobody opened vhost" in proxy_log(logs)
