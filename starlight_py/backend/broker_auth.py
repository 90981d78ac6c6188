"""How the proxy authenticates to Pulsar and which TLS certificates it trusts there.

The keys are those of Pulsar's own proxy and of Starlight for RabbitMQ, so an existing conf
file keeps working: `brokerClientAuthenticationPlugin` + `brokerClientAuthenticationParameters`
name the credentials, `tlsEnabledWithBroker` switches to `brokerServiceURLTLS` /
`brokerWebServiceURLTLS`, `brokerClientTrustCertsFilePath` is the CA to trust.

Pure: parsing and frozen values, no pulsar or network import. The adapters
(`pulsar_client`, `pulsar_admin`) turn a `BrokerClientSettings` into pulsar-client options and
an HTTPS context. Token values are secrets: they are kept out of `repr`, error messages and
`describe()`, and a token given as `file:` is read again on every use, so a rotated token
file is picked up without a restart.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol
from urllib.parse import unquote, urlsplit

PLUGIN_KEY = "brokerClientAuthenticationPlugin"
PARAMETERS_KEY = "brokerClientAuthenticationParameters"

AuthMethod = Literal["none", "token", "tls"]

# Java class names (Pulsar's and Starlight's conf files) and the short names of the
# pulsar-client C++/Python libraries and `pulsar-client` CLI.
_PLUGINS: dict[str, AuthMethod] = {
    "": "none",
    "none": "none",
    "org.apache.pulsar.client.impl.auth.AuthenticationDisabled": "none",
    "token": "token",
    "AuthenticationToken": "token",
    "org.apache.pulsar.client.impl.auth.AuthenticationToken": "token",
    "tls": "tls",
    "AuthenticationTls": "tls",
    "org.apache.pulsar.client.impl.auth.AuthenticationTls": "tls",
}

_TOKEN_FORMS = 'token:<jwt>, file:///path/to/token or {"token": "<jwt>"}'
_TLS_FORMS = 'tlsCertFile:<path>,tlsKeyFile:<path> or {"tlsCertFile": ..., "tlsKeyFile": ...}'


class BrokerAuthError(ValueError):
    """Broker credentials are malformed or unreadable; `key` names the conf key. The message
    never contains a token."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class BrokerAuth:
    """The proxy's credentials for Pulsar: nothing, a JWT (inline or in a file), or a TLS
    client certificate whose CN is the role."""

    method: AuthMethod = "none"
    token: str = field(default="", repr=False)
    token_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def current_token(self) -> str:
        """The token to send now (read from `token_file` when there is one).

        Raises BrokerAuthError when the file cannot be read or is empty."""
        if not self.token_file:
            return self.token
        try:
            token = Path(self.token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise BrokerAuthError(
                PARAMETERS_KEY, f"cannot read the token file {self.token_file}: {e}"
            ) from e
        if not token:
            raise BrokerAuthError(PARAMETERS_KEY, f"the token file {self.token_file} is empty")
        return token

    def describe(self) -> str:
        """For logs: the method and where the secret comes from, never the secret."""
        if self.method == "token":
            return f"token from {self.token_file}" if self.token_file else "token (inline)"
        if self.method == "tls":
            return f"TLS client certificate {self.cert_file}"
        return "no authentication"


def parse_broker_auth(plugin: str, parameters: str) -> BrokerAuth:
    """`brokerClientAuthenticationPlugin` + `...Parameters` -> BrokerAuth.

    Token parameters: `token:<jwt>`, `file:///path` (read at each use), `{"token": "<jwt>"}`
    or the bare JWT. TLS parameters: `tlsCertFile:<path>,tlsKeyFile:<path>` or the same as a
    JSON object. Raises BrokerAuthError naming the key; files are not read here.
    """
    method = _PLUGINS.get(plugin.strip())
    if method is None:
        raise BrokerAuthError(
            PLUGIN_KEY,
            f"unknown plugin {plugin.strip()!r}; use "
            "org.apache.pulsar.client.impl.auth.AuthenticationToken (or token), "
            "org.apache.pulsar.client.impl.auth.AuthenticationTls (or tls), or leave it empty",
        )
    text = parameters.strip()
    if method == "none":
        if text:
            raise BrokerAuthError(
                PLUGIN_KEY, f"{PARAMETERS_KEY} is set but no plugin says how to use it"
            )
        return BrokerAuth()
    if method == "token":
        return _token_auth(text)
    return _tls_auth(text)


def _token_auth(text: str) -> BrokerAuth:
    if text.startswith("{"):
        try:
            document = json.loads(text)
        except ValueError:
            # Not json.JSONDecodeError's text: it quotes the document, token included.
            raise BrokerAuthError(PARAMETERS_KEY, f"invalid JSON; use {_TOKEN_FORMS}") from None
        value = document.get("token") if isinstance(document, dict) else None
        if not isinstance(value, str):
            raise BrokerAuthError(
                PARAMETERS_KEY, f'JSON without a "token" string; use {_TOKEN_FORMS}'
            )
        text = value.strip()
    if text.startswith("token:"):
        text = text[len("token:") :].strip()
    elif text.startswith("file:"):
        return BrokerAuth("token", token_file=_file_url_path(text))
    if not text:
        raise BrokerAuthError(PARAMETERS_KEY, f"the token plugin needs {_TOKEN_FORMS}")
    if any(c.isspace() for c in text):
        raise BrokerAuthError(PARAMETERS_KEY, f"the token contains white space; use {_TOKEN_FORMS}")
    return BrokerAuth("token", token=text)


def _file_url_path(url: str) -> str:
    parts = urlsplit(url)
    path = unquote(parts.path)
    if parts.netloc not in ("", "localhost") or not path.startswith("/"):
        raise BrokerAuthError(PARAMETERS_KEY, f"{url!r} is not file:///absolute/path")
    return path


def _tls_auth(text: str) -> BrokerAuth:
    values: dict[str, str] = {}
    if text.startswith("{"):
        try:
            document = json.loads(text)
        except ValueError:
            raise BrokerAuthError(PARAMETERS_KEY, f"invalid JSON; use {_TLS_FORMS}") from None
        if not isinstance(document, dict):
            raise BrokerAuthError(PARAMETERS_KEY, f"use {_TLS_FORMS}")
        values = {str(k): str(v) for k, v in document.items()}
    else:
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            name, sep, value = item.partition(":")
            if not sep:
                raise BrokerAuthError(
                    PARAMETERS_KEY, f"{item!r} is not name:value; use {_TLS_FORMS}"
                )
            values[name.strip()] = value.strip()
    unknown = sorted(set(values) - {"tlsCertFile", "tlsKeyFile"})
    if unknown:
        raise BrokerAuthError(
            PARAMETERS_KEY, f"unknown TLS parameter {unknown[0]!r}; use {_TLS_FORMS}"
        )
    cert_file, key_file = values.get("tlsCertFile", ""), values.get("tlsKeyFile", "")
    if not cert_file or not key_file:
        raise BrokerAuthError(PARAMETERS_KEY, f"the tls plugin needs {_TLS_FORMS}")
    return BrokerAuth("tls", cert_file=_plain_path(cert_file), key_file=_plain_path(key_file))


def _plain_path(value: str) -> str:
    return _file_url_path(value) if value.startswith("file:") else value


class BrokerConnectionConfig(Protocol):
    """What `BrokerClientSettings.from_config` reads of the proxy's configuration
    (`StarlightConfig`, which imports this module to check the keys)."""

    @property
    def pulsar_service_url(self) -> str: ...
    @property
    def pulsar_web_url(self) -> str: ...
    @property
    def tls_enabled_with_broker(self) -> bool: ...
    @property
    def broker_service_url_tls(self) -> str: ...
    @property
    def broker_web_url_tls(self) -> str: ...
    @property
    def broker_client_auth_plugin(self) -> str: ...
    @property
    def broker_client_auth_parameters(self) -> str: ...
    @property
    def broker_client_trust_certs_file(self) -> str: ...
    @property
    def broker_tls_allow_insecure(self) -> bool: ...
    @property
    def broker_tls_hostname_verification(self) -> bool: ...


@dataclass(frozen=True)
class BrokerClientSettings:
    """Where and how the proxy connects to Pulsar: the binary and admin URLs actually used,
    the credentials, and the TLS trust for `pulsar+ssl://` / `https://` URLs."""

    service_url: str
    web_url: str
    auth: BrokerAuth = BrokerAuth()
    trust_certs_file: str = ""
    allow_insecure: bool = False
    validate_hostname: bool = True

    @classmethod
    def from_config(cls, config: BrokerConnectionConfig) -> BrokerClientSettings:
        """The settings of a validated configuration (which already checked the keys, so
        this raises nothing; token files are read later, at each use)."""
        service_url, web_url = config.pulsar_service_url, config.pulsar_web_url
        if config.tls_enabled_with_broker:
            service_url = config.broker_service_url_tls or service_url
            web_url = config.broker_web_url_tls or web_url
        return cls(
            service_url,
            web_url,
            parse_broker_auth(
                config.broker_client_auth_plugin, config.broker_client_auth_parameters
            ),
            config.broker_client_trust_certs_file,
            config.broker_tls_allow_insecure,
            config.broker_tls_hostname_verification,
        )

    @property
    def uses_tls(self) -> bool:
        return self.service_url.startswith("pulsar+ssl:") or self.web_url.startswith("https:")

    def describe(self) -> str:
        """For the start-up log; never contains a secret."""
        if self.uses_tls:
            trust = self.trust_certs_file or "the system CAs"
            if self.allow_insecure:
                check = "certificates NOT verified (tlsAllowInsecureConnection=true)"
            elif self.validate_hostname:
                check = "host names verified"
            else:
                check = "host names not verified"
            tls = f"TLS trusting {trust}, {check}"
        else:
            tls = "no TLS"
        return f"{self.service_url} and {self.web_url}: {tls}, {self.auth.describe()}"

    def ssl_context(self) -> ssl.SSLContext:
        """The HTTPS context of the admin client: the trusted CAs, host name and
        certificate checks, and the client certificate of TLS authentication.

        Raises BrokerAuthError when a certificate or key file cannot be loaded."""
        try:
            context = ssl.create_default_context(cafile=self.trust_certs_file or None)
        except (OSError, ssl.SSLError) as e:
            raise BrokerAuthError(
                "brokerClientTrustCertsFilePath",
                f"cannot load {self.trust_certs_file}: {e}",
            ) from e
        if self.allow_insecure or not self.validate_hostname:
            context.check_hostname = False
        if self.allow_insecure:
            context.verify_mode = ssl.CERT_NONE
        if self.auth.method == "tls":
            try:
                context.load_cert_chain(self.auth.cert_file, self.auth.key_file)
            except (OSError, ssl.SSLError) as e:
                raise BrokerAuthError(
                    PARAMETERS_KEY,
                    f"cannot load {self.auth.cert_file} / {self.auth.key_file}: {e}",
                ) from e
        return context
