"""SIGTERM on a real proxy process: listeners close at once, clients get the drain period,
then 320 CONNECTION_FORCED after their confirms; unacked messages go to other proxies'
consumers; nothing confirmed is lost; the process exits 0."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pamqp import body as amqp_body
from pamqp import commands, frame
from pamqp import header as amqp_header
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from starlight_py.local import ServiceEndpoints, free_port
from starlight_py.local.proxy import ProxyProcess
from tests.integration.test_quiet_connections import metric
from tests.support.proxy_runner import ProxyThread
from tests.support.raw_amqp import RawClient

SHUTDOWN_TEXT = "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
# Generous: the process also closes Pulsar and ZooKeeper clients after the drain.
EXIT_MARGIN = 30.0


@dataclass
class RunningProxy:
    process: ProxyProcess
    metrics_url: str

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def port(self) -> int:
        return self.process.port


ProxyStarter = Callable[..., RunningProxy]


@pytest.fixture
def start_proxy_process(services: ServiceEndpoints, tmp_path: Path) -> Iterator[ProxyStarter]:
    """`starlight-proxy serve` as a separate process on the session's Pulsar and ZooKeeper,
    with /readyz on a port of its own."""
    started: list[ProxyProcess] = []

    def start(**settings: str) -> RunningProxy:
        metrics_port = free_port()
        proxy = ProxyProcess(
            f"proxy-{len(started)}",
            tmp_path / f"proxy-{len(started)}.log",
            {
                "configurationStoreServers": services.zookeeper,
                "brokerServiceURL": services.pulsar_service_url,
                "brokerWebServiceURL": services.pulsar_web_url,
                "amqpAutoCreateNamespaces": "true",
                "metricsListener": f"http://127.0.0.1:{metrics_port}",
                **settings,
            },
        )
        started.append(proxy)
        proxy.start()
        return RunningProxy(proxy, f"http://127.0.0.1:{metrics_port}")

    yield start
    for proxy in started:
        proxy.stop()


def readyz(proxy: RunningProxy) -> tuple[int, dict[str, object]]:
    url = f"{proxy.metrics_url}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


class ConfirmingPublisher(threading.Thread):
    """Publishes numbered messages with confirms until the broker closes the connection;
    `confirmed` holds every body the broker acknowledged."""

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(name="publisher", daemon=True)
        self.url = url
        self.queue = queue
        self.confirmed: list[str] = []
        self.closed_with: tuple[int, str] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(self.url))
            channel = connection.channel()
            channel.confirm_delivery()
            number = 0
            while True:
                body = f"m-{number}"
                # Raises NackError/UnroutableError if not confirmed: the test fails then.
                channel.basic_publish("", self.queue, body.encode(), mandatory=True)
                self.confirmed.append(body)
                number += 1
        except pika.exceptions.ConnectionClosedByBroker as e:
            self.closed_with = (e.reply_code, e.reply_text)
        except BaseException as e:  # surfaced by the test
            self.error = e


def consume_until(
    channel: BlockingChannel, queue: str, wanted: set[str], timeout: float
) -> dict[str, bool]:
    """Consume (acking) until every body in `wanted` arrived; returns body -> redelivered."""
    seen: dict[str, bool] = {}
    deadline = time.monotonic() + timeout
    for method, _properties, body in channel.consume(queue, inactivity_timeout=1):
        if method is not None:
            seen[body.decode()] = seen.get(body.decode(), False) or bool(method.redelivered)
            channel.basic_ack(method.delivery_tag)
        if wanted <= set(seen) or time.monotonic() > deadline:
            break
    channel.cancel()
    return seen


def test_sigterm_drains_then_closes_with_320_and_loses_nothing(
    start_proxy_process: ProxyStarter, start_proxy: Callable[..., ProxyThread]
) -> None:
    drain = 3.0
    doomed = start_proxy_process(shutdownDrainMillis=str(int(drain * 1000)))
    survivor = start_proxy()
    queue = f"graceful-{uuid.uuid4().hex[:8]}"
    declaring = pika.BlockingConnection(pika.URLParameters(survivor.amqp_url()))
    declaring.channel().queue_declare(queue, durable=True)
    declaring.close()

    # A consumer on the doomed proxy holds 20 deliveries without acking them.
    consumer = pika.BlockingConnection(pika.URLParameters(doomed.url))
    consumer_channel = consumer.channel()
    consumer_channel.basic_qos(prefetch_count=20)
    publisher = ConfirmingPublisher(doomed.url, queue)
    publisher.start()
    held: list[str] = []
    for method, _properties, body in consumer_channel.consume(queue, inactivity_timeout=30):
        assert method is not None, "no delivery within 30 s"
        held.append(body.decode())
        if len(held) == 20:
            break
    wait_until(lambda: len(publisher.confirmed) >= 200 or not publisher.is_alive(), 60, "200")
    assert publisher.error is None, publisher.error

    signalled = time.monotonic()
    doomed.process.send_signal(signal.SIGTERM)
    # Listeners close at once, while both clients stay connected.
    wait_until(lambda: refuses_connections(doomed.port), 5, "listener closed")
    status, answer = readyz(doomed)
    assert status == 503 and answer["problems"] == ["shutting down"]

    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        while True:
            consumer.process_data_events(time_limit=0.2)
            assert time.monotonic() - signalled < drain + EXIT_MARGIN, "no connection.close"
    closed_after = time.monotonic() - signalled
    assert closed.value.reply_code == 320
    assert closed.value.reply_text == SHUTDOWN_TEXT
    # The clients got the drain period (they were not closed at once).
    assert closed_after >= drain * 0.9
    publisher.join(30)
    assert publisher.error is None, publisher.error
    assert publisher.closed_with == (320, SHUTDOWN_TEXT)
    assert doomed.process.wait_exited(drain + EXIT_MARGIN) == 0
    assert time.monotonic() - signalled < drain + EXIT_MARGIN

    # Everything confirmed, and the unacked 20, reach a consumer on the other proxy.
    receiving = pika.BlockingConnection(pika.URLParameters(survivor.amqp_url()))
    channel = receiving.channel()
    channel.basic_qos(prefetch_count=500)
    confirmed = set(publisher.confirmed)
    assert len(confirmed) >= 200
    seen = consume_until(channel, queue, confirmed | set(held), timeout=120)
    channel.queue_delete(queue)
    receiving.close()
    missing = sorted(confirmed - set(seen), key=lambda b: int(b[2:]))
    assert missing == [], f"{len(missing)} confirmed messages lost: {missing[:10]}"
    # The unacked deliveries went back to the subscription. (Their `redelivered` flag is
    # not asserted: Pulsar does not count a redelivery caused by a consumer closing.)
    assert set(held) <= set(seen)

    log = doomed.process.log_path.read_text()
    # (At least 2: a probe of refuses_connections may have got in before the listener closed.)
    assert re.search(r"shutting down: listeners closed, \d+ client connection\(s\) open", log)
    assert "closing 2 remaining client connection(s)" in log
    assert "all client connections are closed" in log


def test_clients_that_leave_during_the_drain_end_it_early(
    start_proxy_process: ProxyStarter,
) -> None:
    doomed = start_proxy_process(shutdownDrainMillis="120000")
    staying = pika.BlockingConnection(pika.URLParameters(doomed.url))
    channel = staying.channel()
    doomed.process.send_signal(signal.SIGTERM)

    # A new connection is refused at once; the existing one keeps working meanwhile.
    wait_until(lambda: refuses_connections(doomed.port), 5, "listener closed")
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(
            pika.URLParameters(doomed.url + "?connection_attempts=1&socket_timeout=5")
        )
    assert readyz(doomed)[0] == 503
    channel.basic_qos(prefetch_count=7)
    assert staying.is_open

    # The last client leaving ends the drain long before its 120 s.
    staying.close()
    assert doomed.process.wait_exited(EXIT_MARGIN) == 0
    assert "all client connections are closed" in doomed.process.log_path.read_text()


def test_a_second_sigterm_cuts_the_drain_short(start_proxy_process: ProxyStarter) -> None:
    doomed = start_proxy_process(shutdownDrainMillis="120000")
    staying: BlockingConnection = pika.BlockingConnection(pika.URLParameters(doomed.url))
    staying.channel()
    doomed.process.send_signal(signal.SIGTERM)
    wait_until(lambda: refuses_connections(doomed.port), 5, "listener closed")
    staying.process_data_events(time_limit=0.5)
    assert staying.is_open  # still draining

    doomed.process.send_signal(signal.SIGTERM)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        deadline = time.monotonic() + EXIT_MARGIN
        while time.monotonic() < deadline:
            staying.process_data_events(time_limit=0.2)
    assert closed.value.reply_code == 320
    assert doomed.process.wait_exited(EXIT_MARGIN) == 0
    assert "drain cut short by a second signal: 1 connection(s) remain" in (
        doomed.process.log_path.read_text()
    )


class PipeliningPublisher:
    """Raw AMQP: publishes `p-<seq>` in bursts without waiting for confirms (so many are in
    flight at any time) and records every ack and nack, until the server closes."""

    def __init__(self, port: int, queue: str) -> None:
        self.client = RawClient("127.0.0.1", port)
        self.client.handshake(heartbeat=0)
        assert isinstance(self.client.open_channel(1), commands.Channel.OpenOk)
        self.client.send_method(1, commands.Confirm.Select())
        assert isinstance(self.client.read_method()[1], commands.Confirm.SelectOk)
        self.queue = queue
        self.sent = 0
        self.acked: set[int] = set()
        self.nacked: set[int] = set()
        self.close: commands.Connection.Close | None = None
        self.frames_after_close = 0
        self._settled = 0  # every tag up to this one has its ack or nack
        self._sender = threading.Thread(target=self._send, daemon=True)
        self._reader = threading.Thread(target=self._read, daemon=True)

    def start(self) -> None:
        # Blocking socket from here on: each thread uses one direction only.
        self.client.sock.settimeout(None)
        self._reader.start()
        self._sender.start()

    def join(self, timeout: float) -> None:
        self._reader.join(timeout)
        assert not self._reader.is_alive(), "the server never closed the connection"
        self.client.close()
        self._sender.join(timeout)

    def _send(self) -> None:
        properties = commands.Basic.Properties(delivery_mode=2)
        while self.close is None:
            burst = b""
            for _ in range(20):
                data = f"p-{self.sent + 1}".encode()
                burst += frame.marshal(commands.Basic.Publish(routing_key=self.queue), 1)
                burst += frame.marshal(amqp_header.ContentHeader(0, len(data), properties), 1)
                burst += frame.marshal(amqp_body.ContentBody(data), 1)
                self.sent += 1
            try:
                self.client.sock.sendall(burst)
            except OSError:
                return
            time.sleep(0.01)

    def _settle(self, tag: int, multiple: bool, into: set[int]) -> None:
        first = self._settled + 1 if multiple else tag
        into.update(range(first, tag + 1))
        self._settled = max(self._settled, tag) if multiple else self._settled
        while self._settled + 1 in self.acked or self._settled + 1 in self.nacked:
            self._settled += 1

    def _read(self) -> None:
        while True:
            try:
                _, method = self.client.read_method(timeout=120)
            except (EOFError, OSError):
                return
            if self.close is not None:
                self.frames_after_close += 1
            elif isinstance(method, commands.Basic.Ack):
                self._settle(method.delivery_tag, bool(method.multiple), self.acked)
            elif isinstance(method, commands.Basic.Nack):
                self._settle(method.delivery_tag, bool(method.multiple), self.nacked)
            elif isinstance(method, commands.Connection.Close):
                self.close = method
                self.client.send_method(0, commands.Connection.CloseOk())


def test_every_publish_that_reached_pulsar_was_confirmed_before_the_close(
    start_proxy_process: ProxyStarter, start_proxy: Callable[..., ProxyThread]
) -> None:
    """Publishes read by the proxy but not yet confirmed by Pulsar when the drain ends get
    their confirm before connection.close: what is stored is exactly what was acked."""
    doomed = start_proxy_process(shutdownDrainMillis="1000")
    survivor = start_proxy()
    queue = f"graceful-pipelined-{uuid.uuid4().hex[:8]}"
    declaring = pika.BlockingConnection(pika.URLParameters(survivor.amqp_url()))
    declaring.channel().queue_declare(queue, durable=True)
    declaring.close()

    publisher = PipeliningPublisher(doomed.port, queue)
    publisher.start()
    wait_until(lambda: len(publisher.acked) >= 500, 60, "500 confirms")
    doomed.process.send_signal(signal.SIGTERM)
    publisher.join(60)
    assert doomed.process.wait_exited(EXIT_MARGIN) == 0

    assert publisher.close is not None
    assert (publisher.close.reply_code, publisher.close.reply_text) == (320, SHUTDOWN_TEXT)
    assert publisher.nacked == set()
    # Confirms come as one contiguous run from 1, all of them before connection.close.
    assert publisher.acked == set(range(1, len(publisher.acked) + 1))
    assert publisher.frames_after_close == 0

    receiving = pika.BlockingConnection(pika.URLParameters(survivor.amqp_url()))
    channel = receiving.channel()
    channel.basic_qos(prefetch_count=500)
    wanted = {f"p-{seq}" for seq in publisher.acked}
    stored = set(consume_until(channel, queue, wanted, timeout=120))
    # Drain what else is there (messages stored but never confirmed would show up here).
    stored |= set(consume_until(channel, queue, {"none"}, timeout=5))
    channel.queue_delete(queue)
    receiving.close()
    assert stored == wanted, (
        f"stored but not confirmed: {sorted(stored - wanted)[:10]}; "
        f"confirmed but not stored: {sorted(wanted - stored)[:10]}"
    )


def test_sigterm_stops_a_proxy_still_waiting_for_zookeeper(
    services: ServiceEndpoints, tmp_path: Path
) -> None:
    # ZooKeeper unreachable at startup: the proxy keeps trying (and would serve with 541s
    # meanwhile), but a SIGTERM must still stop it, as at any other time.
    proxy = ProxyProcess(
        "proxy-without-zookeeper",
        tmp_path / "proxy.log",
        {
            "configurationStoreServers": f"127.0.0.1:{free_port()}",  # nothing listens
            "brokerServiceURL": services.pulsar_service_url,
            "brokerWebServiceURL": services.pulsar_web_url,
        },
    )
    proxy.launch()
    try:
        wait_until(
            lambda: "kazoo.client" in proxy.log_path.read_text(errors="replace"),
            EXIT_MARGIN,
            "the proxy tries to reach ZooKeeper",
        )
        proxy.send_signal(signal.SIGTERM)
        assert proxy.wait_exited(EXIT_MARGIN) == 0
    finally:
        proxy.stop()


def test_sigterm_closes_a_parked_connection_with_320_and_exits(
    start_proxy_process: ProxyStarter,
) -> None:
    """A quiet connection with no channel keeps no task (parked): the shutdown still
    sends it connection.close, and its close-ok ends the drain."""
    doomed = start_proxy_process(shutdownDrainMillis="500", amqpQuietConnectionAfterMillis="300")
    client = RawClient("127.0.0.1", doomed.port)
    try:
        client.handshake(heartbeat=5)
        wait_until(
            lambda: metric(f"{doomed.metrics_url}/metrics", "starlight_parked_connections") == 1,
            10,
            "the connection parked",
        )
        doomed.process.send_signal(signal.SIGTERM)
        close = client.expect_connection_close(timeout=EXIT_MARGIN)
        assert (close.reply_code, close.reply_text) == (320, SHUTDOWN_TEXT)
        assert doomed.process.wait_exited(EXIT_MARGIN) == 0
    finally:
        client.close()
