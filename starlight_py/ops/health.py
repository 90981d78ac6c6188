"""A small HTTP endpoint (trio) for operators: `/metrics` (Prometheus text format),
`/healthz` (the process serves) and `/readyz` (ZooKeeper connected, Pulsar answering, AMQP
listeners open; 503 with the reasons otherwise)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import trio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from starlight_py.ops.metrics import ProxyMetrics

log = logging.getLogger("starlight.ops")

MAX_REQUEST = 8192
READ_TIMEOUT = 5.0

Readiness = Callable[[], list[str]]  # blocking; returns what is not ready (empty: ready)


async def serve_health(
    host: str,
    port: int,
    metrics: ProxyMetrics,
    readiness: Readiness,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound_host, bound_port = listeners[0].socket.getsockname()[:2]
    url = f"http://{bound_host}:{bound_port}"
    log.info("metrics and health on %s (/metrics, /healthz, /readyz)", url)
    task_status.started(url)

    async def handle(stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(READ_TIMEOUT):
                request = await _read_request(stream)
                if request is None:
                    return
                status, content_type, body = await _answer(request, metrics, readiness)
                head = (
                    f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                )
                await stream.send_all(head.encode() + body)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()

    await trio.serve_listeners(handle, listeners)


async def _read_request(stream: trio.SocketStream) -> str | None:
    data = b""
    while b"\r\n\r\n" not in data and b"\n\n" not in data:
        chunk = await stream.receive_some(4096)
        if not chunk:
            return None
        data += chunk
        if len(data) > MAX_REQUEST:
            return None
    line = data.split(b"\n", 1)[0].decode("latin-1").strip()
    parts = line.split()
    if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
        return ""
    return parts[1].split("?", 1)[0]


async def _answer(path: str, metrics: ProxyMetrics, readiness: Readiness) -> tuple[str, str, bytes]:
    if path == "/metrics":
        # In a thread: with many queues the text takes a while to write (docs/operations.md).
        body = await trio.to_thread.run_sync(generate_latest, metrics.registry)
        return "200 OK", CONTENT_TYPE_LATEST, body
    if path == "/healthz":
        return "200 OK", "text/plain; charset=utf-8", b"ok\n"
    if path == "/readyz":
        problems = await trio.to_thread.run_sync(readiness)
        body = json.dumps({"ready": not problems, "problems": problems}).encode() + b"\n"
        status = "200 OK" if not problems else "503 Service Unavailable"
        return status, "application/json", body
    return "404 Not Found", "text/plain; charset=utf-8", b"not found\n"
