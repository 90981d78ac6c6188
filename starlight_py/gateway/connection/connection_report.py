"""This proxy's AMQP connections, channels and consumers in the shapes of RabbitMQ's
management API (`/api/connections`, `/api/channels`, `/api/consumers`), for the connection
reports every proxy writes to ZooKeeper (cluster/connection_reports.py). Runs on trio's
thread: it reads the live connection objects."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from starlight_py.admin.definitions import json_value
from starlight_py.gateway.connection.client_connection import ClientConnection
from starlight_py.model.addresses import host_port

NODE = "starlight@proxy"  # as the management API names the node (management/shapes.py)


def connection_name(connection: ClientConnection) -> str:
    """RabbitMQ's `client:port -> server:port`."""
    return f"{connection.peer} -> {connection.local}"


def describe_connections(
    connections: Iterable[ClientConnection], proxy_id: str
) -> list[dict[str, Any]]:
    report = []
    for connection in connections:
        name = connection_name(connection)
        peer_host, peer_port = host_port(connection.peer)
        host, port = host_port(connection.local)
        vhost = connection.vhost.vhost if connection.vhost is not None else None
        user = connection.principal.name if connection.principal is not None else ""
        amqp = connection.conn
        details = {
            "name": name,
            "node": NODE,
            "starlight_proxy": proxy_id,
            "vhost": vhost,
            "user": user,
            "user_who_performed_action": user,
            "state": "running" if vhost is not None else "starting",
            "type": "network",
            "protocol": "AMQP 0-9-1",
            "auth_mechanism": connection.principal.mechanism if connection.principal else None,
            "ssl": connection.tls,
            "peer_host": peer_host,
            "peer_port": peer_port,
            "host": host,
            "port": port,
            "channels": len(connection.channels),
            "channel_max": amqp.channel_max,
            "frame_max": amqp.frame_max,
            "timeout": amqp.heartbeat,
            "connected_at": int(connection.connected_at * 1000),
            "client_properties": json_value(dict(amqp.client_properties)),
        }
        channels = []
        consumers = []
        for number, session in sorted(connection.channels.items()):
            core = session.core
            channel_name = f"{name} ({number})"
            channels.append(
                {
                    "name": channel_name,
                    "number": number,
                    "node": NODE,
                    "vhost": vhost,
                    "user": user,
                    "user_who_performed_action": user,
                    "state": "running",
                    "connection_details": {
                        "name": name,
                        "peer_host": peer_host,
                        "peer_port": peer_port,
                    },
                    "consumer_count": len(core.consumers),
                    "prefetch_count": core.prefetch_consumer,
                    "global_prefetch_count": core.prefetch_global,
                    "messages_unacknowledged": len(core.unacked),
                    "messages_unconfirmed": core.unconfirmed,
                    "messages_uncommitted": 0,
                    "acks_uncommitted": 0,
                    "confirm": core.confirms is not None,
                    "transactional": core.transaction is not None,
                }
            )
            for consumer in list(core.consumers.values()):
                consumers.append(
                    {
                        "consumer_tag": consumer.tag,
                        "queue": {"name": consumer.queue, "vhost": vhost},
                        "channel_details": {
                            "name": channel_name,
                            "number": number,
                            "connection_name": name,
                            "node": NODE,
                            "peer_host": peer_host,
                            "peer_port": peer_port,
                            "user": user,
                        },
                        "ack_required": not consumer.no_ack,
                        "exclusive": consumer.exclusive,
                        "prefetch_count": consumer.prefetch,
                        "active": True,
                        "activity_status": "up",
                        "arguments": {},
                    }
                )
        report.append({"connection": details, "channels": channels, "consumers": consumers})
    return report
