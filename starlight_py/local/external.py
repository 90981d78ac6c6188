"""Servers someone else runs, named by environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass

from starlight_py.local.errors import LocalInfraError

PULSAR_URL_VARIABLE = "STARLIGHT_PULSAR_URL"
PULSAR_WEB_URL_VARIABLE = "STARLIGHT_PULSAR_WEB_URL"
ZOOKEEPER_VARIABLE = "STARLIGHT_ZOOKEEPER"


@dataclass(frozen=True)
class ServiceEndpoints:
    """Where the proxy finds its backing services."""

    pulsar_service_url: str
    """Pulsar binary protocol URL, e.g. ``pulsar://127.0.0.1:6650``."""

    pulsar_web_url: str
    """Pulsar admin/REST URL, e.g. ``http://127.0.0.1:8080``."""

    zookeeper: str
    """ZooKeeper connect string for starlight-py's metadata, e.g. ``127.0.0.1:2181``."""


def endpoints_from_env() -> ServiceEndpoints | None:
    """Endpoints of already running servers, from the environment, or None.

    All three of ``STARLIGHT_PULSAR_URL``, ``STARLIGHT_PULSAR_WEB_URL`` and
    ``STARLIGHT_ZOOKEEPER`` set (non-empty) means "use these, start nothing"; none set
    returns None, meaning "start local servers".

    Raises:
        LocalInfraError: only some of the three are set; the message names the missing ones.
    """
    names = (PULSAR_URL_VARIABLE, PULSAR_WEB_URL_VARIABLE, ZOOKEEPER_VARIABLE)
    values = {name: os.environ.get(name, "").strip() for name in names}
    missing = [name for name in names if not values[name]]
    if len(missing) == len(names):
        return None
    if missing:
        given = [name for name in names if values[name]]
        raise LocalInfraError(
            f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} set but "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not; set all three "
            "to use existing servers, or none to start local ones"
        )
    return ServiceEndpoints(
        pulsar_service_url=values[PULSAR_URL_VARIABLE],
        pulsar_web_url=values[PULSAR_WEB_URL_VARIABLE],
        zookeeper=values[ZOOKEEPER_VARIABLE],
    )
