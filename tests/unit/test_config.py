"""load_config: sources and their precedence, conversions, validation naming the key."""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

import pytest

from starlight_py.config import (
    CONFIG_KEYS,
    ConfigError,
    Listener,
    StarlightConfig,
    env_var_for,
    load_config,
    parse_listeners,
    read_conf_file,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_CONF = REPO_ROOT / "conf" / "starlight.conf"


def write_conf(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "starlight.conf"
    path.write_text(text, encoding="utf-8")
    return path


def config_error(**overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    return info.value


# ---- sources and precedence ----------------------------------------------------------------


def test_defaults() -> None:
    cfg = load_config()
    assert cfg == StarlightConfig()
    assert cfg.listeners == (Listener("amqp", "127.0.0.1", 5672),)
    assert cfg.frame_max == 131072
    assert cfg.channel_max == 2047
    assert cfg.heartbeat == 60.0
    assert cfg.handshake_timeout == 10.0
    assert cfg.authentication_enabled is False


def test_file_then_env_then_overrides(tmp_path: Path) -> None:
    path = write_conf(
        tmp_path,
        "amqpDefaultTenant=file-tenant\n"
        "amqpDefaultNamespace=file-ns\n"
        "logLevel=DEBUG\n"
        "amqpMaxNoOfChannels=100\n",
    )
    env = {
        "STARLIGHT_AMQP_DEFAULT_TENANT": "env-tenant",
        "STARLIGHT_AMQP_DEFAULT_NAMESPACE": "env-ns",
        "STARLIGHT_AMQP_MAX_FRAME_SIZE": "8192",
    }
    overrides = {"amqpDefaultTenant": "flag-tenant", "amqpMaxFrameSize": "16384"}
    cfg = load_config(path, env=env, overrides=overrides)
    assert cfg.default_tenant == "flag-tenant"  # override beats env and file
    assert cfg.default_namespace == "env-ns"  # env beats file
    assert cfg.log_level == "DEBUG"  # file beats default
    assert cfg.channel_max == 100
    assert cfg.frame_max == 16384
    assert cfg.zookeeper_servers == "127.0.0.1:2181"  # default stays


def test_env_alone_and_file_alone(tmp_path: Path) -> None:
    path = write_conf(tmp_path, "amqpMaxMessageSize=1000\n")
    assert load_config(path).max_message_size == 1000
    env = {"STARLIGHT_AMQP_MAX_MESSAGE_SIZE": "2000"}
    assert load_config(env=env).max_message_size == 2000
    assert load_config(path, env=env).max_message_size == 2000


def test_every_key_is_read_from_its_env_var() -> None:
    values = {
        "configurationStoreServers": "zk1:2181,zk2:2181",
        "starlightMetadataRoot": "/sl",
        "zooKeeperSessionTimeoutMillis": "5000",
        "brokerServiceURL": "pulsar+ssl://broker:6651",
        "brokerWebServiceURL": "https://broker:8443",
        "brokerServiceURLTLS": "pulsar+ssl://broker-tls:6651",
        "brokerWebServiceURLTLS": "https://broker-tls:8443",
        "tlsEnabledWithBroker": "true",
        "brokerClientTrustCertsFilePath": "/tls/pulsar-ca.pem",
        "tlsHostnameVerificationEnabled": "false",
        "tlsAllowInsecureConnection": "true",
        "brokerClientAuthenticationPlugin": "token",
        "brokerClientAuthenticationParameters": "file:///etc/starlight/pulsar.token",
        "amqpListeners": "amqp://0.0.0.0:5673",
        "amqpDefaultTenant": "t",
        "amqpDefaultNamespace": "n",
        "amqpMapShortVhostToTenant": "true",
        "amqpAutoCreateNamespaces": "true",
        "amqpHeartbeatDelay": "15",
        "amqpMaxFrameSize": "65536",
        "amqpMaxNoOfChannels": "64",
        "amqpMaxMessageSize": "1048576",
        "amqpHandshakeTimeoutMillis": "1500",
        "amqpQuietConnectionAfterMillis": "20000",
        "amqpMaxConnections": "900",
        "amqpMaxConnectionsPerIp": "30",
        "pulsarProducerMaxPendingMessages": "7",
        "pulsarProducerIdleTimeoutMillis": "30000",
        "pulsarProducerBatching": "true",
        "pulsarSendTimeoutMillis": "60000",
        "pulsarAckGroupingTimeMillis": "250",
        "pulsarProducerBatchMaxMessages": "50",
        "subscriptionCleanerEnabled": "false",
        "metricsListener": "http://0.0.0.0:9101",
        "managementListener": "http://0.0.0.0:15672",
        "managementAdministrators": "ops, alice",
        "queueMetricsIntervalMillis": "4500",
        "amqpProxyProtocol": "true",
        "subscriptionCleanerIntervalMillis": "2500",
        "subscriptionCleanerGracePeriodMillis": "0",
        "subscriptionCleanerMaxActionsPerPass": "3",
        "authenticationEnabled": "true",
        "authenticationProviders": (
            "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
        ),
        "loopbackUsers": "guest, admin",
        "tokenSecretKey": "data:;base64,c2VjcmV0",
        "tokenPublicKey": "file:///etc/starlight/public.key",
        "tokenPublicAlg": "ES256",
        "tokenAuthClaim": "email",
        "tokenAudienceClaim": "aud2",
        "tokenAudience": "starlight",
        "tokenAllowedClockSkewSeconds": "30",
        "tlsCertificateFilePath": "/tls/server.pem",
        "tlsKeyFilePath": "/tls/server.key",
        "tlsTrustCertsFilePath": "/tls/ca.pem",
        "tlsRequireTrustedClientCertOnConnect": "true",
        "tlsProtocols": "TLSv1.3",
        "tlsCiphers": "ECDHE-RSA-AES256-GCM-SHA384, ECDHE-ECDSA-AES256-GCM-SHA384",
        "tlsHandshakeTimeoutMillis": "2500",
        "tlsCertRefreshCheckDurationSec": "60",
        "tlsExternalPrincipalFrom": "san_dns",
        "logLevel": "WARNING",
        "logFormat": "json",
        "shutdownDrainMillis": "2500",
    }
    assert set(values) == set(CONFIG_KEYS)
    cfg = load_config(env={env_var_for(key): value for key, value in values.items()})
    assert cfg == StarlightConfig(
        zookeeper_servers="zk1:2181,zk2:2181",
        metadata_root="/sl",
        zookeeper_session_timeout=5.0,
        pulsar_service_url="pulsar+ssl://broker:6651",
        pulsar_web_url="https://broker:8443",
        broker_service_url_tls="pulsar+ssl://broker-tls:6651",
        broker_web_url_tls="https://broker-tls:8443",
        tls_enabled_with_broker=True,
        broker_client_trust_certs_file="/tls/pulsar-ca.pem",
        broker_tls_hostname_verification=False,
        broker_tls_allow_insecure=True,
        broker_client_auth_plugin="token",
        broker_client_auth_parameters="file:///etc/starlight/pulsar.token",
        listeners=(Listener("amqp", "0.0.0.0", 5673),),
        default_tenant="t",
        default_namespace="n",
        map_short_vhost_to_tenant=True,
        auto_create_namespaces=True,
        heartbeat=15.0,
        frame_max=65536,
        channel_max=64,
        max_message_size=1048576,
        handshake_timeout=1.5,
        quiet_after=20.0,
        max_connections=900,
        max_connections_per_ip=30,
        producer_max_pending=7,
        producer_idle_timeout=30.0,
        producer_batching=True,
        consumer_ack_grouping_ms=250,
        producer_send_timeout_ms=60000,
        producer_batch_max_messages=50,
        cleaner_enabled=False,
        metrics_listener="http://0.0.0.0:9101",
        management_listener="http://0.0.0.0:15672",
        management_administrators=("ops", "alice"),
        queue_metrics_interval=4.5,
        proxy_protocol=True,
        cleaner_interval=2.5,
        cleaner_grace=0.0,
        cleaner_max_actions=3,
        authentication_enabled=True,
        authentication_providers=("token",),
        loopback_users=("guest", "admin"),
        token_secret_key="data:;base64,c2VjcmV0",
        token_public_key="file:///etc/starlight/public.key",
        token_public_alg="ES256",
        token_auth_claim="email",
        token_audience_claim="aud2",
        token_audience="starlight",
        token_clock_skew=30.0,
        tls_certificate_file="/tls/server.pem",
        tls_key_file="/tls/server.key",
        tls_trust_certs_file="/tls/ca.pem",
        tls_require_client_cert=True,
        tls_protocols=("TLSv1.3",),
        tls_ciphers=("ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-ECDSA-AES256-GCM-SHA384"),
        tls_handshake_timeout=2.5,
        tls_cert_refresh_interval=60.0,
        tls_external_principal_from="san_dns",
        log_level="WARNING",
        log_format="json",
        shutdown_drain=2.5,
    )


def test_env_vars_of_other_programs_and_of_the_tools_are_ignored() -> None:
    env = {
        "PATH": "/bin",
        "STARLIGHT_CACHE_DIR": "/tmp/c",
        "STARLIGHT_TEST_AMQP_URL": "amqp://x",
        "STARLIGHT_WORKER_INDEX": "1",
    }
    assert load_config(env=env) == StarlightConfig()


def test_a_starlight_variable_that_names_no_key_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"STARLIGHT_AMQP_LISTENER": "amqp://0.0.0.0:5672"})
    assert info.value.key == "STARLIGHT_AMQP_LISTENER"
    assert "did you mean STARLIGHT_AMQP_LISTENERS?" in str(info.value)


def test_every_problem_is_named_at_once(tmp_path: Path) -> None:
    path = write_conf(tmp_path, "amqpListner=amqp://0.0.0.0:5672\nlogLevel\namqpMaxFrameSize=big\n")
    with pytest.raises(ConfigError) as info:
        load_config(
            path,
            env={"STARLIGHT_NOPE": "1", "STARLIGHT_AMQP_HEARTBEAT_DELAY": "soon"},
            overrides={"frameMax": "1"},
        )
    lines = str(info.value).splitlines()
    assert [p.key for p in info.value.problems] == [
        "amqpListner",
        "logLevel",
        "STARLIGHT_NOPE",
        "frameMax",
        "amqpMaxFrameSize",
        "amqpHeartbeatDelay",
    ]
    assert len(lines) == 6 and "did you mean amqpListeners?" in lines[0]


def test_keys_of_a_starlight_for_rabbitmq_file_are_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Starlight for RabbitMQ's gateway.conf: its own keys, Pulsar proxy keys, and ours.
    path = write_conf(
        tmp_path,
        "brokerServiceURL=pulsar://pulsar:6650\n"
        "amqpSessionCountLimit=256\n"
        "amqpBatchingEnabled=true\n"
        "servicePort=6650\n"
        "amqpListeners=amqp://0.0.0.0:5672\n",
    )
    with caplog.at_level(logging.WARNING, logger="starlight.config"):
        cfg = load_config(path)
    assert cfg.pulsar_service_url == "pulsar://pulsar:6650"
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3 and all("is not a starlight-py key: ignored" in w for w in warned)
    assert "amqpSessionCountLimit" in warned[0] and f"{path}:2" in warned[0]


def test_conf_file_syntax(tmp_path: Path) -> None:
    path = write_conf(
        tmp_path,
        "# a comment\n"
        "! also a comment (Java properties)\n"
        "\n"
        "   brokerWebServiceURL =  http://admin:8080/path?a=b  \n"
        "  # amqpDefaultTenant=commented-out\n",
    )
    assert read_conf_file(path) == {"brokerWebServiceURL": "http://admin:8080/path?a=b"}
    cfg = load_config(path)
    assert cfg.pulsar_web_url == "http://admin:8080/path?a=b"
    assert cfg.default_tenant == "public"


def test_unknown_key_in_file_is_named(tmp_path: Path) -> None:
    path = write_conf(tmp_path, "logLevel=INFO\namqpListner=amqp://0.0.0.0:5672\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == "amqpListner"
    assert str(info.value).startswith("amqpListner: ")
    assert f"{path}:2" in str(info.value)


def test_line_without_equals_is_refused(tmp_path: Path) -> None:
    path = write_conf(tmp_path, "logLevel\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == "logLevel"
    assert "expected key=value" in str(info.value)


def test_unknown_override_is_named() -> None:
    assert config_error(frameMax="4096").key == "frameMax"


def test_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        load_config(tmp_path / "missing.conf")


# ---- conversions ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"), [("true", True), ("false", False), ("TRUE", True), (" False ", False)]
)
def test_bool_values(raw: str, expected: bool) -> None:
    cfg = load_config(overrides={"amqpAutoCreateNamespaces": raw})
    assert cfg.auto_create_namespaces is expected


@pytest.mark.parametrize("raw", ["yes", "1", "on", "", "truthy"])
def test_bad_bool_names_the_key(raw: str) -> None:
    error = config_error(amqpAutoCreateNamespaces=raw)
    assert error.key == "amqpAutoCreateNamespaces"
    assert str(error).startswith("amqpAutoCreateNamespaces: ")


@pytest.mark.parametrize(
    ("key", "raw"),
    [
        ("amqpMaxFrameSize", "128k"),
        ("amqpMaxFrameSize", "4096.5"),
        ("amqpMaxNoOfChannels", ""),
        ("amqpMaxMessageSize", "lots"),
        ("amqpHandshakeTimeoutMillis", "soon"),
        ("amqpHeartbeatDelay", "1m"),
    ],
)
def test_bad_number_names_the_key(key: str, raw: str) -> None:
    error = config_error(**{key: raw})
    assert error.key == key
    assert repr(raw.strip()) in str(error)


def test_millisecond_keys_become_seconds() -> None:
    cfg = load_config(
        overrides={
            "amqpHandshakeTimeoutMillis": "2500",
            "zooKeeperSessionTimeoutMillis": "15000",
        }
    )
    assert cfg.handshake_timeout == 2.5
    assert cfg.zookeeper_session_timeout == 15.0


def test_heartbeat_is_in_seconds() -> None:
    assert load_config(overrides={"amqpHeartbeatDelay": "30"}).heartbeat == 30.0
    assert load_config(overrides={"amqpHeartbeatDelay": "0"}).heartbeat == 0.0


# ---- listeners -----------------------------------------------------------------------------


def test_listeners_parsing() -> None:
    assert parse_listeners("amqp://0.0.0.0:5672, amqps://broker.example.com:5671") == (
        Listener("amqp", "0.0.0.0", 5672),
        Listener("amqps", "broker.example.com", 5671),
    )


def test_listener_default_ports() -> None:
    assert parse_listeners("amqp://a,amqps://b") == (
        Listener("amqp", "a", 5672),
        Listener("amqps", "b", 5671),
    )


def test_listener_empty_entries_are_skipped_and_url_round_trips() -> None:
    listeners = parse_listeners(" amqp://h:1234 ,, ")
    assert listeners == (Listener("amqp", "h", 1234),)
    assert listeners[0].url == "amqp://h:1234"


def test_listeners_from_the_conf_file(tmp_path: Path) -> None:
    path = write_conf(tmp_path, "amqpListeners=amqp://0.0.0.0:5672,amqp://127.0.0.1:15672\n")
    assert load_config(path).listeners == (
        Listener("amqp", "0.0.0.0", 5672),
        Listener("amqp", "127.0.0.1", 15672),
    )


@pytest.mark.parametrize(
    "text",
    [
        "http://h:5672",
        "h:5672",
        "localhost",
        "amqp://:5672",
        "amqp://h:notaport",
        "amqp://h:70000",
        "amqp://ok:5672,tcp://bad:1",
    ],
)
def test_bad_listener_names_the_key(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_listeners(text)
    assert info.value.key == "amqpListeners"
    assert config_error(amqpListeners=text).key == "amqpListeners"


@pytest.mark.parametrize("text", ["", " , "])
def test_no_listener_at_all_is_refused(text: str) -> None:
    assert config_error(amqpListeners=text).key == "amqpListeners"


# ---- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "raw"),
    [
        ("amqpMaxFrameSize", "4095"),
        ("amqpMaxFrameSize", "0"),
        ("amqpMaxFrameSize", str(64 * 1024 * 1024 + 1)),
        ("amqpMaxNoOfChannels", "0"),
        ("amqpMaxNoOfChannels", "65536"),
        ("amqpMaxNoOfChannels", "-1"),
        ("amqpHeartbeatDelay", "-1"),
        ("amqpHeartbeatDelay", "65536"),
        ("amqpMaxMessageSize", "0"),
        ("amqpHandshakeTimeoutMillis", "0"),
        ("amqpMaxConnections", "-1"),
        ("amqpMaxConnectionsPerIp", "-5"),
        ("zooKeeperSessionTimeoutMillis", "1999"),
        ("brokerServiceURL", "http://broker:6650"),
        ("brokerServiceURL", "broker:6650"),
        ("brokerServiceURL", ""),
        ("brokerWebServiceURL", "pulsar://broker:8080"),
        ("brokerWebServiceURL", "broker:8080"),
        ("starlightMetadataRoot", "starlight"),
        ("starlightMetadataRoot", "/starlight/"),
        ("configurationStoreServers", "  "),
        ("logLevel", "TRACE"),
        ("logLevel", "debug"),
        ("logFormat", "JSON"),
        ("logFormat", "xml"),
        ("shutdownDrainMillis", "-1"),
        ("amqpDefaultTenant", "my tenant"),
        ("amqpDefaultTenant", "a/b"),
        ("amqpDefaultNamespace", ""),
    ],
)
def test_invalid_value_names_the_key(key: str, raw: str) -> None:
    error = config_error(**{key: raw})
    assert error.key == key
    assert str(error).startswith(f"{key}: ")


@pytest.mark.parametrize(
    ("key", "raw"),
    [
        ("amqpMaxFrameSize", "4096"),
        ("amqpMaxFrameSize", str(64 * 1024 * 1024)),
        ("amqpMaxNoOfChannels", "1"),
        ("amqpMaxNoOfChannels", "65535"),
        ("zooKeeperSessionTimeoutMillis", "2000"),
        ("brokerServiceURL", "pulsar+ssl://broker:6651"),
        ("brokerWebServiceURL", "https://broker:8443"),
        ("amqpDefaultTenant", "a-b_c.d=e:f"),
        ("shutdownDrainMillis", "0"),
    ],
)
def test_boundary_values_are_accepted(key: str, raw: str) -> None:
    cfg = load_config(overrides={key: raw})
    assert getattr(cfg, CONFIG_KEYS[key].name) != getattr(StarlightConfig(), CONFIG_KEYS[key].name)


def test_building_the_object_directly_validates_too() -> None:
    with pytest.raises(ConfigError) as info:
        StarlightConfig(frame_max=1024)
    assert info.value.key == "amqpMaxFrameSize"
    with pytest.raises(ConfigError) as info:
        StarlightConfig(listeners=())
    assert info.value.key == "amqpListeners"


def test_config_is_frozen() -> None:
    cfg = load_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.frame_max = 4096  # type: ignore[misc]


def test_config_error_is_a_value_error() -> None:
    assert isinstance(ConfigError("k", "m"), ValueError)


# ---- env var names and the shipped conf file -----------------------------------------------


@pytest.mark.parametrize(
    ("key", "env"),
    [
        ("brokerServiceURL", "STARLIGHT_BROKER_SERVICE_URL"),
        ("brokerWebServiceURL", "STARLIGHT_BROKER_WEB_SERVICE_URL"),
        ("amqpListeners", "STARLIGHT_AMQP_LISTENERS"),
        ("zooKeeperSessionTimeoutMillis", "STARLIGHT_ZOO_KEEPER_SESSION_TIMEOUT_MILLIS"),
        ("amqpMaxNoOfChannels", "STARLIGHT_AMQP_MAX_NO_OF_CHANNELS"),
        ("configurationStoreServers", "STARLIGHT_CONFIGURATION_STORE_SERVERS"),
        ("logLevel", "STARLIGHT_LOG_LEVEL"),
    ],
)
def test_env_var_names(key: str, env: str) -> None:
    assert env_var_for(key) == env


def test_env_var_names_are_distinct_and_well_formed() -> None:
    names = [env_var_for(key) for key in CONFIG_KEYS]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"STARLIGHT_[A-Z0-9]+(_[A-Z0-9]+)*", name) for name in names)


def test_every_config_key_is_documented_in_the_shipped_conf_file() -> None:
    text = SHIPPED_CONF.read_text(encoding="utf-8")
    missing = [
        key
        for key in CONFIG_KEYS
        if not re.search(rf"^[ \t]*#?[ \t]*{re.escape(key)}[ \t]*=", text, re.MULTILINE)
    ]
    assert missing == []


def test_shipped_conf_file_loads_to_the_defaults() -> None:
    assert load_config(SHIPPED_CONF) == StarlightConfig()


def test_queue_metrics_can_be_turned_off_but_not_negative() -> None:
    assert (
        load_config(env={"STARLIGHT_QUEUE_METRICS_INTERVAL_MILLIS": "0"}).queue_metrics_interval
        == 0
    )
    error = config_error(queueMetricsIntervalMillis="-1")
    assert error.key == "queueMetricsIntervalMillis" and "negative" in str(error)
