"""One producer or one consumer of a benchmark case, each in its own process.

``python -m starlight_py.bench.worker '<WorkerSpec as JSON>'``. Its own process means its
own GIL and CPU time, and a hung client can be killed without touching the others.

Protocol with the coordinator (``runner``): stdout lines starting with ``@`` (``@ready``
once connected and, for a consumer, subscribed; ``@progress N`` about twice a second); a
producer waits for a ``go`` line on stdin before its first message. The result is a JSON
file at ``spec.out``; anything else a client library prints goes to stderr (a log file).

Message body: ``>qBBI`` = send time (``time.monotonic_ns()``, taken just before the
publish call; CLOCK_MONOTONIC is system-wide on Linux, so it compares across processes),
kind (measured, warm-up or end), producer index, sequence number; then padding up to the
body size. The end message carries the number of measured messages the broker confirmed, so
a consumer knows when it has them all even if the producer stopped early (``duration``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import select
import struct
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any

HEADER = struct.Struct(">qBBI")
MEASURED = 0
WARMUP = 1
END = 2
MIN_BODY = HEADER.size

PROGRESS_INTERVAL = 0.5
POLL = 0.2


@dataclass
class WorkerSpec:
    """What one worker process does. ``target`` is ``amqp`` or ``pulsar``."""

    role: str  # "producer" | "consumer"
    target: str  # "amqp" | "pulsar"
    mode: str  # "each" | "pipelined"
    url: str
    queue: str  # AMQP queue name, or Pulsar topic
    size: int
    out: str
    producer_index: int = 0
    count: int = 0  # producer: measured messages to send
    duration: float = 0.0  # producer: stop after this many seconds (0 = no cap)
    rate: float = 0.0  # producer: messages per second (0 = as fast as confirms allow)
    warmup: int = 20  # producer: unmeasured messages first (topic and producer creation)
    window: int = 100  # producer, pipelined: confirms awaited per batch of this many
    prefetch: int = 200  # consumer: basic.qos prefetch / Pulsar receiver queue size
    producers: int = 1  # consumer: how many producers feed this queue
    deadline: float = 120.0  # seconds after start at which the worker gives up
    subscription: str = "bench"  # consumer, pulsar
    # pulsar: "file" = pulsar.FileLogger at Warn, filtered in C++; "python" = a Python
    # logging.Logger at WARNING, as the proxy once passed it (docs/history/performance-log.md).
    pulsar_logger: str = "file"
    pulsar_batching: bool = False  # pulsar: producer batching (1 ms window) on

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def body(size: int, kind: int, index: int, seq: int) -> bytes:
    header = HEADER.pack(time.monotonic_ns(), kind, index, seq)
    return header + b"\0" * (size - len(header))


_cpu_at_ready = 0.0


def emit(line: str) -> None:
    global _cpu_at_ready  # noqa: PLW0603 (one worker per process)
    if line == "ready":
        _cpu_at_ready = time.process_time()
    sys.stdout.write(f"@{line}\n")
    sys.stdout.flush()


class Progress:
    def __init__(self) -> None:
        self._last = 0.0

    def maybe(self, n: int) -> None:
        now = time.monotonic()
        if now - self._last >= PROGRESS_INTERVAL:
            self._last = now
            emit(f"progress {n}")


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return self.at - time.monotonic()

    def passed(self) -> bool:
        return time.monotonic() >= self.at


def wait_go(deadline: Deadline) -> None:
    """Block until the coordinator writes ``go``; raises TimeoutError at the deadline."""
    while not deadline.passed():
        readable, _, _ = select.select([sys.stdin], [], [], min(1.0, max(0.0, deadline.left())))
        if readable:
            line = sys.stdin.readline()
            if not line:
                raise RuntimeError("coordinator went away before 'go'")
            if line.strip() == "go":
                return
    raise TimeoutError("no 'go' from the coordinator")


class Plan:
    """How many measured messages a producer still sends, and when (rate)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.seq = 0  # messages published (sequence numbers handed out)
        self.acked = 0  # of those, confirmed by the broker
        self.nacked = 0
        self.first_ns = 0
        self.last_ns = 0
        self._start = 0.0

    def start(self) -> None:
        self._start = time.monotonic()
        self.first_ns = time.monotonic_ns()

    def room(self, deadline: Deadline) -> int:
        """How many more measured messages may be published now (0 = stop)."""
        if deadline.passed():
            return 0
        elapsed = time.monotonic() - self._start
        if self.spec.duration and elapsed >= self.spec.duration:
            return 0
        return max(0, self.spec.count - self.seq)

    def pace(self) -> None:
        if self.spec.rate > 0:
            due = self._start + self.seq / self.spec.rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    def result(self) -> dict[str, Any]:
        return {
            "sent": self.acked,
            "published": self.seq,
            "nacked": self.nacked,
            "first_ns": self.first_ns,
            "last_ns": self.last_ns,
        }


# --- AMQP (pika / aio-pika) ------------------------------------------------------------


def _pika_parameters(url: str) -> Any:
    import pika  # type: ignore[import-untyped]  # noqa: PLC0415 (client libs load lazily)

    params = pika.URLParameters(url)
    params.socket_timeout = 10
    params.stack_timeout = 20
    params.blocked_connection_timeout = 60
    params.connection_attempts = 3
    params.retry_delay = 1
    return params


def amqp_each_producer(spec: WorkerSpec, deadline: Deadline) -> dict[str, Any]:
    """pika BlockingConnection with confirm_delivery: every basic_publish waits for its
    basic.ack."""
    import pika  # noqa: PLC0415
    from pika import exceptions as pika_errors  # noqa: PLC0415

    conn = pika.BlockingConnection(_pika_parameters(spec.url))
    plan = Plan(spec)
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2)
        emit("ready")
        wait_go(deadline)
        for i in range(spec.warmup):
            channel.basic_publish(
                "", spec.queue, body(spec.size, WARMUP, spec.producer_index, i), props
            )
        progress = Progress()
        plan.start()
        while plan.room(deadline) > 0:
            plan.pace()
            seq = plan.seq
            plan.seq += 1
            try:
                channel.basic_publish(
                    "", spec.queue, body(spec.size, MEASURED, spec.producer_index, seq), props
                )
                plan.acked += 1
            except pika_errors.NackError:
                plan.nacked += 1
            progress.maybe(plan.acked)
        plan.last_ns = time.monotonic_ns()
        channel.basic_publish(
            "", spec.queue, body(spec.size, END, spec.producer_index, plan.acked), props
        )
    finally:
        if conn.is_open:
            conn.close()
    return plan.result()


def amqp_pipelined_producer(spec: WorkerSpec, deadline: Deadline) -> dict[str, Any]:
    return asyncio.run(_amqp_pipelined(spec, deadline))


async def _amqp_pipelined(spec: WorkerSpec, deadline: Deadline) -> dict[str, Any]:
    """aio-pika with publisher confirms: publish ``window`` messages, await all their
    confirms (asyncio.gather), repeat."""
    import aio_pika  # noqa: PLC0415
    from pamqp.commands import Basic  # noqa: PLC0415

    plan = Plan(spec)
    conn = await asyncio.wait_for(aio_pika.connect(spec.url), 20)
    async with conn:
        channel = await conn.channel(publisher_confirms=True)
        exchange = channel.default_exchange
        emit("ready")
        await asyncio.get_running_loop().run_in_executor(None, wait_go, deadline)

        async def publish(kind: int, seqs: range) -> int:
            messages = [
                aio_pika.Message(
                    body(spec.size, kind, spec.producer_index, seq),
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                )
                for seq in seqs
            ]
            results = await asyncio.wait_for(
                asyncio.gather(
                    *(
                        exchange.publish(m, routing_key=spec.queue, mandatory=False)
                        for m in messages
                    ),
                    return_exceptions=True,
                ),
                max(1.0, deadline.left()),
            )
            return sum(1 for r in results if isinstance(r, Basic.Ack))

        if spec.warmup:
            await publish(WARMUP, range(spec.warmup))
        progress = Progress()
        plan.start()
        while (room := plan.room(deadline)) > 0:
            plan.pace()
            n = min(room, spec.window)
            seqs = range(plan.seq, plan.seq + n)
            plan.seq += n
            acked = await publish(MEASURED, seqs)
            plan.acked += acked
            plan.nacked += n - acked
            progress.maybe(plan.acked)
        plan.last_ns = time.monotonic_ns()
        await publish(END, range(plan.acked, plan.acked + 1))
    return plan.result()


class Tracker:
    """Consumer-side bookkeeping: latencies of first deliveries, duplicates, end markers."""

    def __init__(self, producers: int) -> None:
        self.producers = producers
        self.seen: set[int] = set()
        self.latencies_ns: list[int] = []
        self.duplicates = 0
        self.warmup = 0
        self.totals: dict[int, int] = {}
        self.last_ns = 0

    def on_body(self, data: bytes, now_ns: int) -> None:
        sent_ns, kind, index, seq = HEADER.unpack_from(data)
        if kind == END:
            self.totals[index] = seq
            return
        if kind == WARMUP:
            self.warmup += 1
            return
        key = (index << 32) | seq
        if key in self.seen:
            self.duplicates += 1
            return
        self.seen.add(key)
        self.latencies_ns.append(now_ns - sent_ns)
        self.last_ns = now_ns

    def done(self) -> bool:
        return len(self.totals) >= self.producers and len(self.seen) >= sum(self.totals.values())

    def result(self, timed_out: bool) -> dict[str, Any]:
        return {
            "received": len(self.seen),
            "duplicates": self.duplicates,
            "warmup": self.warmup,
            "expected": sum(self.totals.values()) if len(self.totals) >= self.producers else None,
            "last_ns": self.last_ns,
            "latencies_us": [n // 1000 for n in self.latencies_ns],
            "timed_out": timed_out,
        }


def amqp_consumer(spec: WorkerSpec, deadline: Deadline) -> dict[str, Any]:
    """pika BlockingConnection, basic.qos(prefetch), manual ack of every message."""
    import pika  # noqa: PLC0415

    tracker = Tracker(spec.producers)
    conn = pika.BlockingConnection(_pika_parameters(spec.url))
    try:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=spec.prefetch)

        def on_message(ch: Any, method: Any, _properties: Any, data: bytes) -> None:
            tracker.on_body(data, time.monotonic_ns())
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume(spec.queue, on_message, auto_ack=False)
        emit("ready")
        progress = Progress()
        while not tracker.done() and not deadline.passed():
            conn.process_data_events(time_limit=POLL)
            progress.maybe(len(tracker.seen))
    finally:
        if conn.is_open:
            conn.close()
    return tracker.result(not tracker.done())


# --- direct pulsar-client ----------------------------------------------------------------


def _pulsar_client(spec: WorkerSpec) -> Any:
    import pulsar  # noqa: PLC0415

    logger: Any
    if spec.pulsar_logger == "python":
        # pulsar-client's LoggerWrapper reports every level as enabled to C++, so each
        # DEBUG line of the client takes the GIL to be dropped by this logger's level.
        logger = logging.getLogger("pulsar")
        logger.setLevel(logging.WARNING)
    else:
        logger = pulsar.FileLogger(pulsar.LoggerLevel.Warn, f"{spec.out}.pulsar.log")
    return pulsar.Client(spec.url, operation_timeout_seconds=15, logger=logger)


def _pulsar_producer(client: Any, spec: WorkerSpec) -> Any:
    # By default the proxy's producer settings (backend/pulsar_client.py: no batching), so
    # the two differ only in what sits between the client and Pulsar; ``batching`` shows
    # what client-side batching (1 ms window) adds.
    batching: dict[str, Any] = {"batching_enabled": spec.pulsar_batching}
    if spec.pulsar_batching:
        batching["batching_max_publish_delay_ms"] = 1
    return client.create_producer(
        spec.queue,
        max_pending_messages=5000,
        block_if_queue_full=True,
        send_timeout_millis=30000,
        **batching,
    )


def pulsar_each_producer(spec: WorkerSpec, deadline: Deadline) -> dict[str, Any]:
    """producer.send(): blocks until Pulsar acknowledges each message."""
    client = _pulsar_client(spec)
    plan = Plan(spec)
    try:
        producer = _pulsar_producer(client, spec)
        emit("ready")
        wait_go(deadline)
        for i in range(spec.warmup):
            producer.send(body(spec.size, WARMUP, spec.producer_index, i))
        progress = Progress()
        plan.start()
        while plan.room(deadline) > 0:
            plan.pace()
            seq = plan.seq
            plan.seq += 1
            producer.send(body(spec.size, MEASURED, spec.producer_index, seq))
            plan.acked += 1
            progress.maybe(plan.acked)
        plan.last_ns = time.monotonic_ns()
        producer.send(body(spec.size, END, spec.producer_index, plan.acked))
        producer.close()
    finally:
        client.close()
    return plan.result()


def pulsar_pipelined_producer(spec: WorkerSpec, deadline: Deadline) -> dict[str, Any]:
    """send_async with a callback counting acks; ``window`` sends, then wait for all of
    their acks, repeat (the same batches as the aio-pika producer)."""
    import pulsar  # noqa: PLC0415

    client = _pulsar_client(spec)
    plan = Plan(spec)
    cond = threading.Condition()
    counts = {"ok": 0, "failed": 0}

    def callback(result: Any, _message_id: Any) -> None:
        with cond:
            counts["ok" if result == pulsar.Result.Ok else "failed"] += 1
            cond.notify_all()

    def publish(kind: int, seqs: range) -> int:
        with cond:
            before_ok, before_failed = counts["ok"], counts["failed"]
        for seq in seqs:
            producer.send_async(body(spec.size, kind, spec.producer_index, seq), callback)
        target = before_ok + before_failed + len(seqs)
        with cond:
            if not cond.wait_for(
                lambda: counts["ok"] + counts["failed"] >= target, max(0.1, deadline.left())
            ):
                raise TimeoutError("Pulsar did not acknowledge the batch in time")
            return counts["ok"] - before_ok

    try:
        producer = _pulsar_producer(client, spec)
        emit("ready")
        wait_go(deadline)
        if spec.warmup:
            publish(WARMUP, range(spec.warmup))
        progress = Progress()
        plan.start()
        while (room := plan.room(deadline)) > 0:
            plan.pace()
            n = min(room, spec.window)
            seqs = range(plan.seq, plan.seq + n)
            plan.seq += n
            acked = publish(MEASURED, seqs)
            plan.acked += acked
            plan.nacked += n - acked
            progress.maybe(plan.acked)
        plan.last_ns = time.monotonic_ns()
        publish(END, range(plan.acked, plan.acked + 1))
        producer.close()
    finally:
        client.close()
    return plan.result()


def pulsar_consumer(spec: WorkerSpec, deadline: Deadline) -> dict[str, Any]:
    """Shared subscription, receive() + acknowledge() of every message."""
    import pulsar  # noqa: PLC0415

    tracker = Tracker(spec.producers)
    client = _pulsar_client(spec)
    try:
        consumer = client.subscribe(
            spec.queue,
            spec.subscription,
            consumer_type=pulsar.ConsumerType.Shared,
            receiver_queue_size=spec.prefetch,
            initial_position=pulsar.InitialPosition.Earliest,
        )
        emit("ready")
        progress = Progress()
        while not tracker.done() and not deadline.passed():
            try:
                message = consumer.receive(timeout_millis=int(POLL * 1000))
            except pulsar.Timeout:
                progress.maybe(len(tracker.seen))
                continue
            tracker.on_body(message.data(), time.monotonic_ns())
            consumer.acknowledge(message)
            progress.maybe(len(tracker.seen))
        try:
            consumer.unsubscribe()
        except pulsar.PulsarException as e:
            print(f"unsubscribe: {e}", file=sys.stderr)
    finally:
        client.close()
    return tracker.result(not tracker.done())


WORKERS = {
    ("producer", "amqp", "each"): amqp_each_producer,
    ("producer", "amqp", "pipelined"): amqp_pipelined_producer,
    ("producer", "pulsar", "each"): pulsar_each_producer,
    ("producer", "pulsar", "pipelined"): pulsar_pipelined_producer,
    ("consumer", "amqp", "each"): amqp_consumer,
    ("consumer", "amqp", "pipelined"): amqp_consumer,
    ("consumer", "pulsar", "each"): pulsar_consumer,
    ("consumer", "pulsar", "pipelined"): pulsar_consumer,
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m starlight_py.bench.worker '<spec json>'", file=sys.stderr)
        return 2
    spec = WorkerSpec(**json.loads(args[0]))
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    deadline = Deadline(spec.deadline)
    code = 0
    try:
        run = WORKERS[(spec.role, spec.target, spec.mode)]
        result: dict[str, Any] = {"ok": True, **run(spec, deadline)}
        result["cpu_s"] = time.process_time() - _cpu_at_ready
    except Exception as e:
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        code = 1
    with open(spec.out, "w") as out:
        json.dump(result, out)
    return code


if __name__ == "__main__":
    sys.exit(main())
