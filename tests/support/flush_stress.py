"""Run by tests/integration/test_producer_flush.py in a process of its own (a deadlock holds
the GIL, and would stop the test run with it): from one thread, send on a batching producer
with a 1 ms batch delay, each time one message with a Python callback (what tracked sends
give pulsar-client) and one without, then flush; prints how many of the callbacks came.

    python -m tests.support.flush_stress <pulsar service URL> <topic> <rounds>
"""

from __future__ import annotations

import sys
import threading
import time

import pulsar

from starlight_py.backend.pulsar_client import ProducerHandle

WAIT = 30.0  # s for the last outcomes, once everything is sent


def main(service_url: str, topic: str, rounds: int) -> None:
    client = pulsar.Client(service_url)
    producer = client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_publish_delay_ms=1,
        block_if_queue_full=False,
        max_pending_messages=4 * rounds,
    )
    handle = ProducerHandle(producer, 4 * rounds, None, batching=True)
    outcomes: list[bool] = []
    lock = threading.Lock()

    def sent(ok: bool, error: str) -> None:
        with lock:
            outcomes.append(ok)

    def flushed(covered: int, ok: bool, error: str) -> None:
        with lock:
            outcomes.append(ok)

    for number in range(rounds):
        handle.send_tracked(b"tracked %d" % number, {}, sent)
        handle.send(b"untracked %d" % number, {})
        handle.flush(flushed)
        if number % 50 == 0:
            time.sleep(0.0005)  # let batch timers fire in between
    print(f"sent {rounds} rounds", flush=True)
    deadline = time.monotonic() + WAIT
    while len(outcomes) < 2 * rounds and time.monotonic() < deadline:
        time.sleep(0.05)
    with lock:
        print(f"outcomes {len(outcomes)} ok {sum(outcomes)} of {2 * rounds}", flush=True)
    client.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
