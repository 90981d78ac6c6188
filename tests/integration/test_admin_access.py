"""`starlight-admin token create`, `permissions set|clear|list`, `proxies list` and `cleaner
status` against real ZooKeeper + Pulsar, with pika logging in to a proxy with the tokens."""

from __future__ import annotations

import base64
import time
import uuid
from pathlib import Path

import pika
import pika.exceptions
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from starlight_py.local import ServiceEndpoints
from tests.integration.conftest import ProxyFactory
from tests.support.admin_cli import AdminCLI
from tests.support.proxy_runner import ProxyThread

SECRET = b"admin-test-secret-key-of-32-bytes!"
SECRET_SPEC = "data:;base64," + base64.b64encode(SECRET).decode()


@pytest.fixture
def admin(services: ServiceEndpoints) -> AdminCLI:
    return AdminCLI(services)


def login(proxy: ProxyThread, token: str, vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            proxy.port,
            vhost,
            pika.PlainCredentials("ignored", token),
            connection_attempts=1,
            heartbeat=0,
        )
    )


def round_trip(connection: pika.BlockingConnection, queue: str) -> bytes:
    channel = connection.channel()
    channel.queue_declare(queue, exclusive=True)
    channel.basic_publish("", queue, b"with an admin token")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            return bytes(body)
        time.sleep(0.05)
    raise AssertionError("nothing arrived")


def test_tokens_and_permissions_made_by_the_admin_let_pika_in(
    admin: AdminCLI, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_file = tmp_path / "private.pem"
    private_file.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public_file = tmp_path / "public.pem"
    public_file.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    proxy = start_proxy(
        authenticationEnabled="true",
        authenticationProviders="token",
        tokenSecretKey=SECRET_SPEC,
        tokenPublicKey=f"file://{public_file}",
        **admin.proxy_settings,
    )
    hs_token = admin.ok(
        "token", "create", "--subject", "adm-alice", "--expiry", "1h", "--secret-key", SECRET_SPEC
    ).out.strip()
    rs_token = admin.json(
        "token", "create", "--subject", "adm-svc", "--private-key", f"file://{private_file}"
    )["token"]

    # Without permissions in the vhost the token is not enough.
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        login(proxy, hs_token)
    admin.ok("permissions", "set", "adm-alice", ".*", ".*", ".*")
    admin.ok("permissions", "set", "adm-svc", "^svc-", "^svc-|^amq\\.default$", "^svc-")
    assert admin.json("permissions", "list") == [
        {"vhost": "/", "principal": "adm-alice", "configure": ".*", "write": ".*", "read": ".*"},
        {
            "vhost": "/",
            "principal": "adm-svc",
            "configure": "^svc-",
            "write": "^svc-|^amq\\.default$",
            "read": "^svc-",
        },
    ]
    deadline = time.monotonic() + 5  # the proxy caches permissions for up to a second
    while True:
        try:
            connection = login(proxy, hs_token)
            break
        except pika.exceptions.AMQPConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    assert round_trip(connection, f"adm-{uuid.uuid4().hex[:8]}") == b"with an admin token"
    connection.close()
    connection = login(proxy, rs_token)
    assert round_trip(connection, f"svc-{uuid.uuid4().hex[:8]}") == b"with an admin token"
    connection.close()

    assert admin.json("permissions", "clear", "adm-alice")["cleared"] is True
    assert admin.json("permissions", "clear", "adm-alice")["cleared"] is False
    assert [p["principal"] for p in admin.json("permissions", "list", "--vhost", "/")] == [
        "adm-svc"
    ]
    bad = admin.run("permissions", "set", "bob", "(", ".*", ".*")
    assert bad.code == 2
    assert "invalid configure pattern" in bad.err


def test_proxies_list_and_cleaner_status(admin: AdminCLI, start_proxy: ProxyFactory) -> None:
    proxy = start_proxy(subscriptionCleanerIntervalMillis="500", **admin.proxy_settings)
    deadline = time.monotonic() + 15  # the proxy registers itself just after it starts
    while not (proxies := admin.json("proxies", "list")):
        assert time.monotonic() < deadline, "the proxy did not register"
        time.sleep(0.2)
    assert len(proxies) == 1
    assert proxies[0]["listeners"] == proxy.url
    deadline = time.monotonic() + 15
    while (status := admin.json("cleaner", "status"))["leader"] is None:
        assert time.monotonic() < deadline, "no cleaner leader"
        time.sleep(0.2)
    assert status["leader"] == proxies[0]["id"]

    # An unbind with messages still unread leaves a subscription draining.
    connection = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))
    channel = connection.channel()
    channel.exchange_declare("adm-x", "fanout")
    channel.queue_declare("adm-draining")
    channel.queue_bind("adm-draining", "adm-x")
    channel.confirm_delivery()
    channel.basic_publish("adm-x", "", b"unread")
    channel.queue_unbind("adm-draining", "adm-x")
    pending = admin.json("cleaner", "status")["pending"]
    assert [(p["queue"], p["state"]) for p in pending] == [("adm-draining", "draining")]
    assert pending[0]["topic"] == "persistent://public/default/adm-x"
    text = admin.ok("cleaner", "status").out
    assert f"leader: {proxies[0]['id']}" in text
    connection.close()
