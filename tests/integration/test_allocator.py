"""Proxy processes on jemalloc (starlight_py/allocator.py): `serve` restarts itself with
the library `pip install` built preloaded, says so in its log, and loses nothing on it;
`STARLIGHT_ALLOCATOR=system` keeps glibc's malloc. (`standalone` and `--workers`: their
own test files.) Proxy-specific: no RabbitMQ run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from starlight_py.local import ServiceEndpoints
from starlight_py.local.proxy import ProxyProcess
from tests.support.allocator_checks import runs_on_jemalloc
from tests.support.amqp_fixtures import unique

MESSAGES = 1000
BODY = b"j" * 1100  # just over glibc's thread-cache sizes, like the bench's 1 KiB


@pytest.fixture
def proxy_process(
    services: ServiceEndpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ProxyProcess]:
    monkeypatch.delenv("STARLIGHT_ALLOCATOR", raising=False)
    process = ProxyProcess(
        "allocator",
        tmp_path / "allocator.log",
        {
            "configurationStoreServers": services.zookeeper,
            "brokerServiceURL": services.pulsar_service_url,
            "brokerWebServiceURL": services.pulsar_web_url,
            "amqpAutoCreateNamespaces": "true",
            "pulsarProducerBatching": "true",
        },
    )
    yield process
    process.stop()


def test_a_proxy_process_runs_on_jemalloc_and_loses_nothing(proxy_process: ProxyProcess) -> None:
    proxy_process.start()
    assert proxy_process.pid is not None
    assert runs_on_jemalloc(proxy_process.pid)
    log = proxy_process.log_path.read_text()
    assert "memory allocator: jemalloc" in log
    # and calls pulsar-client through its C API (backend/producer_send.py, consumer_ack.py,
    # producer_flush.py), whose threads hand over to trio through the bridge's eventfd
    assert (
        "pulsar-client calls: sends, flushes and acknowledgements through its C API, "
        "flush outcomes taken by a trio task" in log
    )
    assert "consumers: listened through the C API, taken by a trio task" in log
    assert "LD_PRELOAD" not in log and "cannot be preloaded" not in log

    # Fanouts with pre-acks and flushes, on each allocator: test_producer_flush.py.
    queue = unique("q", "jemalloc")
    connection = pika.BlockingConnection(pika.URLParameters(proxy_process.url))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    for number in range(MESSAGES):
        channel.basic_publish("", queue, b"%05d " % number + BODY)
    channel.basic_qos(prefetch_count=200)
    received = set()
    for method, _, body in channel.consume(queue, inactivity_timeout=30):
        if method is None:
            break
        assert body[len(b"00000 ") :] == BODY
        received.add(int(body[:5]))
        channel.basic_ack(method.delivery_tag)
        if len(received) == MESSAGES:
            break
    connection.close()
    assert received == set(range(MESSAGES))


def test_system_keeps_glibc_malloc(
    proxy_process: ProxyProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STARLIGHT_ALLOCATOR", "system")
    proxy_process.start()
    assert proxy_process.pid is not None
    assert not runs_on_jemalloc(proxy_process.pid)
    [line] = [x for x in proxy_process.log_path.read_text().splitlines() if "memory allocator" in x]
    assert " INFO " in line
    assert line.endswith("memory allocator: glibc malloc (STARLIGHT_ALLOCATOR=system)")
