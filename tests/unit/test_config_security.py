"""TLS and authentication keys: conversions, and validation that names the key (and never
echoes a secret)."""

from __future__ import annotations

import pytest

from starlight_py.config import ConfigError, StarlightConfig, load_config

TLS = {
    "amqpListeners": "amqp://127.0.0.1:5672,amqps://127.0.0.1:5671",
    "tlsCertificateFilePath": "/tls/server.pem",
    "tlsKeyFilePath": "/tls/server.key",
}
TOKEN = {
    "authenticationEnabled": "true",
    "authenticationProviders": "token",
    "tokenSecretKey": "data:;base64,c2VjcmV0",
}


def error(**overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    return info.value


def test_defaults_are_tls_1_2_and_up_and_authentication_off() -> None:
    cfg = StarlightConfig()
    assert cfg.tls_protocols == ("TLSv1.3", "TLSv1.2")
    assert cfg.tls_handshake_timeout == 5.0
    assert cfg.tls_cert_refresh_interval == 300.0
    assert cfg.authentication_providers == ()
    assert cfg.token_public_alg == "RS256"
    assert (cfg.token_auth_claim, cfg.token_audience_claim) == ("sub", "aud")


def test_pulsar_provider_class_names_are_understood() -> None:
    cfg = load_config(
        overrides={
            **TOKEN,
            **TLS,
            "tlsTrustCertsFilePath": "/tls/ca.pem",
            "authenticationProviders": (
                "org.apache.pulsar.broker.authentication.AuthenticationProviderToken,"
                "org.apache.pulsar.broker.authentication.AuthenticationProviderTls, token"
            ),
        }
    )
    assert cfg.authentication_providers == ("token", "tls")


def test_lists_are_comma_separated() -> None:
    cfg = load_config(overrides={"tlsProtocols": " TLSv1.2 ", "tlsCiphers": "A,B , C,"})
    assert cfg.tls_protocols == ("TLSv1.2",)
    assert cfg.tls_ciphers == ("A", "B", "C")


def test_secret_key_is_not_in_the_repr() -> None:
    cfg = load_config(overrides=TOKEN)
    assert "c2VjcmV0" not in repr(cfg)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"authenticationEnabled": "true"}, "authenticationProviders"),
        ({**TOKEN, "authenticationProviders": "ldap"}, "authenticationProviders"),
        ({**TOKEN, "tokenSecretKey": ""}, "tokenSecretKey"),
        ({**TOKEN, "tokenPublicAlg": "HS256"}, "tokenPublicAlg"),
        ({**TOKEN, "tokenAuthClaim": " "}, "tokenAuthClaim"),
        ({**TOKEN, "tokenAudienceClaim": ""}, "tokenAudienceClaim"),
        ({**TOKEN, "tokenAllowedClockSkewSeconds": "-1"}, "tokenAllowedClockSkewSeconds"),
        ({"tokenPublicKey": "/etc/key.pem"}, "tokenPublicKey"),
        ({"amqpListeners": "amqps://127.0.0.1:5671"}, "tlsCertificateFilePath"),
        (
            {"amqpListeners": "amqps://h:5671", "tlsCertificateFilePath": "/c.pem"},
            "tlsKeyFilePath",
        ),
        ({"tlsRequireTrustedClientCertOnConnect": "true"}, "tlsTrustCertsFilePath"),
        ({"tlsProtocols": "SSLv3"}, "tlsProtocols"),
        ({"tlsProtocols": ""}, "tlsProtocols"),
        ({"tlsHandshakeTimeoutMillis": "0"}, "tlsHandshakeTimeoutMillis"),
        ({"tlsCertRefreshCheckDurationSec": "-5"}, "tlsCertRefreshCheckDurationSec"),
        ({"tlsExternalPrincipalFrom": "dn"}, "tlsExternalPrincipalFrom"),
        ({**TOKEN, "authenticationProviders": "tls"}, "amqpListeners"),
        ({**TOKEN, **TLS, "authenticationProviders": "tls"}, "tlsTrustCertsFilePath"),
    ],
)
def test_invalid_security_settings_name_the_key(overrides: dict[str, str], key: str) -> None:
    assert error(**overrides).key == key


def test_a_malformed_secret_is_not_echoed() -> None:
    secret = "my-very-secret-hmac-key"
    failure = error(**{**TOKEN, "tokenSecretKey": secret})
    assert failure.key == "tokenSecretKey"
    assert secret not in str(failure)


def test_tls_listener_with_its_files_is_valid() -> None:
    cfg = load_config(overrides={**TLS, "tlsTrustCertsFilePath": "/ca.pem"})
    assert [listener.scheme for listener in cfg.listeners] == ["amqp", "amqps"]
