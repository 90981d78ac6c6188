"""`starlight-proxy config print` and `config check`: the effective configuration with the
source of every key, and a validation that names the offending key.

The sources are found the way `load_config` applies them (defaults < conf file <
environment < command line); the values printed are those of the validated
`StarlightConfig`, written back in conf-file syntax, so what is printed is what the proxy
would run with. Secrets are masked: a `file:` reference is shown (operators check paths),
any other value of a secret key is not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from starlight_py.auth.authenticator import build_authenticator
from starlight_py.config import (
    CONFIG_KEYS,
    Listener,
    StarlightConfig,
    env_var_for,
    load_config,
    read_conf_file,
)
from starlight_py.gateway.connection.tls import server_tls
from starlight_py.units import MILLISECONDS

MASK = "********"
# Keys whose values are credentials: HMAC keys, passwords, authentication parameters
# (which may embed a token). Fields declared with repr=False are secret too.
_SECRET_KEY_NAME = re.compile(
    r"secret|password|passwd|credential|authParams|authenticationParameters|privateKey",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Setting:
    """One key of the effective configuration, as `config print` shows it."""

    key: str
    value: str  # conf-file syntax; already masked when `secret`
    source: str  # default, file, environment or command line
    origin: str  # the file path, the environment variable or the flag; "" for defaults
    secret: bool


def is_secret(key: str) -> bool:
    """Whether the value of configuration key `key` must never be shown or logged."""
    f = CONFIG_KEYS[key]
    return not f.repr or bool(_SECRET_KEY_NAME.search(key))


def format_value(key: str, value: Any) -> str:
    """A typed configuration value back in conf-file syntax (`load_config` reads it back
    to the same value)."""
    unit = CONFIG_KEYS[key].metadata["unit"]
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(v.url if isinstance(v, Listener) else str(v) for v in value)
    if isinstance(value, float):
        number = value / MILLISECONDS if unit == "ms" else value
        return str(round(number)) if abs(number - round(number)) < 1e-9 else repr(number)
    return str(value)


def mask(value: str) -> str:
    if not value or value.startswith("file:"):
        return value
    return MASK


def effective_settings(
    path: Path | None, env: Mapping[str, str], overrides: Mapping[str, str]
) -> list[Setting]:
    """Every key with its effective value and where it came from.

    Raises ConfigError naming the offending key, OSError when the file cannot be read."""
    config = load_config(path, env, overrides)
    from_file = read_conf_file(path) if path is not None else {}
    settings = []
    for key, f in CONFIG_KEYS.items():
        if key in overrides:
            source, origin = "command line", f"--set {key}"
        elif env_var_for(key) in env:
            source, origin = "environment", env_var_for(key)
        elif key in from_file:
            source, origin = "file", str(path)
        else:
            source, origin = "default", ""
        secret = is_secret(key)
        text = format_value(key, getattr(config, f.name))
        settings.append(Setting(key, mask(text) if secret else text, source, origin, secret))
    return settings


def check_config(
    path: Path | None, env: Mapping[str, str], overrides: Mapping[str, str]
) -> StarlightConfig:
    """Everything the proxy checks before it opens a socket: values, and the TLS and token
    key files they name. Raises ConfigError naming the key, OSError for the conf file."""
    config = load_config(path, env, overrides)
    server_tls(config)
    build_authenticator(config)
    return config


def print_settings(settings: list[Setting], output_format: str, out: TextIO) -> None:
    if output_format == "json":
        document = {
            s.key: {"value": s.value, "source": s.source, "origin": s.origin, "secret": s.secret}
            for s in settings
        }
        json.dump(document, out, indent=2)
        out.write("\n")
        return
    key_width = max(len(s.key) for s in settings)
    values = [s.value if s.value else '""' for s in settings]
    # Long values (listener lists, cipher lists) do not push every other line right.
    value_width = min(max(len(v) for v in values), 40)
    out.write("# effective configuration; sources: default < file < environment < command line\n")
    for s, value in zip(settings, values, strict=True):
        where = f"{s.source} ({s.origin})" if s.origin else s.source
        out.write(f"{s.key:<{key_width}}  {value:<{value_width}}  [{where}]\n")
