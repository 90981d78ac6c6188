"""Authentication policies (pure): which mechanisms are offered, PLAIN/AMQPLAIN with tokens,
EXTERNAL from client certificates, update-secret, and building them from the config."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from pamqp.encode import field_table

from starlight_py.auth.authenticator import (
    AcceptAnyAuthenticator,
    AuthenticationFailed,
    ConfiguredAuthenticator,
    Principal,
    build_authenticator,
)
from starlight_py.auth.certificates import CertificateIdentityMissing, certificate_principal
from starlight_py.auth.tokens import InvalidToken, TokenSettings, TokenVerifier
from starlight_py.config import ConfigError, load_config
from tests.support.pki import TestPKI, new_key

SECRET = b"s" * 32
SECRET_URL = "data:;base64," + base64.b64encode(SECRET).decode()


def token(sub: str = "alice", ttl: float = 3600, **claims: object) -> str:
    return jwt.encode({"sub": sub, "exp": int(time.time() + ttl), **claims}, SECRET, "HS256")


def plain(password: str, user: str = "ignored") -> bytes:
    return f"\x00{user}\x00{password}".encode()


def amqplain(password: str) -> bytes:
    return field_table({"LOGIN": "ignored", "PASSWORD": password})[4:]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    return TestPKI(tmp_path_factory.mktemp("pki"))


def der(pki: TestPKI, cn: str, **kwargs: tuple[str, ...]) -> bytes:
    issued = pki.client(cn, **kwargs)
    return issued.cert.public_bytes(serialization.Encoding.DER)


def tokens_only() -> ConfiguredAuthenticator:
    return ConfiguredAuthenticator(TokenVerifier(TokenSettings(secret_key=SECRET)))


# ---- certificates ----------------------------------------------------------------------------


def test_principal_from_common_name(pki: TestPKI) -> None:
    assert certificate_principal(der(pki, "orders-service")) == "orders-service"


def test_principal_from_subject_alternative_names(pki: TestPKI) -> None:
    cert = der(pki, "cn-name", dns_names=("svc.example.com",), emails=("ops@example.com",))
    assert certificate_principal(cert, "san_dns") == "svc.example.com"
    assert certificate_principal(cert, "san_email") == "ops@example.com"
    assert certificate_principal(cert, "cn") == "cn-name"


def test_missing_identity_is_refused(pki: TestPKI) -> None:
    with pytest.raises(CertificateIdentityMissing, match="no san_dns identity"):
        certificate_principal(der(pki, "only-cn"), "san_dns")
    with pytest.raises(CertificateIdentityMissing, match="unreadable"):
        certificate_principal(b"not a certificate")
    with pytest.raises(ValueError):
        certificate_principal(der(pki, "x"), "dn")


# ---- which mechanisms are offered ------------------------------------------------------------


def test_mechanisms_follow_providers_and_transport() -> None:
    verifier = TokenVerifier(TokenSettings(secret_key=SECRET))
    assert ConfiguredAuthenticator(verifier).mechanisms(tls=True) == ("PLAIN", "AMQPLAIN")
    both = ConfiguredAuthenticator(verifier, "cn")
    assert both.mechanisms(tls=False) == ("PLAIN", "AMQPLAIN")
    assert both.mechanisms(tls=True) == ("PLAIN", "AMQPLAIN", "EXTERNAL")
    assert ConfiguredAuthenticator(None, "cn").mechanisms(tls=True) == ("EXTERNAL",)
    assert AcceptAnyAuthenticator().mechanisms(tls=False) == ("PLAIN", "AMQPLAIN")
    assert AcceptAnyAuthenticator().mechanisms(tls=True) == ("PLAIN", "AMQPLAIN", "EXTERNAL")


# ---- token logins ----------------------------------------------------------------------------


def test_plain_and_amqplain_passwords_are_tokens() -> None:
    auth = tokens_only()
    good = token("alice", ttl=60)
    principal = auth.authenticate("PLAIN", plain(good))
    assert (principal.name, principal.mechanism) == ("alice", "PLAIN")
    assert principal.expires_at is not None and principal.expires_at > time.time()
    assert auth.authenticate("AMQPLAIN", amqplain(good)).name == "alice"


@pytest.mark.parametrize(
    "response",
    [plain(token(ttl=-10)), plain("guest"), plain(""), b"no-nul-separators", amqplain("x")],
)
def test_bad_tokens_and_responses_are_refused(response: bytes) -> None:
    with pytest.raises(AuthenticationFailed):
        tokens_only().authenticate("PLAIN" if b"\x00" in response[:20] else "AMQPLAIN", response)


def test_mechanism_without_a_provider_is_refused(pki: TestPKI) -> None:
    with pytest.raises(AuthenticationFailed, match="EXTERNAL is not enabled"):
        tokens_only().authenticate("EXTERNAL", b"", der(pki, "alice"))
    with pytest.raises(AuthenticationFailed, match="PLAIN is not enabled"):
        ConfiguredAuthenticator(None, "cn").authenticate("PLAIN", plain(token()))


# ---- EXTERNAL --------------------------------------------------------------------------------


def test_external_takes_the_verified_certificate(pki: TestPKI) -> None:
    auth = ConfiguredAuthenticator(None, "cn")
    assert auth.authenticate("EXTERNAL", b"", der(pki, "billing")) == Principal(
        "billing", "EXTERNAL"
    )
    san = ConfiguredAuthenticator(None, "san_email")
    cert = der(pki, "x", emails=("ann@example.com",))
    assert san.authenticate("EXTERNAL", b"", cert).name == "ann@example.com"


def test_external_without_a_certificate_is_refused() -> None:
    with pytest.raises(AuthenticationFailed, match="without a client certificate"):
        ConfiguredAuthenticator(None, "cn").authenticate("EXTERNAL", b"", None)


def test_accept_any_names_external_clients_by_certificate_or_anonymous(pki: TestPKI) -> None:
    auth = AcceptAnyAuthenticator()
    assert auth.authenticate("EXTERNAL", b"", der(pki, "ci-runner")).name == "ci-runner"
    assert auth.authenticate("EXTERNAL", b"", None).name == "anonymous"
    assert auth.authenticate("EXTERNAL", b"", b"garbage").name == "anonymous"
    assert auth.authenticate("PLAIN", plain("pw", user="guest")).name == "guest"


# ---- update-secret ---------------------------------------------------------------------------


def test_update_secret_renews_the_expiry_of_the_same_principal() -> None:
    auth = tokens_only()
    principal = auth.authenticate("PLAIN", plain(token("alice", ttl=5)))
    renewed = auth.update_secret(principal, token("alice", ttl=3600).encode())
    assert renewed.name == "alice" and renewed.mechanism == "PLAIN"
    assert renewed.expires_at is not None and principal.expires_at is not None
    assert renewed.expires_at > principal.expires_at


def test_update_secret_refuses_bad_tokens_and_other_principals() -> None:
    auth = tokens_only()
    principal = auth.authenticate("PLAIN", plain(token("alice")))
    with pytest.raises(InvalidToken):
        auth.update_secret(principal, token("alice", ttl=-1).encode())
    with pytest.raises(InvalidToken):
        auth.update_secret(principal, b"garbage")
    with pytest.raises(AuthenticationFailed, match="names 'mallory'"):
        auth.update_secret(principal, token("mallory").encode())


def test_update_secret_of_an_external_login_is_refused() -> None:
    auth = ConfiguredAuthenticator(TokenVerifier(TokenSettings(secret_key=SECRET)), "cn")
    with pytest.raises(AuthenticationFailed, match="no secret"):
        auth.update_secret(Principal("billing", "EXTERNAL"), token("billing").encode())


def test_update_secret_with_authentication_disabled_is_accepted() -> None:
    principal = Principal("guest", "PLAIN")
    assert AcceptAnyAuthenticator().update_secret(principal, b"anything") == principal


# ---- from the configuration ------------------------------------------------------------------


def test_disabled_authentication_accepts_anything() -> None:
    assert isinstance(build_authenticator(load_config()), AcceptAnyAuthenticator)


def test_token_provider_with_a_secret_key() -> None:
    config = load_config(
        overrides={
            "authenticationEnabled": "true",
            "authenticationProviders": "token",
            "tokenSecretKey": SECRET_URL,
        }
    )
    auth = build_authenticator(config)
    assert auth.authenticate("PLAIN", plain(token("bob"))).name == "bob"
    assert auth.mechanisms(tls=True) == ("PLAIN", "AMQPLAIN")


def test_token_provider_with_a_public_key_file(tmp_path: Path) -> None:
    key = new_key()
    path = tmp_path / "public.der"
    path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    config = load_config(
        overrides={
            "authenticationEnabled": "true",
            "authenticationProviders": "token",
            "tokenPublicKey": path.as_uri(),
            "tokenPublicAlg": "ES256",
            "tokenAuthClaim": "client_id",
            "tokenAudience": "starlight",
        }
    )
    auth = build_authenticator(config)
    good = jwt.encode({"client_id": "svc", "aud": "starlight"}, key, algorithm="ES256")
    assert auth.authenticate("PLAIN", plain(good)).name == "svc"
    wrong_audience = jwt.encode({"client_id": "svc", "aud": "other"}, key, algorithm="ES256")
    with pytest.raises(AuthenticationFailed, match="audience"):
        auth.authenticate("PLAIN", plain(wrong_audience))


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"tokenSecretKey": "file:///no/such/key"}, "tokenSecretKey"),
        ({"tokenSecretKey": "data:;base64,"}, "tokenSecretKey"),
        ({"tokenPublicKey": "data:;base64,AAAA"}, "tokenPublicKey"),
    ],
)
def test_unusable_keys_fail_at_start_naming_the_key(overrides: dict[str, str], key: str) -> None:
    config = load_config(
        overrides={"authenticationEnabled": "true", "authenticationProviders": "token", **overrides}
    )
    with pytest.raises(ConfigError) as info:
        build_authenticator(config)
    assert info.value.key == key


def test_tls_provider_offers_external_with_the_configured_source(tmp_path: Path) -> None:
    config = load_config(
        overrides={
            "authenticationEnabled": "true",
            "authenticationProviders": "tls",
            "amqpListeners": "amqps://127.0.0.1:5671",
            "tlsCertificateFilePath": "/x.pem",
            "tlsKeyFilePath": "/x.key",
            "tlsTrustCertsFilePath": "/ca.pem",
            "tlsExternalPrincipalFrom": "san_dns",
        }
    )
    auth = build_authenticator(config)
    assert auth.mechanisms(tls=True) == ("EXTERNAL",)
    assert isinstance(auth, ConfiguredAuthenticator)
    assert auth.external_principal_from == "san_dns"
