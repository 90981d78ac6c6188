"""Nothing lost: every message confirmed by the proxy is consumed, counted one by one."""

from __future__ import annotations

import asyncio
import time
import uuid

import aio_pika
import pytest

from tests.support.proxy_runner import ProxyThread

# Enough to keep 2,000 publishes in flight for a while on each of four queues; 100,000
# took 3.5 minutes of CI here (the Python client is the slow side).
TOTAL = 30_000
QUEUES = 4
WINDOW = 2000  # publishes in flight awaiting their confirms


async def publish_all(url: str, queues: list[str]) -> int:
    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    for name in queues:
        await channel.declare_queue(name, durable=True)
    confirmed = 0
    pending: set[asyncio.Future[object]] = set()
    for i in range(TOTAL):
        message = aio_pika.Message(body=f"{i}".encode(), headers={"n": i})
        future = asyncio.ensure_future(
            channel.default_exchange.publish(message, routing_key=queues[i % QUEUES])
        )
        pending.add(future)
        if len(pending) >= WINDOW:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            confirmed += sum(1 for f in done if f.exception() is None)
    for future in asyncio.as_completed(pending):
        await future
        confirmed += 1
    await connection.close()
    return confirmed


async def consume_all(url: str, queues: list[str], expected: int) -> list[int]:
    connection = await aio_pika.connect(url)
    seen: list[int] = []
    finished = asyncio.Event()
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=500)

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        seen.append(int(message.body))
        await message.ack()
        if len(seen) >= expected:
            finished.set()

    for name in queues:
        queue = await channel.declare_queue(name, passive=True)
        await queue.consume(on_message)
    deadline = time.monotonic() + 600
    while not finished.is_set() and time.monotonic() < deadline:
        try:
            await asyncio.wait_for(finished.wait(), timeout=5)
        except TimeoutError:
            continue
    # Anything beyond `expected` would be a duplicate: give it a moment to show up.
    await asyncio.sleep(1)
    for name in queues:
        queue = await channel.declare_queue(name, passive=True)
        await queue.delete(if_unused=False, if_empty=False)
    await connection.close()
    return seen


# About a minute on the 2-core machine; the default 300 s limit is too close for a
# counting test on a loaded machine (no timing is asserted).
@pytest.mark.timeout(900)
def test_30k_confirmed_messages_across_4_queues_are_all_consumed(proxy: ProxyThread) -> None:
    url = proxy.amqp_url()
    queues = [f"count-{uuid.uuid4().hex[:8]}-{i}" for i in range(QUEUES)]
    started = time.monotonic()
    confirmed = asyncio.run(publish_all(url, queues))
    published_in = time.monotonic() - started
    assert confirmed == TOTAL
    seen = asyncio.run(consume_all(url, queues, TOTAL))
    print(
        f"\n{TOTAL} messages: published+confirmed in {published_in:.1f} s, "
        f"consumed in {time.monotonic() - started - published_in:.1f} s"
    )
    assert len(seen) == TOTAL, f"consumed {len(seen)} of {TOTAL}"
    assert sorted(seen) == list(range(TOTAL))  # each exactly once, none lost
