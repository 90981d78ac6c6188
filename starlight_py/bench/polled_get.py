"""Publish-to-get latency of a polling client: ``python -m starlight_py.bench.polled_get``.

Scripts and job runners often poll a queue with ``basic.get`` instead of consuming. For each
broker given with ``--url [NAME=]amqp://...`` (the proxy, RabbitMQ) this declares a queue;
a publisher on a connection of its own sends ``--messages`` messages (default 100)
``--interval-ms`` apart (default 50), and a poller on another connection calls ``basic.get``
(auto-ack unless ``--manual-ack``), sleeping ``--poll-ms`` (default 10) after each empty
answer. It prints, per broker and round, how many messages were got and in order, how many
gets answered empty, and the latency from just before the publish call to the get-ok: p50,
p90, p99 and max. ``--ttl-ms`` gives the queue an ``x-message-ttl`` (the queue is then also
watched by the proxy's expiry work); ``--rounds`` repeats the run on fresh queues.
``--private-proxy`` starts ZooKeeper, Pulsar standalone and one proxy in a temporary folder
and measures it as ``proxy`` from the moment it answers (the first minute of a new broker
is the slowest), beside any ``--url``.

A script that prints figures, not a test. Example, side by side::

    python -m starlight_py.bench.polled_get \\
        --url proxy=amqp://guest:guest@127.0.0.1:5672/ \\
        --url rabbitmq=amqp://guest:guest@127.0.0.1:5673/
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field

import pika  # type: ignore[import-untyped]

from starlight_py.bench.infra import BenchError, private_proxy, say

GRACE = 10.0  # s after the last publish that the poller waits for stragglers


@dataclass
class Run:
    broker: str
    round: int
    sent: int = 0
    got: list[int] = field(default_factory=list)  # sequence numbers, in get order
    latency_ms: list[float] = field(default_factory=list)
    empty_gets: int = 0
    error: str = ""

    def percentile(self, q: float) -> float | None:
        if not self.latency_ms:
            return None
        ordered = sorted(self.latency_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def line(self) -> str:
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value:.1f}"

        in_order = self.got == sorted(self.got)
        figures = " ".join(
            f"{ms(v):>7}"
            for v in (
                self.percentile(0.5),
                self.percentile(0.9),
                self.percentile(0.99),
                max(self.latency_ms, default=None),
            )
        )
        text = (
            f"{self.broker:<10} {self.round:>5} {len(self.got):>4}/{self.sent:<4} "
            f"{'yes' if in_order else 'NO':>8} {self.empty_gets:>6} {figures}"
        )
        return f"{text}  {self.error}" if self.error else text


def measure(
    name: str,
    url: str,
    round_number: int,
    messages: int,
    interval: float,
    poll: float,
    manual_ack: bool,
    ttl_ms: int | None,
) -> Run:
    run = Run(name, round_number)
    queue = f"polled-get-{uuid.uuid4().hex[:12]}"
    try:
        admin = pika.BlockingConnection(pika.URLParameters(url))
    except Exception as e:  # a broker that cannot be reached still gets its row
        run.error = f"{type(e).__name__}: {e}"
        return run
    try:
        admin.channel().queue_declare(
            queue, arguments={"x-message-ttl": ttl_ms} if ttl_ms is not None else None
        )
        published: dict[int, float] = {}
        done_publishing = threading.Event()
        failures: list[str] = []

        def publish() -> None:
            try:
                connection = pika.BlockingConnection(pika.URLParameters(url))
                channel = connection.channel()
                next_at = time.perf_counter()
                for sequence in range(messages):
                    next_at += interval
                    pause = next_at - time.perf_counter()
                    if pause > 0:
                        connection.sleep(pause)
                    published[sequence] = time.perf_counter()
                    channel.basic_publish("", queue, str(sequence).encode())
                    run.sent += 1
                connection.close()
            except Exception as e:  # reported in the row
                failures.append(f"publisher: {type(e).__name__}: {e}")
            finally:
                done_publishing.set()

        poller = pika.BlockingConnection(pika.URLParameters(url))
        channel = poller.channel()
        publisher = threading.Thread(target=publish, name="publisher", daemon=True)
        publisher.start()
        give_up: float | None = None
        while len(run.got) < messages:
            method, _, body = channel.basic_get(queue, auto_ack=not manual_ack)
            if method is None:
                run.empty_gets += 1
                if done_publishing.is_set():
                    give_up = give_up or time.perf_counter() + GRACE
                    if time.perf_counter() > give_up:
                        break
                poller.sleep(poll)
                continue
            now = time.perf_counter()
            sequence = int(body)
            run.got.append(sequence)
            run.latency_ms.append((now - published.get(sequence, now)) * 1000)
            if manual_ack:
                channel.basic_ack(method.delivery_tag)
        publisher.join()
        poller.close()
        run.error = "; ".join(failures)
        admin.channel().queue_delete(queue)
    except Exception as e:  # a broker that failed the run still gets its row
        run.error = f"{type(e).__name__}: {e}"
    finally:
        if admin.is_open:
            admin.close()
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m starlight_py.bench.polled_get",
        description="Publish-to-get latency of a client polling with basic.get.",
    )
    parser.add_argument("--url", action="append", default=[], metavar="[NAME=]URL")
    parser.add_argument(
        "--private-proxy", action="store_true", help="start servers and a proxy of its own"
    )
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--interval-ms", type=float, default=50.0)
    parser.add_argument("--poll-ms", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--manual-ack", action="store_true")
    parser.add_argument("--ttl-ms", type=int, default=None)
    args = parser.parse_args(argv)
    if not args.url and not args.private_proxy:
        parser.error("give --url (repeatable) or --private-proxy")
    targets: list[tuple[str, str]] = []
    for item in args.url:
        name, sep, url = item.partition("=")
        if not sep or "://" in name:
            name, url = f"broker{len(targets) + 1}", item
        targets.append((name, url))
    with ExitStack() as stack:
        if args.private_proxy:
            try:
                targets.insert(0, ("proxy", private_proxy(stack, "starlight-polled-get-")))
            except BenchError as e:
                say(f"cannot run: {e}")
                return 1
        return _run(args, targets)


def _run(args: argparse.Namespace, targets: list[tuple[str, str]]) -> int:
    print(
        f"{args.messages} messages {args.interval_ms:g} ms apart, a get every "
        f"{args.poll_ms:g} ms while empty ({'manual ack' if args.manual_ack else 'auto-ack'}); "
        "publish-to-get ms"
    )
    print(
        f"{'broker':<10} {'round':>5} {'got':>9} {'in order':>8} {'empty':>6} "
        f"{'p50':>7} {'p90':>7} {'p99':>7} {'max':>7}"
    )
    failed = False
    for round_number in range(1, args.rounds + 1):
        for name, url in targets:
            run = measure(
                name,
                url,
                round_number,
                args.messages,
                args.interval_ms / 1000,
                args.poll_ms / 1000,
                args.manual_ack,
                args.ttl_ms,
            )
            failed = failed or bool(run.error) or len(run.got) < run.sent
            print(run.line(), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
