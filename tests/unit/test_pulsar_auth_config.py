"""Proxy -> Pulsar settings: the plugin and parameter forms Pulsar and Starlight accept,
the TLS URL choice, the HTTPS context, and secrets kept out of reprs, errors and logs."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import pulsar
import pytest

from starlight_py.backend.broker_auth import (
    PARAMETERS_KEY,
    PLUGIN_KEY,
    BrokerAuth,
    BrokerAuthError,
    BrokerClientSettings,
    parse_broker_auth,
)
from starlight_py.backend.pulsar_client import _client_security
from starlight_py.config import ConfigError, load_config
from tests.support.pki import TestPKI

TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJwcm94eSJ9.c2lnbmF0dXJlLW5vdC1jaGVja2Vk"


@pytest.mark.parametrize(
    ("plugin", "method"),
    [
        ("org.apache.pulsar.client.impl.auth.AuthenticationToken", "token"),
        ("AuthenticationToken", "token"),
        ("token", "token"),
        ("org.apache.pulsar.client.impl.auth.AuthenticationTls", "tls"),
        ("AuthenticationTls", "tls"),
        ("tls", "tls"),
        (" tls ", "tls"),
    ],
)
def test_plugin_names(plugin: str, method: str) -> None:
    parameters = f"token:{TOKEN}" if method == "token" else "tlsCertFile:/c.pem,tlsKeyFile:/k.pem"
    assert parse_broker_auth(plugin, parameters).method == method


@pytest.mark.parametrize(
    "plugin", ["", "none", "org.apache.pulsar.client.impl.auth.AuthenticationDisabled"]
)
def test_no_plugin_means_no_authentication(plugin: str) -> None:
    assert parse_broker_auth(plugin, "") == BrokerAuth()


def test_unknown_plugin_is_named() -> None:
    with pytest.raises(BrokerAuthError, match="AuthenticationOauth2") as raised:
        parse_broker_auth("org.apache.pulsar.client.impl.auth.oauth2.AuthenticationOauth2", "")
    assert raised.value.key == PLUGIN_KEY


def test_parameters_without_a_plugin_are_refused() -> None:
    with pytest.raises(BrokerAuthError) as raised:
        parse_broker_auth("", f"token:{TOKEN}")
    assert raised.value.key == PLUGIN_KEY
    assert TOKEN not in str(raised.value)


@pytest.mark.parametrize(
    "parameters",
    [
        f"token:{TOKEN}",
        f"  token: {TOKEN} ",
        TOKEN,
        json.dumps({"token": TOKEN}),
        json.dumps({"token": f"token:{TOKEN}"}),
    ],
)
def test_inline_token_forms(parameters: str) -> None:
    auth = parse_broker_auth("token", parameters)
    assert (auth.method, auth.token, auth.token_file) == ("token", TOKEN, "")
    assert auth.current_token() == TOKEN


def test_token_file_is_read_at_each_use(tmp_path: Path) -> None:
    path = tmp_path / "proxy.token"
    auth = parse_broker_auth("token", path.as_uri())
    assert auth.token_file == str(path)
    # Not read while parsing: the file may be mounted after the conf is checked.
    with pytest.raises(BrokerAuthError, match="cannot read the token file") as raised:
        auth.current_token()
    assert raised.value.key == PARAMETERS_KEY
    path.write_text(TOKEN + "\n")
    assert auth.current_token() == TOKEN
    path.write_text("rotated-token")
    assert auth.current_token() == "rotated-token"
    path.write_text("  \n")
    with pytest.raises(BrokerAuthError, match="is empty"):
        auth.current_token()


def test_token_file_in_json_and_localhost_url(tmp_path: Path) -> None:
    path = tmp_path / "a token"
    assert parse_broker_auth("token", json.dumps({"token": path.as_uri()})).token_file == str(path)
    assert parse_broker_auth("token", f"file://localhost{path}").token_file == str(path)


@pytest.mark.parametrize(
    "parameters",
    [
        "",
        "token:",
        "{}",
        '{"token": 42}',
        "[1, 2]",
        f'{{"token": "{TOKEN}"',  # truncated JSON: the message must not quote it
        "file:relative/path",
        "file://otherhost/etc/token",
        f"token:{TOKEN} {TOKEN}",
    ],
)
def test_malformed_token_parameters_are_refused_without_echoing_them(parameters: str) -> None:
    with pytest.raises(BrokerAuthError) as raised:
        parse_broker_auth("token", parameters)
    assert raised.value.key == PARAMETERS_KEY
    assert TOKEN not in str(raised.value)


@pytest.mark.parametrize(
    "parameters",
    [
        "tlsCertFile:/etc/pulsar/proxy.pem,tlsKeyFile:/etc/pulsar/proxy.key",
        " tlsKeyFile: /etc/pulsar/proxy.key , tlsCertFile:/etc/pulsar/proxy.pem,",
        json.dumps({"tlsCertFile": "/etc/pulsar/proxy.pem", "tlsKeyFile": "/etc/pulsar/proxy.key"}),
        "tlsCertFile:file:///etc/pulsar/proxy.pem,tlsKeyFile:file:///etc/pulsar/proxy.key",
    ],
)
def test_tls_parameter_forms(parameters: str) -> None:
    auth = parse_broker_auth("org.apache.pulsar.client.impl.auth.AuthenticationTls", parameters)
    assert (auth.method, auth.cert_file, auth.key_file) == (
        "tls",
        "/etc/pulsar/proxy.pem",
        "/etc/pulsar/proxy.key",
    )
    assert auth.describe() == "TLS client certificate /etc/pulsar/proxy.pem"


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ("", "needs"),
        ("tlsCertFile:/c.pem", "needs"),
        ("tlsKeyFile:/k.pem", "needs"),
        ("tlsCertFile:/c.pem,tlsKeyFile:/k.pem,tlsPassword:x", "unknown TLS parameter"),
        ("/c.pem,/k.pem", "not name:value"),
        ("{not json", "invalid JSON"),
        ('"just a string"', "not name:value"),
    ],
)
def test_malformed_tls_parameters_are_refused(parameters: str, message: str) -> None:
    with pytest.raises(BrokerAuthError, match=message) as raised:
        parse_broker_auth("tls", parameters)
    assert raised.value.key == PARAMETERS_KEY


def test_token_never_in_repr_or_description(tmp_path: Path) -> None:
    auth = parse_broker_auth("token", f"token:{TOKEN}")
    assert TOKEN not in repr(auth)
    assert auth.describe() == "token (inline)"
    config = load_config(
        overrides={
            "brokerClientAuthenticationPlugin": "token",
            "brokerClientAuthenticationParameters": f"token:{TOKEN}",
        }
    )
    assert TOKEN not in repr(config)
    settings = BrokerClientSettings.from_config(config)
    assert TOKEN not in repr(settings)
    assert TOKEN not in settings.describe()
    path = tmp_path / "t"
    assert parse_broker_auth("token", path.as_uri()).describe() == f"token from {path}"


# --- through the configuration --------------------------------------------------------


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(overrides={"brokerClientAuthenticationPlugin": "kerberos"})
    assert raised.value.key == "brokerClientAuthenticationPlugin"
    with pytest.raises(ConfigError) as raised:
        load_config(
            overrides={
                "brokerClientAuthenticationPlugin": "token",
                "brokerClientAuthenticationParameters": "{" + TOKEN,
            }
        )
    assert raised.value.key == "brokerClientAuthenticationParameters"
    assert TOKEN not in str(raised.value)


def test_environment_carries_the_parameters() -> None:
    config = load_config(
        env={
            "STARLIGHT_BROKER_CLIENT_AUTHENTICATION_PLUGIN": "token",
            "STARLIGHT_BROKER_CLIENT_AUTHENTICATION_PARAMETERS": f"token:{TOKEN}",
        }
    )
    assert BrokerClientSettings.from_config(config).auth.current_token() == TOKEN


def test_plain_urls_by_default_even_when_tls_urls_are_set() -> None:
    config = load_config(
        overrides={
            "brokerServiceURL": "pulsar://broker:6650",
            "brokerWebServiceURL": "http://broker:8080",
            "brokerServiceURLTLS": "pulsar+ssl://broker:6651",
            "brokerWebServiceURLTLS": "https://broker:8443",
        }
    )
    settings = BrokerClientSettings.from_config(config)
    assert (settings.service_url, settings.web_url) == (
        "pulsar://broker:6650",
        "http://broker:8080",
    )
    assert not settings.uses_tls
    assert settings.describe().startswith("pulsar://broker:6650 and http://broker:8080: no TLS")


def test_tls_enabled_with_broker_uses_the_tls_urls() -> None:
    config = load_config(
        overrides={
            "tlsEnabledWithBroker": "true",
            "brokerServiceURLTLS": "pulsar+ssl://broker:6651",
            "brokerWebServiceURLTLS": "https://broker:8443",
            "brokerClientTrustCertsFilePath": "/etc/pulsar/ca.pem",
        }
    )
    settings = BrokerClientSettings.from_config(config)
    assert (settings.service_url, settings.web_url) == (
        "pulsar+ssl://broker:6651",
        "https://broker:8443",
    )
    assert settings.uses_tls
    assert settings.validate_hostname and not settings.allow_insecure
    assert "TLS trusting /etc/pulsar/ca.pem, host names verified" in settings.describe()


def test_tls_enabled_with_broker_accepts_tls_plain_keys() -> None:
    config = load_config(
        overrides={
            "tlsEnabledWithBroker": "true",
            "brokerServiceURL": "pulsar+ssl://broker:6651",
            "brokerWebServiceURL": "https://broker:8443",
        }
    )
    settings = BrokerClientSettings.from_config(config)
    assert settings.service_url == "pulsar+ssl://broker:6651"
    assert "system CAs" in settings.describe()


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"tlsEnabledWithBroker": "true"}, "brokerServiceURLTLS"),
        (
            {"tlsEnabledWithBroker": "true", "brokerServiceURLTLS": "pulsar+ssl://b:6651"},
            "brokerWebServiceURLTLS",
        ),
        ({"brokerServiceURLTLS": "pulsar://b:6650"}, "brokerServiceURLTLS"),
        ({"brokerWebServiceURLTLS": "http://b:8080"}, "brokerWebServiceURLTLS"),
    ],
)
def test_tls_url_errors_name_the_key(overrides: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(overrides=overrides)
    assert raised.value.key == key


# --- what the adapters build ------------------------------------------------------------


def test_https_context_verifies_by_default(tmp_path: Path) -> None:
    pki = TestPKI(tmp_path)
    context = BrokerClientSettings(
        "pulsar+ssl://b:6651", "https://b:8443", trust_certs_file=str(pki.ca_file)
    ).ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    assert context.get_ca_certs()[0]["subject"][-1] == (("commonName", "starlight test CA"),)


def test_https_context_without_hostname_check_or_verification() -> None:
    no_hostname = BrokerClientSettings("pulsar+ssl://b", "https://b", validate_hostname=False)
    context = no_hostname.ssl_context()
    assert (context.verify_mode, context.check_hostname) == (ssl.CERT_REQUIRED, False)
    insecure = BrokerClientSettings("pulsar+ssl://b", "https://b", allow_insecure=True)
    context = insecure.ssl_context()
    assert (context.verify_mode, context.check_hostname) == (ssl.CERT_NONE, False)
    assert "NOT verified" in insecure.describe()


def test_https_context_loads_the_client_certificate(tmp_path: Path) -> None:
    pki = TestPKI(tmp_path)
    client = pki.client("starlight-proxy")
    auth = parse_broker_auth("tls", f"tlsCertFile:{client.cert_file},tlsKeyFile:{client.key_file}")
    BrokerClientSettings("pulsar+ssl://b", "https://b", auth, str(pki.ca_file)).ssl_context()
    missing = parse_broker_auth("tls", f"tlsCertFile:{tmp_path}/none.pem,tlsKeyFile:/none.key")
    with pytest.raises(BrokerAuthError, match=r"none\.pem") as raised:
        BrokerClientSettings("pulsar+ssl://b", "https://b", missing).ssl_context()
    assert raised.value.key == PARAMETERS_KEY


def test_unreadable_trust_file_names_its_key(tmp_path: Path) -> None:
    settings = BrokerClientSettings("pulsar+ssl://b", "https://b", trust_certs_file=f"{tmp_path}/x")
    with pytest.raises(BrokerAuthError) as raised:
        settings.ssl_context()
    assert raised.value.key == "brokerClientTrustCertsFilePath"


def test_pulsar_client_options(tmp_path: Path) -> None:
    plain = _client_security(BrokerClientSettings("pulsar://b:6650", "http://b:8080"))
    assert "authentication" not in plain
    assert "tls_trust_certs_file_path" not in plain
    token = _client_security(
        BrokerClientSettings(
            "pulsar+ssl://b:6651",
            "https://b:8443",
            parse_broker_auth("token", f"token:{TOKEN}"),
            "/etc/pulsar/ca.pem",
        )
    )
    assert isinstance(token["authentication"], pulsar.AuthenticationToken)
    assert token["tls_trust_certs_file_path"] == "/etc/pulsar/ca.pem"
    assert token["tls_validate_hostname"] is True
    assert token["tls_allow_insecure_connection"] is False
    from_file = _client_security(
        BrokerClientSettings(
            "pulsar+ssl://b:6651",
            "https://b:8443",
            parse_broker_auth("token", (tmp_path / "t").as_uri()),
            allow_insecure=True,
        )
    )
    assert isinstance(from_file["authentication"], pulsar.AuthenticationToken)
    assert from_file["tls_validate_hostname"] is False
    assert from_file["tls_allow_insecure_connection"] is True
    tls = _client_security(
        BrokerClientSettings(
            "pulsar+ssl://b:6651",
            "https://b:8443",
            parse_broker_auth("tls", "tlsCertFile:/c.pem,tlsKeyFile:/k.pem"),
        )
    )
    assert isinstance(tls["authentication"], pulsar.AuthenticationTLS)
