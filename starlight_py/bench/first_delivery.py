"""Ready messages reaching a new consumer: ``python -m starlight_py.bench.first_delivery``.

For each broker given with ``--url NAME=amqp://...`` (the proxy, RabbitMQ), and for an
ordinary queue and a priority queue (``x-max-priority`` 5, messages of priorities 0, 2 and
4), it publishes ``--messages`` messages (default 3), waits for them to be stored, starts a
consumer (prefetch 10, manual ack) and prints, over ``--rounds`` rounds (default 20), the
median and worst time from ``basic.consume`` to consume-ok, to the first delivery and to the
last, and how many rounds delivered a priority queue's messages out of priority order. A
script that prints figures, not a test.

Example, against a running ``starlight-proxy standalone`` and a RabbitMQ::

    python -m starlight_py.bench.first_delivery \\
        --url proxy=amqp://guest:guest@127.0.0.1:5672/ \\
        --url rabbitmq=amqp://guest:guest@127.0.0.1:5673/
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field

import pika  # type: ignore[import-untyped]
from pika.adapters.blocking_connection import BlockingChannel  # type: ignore[import-untyped]

PRIORITY_STEP = 2
SETTLE = 0.3  # seconds between publishing and consuming: the messages are stored
DEADLINE = 5.0  # a round gives up waiting for its deliveries after this


@dataclass
class Round:
    consume_ok_ms: float
    first_ms: float | None
    last_ms: float | None
    in_order: bool


@dataclass
class Summary:
    broker: str
    kind: str
    rounds: list[Round] = field(default_factory=list)

    def line(self) -> str:
        def stat(values: list[float]) -> str:
            if not values:
                return "-"
            return f"{statistics.median(values):7.1f} / {max(values):7.1f}"

        firsts = [r.first_ms for r in self.rounds if r.first_ms is not None]
        lasts = [r.last_ms for r in self.rounds if r.last_ms is not None]
        missing = sum(1 for r in self.rounds if r.last_ms is None)
        disorder = sum(1 for r in self.rounds if not r.in_order)
        return (
            f"{self.broker:<10} {self.kind:<9} "
            f"{stat([r.consume_ok_ms for r in self.rounds]):>17} {stat(firsts):>17} "
            f"{stat(lasts):>17} {missing:>10} {disorder:>12}"
        )


def one_round(channel: BlockingChannel, priority: bool, messages: int) -> Round:
    connection = channel.connection
    queue = f"first-delivery-{uuid.uuid4().hex[:12]}"
    channel.queue_declare(queue, arguments={"x-max-priority": 5} if priority else None)
    for i in range(messages):
        level = min(5, i * PRIORITY_STEP) if priority else None
        channel.basic_publish(
            "", queue, str(i).encode(), pika.BasicProperties(priority=level, delivery_mode=2)
        )
    time.sleep(SETTLE)
    channel.basic_qos(prefetch_count=10)
    arrivals: list[tuple[float, int]] = []
    start = time.perf_counter()

    def on_message(ch: BlockingChannel, method: object, props: object, body: bytes) -> None:
        arrivals.append((time.perf_counter(), int(body)))

    channel.basic_consume(queue, on_message)
    consume_ok = time.perf_counter()
    while len(arrivals) < messages and time.perf_counter() - start < DEADLINE:
        connection.process_data_events(time_limit=0)
    order = [n for _, n in arrivals]
    expected = sorted(range(messages), reverse=True) if priority else list(range(messages))
    channel.close()
    cleanup = connection.channel()
    cleanup.queue_delete(queue)
    cleanup.close()
    return Round(
        (consume_ok - start) * 1000,
        (arrivals[0][0] - start) * 1000 if arrivals else None,
        (arrivals[-1][0] - start) * 1000 if len(arrivals) == messages else None,
        order == expected,
    )


def measure(name: str, url: str, rounds: int, messages: int) -> list[Summary]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        summaries = []
        for kind, priority in (("ordinary", False), ("priority", True)):
            summary = Summary(name, kind)
            for _ in range(rounds):
                summary.rounds.append(one_round(connection.channel(), priority, messages))
            summaries.append(summary)
        return summaries
    finally:
        connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m starlight_py.bench.first_delivery",
        description="How soon a new consumer gets a queue's ready messages.",
    )
    parser.add_argument(
        "--url", action="append", required=True, metavar="NAME=URL", help="repeatable"
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--messages", type=int, default=3)
    args = parser.parse_args(argv)
    targets = []
    for item in args.url:
        name, sep, url = item.partition("=")
        if not sep or not url:
            parser.error(f"--url wants NAME=URL, got {item!r}")
        targets.append((name, url))
    print(
        f"{args.messages} ready messages, {args.rounds} rounds; "
        "ms from basic.consume, median / worst"
    )
    print(
        f"{'broker':<10} {'queue':<9} {'consume-ok':>17} {'first delivery':>17} "
        f"{'last delivery':>17} {'incomplete':>10} {'out of order':>12}"
    )
    for name, url in targets:
        for summary in measure(name, url, args.rounds, args.messages):
            print(summary.line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
