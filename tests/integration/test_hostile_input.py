"""Bad bytes close only the connection that sent them, with the code RabbitMQ uses."""

from __future__ import annotations

import random
import struct

import pika
import pytest
from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import frame as pamqp_frame_module
from pamqp import header as pamqp_header

from tests.integration.conftest import Broker, ProxyFactory
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
    assert isinstance(client.open_channel(1), commands.Channel.OpenOk)
    assert isinstance(client.open_channel(2), commands.Channel.OpenOk)
    client.send_method(3, commands.Channel.Open())
    close = client.expect_connection_close()
    assert close.reply_code == 530
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
