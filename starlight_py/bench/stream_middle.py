"""A long stream read from its middle: ``python -m starlight_py.bench.stream_middle``.

For each broker given with ``--url NAME=amqp://...`` (the proxy, RabbitMQ), it declares a
stream queue, publishes ``--messages`` messages (default 1,000,000; 100-byte bodies
numbered in order, without confirms: a ``last`` consumer then waits until the last one is
stored), learns the offset of the middle one (a ``last`` consumer after the first half),
then starts a consumer
at that offset (prefetch 1000, manual ack) and prints the time from ``basic.consume`` to the
first delivery, that the first message is the middle one, and the time to read
``--read`` messages (default 10,000) from there. A script that prints figures, not a test.

Example, against a running ``starlight-proxy standalone`` and a RabbitMQ::

    python -m starlight_py.bench.stream_middle \\
        --url proxy=amqp://guest:guest@127.0.0.1:5672/ \\
        --url rabbitmq=amqp://guest:guest@127.0.0.1:5673/
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
import uuid
from dataclasses import dataclass

import aio_pika
import pika  # type: ignore[import-untyped]

BODY_SIZE = 100


@dataclass
class Result:
    broker: str
    messages: int
    publish_s: float
    middle_offset: int
    first_ms: float
    first_is_middle: bool
    read: int
    read_ms: float

    def line(self) -> str:
        return (
            f"{self.broker:<10} {self.messages:>9} msgs published in {self.publish_s:6.1f} s "
            f"({self.messages / self.publish_s:8.0f}/s); middle offset {self.middle_offset}: "
            f"first message after {self.first_ms:7.1f} ms "
            f"({'the middle one' if self.first_is_middle else 'NOT the middle one'}), "
            f"{self.read} messages in {self.read_ms:7.1f} ms"
        )


def _body(index: int) -> bytes:
    return f"{index:012d}".encode().ljust(BODY_SIZE, b".")


def _publish(url: str, queue: str, start: int, stop: int) -> None:
    """Publish bodies start..stop-1 through pika without confirms (fast); `_offset_of_last`
    then waits until the last one is stored."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        for i in range(start, stop):
            channel.basic_publish("", queue, _body(i))
            if i % 10_000 == 0:
                connection.process_data_events(0)
    finally:
        connection.close()


async def _consume(
    connection: aio_pika.abc.AbstractConnection,
    queue: str,
    offset: int | str,
    count: int,
    timeout: float,
) -> tuple[list[tuple[float, bytes, int]], float]:
    """(seconds since basic.consume, body, x-stream-offset) of up to `count` deliveries
    within `timeout`, on a channel of its own, left open with what it prefetched unacked
    (aio-pika's queue iterator would nack it, which a stream refuses), and when it started."""
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=1000)
    stream = await channel.get_queue(queue, ensure=False)
    seen: list[tuple[float, bytes, int]] = []
    done = asyncio.Event()
    started = time.monotonic()

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        if done.is_set():
            return  # left unacked: the channel is left behind
        value = message.headers.get("x-stream-offset")
        seen.append(
            (time.monotonic() - started, message.body, value if isinstance(value, int) else -1)
        )
        await message.ack()
        if len(seen) >= count:
            done.set()

    tag = await stream.consume(on_message, arguments={"x-stream-offset": offset})
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), timeout)
    done.set()
    await stream.cancel(tag)
    return seen[:count], started


async def _offset_of_last(
    connection: aio_pika.abc.AbstractConnection, queue: str, index: int
) -> int:
    """The offset of message `index`, once a `last` consumer sees it (it is stored)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        seen, _ = await _consume(connection, queue, "last", 10**9, 0.3)
        for _, body, offset in seen:
            if body == _body(index):
                return offset
        await asyncio.sleep(0.5)
    raise RuntimeError(f"message {index} never showed up")


async def run_one(name: str, url: str, messages: int, read: int) -> Result:
    queue = f"bench-stream-{uuid.uuid4().hex[:8]}"
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "stream"})
        try:
            half = messages // 2
            began = time.monotonic()
            await asyncio.to_thread(_publish, url, queue, 0, half)
            middle = await _offset_of_last(connection, queue, half - 1) + 1
            await asyncio.to_thread(_publish, url, queue, half, messages)
            await _offset_of_last(connection, queue, messages - 1)
            publish_s = time.monotonic() - began
            seen, _ = await _consume(connection, queue, middle, read, 300)
            if not seen:
                raise RuntimeError("nothing read from the middle")
            return Result(
                name,
                messages,
                publish_s,
                middle,
                seen[0][0] * 1000,
                seen[0][1] == _body(half),
                len(seen),
                seen[-1][0] * 1000,
            )
        finally:
            await channel.queue_delete(queue)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m starlight_py.bench.stream_middle")
    parser.add_argument("--url", action="append", required=True, help="NAME=amqp://...")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--read", type=int, default=10_000)
    args = parser.parse_args(argv)
    for item in args.url:
        name, _, url = item.partition("=")
        result = asyncio.run(run_one(name, url, args.messages, args.read))
        print(result.line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
