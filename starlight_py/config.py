"""The proxy's configuration: one typed, frozen object, validated when it is built.

Sources, later ones winning: built-in defaults < the conf file (`key=value` lines, Java
properties style, as Pulsar and Starlight for RabbitMQ use) < environment variables
(`STARLIGHT_` + the key in upper snake case, e.g. `STARLIGHT_AMQP_LISTENERS`) < explicit
overrides (command-line flags). Key names follow Starlight for RabbitMQ where it has one, so
an operator's existing conf file keeps working.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from starlight_py.backend.broker_auth import BrokerAuthError, parse_broker_auth
from starlight_py.units import KIB, MIB, MILLISECONDS, SECONDS

log = logging.getLogger("starlight.config")

ENV_PREFIX = "STARLIGHT_"


class ConfigError(ValueError):
    """A configuration value is missing or invalid; `key` names the offending key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.problems = [self]


class ConfigErrors(ConfigError):
    """Several problems found at once (each on a line of its own); `key` is the first's."""

    def __init__(self, problems: list[ConfigError]) -> None:
        ValueError.__init__(self, "\n".join(str(p) for p in problems))
        self.key = problems[0].key
        self.problems = list(problems)


def _raise_all(problems: list[ConfigError]) -> None:
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ConfigErrors(problems)


# STARLIGHT_* variables that are not configuration keys: the tools' own (docs/configuration.md).
OTHER_ENV_VARS = frozenset(
    {
        "STARLIGHT_CACHE_DIR",
        "STARLIGHT_MAVEN_REPOSITORY",
        "STARLIGHT_PULSAR_URL",
        "STARLIGHT_PULSAR_WEB_URL",
        "STARLIGHT_ZOOKEEPER",
        "STARLIGHT_WORKER_INDEX",
        "STARLIGHT_SUPERVISOR_PID",
        "STARLIGHT_FUZZ_SCALE",
        "STARLIGHT_NESTING_FLOOD_SECONDS",
        "STARLIGHT_NATIVE",
        "STARLIGHT_NATIVE_PULSAR",
        "STARLIGHT_LIST_ACKS",
        "STARLIGHT_ALLOCATOR",
        "STARLIGHT_JEMALLOC",
        "STARLIGHT_PRELOAD_BEFORE",
    }
)
OTHER_ENV_PREFIXES = ("STARLIGHT_TEST_", "STARLIGHT_CELERY_")


@dataclass(frozen=True)
class Listener:
    """One AMQP listening socket, parsed from `amqp://host:port` or `amqps://host:port`."""

    scheme: Literal["amqp", "amqps"]
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


MAX_UNCHUNKED_MESSAGE_SIZE = 4 * MIB
"""The largest body a batching producer sends (Pulsar cannot chunk batched messages): below
the broker's default maxMessageSize of 5 MiB, with room for properties. Larger ones go,
chunked, through a second producer of the topic (gateway/publish/publishing.py)."""


def _key(name: str, doc: str, unit: str = "") -> dict[str, str]:
    return {"key": name, "doc": doc, "unit": unit}


@dataclass(frozen=True)
class StarlightConfig:
    """Everything a proxy process needs to know. Build with `load_config`."""

    zookeeper_servers: str = field(
        default="127.0.0.1:2181",
        metadata=_key(
            "configurationStoreServers",
            "ZooKeeper connect string for starlight metadata (host:port[,host:port...]).",
        ),
    )
    metadata_root: str = field(
        default="/starlight",
        metadata=_key("starlightMetadataRoot", "ZooKeeper path under which metadata lives."),
    )
    zookeeper_session_timeout: float = field(
        default=30 * SECONDS,
        metadata=_key(
            "zooKeeperSessionTimeoutMillis",
            "ZooKeeper session timeout; ephemeral state of a dead proxy goes away after it.",
            "ms",
        ),
    )
    pulsar_service_url: str = field(
        default="pulsar://127.0.0.1:6650",
        metadata=_key(
            "brokerServiceURL", "Pulsar binary protocol URL (pulsar:// or pulsar+ssl://)."
        ),
    )
    pulsar_web_url: str = field(
        default="http://127.0.0.1:8080",
        metadata=_key("brokerWebServiceURL", "Pulsar admin REST URL (http:// or https://)."),
    )
    broker_service_url_tls: str = field(
        default="",
        metadata=_key(
            "brokerServiceURLTLS",
            "Pulsar binary protocol URL over TLS (pulsar+ssl://host:6651), used instead of "
            "brokerServiceURL when tlsEnabledWithBroker=true.",
        ),
    )
    broker_web_url_tls: str = field(
        default="",
        metadata=_key(
            "brokerWebServiceURLTLS",
            "Pulsar admin REST URL over TLS (https://host:8443), used instead of "
            "brokerWebServiceURL when tlsEnabledWithBroker=true.",
        ),
    )
    tls_enabled_with_broker: bool = field(
        default=False,
        metadata=_key(
            "tlsEnabledWithBroker",
            "Connect to Pulsar over TLS: brokerServiceURLTLS and brokerWebServiceURLTLS (or "
            "brokerServiceURL / brokerWebServiceURL when they already are pulsar+ssl:// and "
            "https://). Refused at start if neither is a TLS URL.",
        ),
    )
    broker_client_trust_certs_file: str = field(
        default="",
        metadata=_key(
            "brokerClientTrustCertsFilePath",
            "PEM CA certificates that sign the Pulsar brokers' certificates; empty trusts the "
            "system CAs.",
        ),
    )
    broker_tls_hostname_verification: bool = field(
        default=True,
        metadata=_key(
            "tlsHostnameVerificationEnabled",
            "Check that the Pulsar brokers' certificates name the host of the broker URLs. "
            "(Pulsar's own default is false; ours is the safe one.)",
        ),
    )
    broker_tls_allow_insecure: bool = field(
        default=False,
        metadata=_key(
            "tlsAllowInsecureConnection",
            "Accept any certificate from the Pulsar brokers, unverified. Tests only: anyone "
            "on the network path can then impersonate Pulsar and read the proxy's token.",
        ),
    )
    broker_client_auth_plugin: str = field(
        default="",
        metadata=_key(
            "brokerClientAuthenticationPlugin",
            "How the proxy authenticates to Pulsar: "
            "org.apache.pulsar.client.impl.auth.AuthenticationToken (or token), "
            "org.apache.pulsar.client.impl.auth.AuthenticationTls (or tls), or empty (none). "
            "Pulsar must grant the proxy's role super-user (or tenant admin) rights.",
        ),
    )
    broker_client_auth_parameters: str = field(
        default="",
        repr=False,
        metadata=_key(
            "brokerClientAuthenticationParameters",
            'Token: token:<jwt>, file:///path/to/token (re-read at each use) or {"token": '
            '"<jwt>"}. TLS: tlsCertFile:/path/cert.pem,tlsKeyFile:/path/key.pem (the '
            "certificate's CN is the role). Never logged.",
        ),
    )
    listeners: tuple[Listener, ...] = field(
        default=(Listener("amqp", "127.0.0.1", 5672),),
        metadata=_key(
            "amqpListeners",
            "Comma-separated AMQP listeners, e.g. amqp://0.0.0.0:5672. Bind to 0.0.0.0 to "
            "accept remote clients.",
        ),
    )
    default_tenant: str = field(
        default="public",
        metadata=_key("amqpDefaultTenant", "Pulsar tenant for vhost '/' and short vhost names."),
    )
    default_namespace: str = field(
        default="default",
        metadata=_key("amqpDefaultNamespace", "Pulsar namespace for vhost '/'."),
    )
    map_short_vhost_to_tenant: bool = field(
        default=False,
        metadata=_key(
            "amqpMapShortVhostToTenant",
            "Map vhost 'name' to namespace name/<amqpDefaultNamespace> instead of "
            "<amqpDefaultTenant>/name.",
        ),
    )
    auto_create_namespaces: bool = field(
        default=False,
        metadata=_key(
            "amqpAutoCreateNamespaces",
            "Create a vhost's missing Pulsar tenant/namespace through the admin REST API "
            "instead of refusing connection.open. On for `starlight-proxy standalone`.",
        ),
    )
    heartbeat: float = field(
        default=60 * SECONDS,
        metadata=_key(
            "amqpHeartbeatDelay",
            "Heartbeat interval proposed in connection.tune; 0 disables. A peer silent for "
            "two intervals is disconnected.",
            "s",
        ),
    )
    frame_max: int = field(
        default=128 * KIB,
        metadata=_key(
            "amqpMaxFrameSize",
            "Largest frame (bytes, header and end byte included) proposed in connection.tune; "
            "larger frames close the connection with 501 before they are buffered.",
        ),
    )
    channel_max: int = field(
        default=2047,
        metadata=_key("amqpMaxNoOfChannels", "Most channels a connection may open (1..65535)."),
    )
    max_message_size: int = field(
        default=128 * MIB,
        metadata=_key(
            "amqpMaxMessageSize",
            "Largest message body accepted (RabbitMQ's default: 128 MiB). A message larger "
            "than the broker's maxMessageSize (5 MiB by default in Pulsar) is stored in "
            "chunks (Pulsar message chunking), with pulsarProducerBatching too (such a message "
            "is not batched).",
        ),
    )
    producer_max_pending: int = field(
        default=5000,
        metadata=_key(
            "pulsarProducerMaxPendingMessages",
            "Sends in flight per Pulsar producer; when full, publishers are paused and told "
            "with connection.blocked until Pulsar catches up.",
        ),
    )
    producer_send_timeout_ms: int = field(
        default=120_000,
        metadata=_key(
            "pulsarSendTimeoutMillis",
            "How long a message may wait for Pulsar to store it before its publisher gets a "
            "basic.nack. While a topic moves between brokers (unload, bundle split, a broker "
            "that died: its topics move once its metadata session expires, 30 s by default) "
            "publishes wait; keep this above the brokers' metadataStoreSessionTimeoutMillis "
            "plus a few seconds. 0 waits forever.",
        ),
    )
    consumer_ack_grouping_ms: int = field(
        default=1000,
        metadata=_key(
            "pulsarAckGroupingTimeMillis",
            "Only where the proxy cannot acknowledge in lists (a pulsar-client version it was "
            "not tested with, no compiled module, or STARLIGHT_LIST_ACKS=0; it logs why at "
            "start): how long a Pulsar consumer of the proxy gathers acknowledgements before "
            "it sends them to the broker in one command (it also sends them once 1,000 "
            "wait). Each consumer re-arms a timer this often, busy or idle: with thousands of "
            "queues a longer time costs less CPU while idle; 0 sends each acknowledgement at "
            "once and keeps no timer. Queue counts read on other proxies may lag by this "
            "much. With pulsarProducerBatching (the default) at most 100: a requeued message "
            "of a batch entry waits for its entry's acknowledgements to be sent, so this is "
            "how late it goes back. With list acknowledgements (the default) nothing is "
            "grouped: what one round of the proxy's event loop acknowledges on a consumer is "
            "one command.",
        ),
    )
    producer_batching: bool = field(
        default=True,
        metadata=_key(
            "pulsarProducerBatching",
            "Write what one socket read publishes to a topic as one Pulsar batch entry (up to "
            "pulsarProducerBatchMaxMessages), so that Pulsar stores and dispatches entries, not "
            "single messages. Needs acknowledgmentAtBatchIndexLevelEnabled=true and the "
            "starlight-backlog plugin on the brokers: without them the proxy says so at start "
            "and writes one message per entry. Pulsar hands an entry to one consumer whole, so "
            "an entry holds no more than a consumer's share of its queue's prefetch, and one "
            "message for a queue without consumers: see docs/performance.md.",
        ),
    )
    producer_batch_max_messages: int = field(
        default=100,
        metadata=_key(
            "pulsarProducerBatchMaxMessages",
            "With pulsarProducerBatching: most messages in one Pulsar batch entry.",
        ),
    )
    producer_idle_timeout: float = field(
        default=60 * SECONDS,
        metadata=_key(
            "pulsarProducerIdleTimeoutMillis",
            "A Pulsar producer nothing was published through for this long is closed (it is "
            "made again by the next publish to its topic): RPC reply queues and other "
            "short-lived queues would otherwise keep one producer each for good.",
            "ms",
        ),
    )
    handshake_timeout: float = field(
        default=10 * SECONDS,
        metadata=_key(
            "amqpHandshakeTimeoutMillis",
            "Time a client has from TCP connect to connection.open before it is disconnected.",
            "ms",
        ),
    )
    quiet_after: float = field(
        default=10 * SECONDS,
        metadata=_key(
            "amqpQuietConnectionAfterMillis",
            "Time a plain TCP connection receives nothing but heartbeats before its socket "
            "wakes it only for more than a heartbeat (the heartbeats are read by its timer, "
            "which wakes anyway to send the proxy's); 0: every heartbeat wakes it.",
            "ms",
        ),
    )
    max_connections: int = field(
        default=0,
        metadata=_key(
            "amqpMaxConnections",
            "Most client connections this proxy holds; 0 means no limit. Connections over "
            "it are refused at connection.open with 530 NOT_ALLOWED.",
        ),
    )
    max_connections_per_ip: int = field(
        default=0,
        metadata=_key(
            "amqpMaxConnectionsPerIp",
            "Most client connections from one address; 0 means no limit. Behind a load "
            "balancer this needs amqpProxyProtocol, or every client has its address.",
        ),
    )
    authentication_enabled: bool = field(
        default=False,
        metadata=_key(
            "authenticationEnabled",
            "When false, any credentials are accepted and nobody's permissions are checked (a "
            "warning is logged at start). When true, clients log in with one of "
            "authenticationProviders and may use only the vhosts and resources their "
            "permissions allow (see docs/security.md).",
        ),
    )
    authentication_providers: tuple[str, ...] = field(
        default=(),
        metadata=_key(
            "authenticationProviders",
            "Comma-separated, some of: password (SASL PLAIN/AMQPLAIN checked against the "
            "users of `starlight-admin user`, RabbitMQ's internal users), token (SASL "
            "PLAIN/AMQPLAIN, the password is a JWT) and tls (SASL EXTERNAL, the client "
            "certificate on an amqps:// listener). Pulsar's class names "
            "AuthenticationProviderToken / AuthenticationProviderTls are accepted too.",
        ),
    )
    loopback_users: tuple[str, ...] = field(
        default=("guest",),
        metadata=_key(
            "loopbackUsers",
            "Comma-separated password users that may log in only from a loopback address "
            "(RabbitMQ's loopback_users); empty: nobody is restricted.",
        ),
    )
    token_secret_key: str = field(
        default="",
        repr=False,
        metadata=_key(
            "tokenSecretKey",
            "HMAC key for HS256/HS384/HS512 tokens: data:;base64,<key> or file:///path "
            "(raw bytes, as `pulsar tokens create-secret-key` writes).",
        ),
    )
    token_public_key: str = field(
        default="",
        metadata=_key(
            "tokenPublicKey",
            "Public key for tokenPublicAlg tokens: data:;base64,<key> or file:///path (PEM, "
            "or DER as `pulsar tokens create-key-pair` writes).",
        ),
    )
    token_public_alg: str = field(
        default="RS256",
        metadata=_key(
            "tokenPublicAlg",
            "Signature algorithm of tokens checked with tokenPublicKey: RS256, RS384, RS512, "
            "PS256, PS384, PS512, ES256, ES384 or ES512.",
        ),
    )
    token_auth_claim: str = field(
        default="sub",
        metadata=_key("tokenAuthClaim", "Token claim that names the principal."),
    )
    token_audience_claim: str = field(
        default="aud",
        metadata=_key(
            "tokenAudienceClaim",
            "Token claim that holds the audience (checked with tokenAudience).",
        ),
    )
    token_audience: str = field(
        default="",
        metadata=_key(
            "tokenAudience",
            "When set, a token is accepted only if its tokenAudienceClaim is (or lists) this "
            "value.",
        ),
    )
    token_clock_skew: float = field(
        default=0 * SECONDS,
        metadata=_key(
            "tokenAllowedClockSkewSeconds",
            "Leeway when checking a token's exp and nbf against this host's clock.",
            "s",
        ),
    )
    tls_certificate_file: str = field(
        default="",
        metadata=_key(
            "tlsCertificateFilePath",
            "PEM certificate (and chain) of amqps:// listeners. Reloaded when the file changes.",
        ),
    )
    tls_key_file: str = field(
        default="",
        metadata=_key("tlsKeyFilePath", "PEM private key of tlsCertificateFilePath."),
    )
    tls_trust_certs_file: str = field(
        default="",
        metadata=_key(
            "tlsTrustCertsFilePath",
            "PEM CA certificates that sign client certificates. When set, amqps:// listeners "
            "ask clients for a certificate and refuse one the CAs did not sign.",
        ),
    )
    tls_require_client_cert: bool = field(
        default=False,
        metadata=_key(
            "tlsRequireTrustedClientCertOnConnect",
            "Mutual TLS: refuse, during the TLS handshake, clients without a certificate "
            "signed by tlsTrustCertsFilePath.",
        ),
    )
    tls_protocols: tuple[str, ...] = field(
        default=("TLSv1.3", "TLSv1.2"),
        metadata=_key(
            "tlsProtocols",
            "Comma-separated TLS versions accepted (TLSv1.2, TLSv1.3; TLSv1 and TLSv1.1 only "
            "if you must). The range from the lowest to the highest listed is allowed.",
        ),
    )
    tls_ciphers: tuple[str, ...] = field(
        default=(),
        metadata=_key(
            "tlsCiphers",
            "Comma-separated OpenSSL cipher names for TLS 1.2 (e.g. ECDHE-RSA-AES256-GCM-SHA384); "
            "empty keeps OpenSSL's secure defaults. TLS 1.3 suites are not configurable.",
        ),
    )
    tls_handshake_timeout: float = field(
        default=5 * SECONDS,
        metadata=_key(
            "tlsHandshakeTimeoutMillis",
            "Time a client has to complete the TLS handshake before it is disconnected.",
            "ms",
        ),
    )
    tls_cert_refresh_interval: float = field(
        default=300 * SECONDS,
        metadata=_key(
            "tlsCertRefreshCheckDurationSec",
            "How often (at most) the certificate, key and CA files are checked for changes; "
            "new connections use the new files. 0 checks on every connection.",
            "s",
        ),
    )
    tls_external_principal_from: str = field(
        default="cn",
        metadata=_key(
            "tlsExternalPrincipalFrom",
            "Where SASL EXTERNAL takes the principal from in the client certificate: cn "
            "(subject common name), san_dns or san_email (first subject alternative name "
            "of that type).",
        ),
    )
    cleaner_enabled: bool = field(
        default=True,
        metadata=_key(
            "subscriptionCleanerEnabled",
            "Take part in the election of the SubscriptionCleaner (one proxy of the cluster "
            "runs it at a time).",
        ),
    )
    cleaner_interval: float = field(
        default=10 * SECONDS,
        metadata=_key(
            "subscriptionCleanerIntervalMillis",
            "Time between two passes of the SubscriptionCleaner (retired subscriptions, "
            "abandoned exclusive/auto-delete queues, x-expires).",
            "ms",
        ),
    )
    cleaner_grace: float = field(
        default=10 * SECONDS,
        metadata=_key(
            "subscriptionCleanerGracePeriodMillis",
            "How long a queue must look abandoned before the cleaner deletes it, and how long "
            "it waits for consumers to let go of a drained subscription before forcing.",
            "ms",
        ),
    )
    cleaner_max_actions: int = field(
        default=1000,
        metadata=_key(
            "subscriptionCleanerMaxActionsPerPass",
            "Most deletions (subscriptions, queues, entries) in one pass; the rest waits.",
        ),
    )
    proxy_protocol: bool = field(
        default=False,
        metadata=_key(
            "amqpProxyProtocol",
            "Expect a PROXY protocol header (v1 or v2, as HAProxy's send-proxy / "
            "send-proxy-v2 write) first on every plain amqp:// connection and log the client "
            "address it names; connections without one are closed.",
        ),
    )
    metrics_listener: str = field(
        default="",
        metadata=_key(
            "metricsListener",
            "http://host:port for /metrics (Prometheus), /healthz and /readyz; empty: off. "
            "Example: http://0.0.0.0:9101.",
        ),
    )
    management_listener: str = field(
        default="",
        metadata=_key(
            "managementListener",
            "http://host:port for the management HTTP API, compatible with RabbitMQ's "
            "(/api/..., rabbitmqadmin works against it; docs/management.md); empty: off. "
            "`standalone` serves it on http://127.0.0.1:15672 unless set. Example: "
            "http://0.0.0.0:15672.",
        ),
    )
    management_administrators: tuple[str, ...] = field(
        default=(),
        metadata=_key(
            "managementAdministrators",
            "Comma-separated principals that may use every vhost and the cluster-wide parts "
            "of the management API (definitions, permissions) when authenticationEnabled is "
            "true. Others see and change only what their permissions allow.",
        ),
    )
    queue_metrics_interval: float = field(
        default=10 * SECONDS,
        metadata=_key(
            "queueMetricsIntervalMillis",
            "Time between two readings of the Pulsar brokers' topic stats for the per-queue "
            "metrics (rabbitmq_queue_messages_ready & co.; by the cleaner's leader); 0: no "
            "per-queue metrics.",
            "ms",
        ),
    )
    log_level: str = field(
        default="INFO",
        metadata=_key("logLevel", "DEBUG, INFO, WARNING or ERROR."),
    )
    log_format: str = field(
        default="text",
        metadata=_key(
            "logFormat",
            "text (one readable line per record) or json (one JSON object per line with "
            "timestamp, level, logger, message, connection and exception, for log shippers).",
        ),
    )
    shutdown_drain: float = field(
        default=10 * SECONDS,
        metadata=_key(
            "shutdownDrainMillis",
            "On SIGTERM the listeners close at once, then clients get this long to leave on "
            "their own before the rest are closed with 320 CONNECTION_FORCED. 0 closes them "
            "at once; a second SIGTERM or SIGINT cuts the wait short.",
            "ms",
        ),
    )

    def __post_init__(self) -> None:
        _validate(self)


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")


# Settings checked alone: (field, whether a value is acceptable, what it must be).
_SINGLE_CHECKS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    # 4096 is the AMQP 0-9-1 minimum frame size every peer must accept.
    ("frame_max", lambda v: 4096 <= v <= 64 * MIB, "must be between 4096 and 67108864"),
    ("channel_max", lambda v: 1 <= v <= 65535, "must be between 1 and 65535"),
    ("heartbeat", lambda v: 0 <= v <= 65535, "must be between 0 and 65535 seconds"),
    ("consumer_ack_grouping_ms", lambda v: v >= 0, "must be 0 (no grouping) or positive"),
    ("producer_send_timeout_ms", lambda v: v >= 0, "must be 0 (no limit) or positive"),
    ("producer_max_pending", lambda v: v >= 1, "must be positive"),
    ("max_message_size", lambda v: v >= 1, "must be positive"),
    ("handshake_timeout", lambda v: v > 0, "must be positive"),
    ("quiet_after", lambda v: v >= 0, "must not be negative"),
    ("producer_batch_max_messages", lambda v: v >= 1, "must be positive"),
    ("producer_idle_timeout", lambda v: v > 0, "must be positive"),
    ("max_connections", lambda v: v >= 0, "must not be negative (0: no limit)"),
    ("max_connections_per_ip", lambda v: v >= 0, "must not be negative (0: no limit)"),
    ("zookeeper_session_timeout", lambda v: v >= 2 * SECONDS, "must be at least 2000"),
    ("queue_metrics_interval", lambda v: v >= 0, "must not be negative"),
    ("cleaner_interval", lambda v: v > 0, "must be positive"),
    ("cleaner_grace", lambda v: v >= 0, "must not be negative"),
    ("cleaner_max_actions", lambda v: v >= 1, "must be positive"),
    ("log_level", lambda v: v in _LOG_LEVELS, f"must be one of {', '.join(_LOG_LEVELS)}"),
    ("log_format", lambda v: v in LOG_FORMATS, f"must be one of {', '.join(LOG_FORMATS)}"),
    ("shutdown_drain", lambda v: v >= 0, "must not be negative"),
)


def _validate(cfg: StarlightConfig) -> None:
    _validate_addresses(cfg)
    _validate_broker_client(cfg)
    for name, acceptable, requirement in _SINGLE_CHECKS:
        if not acceptable(getattr(cfg, name)):
            raise ConfigError(_FIELDS_BY_NAME[name].metadata["key"], requirement)
    _check_http_listener("metricsListener", cfg.metrics_listener)
    _check_http_listener("managementListener", cfg.management_listener)
    _validate_security(cfg)
    for name in ("default_tenant", "default_namespace"):
        value = getattr(cfg, name)
        if not re.fullmatch(r"[A-Za-z0-9_.=:-]+", value):
            raise ConfigError(_FIELDS_BY_NAME[name].metadata["key"], f"invalid name {value!r}")


def _validate_addresses(cfg: StarlightConfig) -> None:
    """Where the proxy listens and what it connects to."""
    if not cfg.listeners:
        raise ConfigError("amqpListeners", "at least one listener is required")
    if not cfg.metadata_root.startswith("/") or cfg.metadata_root.endswith("/"):
        raise ConfigError("starlightMetadataRoot", "must start with '/' and not end with '/'")
    if not cfg.zookeeper_servers.strip():
        raise ConfigError("configurationStoreServers", "must not be empty")
    if urlsplit(cfg.pulsar_service_url).scheme not in ("pulsar", "pulsar+ssl"):
        raise ConfigError("brokerServiceURL", "must start with pulsar:// or pulsar+ssl://")
    if urlsplit(cfg.pulsar_web_url).scheme not in ("http", "https"):
        raise ConfigError("brokerWebServiceURL", "must start with http:// or https://")


def _check_http_listener(key: str, url: str) -> None:
    """An HTTP endpoint's listener: http://host:port, or empty (off)."""
    if not url:
        return
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise ConfigError(key, "must be http://host:port (or empty: off)")


AUTHENTICATION_PROVIDERS = ("password", "token", "tls")
# Starlight for RabbitMQ (and Pulsar) name providers by class; both spellings work.
_PROVIDER_ALIASES = {
    "org.apache.pulsar.broker.authentication.AuthenticationProviderToken": "token",
    "org.apache.pulsar.broker.authentication.AuthenticationProviderTls": "tls",
}
TLS_PROTOCOLS = ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3")
TOKEN_PUBLIC_ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
)
EXTERNAL_PRINCIPAL_SOURCES = ("cn", "san_dns", "san_email")


def _validate_broker_client(cfg: StarlightConfig) -> None:
    """The proxy's own connection to Pulsar: TLS URLs and credentials (parsed, not read:
    a token file is read when used, so a rotated file is picked up)."""
    if cfg.broker_service_url_tls and not cfg.broker_service_url_tls.startswith("pulsar+ssl://"):
        raise ConfigError("brokerServiceURLTLS", "must start with pulsar+ssl://")
    if cfg.broker_web_url_tls and not cfg.broker_web_url_tls.startswith("https://"):
        raise ConfigError("brokerWebServiceURLTLS", "must start with https://")
    if cfg.tls_enabled_with_broker:
        service = cfg.broker_service_url_tls or cfg.pulsar_service_url
        web = cfg.broker_web_url_tls or cfg.pulsar_web_url
        if not service.startswith("pulsar+ssl://"):
            raise ConfigError(
                "brokerServiceURLTLS", "required (pulsar+ssl://...) by tlsEnabledWithBroker=true"
            )
        if not web.startswith("https://"):
            raise ConfigError(
                "brokerWebServiceURLTLS", "required (https://...) by tlsEnabledWithBroker=true"
            )
    try:
        parse_broker_auth(cfg.broker_client_auth_plugin, cfg.broker_client_auth_parameters)
    except BrokerAuthError as e:
        raise ConfigError(e.key, str(e)) from e


# Security settings checked alone, as _SINGLE_CHECKS.
_SECURITY_CHECKS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    (
        "token_public_alg",
        lambda v: v in TOKEN_PUBLIC_ALGORITHMS,
        f"must be one of {', '.join(TOKEN_PUBLIC_ALGORITHMS)}",
    ),
    ("token_auth_claim", lambda v: bool(v.strip()), "must not be empty"),
    ("token_audience_claim", lambda v: bool(v.strip()), "must not be empty"),
    ("token_clock_skew", lambda v: v >= 0, "must not be negative"),
    (
        "tls_protocols",
        lambda v: bool(v) and all(p in TLS_PROTOCOLS for p in v),
        f"must list some of {', '.join(TLS_PROTOCOLS)}",
    ),
    ("tls_handshake_timeout", lambda v: v > 0, "must be positive"),
    ("tls_cert_refresh_interval", lambda v: v >= 0, "must not be negative"),
    (
        "tls_external_principal_from",
        lambda v: v in EXTERNAL_PRINCIPAL_SOURCES,
        f"must be one of {', '.join(EXTERNAL_PRINCIPAL_SOURCES)}",
    ),
)


def _validate_security(cfg: StarlightConfig) -> None:
    """TLS and authentication keys, alone and together (a listener that cannot work, or a
    provider without its key, fails at start rather than at the first client)."""
    for provider in cfg.authentication_providers:
        if provider not in AUTHENTICATION_PROVIDERS:
            raise ConfigError(
                "authenticationProviders",
                f"unknown provider {provider!r}; use {' or '.join(AUTHENTICATION_PROVIDERS)}",
            )
    for key_name in ("token_secret_key", "token_public_key"):
        value = getattr(cfg, key_name)
        if value and not value.startswith(("data:", "file:")):
            # Never echo the value: it may be the secret itself.
            raise ConfigError(
                _FIELDS_BY_NAME[key_name].metadata["key"], "must start with data: or file:"
            )
    for name, acceptable, requirement in _SECURITY_CHECKS:
        if not acceptable(getattr(cfg, name)):
            raise ConfigError(_FIELDS_BY_NAME[name].metadata["key"], requirement)
    tls_listeners = [listener for listener in cfg.listeners if listener.scheme == "amqps"]
    if tls_listeners:
        for key_name in ("tls_certificate_file", "tls_key_file"):
            if not getattr(cfg, key_name):
                raise ConfigError(
                    _FIELDS_BY_NAME[key_name].metadata["key"],
                    f"required by the TLS listener {tls_listeners[0].url}",
                )
    if cfg.tls_require_client_cert and not cfg.tls_trust_certs_file:
        raise ConfigError(
            "tlsTrustCertsFilePath", "required by tlsRequireTrustedClientCertOnConnect=true"
        )
    if cfg.authentication_enabled:
        _validate_providers(cfg, bool(tls_listeners))


def _validate_providers(cfg: StarlightConfig, tls_listeners: bool) -> None:
    """With authentication on: each provider has what it needs."""
    if not cfg.authentication_providers:
        raise ConfigError(
            "authenticationProviders",
            "authenticationEnabled=true needs some of password, token, tls",
        )
    if "token" in cfg.authentication_providers and not (
        cfg.token_secret_key or cfg.token_public_key
    ):
        raise ConfigError(
            "tokenSecretKey", "the token provider needs tokenSecretKey or tokenPublicKey"
        )
    if "tls" in cfg.authentication_providers:
        if not tls_listeners:
            raise ConfigError("amqpListeners", "the tls provider needs an amqps:// listener")
        if not cfg.tls_trust_certs_file:
            raise ConfigError(
                "tlsTrustCertsFilePath", "the tls provider needs the CA of client certificates"
            )


def parse_providers(text: str) -> tuple[str, ...]:
    """`token, org.apache...AuthenticationProviderTls` -> ("token", "tls"); unknown names are
    kept for validation to name them."""
    names = (part.strip() for part in text.split(","))
    return tuple(dict.fromkeys(_PROVIDER_ALIASES.get(n, n) for n in names if n))


_FIELDS_BY_NAME = {f.name: f for f in dataclasses.fields(StarlightConfig)}
CONFIG_KEYS: dict[str, dataclasses.Field[Any]] = {
    f.metadata["key"]: f for f in dataclasses.fields(StarlightConfig)
}


def env_var_for(key: str) -> str:
    """`amqpListeners` -> `STARLIGHT_AMQP_LISTENERS`; `brokerServiceURL` -> `..._SERVICE_URL`."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key)
    return ENV_PREFIX + snake.upper()


def parse_listeners(text: str) -> tuple[Listener, ...]:
    """Parse `amqp://host:port,amqps://host:port`; raises ConfigError on a malformed entry."""
    listeners = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        parts = urlsplit(item)
        if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
            raise ConfigError("amqpListeners", f"{item!r} is not amqp://host:port")
        try:
            port = parts.port
        except ValueError as e:
            raise ConfigError("amqpListeners", f"{item!r}: {e}") from e
        if port is None:
            port = 5672 if parts.scheme == "amqp" else 5671
        scheme: Literal["amqp", "amqps"] = "amqp" if parts.scheme == "amqp" else "amqps"
        listeners.append(Listener(scheme, parts.hostname, port))
    return tuple(listeners)


def _convert(key: str, f: dataclasses.Field[Any], raw: str) -> Any:
    raw = raw.strip()
    unit = f.metadata["unit"]
    try:
        if f.name == "listeners":
            return parse_listeners(raw)
        if f.name == "authentication_providers":
            return parse_providers(raw)
        if f.type == "tuple[str, ...]":
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        if f.type in ("bool", bool):
            lowered = raw.lower()
            if lowered not in ("true", "false"):
                raise ValueError("expected true or false")
            return lowered == "true"
        if f.type in ("int", int):
            return int(raw)
        if f.type in ("float", float):
            number = float(raw)
            return number * MILLISECONDS if unit == "ms" else number * SECONDS
        return raw
    except ValueError as e:
        raise ConfigError(key, f"invalid value {raw!r}: {e}") from e


def read_conf_file(path: Path, ignored: list[str] | None = None) -> dict[str, str]:
    """Read `key=value` lines; `#` starts a comment line. Raises ConfigError (ConfigErrors
    for several) for lines without `=` and for unknown keys that look like a typo of ours
    (a typo silently ignored is a production incident), OSError when unreadable. Other
    unknown keys (a Starlight for RabbitMQ or Pulsar proxy file's) are skipped, each with a
    line in `ignored`."""
    values, problems = _parse_conf_file(path, ignored)
    _raise_all(problems)
    return values


def _parse_conf_file(
    path: Path, ignored: list[str] | None
) -> tuple[dict[str, str], list[ConfigError]]:
    values: dict[str, str] = {}
    problems: list[ConfigError] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "!")):
            continue
        key, sep, value = stripped.partition("=")
        key = key.strip()
        if not sep:
            problems.append(ConfigError(key, f"{path}:{number}: expected key=value"))
        elif key in CONFIG_KEYS:
            values[key] = value.strip()
        elif (near := _near_key(key)) is not None:
            problems.append(
                ConfigError(
                    key, f"{path}:{number}: unknown configuration key (did you mean {near}?)"
                )
            )
        elif ignored is not None:
            ignored.append(f"{path}:{number}: {key} is not a starlight-py key: ignored")
    return values, problems


def _near_key(key: str) -> str | None:
    """One of our keys that `key` is probably a typo of."""
    found = difflib.get_close_matches(key, list(CONFIG_KEYS), n=1, cutoff=0.85)
    lowered = {k.lower(): k for k in CONFIG_KEYS}
    return found[0] if found else lowered.get(key.lower())


def _env_problems(env: Mapping[str, str]) -> list[ConfigError]:
    """STARLIGHT_* variables that name no key (and are not the tools' own)."""
    known = {env_var_for(key): key for key in CONFIG_KEYS}
    problems = []
    for name in sorted(env):
        if (
            not name.startswith(ENV_PREFIX)
            or name in known
            or name in OTHER_ENV_VARS
            or name.startswith(OTHER_ENV_PREFIXES)
        ):
            continue
        near = difflib.get_close_matches(name, list(known), n=1, cutoff=0.85)
        hint = f" (did you mean {near[0]}?)" if near else ""
        problems.append(ConfigError(name, f"environment variable names no configuration key{hint}"))
    return problems


def load_config(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> StarlightConfig:
    """Build the configuration from defaults < conf file < env < overrides (keys are conf keys).

    Raises ConfigError naming the offending key (ConfigErrors naming every problem of the
    file, the environment and the overrides at once), or OSError when the file cannot be
    read. Keys of a file that are not ours and not a typo of ours are logged and ignored.
    """
    raw: dict[str, str] = {}
    problems: list[ConfigError] = []
    ignored: list[str] = []
    if path is not None:
        from_file, problems = _parse_conf_file(path, ignored)
        raw.update(from_file)
    problems.extend(_env_problems(env or {}))
    for key in CONFIG_KEYS:
        value = (env or {}).get(env_var_for(key))
        if value is not None:
            raw[key] = value
    for key, value in (overrides or {}).items():
        if key not in CONFIG_KEYS:
            near = _near_key(key)
            hint = f" (did you mean {near}?)" if near else ""
            problems.append(ConfigError(key, f"unknown configuration key{hint}"))
        else:
            raw[key] = value
    kwargs = {}
    for key, value in raw.items():
        try:
            kwargs[CONFIG_KEYS[key].name] = _convert(key, CONFIG_KEYS[key], value)
        except ConfigError as e:
            problems.append(e)
    _raise_all(problems)
    for line in ignored:
        log.warning("%s", line)
    return StarlightConfig(**kwargs)
