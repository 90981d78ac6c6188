"""How late messages leave queues nobody reads: ``python -m starlight_py.bench.expiry``.

Measures issue 18's items 1 and 2 over many messages, on the proxy and, with
``--rabbitmq-url``, on RabbitMQ in the same run:

- ``queue-ttl``: a wait queue with ``x-message-ttl`` and a dead-letter exchange, no consumer;
  lateness = when the dead letter reached a consumer of the work queue - (publish time + TTL);
- ``message-ttl``: the same with a per-message ``expiration`` instead of the queue's TTL;
- ``delayed-get``: messages with ``x-delay`` on an ``x-delayed-message`` exchange, polled with
  ``basic.get`` every ``--poll-ms``; lateness = when a get returned it - (publish + delay).
  RabbitMQ has it only with the community delayed-message plugin; without it the row says
  "not supported".

The publish time is taken just before the publish call, so the publish latency counts as
lateness. Prints, per scenario and broker: messages received, lost (never came), early, and
lateness min / p50 / p90 / p99 / max, and the first message's alone (right after a proxy
starts, whether it leads the expiry work matters). A script that prints figures, not a
test. Without ``--url`` it starts ZooKeeper, Pulsar standalone and one proxy in a temporary
folder, like ``starlight_py.bench.delayed``.

``--handover`` starts two proxies instead, measures ``queue-ttl`` through the second one and
stops the first (the cleaner's leader, which reaps TTL queues nobody reads) gracefully
halfway through the publishes: the rows "before"/"after" show how late messages left while
the lead moved.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pika  # type: ignore[import-untyped]
import pika.exceptions  # type: ignore[import-untyped]
from pika.adapters.blocking_connection import BlockingChannel  # type: ignore[import-untyped]

from starlight_py.bench.infra import BenchError, private_proxy, say, start_proxy, start_pulsar

BODY = struct.Struct(">qI")  # publish time (time.time_ns() before the call), sequence
GRACE_SECONDS = 10.0  # how long after the last message is due stragglers are waited for
SCENARIOS = ("queue-ttl", "message-ttl", "delayed-get")


@dataclass
class Result:
    broker: str
    scenario: str
    sent: int = 0
    received: int = 0
    early: int = 0
    duplicates: int = 0
    lateness_ms: list[float] = field(default_factory=list)  # in sequence order
    first_ms: float | None = None  # the first message's lateness
    error: str = ""

    @property
    def lost(self) -> int:
        return self.sent - self.received

    def percentile(self, q: float) -> float | None:
        if not self.lateness_ms:
            return None
        ordered = sorted(self.lateness_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m starlight_py.bench.expiry", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--url", help="AMQP URL of a running proxy (nothing is started)")
    parser.add_argument("--rabbitmq-url", help="also measure this RabbitMQ, in the same run")
    parser.add_argument("--messages", type=int, default=200, help="per scenario (default 200)")
    parser.add_argument("--ttl-ms", type=int, default=500, help="TTL and x-delay (default 500)")
    parser.add_argument(
        "--gap-ms", type=float, default=20.0, help="between two publishes (default 20)"
    )
    parser.add_argument("--poll-ms", type=float, default=50.0, help="get poll (default 50)")
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help=f"of {', '.join(SCENARIOS)}"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--proxy-code", type=Path, help="run the proxies from this checkout (before/after)"
    )
    parser.add_argument(
        "--handover",
        action="store_true",
        help="two proxies; stop the leading one halfway (queue-ttl only, no --url)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 when no message was lost or early on the proxy, 1 otherwise."""
    args = build_parser().parse_args(argv)
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown or args.messages <= 0 or args.ttl_ms <= 0:
        print(f"bad arguments (unknown scenarios: {unknown})", file=sys.stderr)
        return 2
    if args.handover and args.url:
        print("--handover starts its own proxies: leave out --url", file=sys.stderr)
        return 2
    with ExitStack() as stack:
        url = args.url
        if args.handover:
            try:
                return _handover(stack, args)
            except BenchError as e:
                say(f"cannot run: {e}")
                return 1
        if url is None:
            try:
                url = private_proxy(stack, "starlight-expiry-", code=args.proxy_code)
            except BenchError as e:
                say(f"cannot run: {e}")
                return 1
        targets = [("proxy", url)]
        if args.rabbitmq_url:
            targets.append(("rabbitmq", args.rabbitmq_url))
        results: list[Result] = []
        for scenario in scenarios:
            for broker, target_url in targets:
                say(f"{scenario} on {broker}: {args.messages} messages")
                results.append(measure(broker, target_url, scenario, args))
    print(table(results, args))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    proxy_bad = [r for r in results if r.broker == "proxy" and (r.lost or r.early or r.error)]
    return 1 if proxy_bad else 0


def _handover(stack: ExitStack, args: argparse.Namespace) -> int:
    work_dir = Path(tempfile.mkdtemp(prefix="starlight-expiry-"))
    stack.callback(shutil.rmtree, work_dir, True)
    endpoints = start_pulsar(stack, work_dir)
    for name in ("first", "second"):
        (work_dir / name).mkdir()
    first, _ = start_proxy(stack, work_dir / "first", endpoints, code=args.proxy_code)
    _, url = start_proxy(stack, work_dir / "second", endpoints, code=args.proxy_code)
    time.sleep(2.0)  # both stand in the election; the first one leads
    say(f"queue-ttl through the second proxy; the first stops after {args.messages // 2}")
    result = measure("proxy", url, "queue-ttl", args, halfway=lambda: first.stop(grace=30.0))
    led = "now leads the SubscriptionCleaner" in first.log_path.read_text(errors="replace")
    say(f"the stopped proxy {'led' if led else 'did NOT lead'} the cleaner and the reaper")
    half = args.messages // 2
    before = Result("proxy", "queue-ttl, before the stop", sent=half)
    after = Result("proxy", "queue-ttl, after the stop", sent=result.sent - half)
    for part, values in ((before, result.lateness_ms[:half]), (after, result.lateness_ms[half:])):
        part.lateness_ms = values
        part.received = len(values)
        part.early = sum(1 for v in values if v < 0)
        part.first_ms = values[0] if values else None
    print(table([result, before, after], args))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in (result, before, after)], indent=1))
    return 1 if result.lost or result.early or result.error else 0


def measure(
    broker: str,
    url: str,
    scenario: str,
    args: argparse.Namespace,
    halfway: Callable[[], None] | None = None,
) -> Result:
    result = Result(broker, scenario)
    try:
        _run(url, scenario, args, result, halfway)
    except (pika.exceptions.AMQPError, OSError) as e:
        result.error = f"{type(e).__name__}: {e}"
    return result


def _run(
    url: str,
    scenario: str,
    args: argparse.Namespace,
    result: Result,
    halfway: Callable[[], None] | None,
) -> None:
    tag = uuid.uuid4().hex[:8]
    setup = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = setup.channel()
        channel.confirm_delivery()
        if scenario == "delayed-get":
            source, target = _declare_delayed(channel, tag)
        else:
            source, target = _declare_ttl(channel, tag, scenario, args.ttl_ms)
        if source is None:
            result.error = "not supported"
            return
        arrivals: dict[int, list[int]] = {}
        done = threading.Event()
        reader = threading.Thread(
            target=_read,
            args=(url, target, scenario == "delayed-get", args.poll_ms / 1000, arrivals, done),
            daemon=True,
        )
        reader.start()
        sent: dict[int, int] = {}
        for sequence in range(args.messages):
            if halfway is not None and sequence == args.messages // 2:
                # In a thread: the publishes go on while it stops.
                threading.Thread(target=halfway, daemon=True).start()
            properties = _properties(scenario, args.ttl_ms)
            published_ns = time.time_ns()
            sent[sequence] = published_ns
            exchange, key = source
            channel.basic_publish(exchange, key, BODY.pack(published_ns, sequence), properties)
            setup.sleep(args.gap_ms / 1000)
        deadline = time.monotonic() + args.ttl_ms / 1000 + GRACE_SECONDS
        while time.monotonic() < deadline and len(arrivals) < len(sent):
            setup.sleep(0.1)
        done.set()
        reader.join(timeout=5)
        result.sent = len(sent)
        _score(result, sent, arrivals, args.ttl_ms)
        _tidy(channel, tag, scenario)
    finally:
        if setup.is_open:
            setup.close()


def _declare_ttl(
    channel: BlockingChannel, tag: str, scenario: str, ttl_ms: int
) -> tuple[tuple[str, str] | None, str]:
    work, wait = f"bench-expiry-work-{tag}", f"bench-expiry-wait-{tag}"
    channel.queue_declare(work)
    arguments: dict[str, object] = {
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": work,
    }
    if scenario == "queue-ttl":
        arguments["x-message-ttl"] = ttl_ms
    channel.queue_declare(wait, arguments=arguments)
    return ("", wait), work


def _declare_delayed(channel: BlockingChannel, tag: str) -> tuple[tuple[str, str] | None, str]:
    exchange, queue = f"bench-expiry-delayed-{tag}", f"bench-expiry-due-{tag}"
    try:
        channel.exchange_declare(
            exchange, "x-delayed-message", arguments={"x-delayed-type": "direct"}
        )
    except pika.exceptions.ChannelClosedByBroker:
        return None, queue
    channel.queue_declare(queue)
    channel.queue_bind(queue, exchange, "due")
    return (exchange, "due"), queue


def _properties(scenario: str, ttl_ms: int) -> pika.BasicProperties | None:
    if scenario == "message-ttl":
        return pika.BasicProperties(expiration=str(ttl_ms))
    if scenario == "delayed-get":
        return pika.BasicProperties(headers={"x-delay": ttl_ms})
    return None


def _read(
    url: str,
    queue: str,
    polling: bool,
    poll_s: float,
    arrivals: dict[int, list[int]],
    done: threading.Event,
) -> None:
    """Consume (or poll with basic.get) `queue` until `done`, noting when each sequence came."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()

    def arrived(body: bytes) -> None:
        now = time.time_ns()
        _published, sequence = BODY.unpack(body)
        arrivals.setdefault(sequence, []).append(now)

    try:
        if polling:
            while not done.is_set():
                method, _properties, body = channel.basic_get(queue, auto_ack=True)
                if method is None:
                    connection.sleep(poll_s)
                else:
                    arrived(body)
        else:
            channel.basic_consume(queue, lambda _c, _m, _p, body: arrived(body), auto_ack=True)
            while not done.is_set():
                connection.process_data_events(time_limit=0.05)
    finally:
        if connection.is_open:
            connection.close()


def _score(
    result: Result, sent: dict[int, int], arrivals: dict[int, list[int]], ttl_ms: int
) -> None:
    for sequence, published_ns in sorted(sent.items()):
        times = arrivals.get(sequence)
        if not times:
            continue
        result.received += 1
        result.duplicates += len(times) - 1
        lateness = (min(times) - published_ns) / 1e6 - ttl_ms
        if lateness < 0:
            result.early += 1
        result.lateness_ms.append(lateness)
        if result.first_ms is None:
            result.first_ms = lateness


def _tidy(channel: BlockingChannel, tag: str, scenario: str) -> None:
    names = (
        [f"bench-expiry-due-{tag}"]
        if scenario == "delayed-get"
        else [f"bench-expiry-work-{tag}", f"bench-expiry-wait-{tag}"]
    )
    for name in names:
        channel.queue_delete(name)
    if scenario == "delayed-get":
        channel.exchange_delete(f"bench-expiry-delayed-{tag}")


def table(results: list[Result], args: argparse.Namespace) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    lines = [
        f"{args.messages} messages per row, TTL/delay {args.ttl_ms} ms, one every "
        f"{args.gap_ms:g} ms; lateness in ms after the due time",
        "",
        "| scenario | broker | received | lost | early | dup | min | p50 | p90 | p99 | max "
        "| first |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    pick: Callable[[Result, float], str] = lambda r, q: ms(r.percentile(q))  # noqa: E731
    for r in results:
        if r.error:
            lines.append(f"| {r.scenario} | {r.broker} | {r.error} |" + " |" * 10)
            continue
        low = min(r.lateness_ms) if r.lateness_ms else None
        high = max(r.lateness_ms) if r.lateness_ms else None
        lines.append(
            f"| {r.scenario} | {r.broker} | {r.received} | {r.lost} | {r.early} | "
            f"{r.duplicates} | {ms(low)} | {pick(r, 0.5)} | {pick(r, 0.9)} | "
            f"{pick(r, 0.99)} | {ms(high)} | {ms(r.first_ms)} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
