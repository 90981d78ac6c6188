"""Every endpoint of the management API and the function that answers it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from starlight_py.management import (
    bindings,
    cluster_resources,
    connections,
    definitions,
    exchanges,
    messages,
    overview,
    policies,
    pulsar_view,
    queues,
    users,
)
from starlight_py.management.api import ApiContext, Endpoint, ManagementApi
from starlight_py.management.routing import Router

if TYPE_CHECKING:
    from starlight_py.gateway.proxy_services import ProxyServices


def build_router() -> Router[Endpoint]:
    r: Router[Endpoint] = Router()
    r.add("/api/overview", GET=overview.overview)
    r.add("/api/whoami", GET=overview.whoami)
    r.add("/api/vhosts", GET=overview.list_vhosts)
    r.add(
        "/api/vhosts/{vhost}",
        GET=overview.get_vhost,
        PUT=overview.put_vhost,
        DELETE=overview.delete_vhost,
    )
    r.add("/api/vhosts/{vhost}/permissions", GET=definitions.list_permissions)
    r.add("/api/health/checks/alarms", GET=overview.alarms)
    r.add("/api/aliveness-test/{vhost}", GET=overview.aliveness)

    r.add("/api/queues", GET=queues.list_queues)
    r.add("/api/queues/{vhost}", GET=queues.list_queues)
    r.add(
        "/api/queues/{vhost}/{name}",
        GET=queues.get_queue,
        PUT=queues.put_queue,
        DELETE=queues.delete_queue,
    )
    r.add("/api/queues/{vhost}/{name}/contents", DELETE=queues.purge_queue)
    r.add("/api/queues/{vhost}/{name}/bindings", GET=queues.queue_bindings)
    r.add("/api/queues/{vhost}/{name}/get", POST=messages.get)
    r.add("/api/queues/{vhost}/{name}/pulsar", GET=pulsar_view.queue_in_pulsar)

    r.add("/api/exchanges", GET=exchanges.list_exchanges)
    r.add("/api/exchanges/{vhost}", GET=exchanges.list_exchanges)
    r.add(
        "/api/exchanges/{vhost}/{name}",
        GET=exchanges.get_exchange,
        PUT=exchanges.put_exchange,
        DELETE=exchanges.delete_exchange,
    )
    r.add("/api/exchanges/{vhost}/{name}/bindings/source", GET=exchanges.source_bindings)
    r.add("/api/exchanges/{vhost}/{name}/bindings/destination", GET=exchanges.destination_bindings)
    r.add("/api/exchanges/{vhost}/{name}/publish", POST=messages.publish)

    r.add("/api/bindings", GET=bindings.list_bindings)
    r.add("/api/bindings/{vhost}", GET=bindings.list_bindings)
    r.add(
        "/api/bindings/{vhost}/e/{source}/{kind}/{destination}",
        GET=bindings.bindings_between,
        POST=bindings.create_binding,
    )
    r.add(
        "/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}",
        GET=bindings.get_binding,
        DELETE=bindings.delete_binding,
    )

    r.add("/api/definitions", GET=definitions.get_definitions, POST=definitions.post_definitions)
    r.add(
        "/api/definitions/{vhost}",
        GET=definitions.get_definitions,
        POST=definitions.post_definitions,
    )
    r.add("/api/permissions", GET=definitions.list_permissions)
    r.add(
        "/api/permissions/{vhost}/{user}",
        GET=definitions.get_permission,
        PUT=definitions.put_permission,
        DELETE=definitions.delete_permission,
    )
    r.add("/api/users/{user}/permissions", GET=definitions.list_permissions)
    r.add("/api/users", GET=users.list_users)
    r.add(
        "/api/users/{user}",
        GET=users.get_user,
        PUT=users.put_user,
        DELETE=users.remove_user,
    )

    r.add("/api/nodes", GET=cluster_resources.list_nodes)
    r.add("/api/nodes/{node}", GET=cluster_resources.get_node)
    r.add("/api/policies", GET=policies.list_policies)
    r.add("/api/policies/{vhost}", GET=policies.list_policies)
    r.add(
        "/api/policies/{vhost}/{name}",
        GET=policies.get_policy,
        PUT=policies.put_policy,
        DELETE=policies.delete_policy,
    )

    r.add("/api/connections", GET=connections.list_connections)
    r.add("/api/vhosts/{vhost}/connections", GET=connections.list_connections)
    r.add(
        "/api/connections/{name}",
        GET=connections.get_connection,
        DELETE=connections.delete_connection,
    )
    r.add("/api/connections/{name}/channels", GET=connections.connection_channels)
    r.add("/api/channels", GET=connections.list_channels)
    r.add("/api/vhosts/{vhost}/channels", GET=connections.list_channels)
    r.add("/api/channels/{name}", GET=connections.get_channel)
    r.add("/api/consumers", GET=connections.list_consumers)
    r.add("/api/consumers/{vhost}", GET=connections.list_consumers)
    return r


def management_api(
    services: ProxyServices,
    amqp_urls: list[str],
    readiness: Callable[[], list[str]],
) -> ManagementApi:
    return ManagementApi(ApiContext(services, amqp_urls, readiness), build_router())
