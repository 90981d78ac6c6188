"""/api/connections, /api/channels and /api/consumers of the whole cluster (every proxy's,
from the reports they write to ZooKeeper, cluster/connection_reports.py), and DELETE
/api/connections/{name}, which the proxy holding the connection carries out with 320
CONNECTION_FORCED and the `X-Reason` header's text (within about a second).

Administrators see every connection; other users their own, as RabbitMQ shows them to
users without the `monitoring` tag."""

from __future__ import annotations

from typing import Any

from starlight_py.cluster.connection_reports import read_reports, request_close
from starlight_py.management.api import NO_CONTENT, Answer, ApiCall
from starlight_py.management.errors import ObjectNotFound
from starlight_py.management.shapes import listed
from starlight_py.management.vhost_access import usable_vhost

DEFAULT_REASON = "Closed via management plugin"  # RabbitMQ's text without X-Reason


def _reports(call: ApiCall) -> list[tuple[str, dict[str, Any]]]:
    """(proxy id, connection report) of every connection the caller may see."""
    services = call.context.services
    found = []
    for proxy, connections in read_reports(services.zookeeper, services.topology.paths):
        for report in connections:
            details = report.get("connection") or {}
            if call.user.administrator or details.get("user") == call.user.name:
                found.append((proxy, report))
    return found


def _in_vhost(call: ApiCall) -> list[tuple[str, dict[str, Any]]]:
    vhost = call.params.get("vhost")
    if vhost is not None:
        usable_vhost(call, vhost)
    return [
        (proxy, report)
        for proxy, report in _reports(call)
        if vhost is None or report["connection"].get("vhost") == vhost
    ]


def list_connections(call: ApiCall) -> Answer:
    items = [report["connection"] for _, report in _in_vhost(call)]
    return Answer(200, listed(items, call.query))


def _named(call: ApiCall) -> tuple[str, dict[str, Any]]:
    for proxy, report in _reports(call):
        if report["connection"].get("name") == call.params["name"]:
            return proxy, report
    raise ObjectNotFound()


def get_connection(call: ApiCall) -> Answer:
    _, report = _named(call)
    return Answer(200, report["connection"])


def delete_connection(call: ApiCall) -> Answer:
    proxy, report = _named(call)
    reason = call.request.headers.get("x-reason") or DEFAULT_REASON
    services = call.context.services
    request_close(
        services.zookeeper, services.topology.paths, proxy, report["connection"]["name"], reason
    )
    return NO_CONTENT


def connection_channels(call: ApiCall) -> Answer:
    _, report = _named(call)
    return Answer(200, listed(list(report["channels"]), call.query))


def list_channels(call: ApiCall) -> Answer:
    items = [channel for _, report in _in_vhost(call) for channel in report["channels"]]
    return Answer(200, listed(items, call.query))


def get_channel(call: ApiCall) -> Answer:
    for _, report in _reports(call):
        for channel in report["channels"]:
            if channel.get("name") == call.params["name"]:
                return Answer(200, channel)
    raise ObjectNotFound()


def list_consumers(call: ApiCall) -> Answer:
    items = [consumer for _, report in _in_vhost(call) for consumer in report["consumers"]]
    return Answer(200, listed(items, call.query))
