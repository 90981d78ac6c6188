"""Connection churn for the soak (`--soak-churn`): short-lived clients next to the steady
producer and consumer, to show whether what a connection leaves behind is bounded.

Each cycle opens a connection and a channel with confirms, publishes one message to a queue
of its own run (`bench.churn.<random>`), takes it back with basic.get, acks it and closes.
Every tenth cycle also declares an exclusive server-named queue and sends one message
through it, as an RPC reply queue (the proxy deletes the queue when the connection closes).
Every body published to the run's queue is remembered until a get returns it; at the end
the queue is drained, and what never came back is counted as lost (exact: only the churn
uses that queue). A reply not taken back before its connection closes is lost too.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

EXCLUSIVE_EVERY = 10
GET_ATTEMPTS = 50
GET_RETRY = 0.02  # seconds between basic.get attempts (get-empty while Pulsar delivers)


@dataclass
class ChurnCounts:
    cycles: int = 0
    exclusive_queues: int = 0
    lost: int = 0
    failures: int = 0
    last_failure: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": round(self.seconds, 1)}

    def failed(self, e: Exception, during: str = "") -> None:
        self.failures += 1
        self.last_failure = f"{during}{type(e).__name__}: {e}"


class Churn:
    """A thread that runs connection cycles at `rate` per second until `stop()`."""

    def __init__(self, url: str, rate: float) -> None:
        self.url = url
        self.rate = rate
        self.queue = f"bench.churn.{uuid.uuid4().hex[:8]}"
        self.counts = ChurnCounts()
        self._outstanding: set[bytes] = set()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="churn", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> ChurnCounts:
        self._stopping.set()
        self._thread.join(timeout=60)
        try:
            self._drain_and_delete()
        except Exception as e:
            self.counts.failed(e, "final drain: ")
        self.counts.lost += len(self._outstanding)
        return self.counts

    def _run(self) -> None:
        began = time.monotonic()
        period = 1.0 / self.rate
        next_at = began
        while not self._stopping.is_set():
            try:
                self._cycle()
            except Exception as e:  # a failed cycle is counted; the soak goes on
                self.counts.failed(e)
            next_at += period
            self._stopping.wait(max(0.0, next_at - time.monotonic()))
        self.counts.seconds = time.monotonic() - began

    def _cycle(self) -> None:
        import pika  # type: ignore[import-untyped]  # noqa: PLC0415 (client libs load lazily)

        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare(self.queue, durable=True)
            if self.counts.cycles % EXCLUSIVE_EVERY == 0:
                reply_queue = channel.queue_declare("", exclusive=True).method.queue
                self.counts.exclusive_queues += 1
                reply = uuid.uuid4().bytes
                channel.basic_publish("", reply_queue, reply)
                if not self._took_back(channel, reply_queue, reply):
                    self.counts.lost += 1  # the queue dies with the connection: lost for good
            body = uuid.uuid4().bytes
            self._outstanding.add(body)
            channel.basic_publish("", self.queue, body, pika.BasicProperties(delivery_mode=2))
            self._took_back(channel, self.queue, body)
            self.counts.cycles += 1
        finally:
            if connection.is_open:
                connection.close()

    def _took_back(self, channel: Any, queue: str, body: bytes) -> bool:
        """basic.get from `queue` until `body` comes back (earlier cycles' stragglers are
        taken too); False when it did not within GET_ATTEMPTS tries."""
        for _ in range(GET_ATTEMPTS):
            if self._get(channel, queue) == body:
                return True
            time.sleep(GET_RETRY)
        return False

    def _get(self, channel: Any, queue: str) -> bytes | None:
        method, _properties, got = channel.basic_get(queue, auto_ack=False)
        if method is None:
            return None
        channel.basic_ack(method.delivery_tag)
        self._outstanding.discard(got)
        return bytes(got)

    def _drain_and_delete(self) -> None:
        import pika  # noqa: PLC0415

        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            channel = connection.channel()
            empty_in_a_row = 0
            while self._outstanding and empty_in_a_row < GET_ATTEMPTS:
                if self._get(channel, self.queue) is None:
                    empty_in_a_row += 1
                    time.sleep(GET_RETRY)
                else:
                    empty_in_a_row = 0
            channel.queue_delete(self.queue)
        finally:
            if connection.is_open:
                connection.close()
