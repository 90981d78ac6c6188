"""The Spark jobs (spark/, docs/spark.md) read what AMQP clients published through the proxy:
a local Spark with StreamNative's pulsar-spark connector against the session's Pulsar."""

from __future__ import annotations

import decimal
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as sql

from starlight_py.backend.message_ids import position_from_bytes
from starlight_py.local import ServiceEndpoints
from starlight_py.spark.connector import ensure_connector_jar
from starlight_py.spark.frames import OUTPUT_COLUMNS, build_session
from starlight_py.spark.jobs import batch_main
from tests.support.proxy_runner import ProxyThread

ROOT = Path(__file__).resolve().parents[2]
ROUTING_KEYS = ("orders.eu.created", "orders.us.created", "orders.eu.cancelled")
N = 12


@pytest.fixture(scope="module")
def connector_jar() -> Path:
    return ensure_connector_jar()


@pytest.fixture(scope="module")
def spark(connector_jar: Path) -> Iterator[SparkSession]:
    # Executors' Python workers must import starlight_py: the interpreter running the tests.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = build_session(
        "starlight-spark-tests",
        "local[2]",
        connector_jar,
        {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
    )
    yield session
    session.stop()


def job_settings(services: ServiceEndpoints) -> list[str]:
    """The jobs read the proxy's configuration; these are the keys they need."""
    return [
        "--set",
        f"configurationStoreServers={services.zookeeper}",
        "--set",
        f"brokerServiceURL={services.pulsar_service_url}",
        "--set",
        f"brokerWebServiceURL={services.pulsar_web_url}",
    ]


def open_channel(proxy: ProxyThread) -> tuple[BlockingConnection, BlockingChannel]:
    connection = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))
    channel = connection.channel()
    channel.confirm_delivery()  # publish returns once Pulsar has the message
    return connection, channel


def message_properties(i: int) -> pika.BasicProperties:
    """Every basic property, varied per message, and headers of several field types."""
    return pika.BasicProperties(
        content_type=("application/json", "text/plain")[i % 2],
        content_encoding=("utf-8", "gzip", None)[i % 3],
        headers={
            "n": i,
            "s": f"text-{i}",
            "flag": i % 2 == 0,
            "price": decimal.Decimal("1.25"),
            "nested": {"a": i},
            "list": [1, "two"],
        },
        delivery_mode=1 + i % 2,
        priority=i % 10,
        correlation_id=f"corr-{i}",
        reply_to=f"reply-{i}" if i % 3 else None,
        expiration="600000",
        message_id=f"msg-{i}",
        timestamp=1_700_000_000 + i,
        type=f"type-{i % 4}",
        user_id="guest",  # RabbitMQ (and the proxy) refuse a user-id other than the login
        app_id="spark-test",
    )


def expected_row(exchange: str, i: int) -> dict[str, Any]:
    return {
        "exchange": exchange,
        "routing_key": ROUTING_KEYS[i % 3],
        "content_type": ("application/json", "text/plain")[i % 2],
        "content_encoding": ("utf-8", "gzip", None)[i % 3],
        "headers": {
            "n": str(i),
            "s": f"text-{i}",
            "flag": "true" if i % 2 == 0 else "false",
            "price": "1.25",
            "nested": repr({"a": i}),
            "list": repr([1, "two"]),
        },
        "headers_json": {
            "n": i,
            "s": f"text-{i}",
            "flag": i % 2 == 0,
            "price": {"$decimal": "1.25"},
            "nested": {"a": i},
            "list": [1, "two"],
        },
        "delivery_mode": 1 + i % 2,
        "priority": i % 10,
        "correlation_id": f"corr-{i}",
        "reply_to": f"reply-{i}" if i % 3 else None,
        "expiration": "600000",
        "message_id": f"msg-{i}",
        "epoch": 1_700_000_000 + i,
        "type": f"type-{i % 4}",
        "user_id": "guest",
        "app_id": "spark-test",
        "cluster_id": None,
        "body": json.dumps({"order": i}).encode(),
    }


def actual_row(row: Row) -> dict[str, Any]:
    values = row.asDict()
    values["headers_json"] = json.loads(values["headers_json"])
    values["body"] = bytes(values["body"])
    # Compared as epoch seconds (`epoch`, `publish_epoch`): pyspark turns timestamps into
    # naive datetimes in the local time zone of the process.
    values.pop("timestamp")
    values.pop("publish_time")
    return values


def read_output(spark: SparkSession, path: Path) -> list[Row]:
    frame = spark.read.parquet(str(path))
    assert tuple(frame.columns) == OUTPUT_COLUMNS
    return (
        frame.withColumn("epoch", sql.col("timestamp").cast("long"))
        .withColumn("publish_epoch", sql.col("publish_time").cast("double"))
        .collect()
    )


def test_batch_job_writes_every_amqp_property(
    proxy: ProxyThread,
    services: ServiceEndpoints,
    spark: SparkSession,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    exchange = f"spark-orders-{uuid.uuid4().hex[:8]}"
    eu_queue = f"spark-eu-{uuid.uuid4().hex[:8]}"
    connection, channel = open_channel(proxy)
    channel.exchange_declare(exchange, "topic")
    # A message no binding routes is not stored (RabbitMQ drops it): bind everything once.
    all_queue = f"spark-all-{uuid.uuid4().hex[:8]}"
    channel.queue_declare(all_queue, exclusive=True)
    channel.queue_bind(all_queue, exchange, "#")
    channel.queue_declare(eu_queue, exclusive=True)
    channel.queue_bind(eu_queue, exchange, "*.eu.*")
    started = time.time()
    for i in range(N):
        channel.basic_publish(
            exchange, ROUTING_KEYS[i % 3], json.dumps({"order": i}).encode(), message_properties(i)
        )
    finished = time.time()

    output = tmp_path / "orders.parquet"
    code = batch_main([*job_settings(services), "--exchange", exchange, "--output", str(output)])
    assert code == 0
    assert f"{N} rows in {output}" in capsys.readouterr().out
    rows = read_output(spark, output)
    assert len(rows) == N
    by_id = {row.message_id: row for row in rows}
    assert sorted(by_id) == sorted(f"msg-{i}" for i in range(N))
    positions = set()
    for i in range(N):
        row = by_id[f"msg-{i}"]
        values = actual_row(row)
        # The first copy of each message: on the binding topic of the queue first by name.
        assert values.pop("topic").startswith(
            f"persistent://public/default/{exchange}~~{all_queue}~~"
        )
        # Pulsar's clock and ours are the same machine's; allow for millisecond rounding.
        assert started - 1 <= values.pop("publish_epoch") <= finished + 1
        message_id = bytes(values.pop("pulsar_message_id"))
        position = values.pop("pulsar_position")
        assert position == str(position_from_bytes(message_id))
        assert re.fullmatch(r"\d+:\d+:-?\d+:-1", position)
        positions.add(position)
        assert values == expected_row(exchange, i)
    assert len(positions) == N

    # The queue's view: only the messages its binding (`*.eu.*`) routed.
    queue_output = tmp_path / "eu.parquet"
    code = batch_main([*job_settings(services), "--queue", eu_queue, "--output", str(queue_output)])
    assert code == 0
    queue_rows = read_output(spark, queue_output)
    expected_ids = sorted(f"msg-{i}" for i in range(N) if ".eu." in ROUTING_KEYS[i % 3])
    assert sorted(r.message_id for r in queue_rows) == expected_ids
    assert {r.routing_key for r in queue_rows} == {"orders.eu.created", "orders.eu.cancelled"}
    connection.close()


def test_batch_job_reads_every_topic_of_a_direct_exchange(
    proxy: ProxyThread, services: ServiceEndpoints, spark: SparkSession, tmp_path: Path
) -> None:
    # A direct exchange has one topic per routing key; a queue reads only its keys' topics.
    exchange = f"spark-direct-{uuid.uuid4().hex[:8]}"
    queue = f"spark-ab-{uuid.uuid4().hex[:8]}"
    other = f"spark-c-{uuid.uuid4().hex[:8]}"
    connection, channel = open_channel(proxy)
    channel.exchange_declare(exchange, "direct")
    channel.queue_declare(queue, exclusive=True)
    channel.queue_declare(other, exclusive=True)
    for key, target in (("a key", queue), ("b/key", queue), ("c", other)):
        channel.queue_bind(target, exchange, key)
    published = [("a key", 0), ("b/key", 1), ("c", 2), ("a key", 3), ("c", 4)]
    for key, i in published:
        channel.basic_publish(
            exchange, key, f"m{i}".encode(), pika.BasicProperties(message_id=f"m{i}")
        )

    output = tmp_path / "direct.parquet"
    assert (
        batch_main([*job_settings(services), "--exchange", exchange, "--output", str(output)]) == 0
    )
    rows = read_output(spark, output)
    assert sorted((r.routing_key, r.message_id, bytes(r.body)) for r in rows) == sorted(
        (key, f"m{i}", f"m{i}".encode()) for key, i in published
    )
    assert {r.exchange for r in rows} == {exchange}
    # Topic names escape the key (docs/mapping.md): `a key` -> `a~20key`, `b/key` -> `b~2Fkey`.
    assert {r.topic for r in rows} == {
        f"persistent://public/default/{exchange}~~{suffix}"
        for suffix in ("a~20key", "b~2Fkey", "c")
    }

    queue_output = tmp_path / "queue.parquet"
    assert (
        batch_main([*job_settings(services), "--queue", queue, "--output", str(queue_output)]) == 0
    )
    assert sorted(r.message_id for r in read_output(spark, queue_output)) == ["m0", "m1", "m3"]
    connection.close()


def test_batch_job_reads_a_stream_queue(
    proxy: ProxyThread, services: ServiceEndpoints, spark: SparkSession, tmp_path: Path
) -> None:
    # A stream is stored like a queue (docs/mapping.md#stream-queues): the job reads its
    # topics, and what stream consumers read and acknowledged is still there.
    stream = f"spark-stream-{uuid.uuid4().hex[:8]}"
    exchange = f"spark-fanout-{uuid.uuid4().hex[:8]}"
    connection, channel = open_channel(proxy)
    channel.exchange_declare(exchange, "fanout")
    channel.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    channel.queue_bind(stream, exchange)
    for i in range(3):
        channel.basic_publish(
            "", stream, f"s{i}".encode(), pika.BasicProperties(message_id=f"s{i}")
        )
    channel.basic_publish(exchange, "k", b"x", pika.BasicProperties(message_id="x"))
    reader = connection.channel()
    reader.basic_qos(prefetch_count=10)
    seen: list[bytes] = []

    def on_message(ch: BlockingChannel, method: Any, props: Any, body: bytes) -> None:
        seen.append(body)
        ch.basic_ack(method.delivery_tag)

    reader.basic_consume(stream, on_message, arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 10
    while len(seen) < 4 and time.monotonic() < deadline:
        connection.process_data_events(0.1)
    assert sorted(seen) == [b"s0", b"s1", b"s2", b"x"]

    output = tmp_path / "stream.parquet"
    assert batch_main([*job_settings(services), "--queue", stream, "--output", str(output)]) == 0
    assert sorted(r.message_id for r in read_output(spark, output)) == ["s0", "s1", "s2", "x"]
    channel.queue_delete(stream)
    connection.close()


def test_batch_job_reports_an_unknown_exchange(
    proxy: ProxyThread,
    services: ServiceEndpoints,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    open_channel(proxy)[0].close()  # the first connection records vhost `/`
    output = tmp_path / "none.parquet"
    code = batch_main([*job_settings(services), "--exchange", "no-such-x", "--output", str(output)])
    assert code == 1
    assert "no exchange 'no-such-x' in vhost '/'" in capsys.readouterr().err
    assert not output.exists()


def wait_for_line(process: subprocess.Popen[str], needle: str, timeout: float) -> list[str]:
    """Lines of the job's stdout up to the one containing `needle`."""
    assert process.stdout is not None
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if needle in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(timeout):
        process.kill()
        raise AssertionError(f"no {needle!r} from the job in {timeout}s; stdout: {lines}")
    return lines


def poll_rows(spark: SparkSession, path: Path, count: int, timeout: float) -> list[Row]:
    """The stream's output once it holds `count` rows (it only grows)."""
    deadline = time.monotonic() + timeout
    rows: list[Row] = []
    while time.monotonic() < deadline:
        # The sink's log names the files of each committed batch; before the first commit
        # there is nothing to read.
        if any((path / "_spark_metadata").glob("[0-9]*")):
            rows = read_output(spark, path)
            if len(rows) >= count:
                return rows
        time.sleep(1)
    raise AssertionError(f"{len(rows)} of {count} rows after {timeout}s: {rows}")


def test_streaming_job_appends_new_messages(
    proxy: ProxyThread,
    services: ServiceEndpoints,
    spark: SparkSession,
    connector_jar: Path,
    tmp_path: Path,
) -> None:
    exchange = f"spark-stream-{uuid.uuid4().hex[:8]}"
    queue = f"spark-sq-{uuid.uuid4().hex[:8]}"
    connection, channel = open_channel(proxy)
    channel.exchange_declare(exchange, "direct")
    channel.queue_declare(queue, exclusive=True)
    channel.queue_bind(queue, exchange, "early")
    for i in range(2):  # before the job starts: read from the earliest offset
        channel.basic_publish(exchange, "early", b"", pika.BasicProperties(message_id=f"e{i}"))

    output, checkpoint = tmp_path / "stream", tmp_path / "checkpoint"
    command = [
        sys.executable,
        str(ROOT / "spark" / "amqp_stream.py"),
        *job_settings(services),
        "--exchange",
        exchange,
        "--output",
        str(output),
        "--checkpoint",
        str(checkpoint),
        "--trigger-seconds",
        "1",
        "--master",
        "local[1]",
        "--connector-jar",
        str(connector_jar),
        "--option",
        "pulsar.client.operationTimeoutMs=30000",
    ]
    log = tmp_path / "amqp_stream.log"
    with log.open("w") as stderr:  # the job keeps its own copy of the descriptor
        job = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )
    try:
        wait_for_line(job, "streaming to", timeout=180)
        rows = poll_rows(spark, output, 2, timeout=120)
        assert sorted(r.message_id for r in rows) == ["e0", "e1"]

        # While it runs: more messages, one of them on a routing key (so a topic) that did
        # not exist when the job started.
        channel.queue_bind(queue, exchange, "late")
        for i in range(3):
            key = ("early", "late")[i % 2]
            channel.basic_publish(
                exchange, key, f"n{i}".encode(), pika.BasicProperties(message_id=f"n{i}")
            )
        rows = poll_rows(spark, output, 5, timeout=120)
        assert sorted((r.message_id, r.routing_key) for r in rows) == [
            ("e0", "early"),
            ("e1", "early"),
            ("n0", "early"),
            ("n1", "late"),
            ("n2", "early"),
        ]
        assert {bytes(r.body) for r in rows if r.message_id.startswith("n")} == {
            b"n0",
            b"n1",
            b"n2",
        }
        job.terminate()  # SIGTERM: the job stops its query and exits 0
        assert job.wait(timeout=60) == 0
    except AssertionError as e:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        stderr_tail = "\n".join(tail)
        raise AssertionError(f"{e}\n--- the job's stderr, last lines ---\n{stderr_tail}") from e
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        connection.close()
