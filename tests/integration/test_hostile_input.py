"""Bad bytes close only the connection that sent them, with the code RabbitMQ uses."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import frame as pamqp_frame_module
from pamqp import header as pamqp_header

from starlight_py.amqp.connection import max_body_frames
from starlight_py.amqp.field_codec import MAX_FIELD_NESTING
from starlight_py.gateway.connection.connection_limits import REFUSING_AT_ONCE
from starlight_py.local import ServiceEndpoints
from starlight_py.local.proxy import ProxyProcess
from tests.integration.conftest import Broker, ProxyFactory
from tests.support.amqp_fixtures import Created, confirming_channel
from tests.support.raw_amqp import PROTOCOL_HEADER, RawClient


@pytest.mark.parametrize(
    "header",
    [b"AMQP\x00\x00\x08\x00", b"AMQP\x00\x00\x09\x00", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"],
    ids=["amqp-0-0-8", "amqp-0-9-0", "http"],
)
def test_wrong_protocol_header_gets_ours_then_close(broker: Broker, header: bytes) -> None:
    client = broker.raw()
    client.send(header)
    assert client.read_raw() == PROTOCOL_HEADER
    client.close()


def test_frame_over_frame_max_is_refused_before_its_payload(broker: Broker) -> None:
    client = broker.raw()
    client.handshake(frame_max=4096)
    client.open_channel(1)
    # Only the 7-byte header of a 1 MB method frame: the payload never comes, so an answer
    # proves the frame was refused on its header, without buffering anything.
    client.send(struct.pack(">BHI", 1, 1, 1_000_000))
    close = client.expect_connection_close(timeout=10)
    assert close.reply_code == 501
    client.close()


def test_frame_at_frame_max_is_accepted(broker: Broker) -> None:
    client = broker.raw()
    tuned = client.handshake(frame_max=4096)
    client.open_channel(1)
    # channel.close whose reply_text pads the frame to exactly frame_max bytes:
    # 8 (frame overhead) + 4 (method id) + 2 (code) + 1 (len) + text + 4 (class/method ids).
    text = "x" * 255
    method = commands.Channel.Close(200, text, 0, 0)
    client.send_method(1, method)
    channel, reply = client.read_method()
    assert (channel, type(reply)) == (1, commands.Channel.CloseOk)
    assert tuned.frame_max == 4096
    client.close()


def test_channel_max_exceeded_closes_the_connection_with_530(broker: Broker) -> None:
    client = broker.raw()
    client.handshake(channel_max=2)
    # RabbitMQ 3.10 limits how many channels are open, whatever their numbers.
    assert isinstance(client.open_channel(5), commands.Channel.OpenOk)
    assert isinstance(client.open_channel(65535), commands.Channel.OpenOk)
    client.send_method(1, commands.Channel.Open())
    close = client.expect_connection_close()
    assert (close.reply_code, close.class_id, close.method_id) == (530, 0, 0)
    assert close.reply_text == (
        "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)"
    )
    client.close()


def test_method_on_unopened_channel_is_504(broker: Broker) -> None:
    client = broker.raw()
    client.handshake()
    client.send_method(5, commands.Basic.Qos(prefetch_count=1))
    assert client.expect_connection_close().reply_code == 504
    client.close()


def test_second_channel_open_is_504(broker: Broker) -> None:
    client = broker.raw()
    client.handshake()
    client.open_channel(1)
    client.send_method(1, commands.Channel.Open())
    assert client.expect_connection_close().reply_code == 504
    client.close()


def test_bad_frame_end_byte_is_501(broker: Broker) -> None:
    client = broker.raw()
    client.handshake()
    frame = bytearray(pamqp_frame(1, commands.Channel.Open()))
    frame[-1] = 0x00
    client.send(bytes(frame))
    assert client.expect_connection_close().reply_code == 501
    client.close()


def test_unknown_frame_type_is_501(broker: Broker) -> None:
    client = broker.raw()
    client.handshake()
    client.send(struct.pack(">BHI", 9, 0, 0) + b"\xce")
    assert client.expect_connection_close().reply_code == 501
    client.close()


def test_content_header_without_publish_is_505(broker: Broker) -> None:
    client = broker.raw()
    client.handshake()
    client.open_channel(1)
    header = commands.Basic.Properties()
    client.send(pamqp_frame(1, pamqp_header.ContentHeader(0, 10, header)))
    assert client.expect_connection_close().reply_code == 505
    client.close()


def test_oversized_message_closes_only_the_channel_with_406(
    proxy_only: None, start_proxy: ProxyFactory
) -> None:
    proxy = start_proxy(amqpMaxMessageSize="1000")
    client = RawClient("127.0.0.1", proxy.port)
    client.handshake()
    client.open_channel(1)
    client.open_channel(2)
    client.send_method(1, commands.Basic.Publish(exchange="", routing_key="q"))
    client.send(pamqp_frame(1, pamqp_header.ContentHeader(0, 1001, commands.Basic.Properties())))
    channel, close = client.read_method()
    assert channel == 1 and isinstance(close, commands.Channel.Close)
    assert close.reply_code == 406
    assert "larger than configured max size 1000" in close.reply_text
    assert (close.class_id, close.method_id) == (60, 40)  # basic.publish
    # The body that follows is discarded; the channel closes; channel 2 lives on.
    client.send(pamqp_frame(1, pamqp_body.ContentBody(b"x" * 1001)))
    client.send_method(1, commands.Channel.CloseOk())
    client.send_method(2, commands.Basic.Qos(prefetch_count=5))
    channel, reply = client.read_method()
    assert (channel, type(reply)) == (2, commands.Basic.QosOk)
    assert isinstance(client.open_channel(1), commands.Channel.OpenOk)
    client.close()


def test_oversized_message_from_pika_leaves_the_connection_usable(
    proxy_only: None, start_proxy: ProxyFactory
) -> None:
    proxy = start_proxy(amqpMaxMessageSize="1000")
    connection = pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))
    channel = connection.channel()
    channel.basic_publish("", "q", b"x" * 1001)
    connection.process_data_events(time_limit=1)
    assert channel.is_closed
    assert connection.is_open and connection.channel().is_open
    connection.close()


def garbage_payloads() -> list[bytes]:
    rng = random.Random(20261122)
    payloads = [bytes(rng.getrandbits(8) for _ in range(size)) for size in (1, 7, 100, 5000)]
    payloads.append(PROTOCOL_HEADER + bytes(rng.getrandbits(8) for _ in range(300)))
    payloads.append(b"\x00" * 64)
    payloads.append(b"\xff" * 70_000)
    return payloads


def test_garbage_from_other_clients_leaves_a_working_client_alone(broker: Broker) -> None:
    good = pika.BlockingConnection(pika.URLParameters(broker.url()))
    channel = good.channel()
    for payload in garbage_payloads():
        bad = broker.raw()
        try:
            bad.send(payload)
            bad.wait_closed(timeout=15)
        except (ConnectionResetError, BrokenPipeError):
            pass  # the server hung up while we were still sending: also a close
        finally:
            bad.close()
        # Garbage after a good handshake too.
        bad = broker.raw()
        bad.handshake()
        bad.send(payload)
        try:
            close = bad.expect_connection_close(timeout=3)
            assert close.reply_code in (501, 502, 503, 504, 505), close
        except (EOFError, ConnectionResetError):
            pass
        except TimeoutError:
            # A fragment that could still be the start of a valid frame: the server rightly
            # waits for the rest (heartbeats end it if nothing comes).
            assert len(payload) < 70_000
        bad.close()
        good.process_data_events(0)
        assert channel.is_open
    assert good.channel().is_open
    good.close()
    fresh = pika.BlockingConnection(pika.URLParameters(broker.url()))
    fresh.close()


def pamqp_frame(channel: int, value: object) -> bytes:
    return pamqp_frame_module.marshal(value, channel)  # type: ignore[arg-type]


def test_truncated_method_is_501_cannot_decode_with_its_ids(broker: Broker) -> None:
    client = broker.raw()
    client.handshake()
    client.open_channel(1)
    client.send(struct.pack(">BHI", 1, 1, 5) + struct.pack(">HH", 60, 10) + b"\x00\xce")
    close = client.expect_connection_close()
    assert (close.reply_code, close.class_id, close.method_id) == (501, 60, 10)
    assert "cannot decode" in close.reply_text
    client.close()


def test_heartbeat_on_a_channel_is_505(broker: Broker) -> None:
    client = broker.raw()
    client.handshake()
    client.send(struct.pack(">BHI", 8, 1, 0) + b"\xce")
    assert client.expect_connection_close().reply_code == 505
    client.close()


def test_unsolicited_channel_close_ok_is_503(broker: Broker) -> None:
    client = broker.raw()
    client.handshake()
    client.open_channel(1)
    client.send_method(1, commands.Channel.CloseOk())
    close = client.expect_connection_close()
    assert (close.reply_code, close.class_id, close.method_id) == (503, 20, 41)
    client.close()


def test_method_on_unopened_channel_reports_its_ids(broker: Broker) -> None:
    client = broker.raw()
    client.handshake()
    client.send_method(5, commands.Basic.Qos(prefetch_count=1))
    close = client.expect_connection_close()
    assert (close.reply_code, close.class_id, close.method_id) == (504, 60, 10)
    client.close()


def test_amqp_0_9_header_is_answered_with_connection_start(broker: Broker) -> None:
    client = broker.raw()
    client.send(b"AMQP\x01\x01\x00\x09")
    _, start = client.read_method()
    assert isinstance(start, commands.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    client.close()


# --- each hostile case next to a well-behaved client ---------------------------------------


class Bystander:
    """A well-behaved pika client on the same proxy: after each hostile act it must still
    publish and get its own message back."""

    def __init__(self, url: str) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()
        self.queue = self.channel.queue_declare("", exclusive=True).method.queue
        self.rounds = 0

    def check(self) -> None:
        self.rounds += 1
        body = f"still here {self.rounds}".encode()
        self.channel.basic_publish("", self.queue, body)
        deadline = time.monotonic() + 15
        while True:
            method, _, got = self.channel.basic_get(self.queue, auto_ack=True)
            if method is not None:
                assert got == body
                return
            assert time.monotonic() < deadline, "the bystander's message never came back"
            time.sleep(0.05)

    def close(self) -> None:
        self.connection.close()


@pytest.fixture
def bystander(broker: Broker) -> Iterator[Bystander]:
    client = Bystander(broker.url())
    yield client
    client.check()
    client.close()


def nested_table(depth: int) -> bytes:
    """An encoded field table with `depth` tables inside one another."""
    table = b""
    for _ in range(depth):
        table = b"\x01aF" + struct.pack(">I", len(table)) + table
    return table


def declare_with_arguments(table: bytes) -> bytes:
    payload = (
        struct.pack(">HH", 50, 10)
        + b"\x00\x00"  # ticket
        + b"\x05hostq"
        + b"\x00"  # bits
        + struct.pack(">I", len(table))
        + table
    )
    return struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce"


@pytest.mark.parametrize("depth", [MAX_FIELD_NESTING, 15_000])
def test_field_tables_nested_too_deeply_are_501(
    proxy_only: None, broker: Broker, bystander: Bystander, depth: int
) -> None:
    client = broker.raw()
    client.handshake()  # 15,000 levels: 105 kB, within the default frame_max
    client.open_channel(1)
    client.send(declare_with_arguments(nested_table(depth)))
    close = client.expect_connection_close()
    assert (close.reply_code, close.class_id, close.method_id) == (501, 50, 10)
    assert "nested" in close.reply_text
    client.close()
    bystander.check()


def test_headers_nested_too_deeply_are_501(
    proxy_only: None, broker: Broker, bystander: Bystander
) -> None:
    headers: dict[str, object] = {}
    for _ in range(MAX_FIELD_NESTING):
        headers = {"a": headers}
    client = broker.raw()
    client.handshake()
    client.open_channel(1)
    client.send_method(1, commands.Basic.Publish(exchange="", routing_key="q"))
    client.send(
        pamqp_frame(1, pamqp_header.ContentHeader(0, 1, commands.Basic.Properties(headers=headers)))
    )
    assert client.expect_connection_close().reply_code == 501
    client.close()
    bystander.check()


def test_field_table_length_beyond_the_frame_is_501(broker: Broker, bystander: Bystander) -> None:
    client = broker.raw()
    client.handshake()
    client.open_channel(1)
    payload = (
        struct.pack(">HH", 50, 10)
        + b"\x00\x00\x05hostq\x00"
        + struct.pack(">I", 1_000_000)  # the arguments table claims a megabyte
        + b"\x01aI\x00\x00\x00\x01"
    )
    client.send(struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce")
    close = client.expect_connection_close()
    assert (close.reply_code, close.class_id, close.method_id) == (501, 50, 10)
    client.close()
    bystander.check()


def test_short_string_length_beyond_the_frame_is_501(broker: Broker, bystander: Bystander) -> None:
    client = broker.raw()
    client.handshake()
    client.open_channel(1)
    payload = struct.pack(">HH", 50, 10) + b"\x00\x00" + b"\xffshort"  # 255 claimed, 5 sent
    client.send(struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce")
    close = client.expect_connection_close()
    assert (close.reply_code, close.class_id, close.method_id) == (501, 50, 10)
    client.close()
    bystander.check()


def test_body_without_a_content_header_is_505(broker: Broker, bystander: Bystander) -> None:
    client = broker.raw()
    client.handshake()
    client.open_channel(1)
    client.send_method(1, commands.Basic.Publish(exchange="", routing_key="q"))
    client.send(pamqp_frame(1, pamqp_body.ContentBody(b"body first")))
    assert client.expect_connection_close().reply_code == 505
    client.close()
    bystander.check()


def test_method_in_the_middle_of_a_message_is_505(broker: Broker, bystander: Bystander) -> None:
    client = broker.raw()
    client.handshake()
    client.open_channel(1)
    client.send_method(1, commands.Basic.Publish(exchange="", routing_key="q"))
    client.send(pamqp_frame(1, pamqp_header.ContentHeader(0, 10, commands.Basic.Properties())))
    client.send_method(1, commands.Basic.Qos(prefetch_count=1))
    assert client.expect_connection_close().reply_code == 505
    client.close()
    bystander.check()


def test_body_longer_than_its_header_declared_is_505(
    proxy_only: None, broker: Broker, bystander: Bystander
) -> None:
    client = broker.raw()
    client.handshake()
    client.open_channel(1)
    client.send_method(1, commands.Basic.Publish(exchange="", routing_key="q"))
    client.send(pamqp_frame(1, pamqp_header.ContentHeader(0, 3, commands.Basic.Properties())))
    client.send(pamqp_frame(1, pamqp_body.ContentBody(b"four")))
    assert client.expect_connection_close().reply_code == 505
    client.close()
    bystander.check()


def test_message_in_too_many_body_frames_is_506(
    proxy_only: None, broker: Broker, bystander: Bystander
) -> None:
    size = 4096
    client = broker.raw()
    client.handshake()
    client.open_channel(1)
    client.send_method(1, commands.Basic.Publish(exchange="", routing_key="q"))
    client.send(pamqp_frame(1, pamqp_header.ContentHeader(0, size, commands.Basic.Properties())))
    empty = struct.pack(">BHI", 3, 1, 0) + b"\xce"
    with contextlib.suppress(OSError):  # the proxy may hang up while we still send
        client.send(empty * (max_body_frames(size) + 1))
    close = client.expect_connection_close()
    assert close.reply_code == 506
    assert "too many body frames" in close.reply_text
    client.close()
    bystander.check()


def test_handshake_trickled_byte_by_byte_is_cut_off(
    start_proxy: ProxyFactory,
) -> None:
    """A slowloris client keeps sending, one byte at a time: the handshake timeout counts
    from the TCP connect, not from the last byte."""
    proxy = start_proxy(amqpHandshakeTimeoutMillis="1500")
    good = Bystander(proxy.amqp_url())
    client = RawClient("127.0.0.1", proxy.port)
    start = time.monotonic()
    cut = False
    for byte in PROTOCOL_HEADER + b"\x00" * 200:
        try:
            client.send(bytes([byte]))
        except OSError:
            cut = True
            break
        if time.monotonic() - start > 20:
            break
        time.sleep(0.1)
    if not cut:
        client.wait_closed(timeout=5)
    assert time.monotonic() - start < 20
    client.close()
    good.check()
    good.close()


# --- connection limits ---------------------------------------------------------------------


def refused_open(client: RawClient) -> commands.Connection.Close:
    """Handshake up to connection.open and return the connection.close that answers it."""
    tune = client.login()
    assert isinstance(tune, commands.Connection.Tune), tune
    client.send_method(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
    client.send_method(0, commands.Connection.Open(virtual_host="/"))
    return client.expect_connection_close()


def test_connections_over_the_proxy_limit_get_530_at_open(start_proxy: ProxyFactory) -> None:
    proxy = start_proxy(amqpMaxConnections="3")
    held = [pika.BlockingConnection(pika.URLParameters(proxy.amqp_url())) for _ in range(3)]
    # pika reports a close at connection.open as a probable access denial, with the close.
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        pika.BlockingConnection(pika.URLParameters(proxy.amqp_url()))
    assert "(530) 'NOT_ALLOWED - connection refused: proxy connection limit (3) is reached'" in (
        str(info.value)
    )
    raw = RawClient("127.0.0.1", proxy.port)
    close = refused_open(raw)
    assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 40)
    raw.close()
    # The connections in place are untouched; once one goes, a new one gets in.
    for connection in held:
        assert connection.channel().is_open
    held.pop().close()
    deadline = time.monotonic() + 10
    while True:
        try:
            held.append(pika.BlockingConnection(pika.URLParameters(proxy.amqp_url())))
            break
        except pika.exceptions.ProbableAccessDeniedError:
            assert time.monotonic() < deadline, "the freed place never came back"
            time.sleep(0.1)
    for connection in held:
        connection.close()


def test_connections_over_the_per_address_limit_get_530(start_proxy: ProxyFactory) -> None:
    proxy = start_proxy(amqpMaxConnectionsPerIp="2")
    first, second = (RawClient("127.0.0.1", proxy.port) for _ in range(2))
    first.handshake()
    second.handshake()
    third = RawClient("127.0.0.1", proxy.port)
    close = refused_open(third)
    assert close.reply_code == 530
    assert "per client address (2)" in close.reply_text and "127.0.0.1" in close.reply_text
    third.close()
    # Another address (all of 127/8 is loopback on Linux) has its own allowance.
    other = socket.create_connection(("127.0.0.1", proxy.port), source_address=("127.0.0.2", 0))
    from_elsewhere = RawClient.from_socket(other)
    from_elsewhere.handshake()
    assert isinstance(from_elsewhere.open_channel(1), commands.Channel.OpenOk)
    for client in (first, second, from_elsewhere):
        assert isinstance(client.open_channel(2), commands.Channel.OpenOk)
        client.close()


def test_a_flood_over_the_limit_is_dropped(
    start_proxy: ProxyFactory,
) -> None:
    """Sockets over the limit that say nothing: a few wait for their refusal, the rest are
    closed at once; the proxy's own client keeps working and gets its place back."""
    proxy = start_proxy(amqpMaxConnections="1", amqpHandshakeTimeoutMillis="30000")
    good = Bystander(proxy.amqp_url())
    flood = [RawClient("127.0.0.1", proxy.port, timeout=5) for _ in range(REFUSING_AT_ONCE + 20)]
    dropped = 0
    for client in flood:
        client.sock.settimeout(0.2)
        try:
            if client.sock.recv(1) == b"":
                dropped += 1
        except TimeoutError:
            pass  # still waiting for its handshake (and its refusal)
        except ConnectionResetError:
            dropped += 1
    assert dropped >= 20
    good.check()
    for client in flood:
        client.close()
    good.close()


def test_a_client_that_does_not_read_is_not_read_either(
    proxy_only: None, broker: Broker, bystander: Bystander, created: Created
) -> None:
    """A client that asks for a lot (here: gets of 1 MB messages) and does not read the
    answers: once a few MiB wait for it, the proxy stops reading what it sends, instead of
    buffering its output without end. Its sends then stall; a proxy that kept reading would
    take small frames off the socket as fast as they come."""
    queue = created.queue()
    filler = confirming_channel(bystander.connection)
    filler.queue_declare(queue)
    for _ in range(12):
        filler.basic_publish("", queue, b"m" * 1_000_000)
    client = broker.raw()
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.handshake(heartbeat=0)
    client.open_channel(1)
    for _ in range(12):
        client.send_method(1, commands.Basic.Get(queue=queue, no_ack=True))
    qos = pamqp_frame(1, commands.Basic.Qos(prefetch_count=1)) * 1000
    client.sock.settimeout(3)
    sent = 0
    stalled = False
    while sent < 16 * 1024 * 1024:
        try:
            client.sock.sendall(qos)
        except TimeoutError:
            stalled = True
            break
        sent += len(qos)
    assert stalled, f"the proxy took {sent} more bytes from a client that reads nothing"
    client.close()
    bystander.check()


def resident_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


# How long six clients send deeply nested frames (the figure was taken over 60 s).
NESTING_FLOOD_SECONDS = float(os.environ.get("STARLIGHT_NESTING_FLOOD_SECONDS", "8"))


def test_six_clients_sending_deep_nestings_leave_memory_flat(
    services: ServiceEndpoints, tmp_path: Path
) -> None:
    # A 15,000-level table is a 105 KB frame. pamqp's decoder recursed into it, copying the
    # rest of the frame at every level: ~98 MB per frame until the garbage collector ran,
    # and six such clients took a proxy to 1.5 GB. RSS must stay within +50 MB.
    proxy = ProxyProcess(
        "proxy-nesting",
        tmp_path / "proxy.log",
        {
            "configurationStoreServers": services.zookeeper,
            "brokerServiceURL": services.pulsar_service_url,
            "brokerWebServiceURL": services.pulsar_web_url,
        },
    )
    proxy.start()
    try:
        assert proxy.pid is not None
        frame = declare_with_arguments(nested_table(15_000))
        bystander = Bystander(f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F")

        def hostile_once() -> None:
            client = RawClient("127.0.0.1", proxy.port)
            try:
                client.handshake()
                client.open_channel(1)
                client.send(frame)
                assert client.expect_connection_close().reply_code == 501
            finally:
                client.close()

        hostile_once()  # warm up: what a first connection allocates is not growth
        bystander.check()
        before = resident_kib(proxy.pid)
        deadline = time.monotonic() + NESTING_FLOOD_SECONDS
        sent = [0] * 6
        errors: list[BaseException] = []

        def flood(index: int) -> None:
            try:
                while time.monotonic() < deadline:
                    hostile_once()
                    sent[index] += 1
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=flood, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        peak = before
        while any(thread.is_alive() for thread in threads):
            bystander.check()
            peak = max(peak, resident_kib(proxy.pid))
            time.sleep(0.1)
        assert not errors, errors
        after = resident_kib(proxy.pid)
        bystander.check()
        bystander.close()
        print(
            f"{sum(sent)} nested frames from 6 clients in {NESTING_FLOOD_SECONDS:.0f} s: "
            f"RSS {before // 1024} MB before, peak {peak // 1024} MB, "
            f"{after // 1024} MB after"
        )
        assert sum(sent) >= 6
        assert peak - before < 50 * 1024
    finally:
        proxy.stop()


def test_a_client_that_never_answers_connection_close_is_hung_up_on(broker: Broker) -> None:
    """The broker closes the connection (504 here) and the client sends no close-ok: the
    broker still ends the connection (the proxy after CLOSE_OK_TIMEOUT, 3 s), whatever its
    heartbeat, and does not wait for the client forever."""
    client = broker.raw()
    client.handshake(heartbeat=600)
    client.send_method(5, commands.Basic.Qos(prefetch_count=1))
    assert client.expect_connection_close().reply_code == 504
    client.wait_closed(timeout=30)
    client.close()
