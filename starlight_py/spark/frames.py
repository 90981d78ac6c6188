"""The Spark side: a session with the connector, readers for a `TopicSelection`, and the
AMQP DataFrame (one column per AMQP property, plus where Pulsar stored the message).

Schema of `amqp_frame` (docs/spark.md explains each column):

    exchange, routing_key, content_type, content_encoding        string
    headers                                                      map<string, string>
    headers_json                                                 string (typed JSON)
    delivery_mode, priority                                      int
    correlation_id, reply_to, expiration, message_id             string
    timestamp                                                    timestamp (UTC)
    type, user_id, app_id, cluster_id                            string
    body                                                         binary
    topic                                                        string
    publish_time                                                 timestamp (Pulsar's)
    pulsar_message_id                                            binary (serialized MessageId)
    pulsar_position                                              string ledger:entry:batch:partition
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as sql
from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from starlight_py.spark import rows
from starlight_py.spark.topics import TopicSelection

_AMQP_TYPES: dict[str, DataType] = {
    "headers": MapType(StringType(), StringType()),
    "delivery_mode": IntegerType(),
    "priority": IntegerType(),
    "timestamp": TimestampType(),
    "body": BinaryType(),
}
AMQP_STRUCT = StructType(
    [StructField(name, _AMQP_TYPES.get(name, StringType())) for name in rows.AMQP_COLUMNS]
)
"""What the decoding UDF returns: `rows.AMQP_COLUMNS` with their Spark types."""

OUTPUT_COLUMNS = (
    *(name for name in rows.AMQP_COLUMNS if name != "pulsar_position"),
    "topic",
    "publish_time",
    "pulsar_message_id",
    "pulsar_position",
)
"""The columns of `amqp_frame`, in order."""


def build_session(
    app_name: str,
    master: str | None = None,
    connector_jar: Path | None = None,
    settings: Mapping[str, str] | None = None,
) -> SparkSession:
    """A session (or the active one) with the connector on its classpath.

    `connector_jar` None: the jar is already there (spark-submit --jars or --packages).
    Timestamps are shown in UTC, like AMQP's. Raises what Spark raises when it cannot start.
    """
    builder: Any = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            # Everything is on this machine: no need to guess a routable address (Spark
            # otherwise picks the first interface's when the hostname is loopback).
            builder = builder.config("spark.driver.host", "127.0.0.1").config(
                "spark.driver.bindAddress", "127.0.0.1"
            )
    if connector_jar is not None:
        builder = builder.config("spark.jars", str(connector_jar))
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    for key, value in (settings or {}).items():
        builder = builder.config(key, value)
    session: SparkSession = builder.getOrCreate()
    return session


def connector_options(
    selection: TopicSelection,
    service_url: str,
    admin_url: str,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Reader options: where Pulsar is, which topics, then `extra` (which wins)."""
    options = {"service.url": service_url, "admin.url": admin_url}
    options.update(selection.connector_options())
    options.update(extra or {})
    return options


def read_batch(
    spark: SparkSession,
    selection: TopicSelection,
    options: Mapping[str, str],
    starting_offsets: str = "earliest",
    ending_offsets: str = "latest",
) -> DataFrame:
    """The selection's messages between two offsets (`earliest`, `latest`, or the
    connector's per-topic JSON), as an AMQP frame."""
    raw = (
        spark.read.format("pulsar")
        .options(**options)
        .option("startingOffsets", starting_offsets)
        .option("endingOffsets", ending_offsets)
        .load()
    )
    return amqp_frame(raw, selection)


def read_stream(
    spark: SparkSession,
    selection: TopicSelection,
    options: Mapping[str, str],
    starting_offsets: str = "earliest",
) -> DataFrame:
    """A streaming AMQP frame of the selection's messages, from `starting_offsets` on (a
    checkpoint, when the query has one, wins over it)."""
    raw = (
        spark.readStream.format("pulsar")
        .options(**options)
        .option("startingOffsets", starting_offsets)
        .load()
    )
    return amqp_frame(raw, selection)


def amqp_frame(raw: DataFrame, selection: TopicSelection) -> DataFrame:
    """The connector's frame (`value`, `__topic`, `__messageProperties`, ...) decoded into
    `OUTPUT_COLUMNS`; for a queue, only the messages its bindings routed."""
    routes = rows.QueueRoutes(selection.binding_sets) if selection.is_queue else None

    def decode(
        topic: str, properties: dict[str, str] | None, body: bytes | None, message_id: bytes | None
    ) -> rows.AmqpRow | None:
        return rows.amqp_row(topic, properties, body, message_id, routes)

    # Non-deterministic only so that the optimizer never inlines the call once per column.
    decode_udf = sql.udf(decode, AMQP_STRUCT).asNondeterministic()
    amqp: Column = decode_udf(
        sql.col("__topic"), sql.col("__messageProperties"), sql.col("value"), sql.col("__messageId")
    )
    decoded = raw.select(
        amqp.alias("amqp"),
        sql.col("__topic").alias("topic"),
        sql.col("__publishTime").alias("publish_time"),
        sql.col("__messageId").alias("pulsar_message_id"),
    ).where(sql.col("amqp").isNotNull())
    return decoded.select(
        *(
            sql.col(f"amqp.{name}").alias(name)
            for name in OUTPUT_COLUMNS
            if name in AMQP_STRUCT.names
        ),
        "topic",
        "publish_time",
        "pulsar_message_id",
    ).select(*OUTPUT_COLUMNS)
