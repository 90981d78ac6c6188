"""/api/nodes: the live proxies, from the proxy registry. /api/policies is policies.py,
/api/users users.py."""

from __future__ import annotations

from starlight_py.cluster.registry import live_proxies, uptime
from starlight_py.management.api import Answer, ApiCall
from starlight_py.management.errors import ObjectNotFound
from starlight_py.management.shapes import listed


def list_nodes(call: ApiCall) -> Answer:
    services = call.context.services
    items = [
        {
            "name": record.id,
            "type": "disc",
            "running": True,
            "uptime": int(uptime(record) * 1000),
            "os_pid": record.pid,
            "starlight_host": record.host,
            "starlight_version": record.version,
            "starlight_listeners": list(record.listeners),
        }
        for record in live_proxies(services.zookeeper, services.topology.paths)
    ]
    return Answer(200, listed(items, call.query))


def get_node(call: ApiCall) -> Answer:
    answer = list_nodes(call)
    for item in answer.value:
        if item["name"] == call.params["node"]:
            return Answer(200, item)
    raise ObjectNotFound()
