"""The proxy's configuration: one typed, frozen object, validated when it is built.

Sources, later ones winning: built-in defaults < the conf file (`key=value` lines, Java
properties style, as Pulsar and Starlight for RabbitMQ use) < environment variables
(`STARLIGHT_` + the key in upper snake case, e.g. `STARLIGHT_AMQP_LISTENERS`) < explicit
overrides (command-line flags). Key names follow Starlight for RabbitMQ where it has one, so
an operator's existing conf file keeps working.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from starlight_py.units import KIB, MIB, MILLISECONDS, SECONDS

ENV_PREFIX = "STARLIGHT_"


class ConfigError(ValueError):
    """A configuration value is missing or invalid; `key` names the offending key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


@dataclass(frozen=True)
class Listener:
    """One AMQP listening socket, parsed from `amqp://host:port` or `amqps://host:port`."""

    scheme: Literal["amqp", "amqps"]
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


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
        default=4 * MIB,
        metadata=_key(
            "amqpMaxMessageSize",
            "Largest message body accepted. Keep it below the broker's maxMessageSize "
            "(5 MiB by default in Pulsar) minus room for properties.",
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
    handshake_timeout: float = field(
        default=10 * SECONDS,
        metadata=_key(
            "amqpHandshakeTimeoutMillis",
            "Time a client has from TCP connect to connection.open before it is disconnected.",
            "ms",
        ),
    )
    authentication_enabled: bool = field(
        default=False,
        metadata=_key(
            "authenticationEnabled",
            "When false, any credentials are accepted (a warning is logged at start).",
        ),
    )
    log_level: str = field(
        default="INFO",
        metadata=_key("logLevel", "DEBUG, INFO, WARNING or ERROR."),
    )

    def __post_init__(self) -> None:
        _validate(self)


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _validate(cfg: StarlightConfig) -> None:
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
    # 4096 is the AMQP 0-9-1 minimum frame size every peer must accept.
    if not 4096 <= cfg.frame_max <= 64 * MIB:
        raise ConfigError("amqpMaxFrameSize", "must be between 4096 and 67108864")
    if not 1 <= cfg.channel_max <= 65535:
        raise ConfigError("amqpMaxNoOfChannels", "must be between 1 and 65535")
    if not 0 <= cfg.heartbeat <= 65535:
        raise ConfigError("amqpHeartbeatDelay", "must be between 0 and 65535 seconds")
    if cfg.producer_max_pending < 1:
        raise ConfigError("pulsarProducerMaxPendingMessages", "must be positive")
    if cfg.max_message_size < 1:
        raise ConfigError("amqpMaxMessageSize", "must be positive")
    if cfg.handshake_timeout <= 0:
        raise ConfigError("amqpHandshakeTimeoutMillis", "must be positive")
    if cfg.zookeeper_session_timeout < 2 * SECONDS:
        raise ConfigError("zooKeeperSessionTimeoutMillis", "must be at least 2000")
    if cfg.log_level not in _LOG_LEVELS:
        raise ConfigError("logLevel", f"must be one of {', '.join(_LOG_LEVELS)}")
    for name in ("default_tenant", "default_namespace"):
        value = getattr(cfg, name)
        if not re.fullmatch(r"[A-Za-z0-9_.=:-]+", value):
            raise ConfigError(_FIELDS_BY_NAME[name].metadata["key"], f"invalid name {value!r}")


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


def read_conf_file(path: Path) -> dict[str, str]:
    """Read `key=value` lines; `#` starts a comment line. Raises ConfigError for unknown keys
    (a typo silently ignored is a production incident) and OSError when unreadable."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "!")):
            continue
        key, sep, value = stripped.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(key, f"{path}:{number}: expected key=value")
        if key not in CONFIG_KEYS:
            raise ConfigError(key, f"{path}:{number}: unknown configuration key")
        values[key] = value.strip()
    return values


def load_config(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> StarlightConfig:
    """Build the configuration from defaults < conf file < env < overrides (keys are conf keys).

    Raises ConfigError naming the offending key, or OSError when the file cannot be read.
    """
    raw: dict[str, str] = {}
    if path is not None:
        raw.update(read_conf_file(path))
    for key in CONFIG_KEYS:
        value = (env or {}).get(env_var_for(key))
        if value is not None:
            raw[key] = value
    for key, value in (overrides or {}).items():
        if key not in CONFIG_KEYS:
            raise ConfigError(key, "unknown configuration key")
        raw[key] = value
    kwargs = {CONFIG_KEYS[k].name: _convert(k, CONFIG_KEYS[k], v) for k, v in raw.items()}
    return StarlightConfig(**kwargs)
