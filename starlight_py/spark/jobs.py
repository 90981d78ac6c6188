"""The command lines of the Spark jobs (`spark/amqp_batch.py`, `spark/amqp_stream.py`).

Both read the proxy's configuration like `starlight-admin` does (`--config` file <
`STARLIGHT_*` environment < `--set KEY=VALUE`): ZooKeeper to resolve the exchange or queue,
and the Pulsar URLs for the connector. Run with plain `python3` they start a local Spark
(`--master`, default `local[*]`) and fetch the connector jar themselves; run under
`spark-submit` they use its master and the jar given there with `--jars` or `--packages`.

Exit codes: 0 done (or the stream was stopped); 1 the job failed (one line on stderr says
why); 2 the command line or the configuration is wrong.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from pyspark.sql import SparkSession
from pyspark.sql import functions as sql

from starlight_py.config import ConfigError, StarlightConfig, load_config
from starlight_py.local.errors import LocalInfraError
from starlight_py.metadata.zookeeper import MetadataUnavailable
from starlight_py.spark.connector import ensure_connector_jar
from starlight_py.spark.frames import build_session, connector_options, read_batch, read_stream
from starlight_py.spark.topics import SelectionError, TopicSelection, resolve_selection

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """Returns usage errors to `main` instead of exiting the process."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _key_value(text: str) -> tuple[str, str]:
    key, separator, value = text.partition("=")
    if not separator or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _timestamp(text: str) -> datetime.datetime:
    try:
        value = datetime.datetime.fromisoformat(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not an ISO-8601 time: {text!r}") from e
    return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)


def _common_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description=description)
    parser.add_argument("--config", type=Path, help="proxy conf file (conf/starlight.conf)")
    parser.add_argument(
        "--set",
        metavar="KEY=VALUE",
        type=_key_value,
        action="append",
        default=[],
        help="override one configuration key, e.g. --set configurationStoreServers=zk:2181",
    )
    parser.add_argument("--vhost", default="/", help="AMQP vhost (default: /)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--exchange", help="read every message published to this exchange")
    which.add_argument("--queue", help="read the messages routed to this queue")
    parser.add_argument("--output", required=True, help="Parquet folder (any Spark path)")
    parser.add_argument(
        "--starting-offsets",
        default="earliest",
        help="earliest (default), latest, or the connector's per-topic JSON",
    )
    parser.add_argument(
        "--option",
        metavar="KEY=VALUE",
        type=_key_value,
        action="append",
        default=[],
        help="extra pulsar-spark connector option, e.g. pulsar.client.authParams=...",
    )
    parser.add_argument(
        "--master", help="Spark master when not run by spark-submit (default: local[*])"
    )
    parser.add_argument(
        "--connector-jar",
        type=Path,
        help="the pulsar-spark connector jar (default: fetched into the cache; under "
        "spark-submit: whatever --jars/--packages gave)",
    )
    return parser


def batch_parser() -> argparse.ArgumentParser:
    parser = _common_parser(
        "amqp_batch",
        "Write the messages of an AMQP exchange or queue, read from Pulsar, as Parquet.",
    )
    parser.add_argument(
        "--ending-offsets", default="latest", help="latest (default) or per-topic JSON"
    )
    parser.add_argument("--since", type=_timestamp, help="only messages Pulsar got at or after")
    parser.add_argument("--until", type=_timestamp, help="only messages Pulsar got before")
    parser.add_argument(
        "--mode",
        choices=("error", "overwrite", "append", "ignore"),
        default="error",
        help="when --output exists: fail (default), replace it, add to it, or do nothing",
    )
    return parser


def stream_parser() -> argparse.ArgumentParser:
    parser = _common_parser(
        "amqp_stream",
        "Continuously append the messages of an AMQP exchange or queue to Parquet.",
    )
    parser.add_argument(
        "--checkpoint", required=True, help="checkpoint folder (where a restart resumes)"
    )
    parser.add_argument(
        "--trigger-seconds", type=float, default=10.0, help="micro-batch interval (default 10)"
    )
    parser.add_argument(
        "--run-seconds",
        type=float,
        help="stop after this long (default: run until SIGTERM or Ctrl-C)",
    )
    return parser


def _config(args: argparse.Namespace) -> StarlightConfig:
    return load_config(args.config, os.environ, dict(args.set))


def _connector_jar(args: argparse.Namespace) -> Path | None:
    if args.connector_jar is not None:
        return Path(args.connector_jar)
    # spark-submit starts the Python driver with this set; its --jars/--packages apply.
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        return None
    if SparkSession.getActiveSession() is not None:
        return None
    return ensure_connector_jar()


def _run(
    argv: Sequence[str] | None,
    parser: argparse.ArgumentParser,
    job: Callable[[argparse.Namespace, StarlightConfig, TopicSelection], int],
) -> int:
    try:
        args = parser.parse_args(argv)
        config = _config(args)
    except _UsageError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    except ConfigError as e:
        print(f"{parser.prog}: configuration: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"{parser.prog}: cannot read {args.config}: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE
    try:
        selection = resolve_selection(config, args.vhost, args.exchange, args.queue)
        return job(args, config, selection)
    except (SelectionError, MetadataUnavailable, LocalInfraError) as e:
        print(f"{parser.prog}: {e}", file=sys.stderr)
        return EXIT_FAILED


def batch_main(argv: Sequence[str] | None = None) -> int:
    """Write the selection's messages once as Parquet; print how many rows."""
    return _run(argv, batch_parser(), _batch)


def stream_main(argv: Sequence[str] | None = None) -> int:
    """Stream the selection's messages to Parquet until stopped."""
    return _run(argv, stream_parser(), _stream)


def _session(args: argparse.Namespace, app_name: str) -> tuple[SparkSession, bool]:
    existing = SparkSession.getActiveSession()
    jar = _connector_jar(args)
    master = args.master
    if master is None and existing is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = "local[*]"
    spark = build_session(app_name, master, jar)
    # Stop only a session this job started: a caller's (a test's, a notebook's) stays.
    return spark, existing is None


def _batch(args: argparse.Namespace, config: StarlightConfig, selection: TopicSelection) -> int:
    spark, owned = _session(args, f"amqp-batch {selection.description}")
    try:
        options = connector_options(
            selection, config.pulsar_service_url, config.pulsar_web_url, dict(args.option)
        )
        frame = read_batch(spark, selection, options, args.starting_offsets, args.ending_offsets)
        if args.since is not None:
            frame = frame.where(sql.col("publish_time") >= sql.lit(args.since))
        if args.until is not None:
            frame = frame.where(sql.col("publish_time") < sql.lit(args.until))
        frame.write.mode(args.mode).parquet(args.output)
        written = spark.read.parquet(args.output).count()
        print(f"{selection.description}: {written} rows in {args.output}", flush=True)
        return EXIT_OK
    finally:
        if owned:
            _close_connector_clients(spark)
            spark.stop()


def _stream(args: argparse.Namespace, config: StarlightConfig, selection: TopicSelection) -> int:
    spark, owned = _session(args, f"amqp-stream {selection.description}")
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, _setter(stop))
        for sig in (signal.SIGTERM, signal.SIGINT)
        if threading.current_thread() is threading.main_thread()
    }
    try:
        options = connector_options(
            selection, config.pulsar_service_url, config.pulsar_web_url, dict(args.option)
        )
        frame = read_stream(spark, selection, options, args.starting_offsets)
        query = (
            frame.writeStream.format("parquet")
            .option("path", args.output)
            .option("checkpointLocation", args.checkpoint)
            .trigger(processingTime=f"{int(args.trigger_seconds * 1000)} milliseconds")
            .queryName("amqp_stream")
            .start()
        )
        print(f"{selection.description}: streaming to {args.output} (query {query.id})", flush=True)
        deadline = None if args.run_seconds is None else time.monotonic() + args.run_seconds
        while not stop.is_set() and query.isActive:
            if deadline is not None and time.monotonic() >= deadline:
                break
            query.awaitTermination(1)
        failure = query.exception()
        query.stop()
        if failure is not None:
            print(f"amqp_stream: the query failed: {failure}", file=sys.stderr)
            return EXIT_FAILED
        print(f"{selection.description}: stopped", flush=True)
        return EXIT_OK
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if owned:
            _close_connector_clients(spark)
            spark.stop()


def _setter(event: threading.Event) -> Callable[[int, FrameType | None], None]:
    def handle(signum: int, frame: FrameType | None) -> None:
        event.set()

    return handle


def _close_connector_clients(spark: SparkSession) -> None:
    # The connector caches its Pulsar clients; their threads would keep a spark-submit JVM
    # alive after the job. Best effort: another connector build may lack this class.
    try:
        jvm: Any = spark.sparkContext._jvm
        # Through the context class loader: that is where spark-submit --jars puts the jar.
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        cache = loader.loadClass("org.apache.spark.sql.pulsar.CachedPulsarClient$")
        cache.getField("MODULE$").get(None).clear()
    except Exception as e:  # py4j reports a missing class or method as various errors
        print(f"note: could not close the connector's Pulsar clients: {e}", file=sys.stderr)
