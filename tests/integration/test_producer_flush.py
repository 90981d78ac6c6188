"""Producers are flushed without the GIL (starlight_py/backend/producer_flush.py): the
binding's own flush_async waits for the producer's lock with the GIL held, while
pulsar-client's batch timer holds that lock and waits for the GIL, and the whole proxy
stopped. The deadlock is checked with sends and flushes back to back in a process of its
own, and end to end with the scenario that stopped a proxy: pre-acknowledged messages
(Python callbacks in open batches) and flushes, counted."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pulsar
import pytest

from starlight_py.backend.producer_flush import ProducerFlusher, result_text
from starlight_py.local import ServiceEndpoints
from starlight_py.local.proxy import ProxyProcess
from tests.support.allocator_checks import runs_on_jemalloc
from tests.support.amqp_fixtures import unique

ROUNDS = 20_000
STRESS_TIMEOUT = 90  # s; the rounds take about 2 s, their outcomes a few more
SOURCE_ROOT = Path(__file__).resolve().parents[2]


def test_sends_with_callbacks_and_flushes_back_to_back_do_not_deadlock(
    services: ServiceEndpoints,
) -> None:
    topic = f"persistent://public/default/{unique('flush-stress', 'topic')}"
    command = [sys.executable, "-m", "tests.support.flush_stress"]
    try:
        run = subprocess.run(
            [*command, services.pulsar_service_url, topic, str(ROUNDS)],
            check=False,
            cwd=SOURCE_ROOT,
            capture_output=True,
            text=True,
            timeout=STRESS_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the producer deadlocked: no end after {STRESS_TIMEOUT} s")
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"sent {ROUNDS} rounds" in run.stdout
    assert f"outcomes {2 * ROUNDS} ok {2 * ROUNDS} of {2 * ROUNDS}" in run.stdout


def test_a_flush_reports_when_what_was_sent_is_stored_and_fails_on_a_closed_producer(
    services: ServiceEndpoints,
) -> None:
    client = pulsar.Client(services.pulsar_service_url)
    try:
        topic = f"persistent://public/default/{unique('flush', 'topic')}"
        producer = client.create_producer(
            topic, batching_enabled=True, batching_max_publish_delay_ms=10_000
        )
        flusher = ProducerFlusher(producer._producer)
        for number in range(5):
            producer.send_async(b"%d" % number, None)
        results: list[int] = []
        done = threading.Event()

        def flushed(result: int) -> None:
            results.append(result)
            done.set()

        flusher.flush(flushed)  # the batch delay is 10 s: only the flush sends them now
        assert done.wait(5)
        assert results == [0]
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert [reader.read_next(5000).data() for _ in range(5)] == [b"0", b"1", b"2", b"3", b"4"]
        reader.close()

        producer.close()
        done.clear()
        flusher.flush(flushed)
        assert done.wait(5)
        assert results[1] != 0
        assert result_text(results[1]) == "Result.AlreadyClosed"
    finally:
        client.close()


MESSAGES = 3000
BODY = b"f" * 1100


@pytest.fixture(params=["jemalloc", "system"])
def batching_process(
    request: pytest.FixtureRequest,
    services: ServiceEndpoints,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[ProxyProcess]:
    """A `serve` process with batching, on each allocator (starlight_py/allocator.py): the
    hang was first seen on jemalloc, then reproduced on glibc's malloc."""
    monkeypatch.setenv("STARLIGHT_ALLOCATOR", request.param)
    process = ProxyProcess(
        "flush",
        tmp_path / "flush.log",
        {
            "configurationStoreServers": services.zookeeper,
            "brokerServiceURL": services.pulsar_service_url,
            "brokerWebServiceURL": services.pulsar_web_url,
            "amqpAutoCreateNamespaces": "true",
            "pulsarProducerBatching": "true",
        },
    )
    process.start()
    assert process.pid is not None
    assert runs_on_jemalloc(process.pid) == (request.param == "jemalloc")
    yield process
    process.stop()


def test_a_fanout_published_right_after_it_is_declared_loses_nothing_with_batching(
    batching_process: ProxyProcess,
) -> None:
    """Published within 2 s of a topology change, every message to a fanout exchange is
    sent with a callback (pre-acks), next to flushes: the mix that stopped the proxy."""
    url = batching_process.url + "?heartbeat=20"
    queues = [unique("q", "flush-a"), unique("q", "flush-b")]
    exchange = unique("x", "flush")
    received: dict[str, set[int]] = {queue: set() for queue in queues}
    errors: list[str] = []
    setup = pika.BlockingConnection(pika.URLParameters(url))
    channel = setup.channel()
    channel.exchange_declare(exchange, "fanout")
    for queue in queues:
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, exchange)
    setup.close()

    def consume(queue: str) -> None:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(url))
            channel = connection.channel()
            channel.basic_qos(prefetch_count=200)
            for method, _, body in channel.consume(queue, inactivity_timeout=30):
                if method is None:
                    break
                received[queue].add(int(body[:5]))
                channel.basic_ack(method.delivery_tag)
                if len(received[queue]) == MESSAGES:
                    break
            connection.close()
        except Exception as e:  # reported below, with the counts
            errors.append(f"{queue}: {e!r}")

    consumers = [threading.Thread(target=consume, args=(queue,)) for queue in queues]
    for consumer in consumers:
        consumer.start()
    started = time.monotonic()
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    for number in range(MESSAGES):
        channel.basic_publish(exchange, "", b"%05d " % number + BODY)
    connection.close()
    for consumer in consumers:
        consumer.join(120)
    counts = {queue: len(numbers) for queue, numbers in received.items()}
    assert not errors, (errors, counts)
    assert all(received[queue] == set(range(MESSAGES)) for queue in queues), counts
    assert time.monotonic() - started < 120  # not a timing: a stopped proxy never gets here
