"""Delayed messages at scale: ``python -m starlight_py.bench.delayed``.

Publishes N messages (default 100,000) to an x-delayed-message exchange, each with a random
``x-delay`` between ``--min-delay`` and ``--max-delay`` seconds (default 0 and 60), consumes
them from a queue bound to it in another process, and prints how late each arrived after its
due time (publish time + delay) as percentiles, how many came early (must be 0) and how many
never came or came twice. While it runs it prints, every ``--sample-every`` seconds, how many
have arrived and what the Pulsar broker holds in memory (heap, old generation, its delayed
index; bench/broker_memory.py), and at the end the largest of each. A script that prints
figures, not a test.

Without ``--url`` it starts ZooKeeper, Pulsar standalone (with the delayed-delivery settings
of ``starlight_py.local``, ``--pulsar-set`` over them) and one proxy in a temporary folder,
like ``starlight_py.bench``; STARLIGHT_PULSAR_URL & co. point it at servers you already run.
With ``--url``, ``--pulsar-web-url`` says where the broker's metrics are.

Message body: ``>qII`` = publish time (``time.time_ns()`` just before the publish call:
Pulsar's broker compares the due time with its wall clock), sequence number, delay in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import multiprocessing.synchronize
import random
import shutil
import struct
import sys
import tempfile
import time
import uuid
from array import array
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

import aio_pika

from starlight_py.bench.broker_memory import BrokerMemory, BrokerMemorySampler
from starlight_py.bench.infra import (
    BenchError,
    add_pulsar_set,
    pulsar_settings,
    say,
    start_proxy,
    start_pulsar,
)

BODY = struct.Struct(">qII")
# Publishes awaiting their confirm at once: enough to keep the proxy busy.
PIPELINE = 500
# How long after the last message is due the consumer keeps waiting for stragglers.
GRACE_SECONDS = 30.0
COLUMNS = 5


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m starlight_py.bench.delayed", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--messages", type=int, default=100_000, help="default: 100000")
    parser.add_argument(
        "--min-delay", type=float, default=0.0, help="smallest x-delay in seconds (default: 0)"
    )
    parser.add_argument(
        "--max-delay", type=float, default=60.0, help="largest x-delay in seconds (default: 60)"
    )
    parser.add_argument("--url", help="an AMQP URL of a running proxy (nothing is started)")
    parser.add_argument(
        "--pulsar-web-url", help="with --url: the broker's web service, for its memory figures"
    )
    add_pulsar_set(parser)
    parser.add_argument(
        "--sample-every",
        type=float,
        default=30.0,
        help="seconds between progress lines and broker memory samples (default: 30)",
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed of the delays")
    parser.add_argument("--keep", action="store_true", help="keep the servers' data and logs")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 when every message came once and none early, 1 otherwise."""
    args = build_parser().parse_args(argv)
    if args.messages <= 0 or not 0 <= args.min_delay <= args.max_delay or args.sample_every <= 0:
        print(
            "--messages and --sample-every must be positive, 0 <= --min-delay <= --max-delay",
            file=sys.stderr,
        )
        return 2
    with ExitStack() as stack:
        url, web_url = args.url, args.pulsar_web_url
        if url is None:
            try:
                url, web_url = _private_servers(stack, args.keep, pulsar_settings(args.pulsar_set))
            except BenchError as e:
                say(f"cannot run: {e}")
                return 1
        plan = Plan(args.messages, args.min_delay, args.max_delay, args.seed, args.sample_every)
        return _run(url, web_url, plan)


@dataclass(frozen=True)
class Plan:
    """What to publish, and how often to report."""

    total: int
    min_delay: float
    max_delay: float
    seed: int
    sample_every: float


def _private_servers(stack: ExitStack, keep: bool, settings: dict[str, str]) -> tuple[str, str]:
    """ZooKeeper, Pulsar standalone and one proxy in a new temporary folder: the proxy's
    amqp:// URL and the broker's web URL. Raises BenchError."""
    work_dir = Path(tempfile.mkdtemp(prefix="starlight-delayed-"))
    if keep:
        say(f"servers and logs stay in {work_dir}")
    else:
        stack.callback(shutil.rmtree, work_dir, True)
    endpoints = start_pulsar(stack, work_dir, pulsar_settings=settings)
    return start_proxy(stack, work_dir, endpoints)[1], endpoints.web_url


def _run(url: str, web_url: str | None, plan: Plan) -> int:
    total, max_delay = plan.total, plan.max_delay
    suffix = uuid.uuid4().hex[:8]
    exchange, queue = f"bench-delayed-{suffix}", f"bench-delayed-{suffix}"
    asyncio.run(_declare(url, exchange, queue))
    out_dir = Path(tempfile.mkdtemp(prefix="starlight-delayed-out-"))
    results = out_dir / "arrivals"
    context = multiprocessing.get_context("spawn")
    consuming, published_all = context.Event(), context.Event()
    arrived = context.Value("q", 0)
    consumer = context.Process(
        target=_consumer_main,
        args=(url, queue, total, max_delay, str(results), consuming, published_all, arrived),
        name="delayed-consumer",
    )
    consumer.start()
    started = time.monotonic()

    def progress(elapsed: float, memory: BrokerMemory) -> None:
        say(
            f"{elapsed:6.0f} s: {arrived.value:,} of {total:,} arrived; broker: {memory.describe()}"
        )

    sampler = BrokerMemorySampler(web_url, plan.sample_every, progress) if web_url else None
    try:
        if not consuming.wait(60):
            say("the consumer did not start within 60 s")
            return 1
        with sampler or nullcontext():
            confirmed = asyncio.run(_publish(url, exchange, plan))
            elapsed = time.monotonic() - started
            say(f"published {total} messages ({confirmed} confirmed) in {elapsed:.1f} s")
            published_all.set()
            consumer.join()
    finally:
        if consumer.is_alive():
            consumer.terminate()
    if sampler is not None:
        say(f"broker, largest of {sampler.peaks.samples} samples: {sampler.peaks.describe()}")
    try:
        _report(results, total, confirmed)
        ok = _ok(results, total)
    finally:
        shutil.rmtree(out_dir, True)
    asyncio.run(_clean_up(url, exchange, queue))
    return 0 if ok else 1


async def _declare(url: str, exchange: str, queue: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        x = await channel.declare_exchange(
            exchange,
            "x-delayed-message",
            durable=True,
            arguments={"x-delayed-type": "direct"},
        )
        q = await channel.declare_queue(queue, durable=True)
        await q.bind(x, "due")


async def _clean_up(url: str, exchange: str, queue: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(queue)
        await channel.exchange_delete(exchange)


async def _publish(url: str, exchange_name: str, plan: Plan) -> int:
    rng = random.Random(plan.seed)
    low, high = int(plan.min_delay * 1000), int(plan.max_delay * 1000)
    connection = await aio_pika.connect(url)
    confirmed = 0
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(exchange_name, ensure=False)
        pending: set[asyncio.Future[Any]] = set()
        for seq in range(plan.total):
            delay_ms = rng.randint(low, high)
            body = BODY.pack(time.time_ns(), seq, delay_ms)
            message = aio_pika.Message(body, headers={"x-delay": delay_ms})
            pending.add(asyncio.ensure_future(exchange.publish(message, "due")))
            if len(pending) >= PIPELINE:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                confirmed += sum(1 for f in done if f.exception() is None)
        if pending:
            done, _ = await asyncio.wait(pending)
            confirmed += sum(1 for f in done if f.exception() is None)
    return confirmed


def _consumer_main(
    url: str,
    queue: str,
    total: int,
    max_delay: float,
    out: str,
    consuming: multiprocessing.synchronize.Event,
    published_all: multiprocessing.synchronize.Event,
    arrived: Synchronized[int],
) -> None:
    asyncio.run(
        _consume(url, queue, total, max_delay, Path(out), consuming, published_all, arrived)
    )


async def _consume(
    url: str,
    queue_name: str,
    total: int,
    max_delay: float,
    out: Path,
    consuming: multiprocessing.synchronize.Event,
    published_all: multiprocessing.synchronize.Event,
    arrived: Synchronized[int],
) -> None:
    # Flat arrays: sequence, publish ns, delay ms, arrival ns, redelivered flag of every
    # message received.
    seqs, sent, delays, arrivals, redelivered = (array("q") for _ in range(COLUMNS))
    distinct: set[int] = set()
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=2000)
        queue = await channel.get_queue(queue_name, ensure=False)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            arrivals.append(time.time_ns())
            published_ns, seq, delay_ms = BODY.unpack_from(message.body)
            seqs.append(seq)
            distinct.add(seq)
            sent.append(published_ns)
            delays.append(delay_ms)
            redelivered.append(int(bool(message.redelivered)))

        await queue.consume(on_message, no_ack=True)
        consuming.set()
        deadline: float | None = None
        while len(distinct) < total:  # duplicates do not count
            await asyncio.sleep(0.2)
            arrived.value = len(seqs)
            if deadline is None and published_all.is_set():
                deadline = time.monotonic() + max_delay + GRACE_SECONDS
            if deadline is not None and time.monotonic() > deadline:
                break
        await asyncio.sleep(1.0)  # duplicates, if any, show up too
    with out.open("wb") as f:
        for values in (seqs, sent, delays, arrivals, redelivered):
            array("q", [len(values)]).tofile(f)
            values.tofile(f)


def _load(out: Path) -> tuple[array[int], ...]:
    columns: list[array[int]] = []
    with out.open("rb") as f:
        for _ in range(COLUMNS):
            size = array("q")
            size.fromfile(f, 1)
            values = array("q")
            values.fromfile(f, size[0])
            columns.append(values)
    return tuple(columns)


def _percentile(sorted_values: list[float], fraction: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def _summary(out: Path, total: int) -> dict[str, Any]:
    seqs, sent, delays, arrivals, redelivered = _load(out)
    lateness_ms = sorted(
        (arrival - published) / 1e6 - delay
        for published, delay, arrival in zip(sent, delays, arrivals, strict=True)
    )
    distinct = set(seqs)
    return {
        "received": len(seqs),
        "lost": total - len(distinct),
        "duplicates": len(seqs) - len(distinct),
        "early": sum(1 for late in lateness_ms if late < 0),
        "redelivered": sum(redelivered),
        "lateness_ms": lateness_ms,
    }


def _report(out: Path, total: int, confirmed: int) -> None:
    summary = _summary(out, total)
    lateness = summary["lateness_ms"]
    say(
        f"received {summary['received']} of {total} (confirmed {confirmed}): "
        f"lost {summary['lost']}, duplicates {summary['duplicates']}, "
        f"early {summary['early']}; marked redelivered {summary['redelivered']}"
    )
    if lateness:
        figures = ", ".join(
            f"{label} {_percentile(lateness, q):.0f}"
            for label, q in (("min", 0.0), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
        )
        say(
            f"lateness after the due time, ms: {figures}, p99.9 "
            f"{_percentile(lateness, 0.999):.0f}, max {lateness[-1]:.0f}"
        )


def _ok(out: Path, total: int) -> bool:
    summary = _summary(out, total)
    return bool(summary["lost"] == 0 and summary["duplicates"] == 0 and summary["early"] == 0)


if __name__ == "__main__":
    sys.exit(main())
