"""`starlight-proxy serve --workers N` (starlight_py/workers.py): N proxy processes on one
AMQP port through SO_REUSEPORT, each with its own metrics listener (port + index), restarted
when one dies, all stopped gracefully by one SIGTERM. Proxy-specific: no RabbitMQ run."""

from __future__ import annotations

import os
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from starlight_py.local import ServiceEndpoints
from starlight_py.local.ports import free_port
from starlight_py.local.proxy import ProxyProcess
from tests.support.allocator_checks import runs_on_jemalloc
from tests.support.amqp_fixtures import unique

WORKERS = 2


def metrics_port_pair() -> int:
    """A free port whose successor is free too (worker 1 listens on port + 1)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two adjacent free ports")


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def wait_for_metrics(port: int, timeout: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return scrape(port)
        except OSError:
            assert time.monotonic() < deadline, f"no metrics on port {port}"
            time.sleep(0.2)


def worker_pids(supervisor: int) -> set[int]:
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    return {int(pid) for pid in children}


@pytest.fixture
def workers(services: ServiceEndpoints, tmp_path: Path) -> Iterator[tuple[ProxyProcess, int]]:
    metrics = metrics_port_pair()
    process = ProxyProcess(
        "workers",
        tmp_path / "workers.log",
        {
            "configurationStoreServers": services.zookeeper,
            "brokerServiceURL": services.pulsar_service_url,
            "brokerWebServiceURL": services.pulsar_web_url,
            "amqpAutoCreateNamespaces": "true",
            "metricsListener": f"http://127.0.0.1:{metrics}",
        },
        workers=WORKERS,
    )
    process.start()
    yield process, metrics
    process.stop()


def test_workers_share_the_port_and_every_message_arrives(
    workers: tuple[ProxyProcess, int],
) -> None:
    process, metrics = workers
    for index in range(WORKERS):
        wait_for_metrics(metrics + index)
    assert process.pid is not None
    assert len(worker_pids(process.pid)) == WORKERS
    # Each worker restarted itself on jemalloc (starlight_py/allocator.py).
    assert all(runs_on_jemalloc(pid) for pid in worker_pids(process.pid))
    queue = unique("q", "workers")
    per_connection, connections = 50, 16
    opened = []
    try:
        for _ in range(connections):
            connection = pika.BlockingConnection(pika.URLParameters(process.url))
            opened.append(connection)
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare(queue, durable=True)
            for i in range(per_connection):
                channel.basic_publish("", queue, f"{len(opened)}-{i}".encode())
        # Every worker took some of the connections (the kernel spreads them by address).
        open_per_worker = [
            scrape(metrics + index)["starlight_connections"] for index in range(WORKERS)
        ]
        assert sum(open_per_worker) == connections
        assert all(count > 0 for count in open_per_worker), open_per_worker
        consumer = opened[0].channel()
        seen: set[bytes] = set()
        deadline = time.monotonic() + 60
        while len(seen) < per_connection * connections and time.monotonic() < deadline:
            method, _, body = consumer.basic_get(queue, auto_ack=True)
            if method is None:
                time.sleep(0.02)
            else:
                seen.add(body)
        assert len(seen) == per_connection * connections
        consumer.queue_delete(queue)
    finally:
        for connection in opened:
            if connection.is_open:
                connection.close()


def test_a_dead_worker_is_replaced_and_sigterm_stops_them_all(
    workers: tuple[ProxyProcess, int],
) -> None:
    process, metrics = workers
    assert process.pid is not None
    for index in range(WORKERS):
        wait_for_metrics(metrics + index)
    before = worker_pids(process.pid)
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        now = worker_pids(process.pid)
        if len(now) == WORKERS and victim not in now:
            break
        assert time.monotonic() < deadline, f"worker not replaced: {now}"
        time.sleep(0.2)
    for index in range(WORKERS):
        wait_for_metrics(metrics + index)
    connection = pika.BlockingConnection(pika.URLParameters(process.url))
    connection.close()
    process.send_signal(signal.SIGTERM)
    assert process.wait_exited(60) == 0
    for pid in now:
        assert (
            not Path(f"/proc/{pid}").exists()
            or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
        )
