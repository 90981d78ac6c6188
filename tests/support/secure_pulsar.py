"""A Pulsar standalone that demands authentication (HS256 tokens, or a client certificate)
and serves TLS ports with a certificate of the test CA: what a production Pulsar looks like
to the proxy."""

from __future__ import annotations

import base64
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import jwt

from starlight_py.local import PulsarStandalone
from starlight_py.local.ports import free_port
from tests.support.pki import Issued, TestPKI

# Roles Pulsar lets do anything: the proxy's token, its TLS client certificate (CN), and the
# broker's own internal client.
PROXY_ROLE = "starlight-proxy"
PROXY_TLS_ROLE = "starlight-proxy-tls"
BROKER_ROLE = "pulsar-broker"

TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


def hs256_token(secret: bytes, subject: str, lifetime: float = 3600) -> str:
    return jwt.encode({"sub": subject, "exp": int(time.time() + lifetime)}, secret, "HS256")


@dataclass
class SecurePulsar:
    """A running standalone and what a client needs to reach it."""

    standalone: PulsarStandalone
    secret: bytes
    pki: TestPKI
    server: Issued
    tls_broker_port: int
    tls_web_port: int

    @property
    def tls_service_url(self) -> str:
        return f"pulsar+ssl://localhost:{self.tls_broker_port}"

    @property
    def tls_web_url(self) -> str:
        return f"https://localhost:{self.tls_web_port}"

    def token(self, subject: str = PROXY_ROLE) -> str:
        return hs256_token(self.secret, subject)


def start_secure_pulsar(
    data_dir: Path, pki: TestPKI, distribution: Path | None = None
) -> SecurePulsar:
    """Start (and return once ready) a standalone with token and TLS authentication and
    TLS ports next to its plain ones (which its own tooling uses). Raises LocalInfraError."""
    secret = secrets.token_bytes(32)
    server = pki.server("pulsar-broker")
    tls_broker_port, tls_web_port = free_port(), free_port()
    broker_token = hs256_token(secret, BROKER_ROLE, lifetime=7 * 24 * 3600)
    properties = {
        "authenticationEnabled": "true",
        "authenticationProviders": (
            "org.apache.pulsar.broker.authentication.AuthenticationProviderToken,"
            "org.apache.pulsar.broker.authentication.AuthenticationProviderTls"
        ),
        "tokenSecretKey": "data:;base64," + base64.b64encode(secret).decode("ascii"),
        "superUserRoles": f"{PROXY_ROLE},{PROXY_TLS_ROLE},{BROKER_ROLE}",
        "authorizationEnabled": "false",
        "brokerClientAuthenticationPlugin": TOKEN_PLUGIN,
        "brokerClientAuthenticationParameters": f"token:{broker_token}",
        "brokerServicePortTls": str(tls_broker_port),
        "webServicePortTls": str(tls_web_port),
        "tlsCertificateFilePath": str(server.cert_file),
        "tlsKeyFilePath": str(server.key_file),
        "tlsTrustCertsFilePath": str(pki.ca_file),
        "tlsAllowInsecureConnection": "false",
    }
    standalone = PulsarStandalone(
        data_dir,
        distribution=distribution,
        extra_properties=properties,
        admin_token=broker_token,
    )
    standalone.start(timeout=300)
    return SecurePulsar(standalone, secret, pki, server, tls_broker_port, tls_web_port)
