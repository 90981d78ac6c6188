"""Playbooks for the sans-IO AMQP server: feed client bytes, check events and exact replies.

Client frames are built with pamqp and what the server queues is decoded with pamqp, so the
tests check the wire, not our own encoder against itself.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest
from pamqp import body, commands, frame, header, heartbeat
from pamqp.base import Frame as PamqpMethod
from pamqp.encode import field_table

from starlight_py.amqp import events as ev
from starlight_py.amqp.connection import AMQPConnection, ServerSettings
from starlight_py.amqp.errors import (
    AccessRefused,
    ChannelStateError,
    CommandInvalid,
    ConnectionAccessRefused,
    FrameError,
    InternalError,
    NotAllowed,
    NotFound,
    PreconditionFailed,
    UnexpectedFrame,
)
from starlight_py.amqp.framing import PROTOCOL_HEADER
from starlight_py.units import KIB

SERVER_PROPERTIES = {"product": "starlight-py", "capabilities": {"publisher_confirms": True}}
SETTINGS = ServerSettings(
    channel_max=8,
    frame_max=8 * KIB,
    heartbeat=30,
    max_message_size=64 * KIB,
    server_properties=SERVER_PROPERTIES,
)
PLAIN_RESPONSE = "\x00guest\x00secret"

Summary = tuple[int, str, dict[str, Any]]


# ---- helpers -------------------------------------------------------------------------------


def marshal(channel: int, value: Any) -> bytes:
    data: bytes = frame.marshal(value, channel)
    return data


def summary(channel: int, value: Any) -> Summary:
    """A comparable (channel, name, fields) for anything pamqp decodes."""
    if isinstance(value, PamqpMethod):
        return channel, value.name, dict(value)
    if isinstance(value, header.ContentHeader):
        return (
            channel,
            "ContentHeader",
            {"body_size": value.body_size, "properties": value.properties},
        )
    if isinstance(value, body.ContentBody):
        return channel, "ContentBody", {"value": bytes(value.value)}
    if isinstance(value, heartbeat.Heartbeat):
        return channel, "Heartbeat", {}
    raise AssertionError(f"unexpected frame {value!r}")


def decode_all(data: bytes) -> list[tuple[int, Any]]:
    frames = []
    while data:
        used, channel, value = frame.unmarshal(data)
        frames.append((channel, value))
        data = data[used:]
    return frames


def sent(conn: AMQPConnection) -> list[Summary]:
    """What the server queued since the last call, decoded by pamqp."""
    return [summary(channel, value) for channel, value in decode_all(conn.data_to_send())]


def m(channel: int, method: PamqpMethod) -> Summary:
    return summary(channel, method)


def connection_close(code: int, text: str, class_id: int = 0, method_id: int = 0) -> Summary:
    return m(
        0,
        commands.Connection.Close(
            reply_code=code, reply_text=text, class_id=class_id, method_id=method_id
        ),
    )


def single_close(frames: list[Summary]) -> dict[str, Any]:
    """The fields of the only frame sent, which must be a connection.close."""
    assert [(ch, name) for ch, name, _ in frames] == [(0, "Connection.Close")]
    return frames[0][2]


def start_ok(mechanism: str = "PLAIN", response: str = PLAIN_RESPONSE) -> bytes:
    return marshal(
        0,
        commands.Connection.StartOk(
            client_properties={"product": "pika"},
            mechanism=mechanism,
            response=response,
            locale="en_US",
        ),
    )


def tune_ok(channel_max: int = 8, frame_max: int = 8 * KIB, heartbeat: int = 30) -> bytes:
    return marshal(
        0,
        commands.Connection.TuneOk(
            channel_max=channel_max, frame_max=frame_max, heartbeat=heartbeat
        ),
    )


def connection_open(vhost: str = "/") -> bytes:
    return marshal(0, commands.Connection.Open(virtual_host=vhost))


def awaiting_tune_ok(settings: ServerSettings = SETTINGS) -> AMQPConnection:
    conn = AMQPConnection(settings)
    conn.receive_data(PROTOCOL_HEADER + start_ok())
    conn.accept_login()
    conn.data_to_send()
    return conn


def open_connection(
    settings: ServerSettings = SETTINGS, channel_max: int = 8, frame_max: int = 8 * KIB
) -> AMQPConnection:
    conn = awaiting_tune_ok(settings)
    assert conn.receive_data(tune_ok(channel_max, frame_max)) == []
    assert conn.receive_data(connection_open()) == [ev.OpenRequested("/")]
    conn.accept_open()
    assert sent(conn) == [m(0, commands.Connection.OpenOk())]
    assert conn.is_open
    return conn


def open_channels(conn: AMQPConnection, *numbers: int) -> None:
    for number in numbers:
        assert conn.receive_data(marshal(number, commands.Channel.Open())) == [
            ev.ChannelOpened(number)
        ]
        assert sent(conn) == [m(number, commands.Channel.OpenOk())]


def publish_frames(
    channel: int,
    payload: bytes,
    properties: commands.Basic.Properties | None = None,
    body_frame_size: int | None = None,
    routing_key: str = "rk",
) -> bytes:
    """basic.publish + content header + body frames of at most body_frame_size bytes."""
    props = properties or commands.Basic.Properties()
    parts = [
        marshal(channel, commands.Basic.Publish(exchange="ex", routing_key=routing_key)),
        marshal(channel, header.ContentHeader(0, len(payload), props)),
    ]
    step = body_frame_size or max(len(payload), 1)
    parts += [
        marshal(channel, body.ContentBody(payload[i : i + step]))
        for i in range(0, len(payload), step)
    ]
    return b"".join(parts)


def queue_declare(channel: int, queue: str = "q") -> bytes:
    return marshal(channel, commands.Queue.Declare(queue=queue))


def error_types(events: list[ev.Event]) -> list[type]:
    return [type(e.error) for e in events if isinstance(e, ev.ErrorRaised)]


# ---- protocol header -----------------------------------------------------------------------


def test_protocol_header_is_answered_with_connection_start() -> None:
    conn = AMQPConnection(SETTINGS)
    assert conn.receive_data(PROTOCOL_HEADER) == []
    assert sent(conn) == [
        m(
            0,
            commands.Connection.Start(
                version_major=0,
                version_minor=9,
                server_properties=SERVER_PROPERTIES,
                mechanisms="PLAIN AMQPLAIN",
                locales="en_US",
            ),
        )
    ]
    assert not conn.closed


@pytest.mark.parametrize(
    "wrong",
    [
        b"AMQP\x00\x00\x09\x02",
        b"AMQP\x00\x00\x08\x00",
        b"GET / HTTP/1.1\r\nHost: example\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01",  # a TLS ClientHello on a plain listener
    ],
)
def test_wrong_protocol_header_gets_our_header_and_a_hang_up(wrong: bytes) -> None:
    conn = AMQPConnection(SETTINGS)
    assert conn.receive_data(wrong) == []
    assert conn.data_to_send() == b"AMQP\x00\x00\x09\x01"
    assert conn.closed
    # Nothing more is read or answered.
    assert conn.receive_data(start_ok()) == []
    assert conn.data_to_send() == b""


def test_protocol_header_split_over_several_reads() -> None:
    conn = AMQPConnection(SETTINGS)
    for piece in (b"AM", b"QP\x00", b"\x00", b"\x09"):
        assert conn.receive_data(piece) == []
        assert conn.data_to_send() == b""
        assert not conn.closed
    assert conn.receive_data(b"\x01") == []
    assert [name for _, name, _ in sent(conn)] == ["Connection.Start"]


def test_wrong_protocol_header_split_over_reads_is_refused_when_it_diverges() -> None:
    conn = AMQPConnection(SETTINGS)
    assert conn.receive_data(b"AMQP") == []
    assert conn.data_to_send() == b""
    assert conn.receive_data(b"\x00\x00\x08\x00") == []
    assert conn.data_to_send() == PROTOCOL_HEADER
    assert conn.closed


def test_amqp_0_9_header_is_spoken_to_as_0_9_1_like_rabbitmq() -> None:
    conn = AMQPConnection(SETTINGS)
    assert conn.receive_data(b"AMQP\x01\x01\x00\x09") == []
    channel, start = decode_all(conn.data_to_send())[0]
    assert channel == 0 and isinstance(start, commands.Connection.Start)
    assert not conn.closed


def test_frames_in_the_same_chunk_as_the_header_are_processed() -> None:
    conn = AMQPConnection(SETTINGS)
    data = PROTOCOL_HEADER + start_ok()
    events = conn.receive_data(data[:10])
    events += conn.receive_data(data[10:])
    assert events == [ev.LoginRequested("PLAIN", b"\x00guest\x00secret", {"product": "pika"})]
    assert [name for _, name, _ in sent(conn)] == ["Connection.Start"]


# ---- start-ok / tune / open ----------------------------------------------------------------


def test_start_ok_asks_for_login_and_sends_nothing_until_accepted() -> None:
    conn = AMQPConnection(SETTINGS)
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    events = conn.receive_data(start_ok())
    assert events == [ev.LoginRequested("PLAIN", b"\x00guest\x00secret", {"product": "pika"})]
    assert conn.client_properties == {"product": "pika"}
    assert conn.data_to_send() == b""
    conn.accept_login()
    assert sent(conn) == [
        m(0, commands.Connection.Tune(channel_max=8, frame_max=8 * KIB, heartbeat=30))
    ]


def test_start_ok_response_that_is_not_utf8_is_passed_on_byte_for_byte() -> None:
    response = b"\x00user\x00\xff\xfe\xc3"
    payload = (
        struct.pack(">HH", 10, 11)
        + field_table({})
        + b"\x05PLAIN"
        + struct.pack(">I", len(response))
        + response
        + b"\x05en_US"
    )
    raw = struct.pack(">BHI", 1, 0, len(payload)) + payload + b"\xce"
    conn = AMQPConnection(SETTINGS)
    conn.receive_data(PROTOCOL_HEADER)
    assert conn.receive_data(raw) == [ev.LoginRequested("PLAIN", response, {})]


def test_amqplain_response_is_passed_on_raw() -> None:
    response = field_table({"LOGIN": "guest", "PASSWORD": "secret"})[4:]
    conn = AMQPConnection(SETTINGS)
    conn.receive_data(PROTOCOL_HEADER)
    events = conn.receive_data(start_ok("AMQPLAIN", response.decode("utf-8")))
    assert events == [ev.LoginRequested("AMQPLAIN", response, {"product": "pika"})]


def test_unknown_mechanism_closes_the_connection_with_503() -> None:
    conn = AMQPConnection(SETTINGS)
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    events = conn.receive_data(start_ok("EXTERNAL", ""))
    assert error_types(events) == [CommandInvalid]
    assert not any(isinstance(e, ev.LoginRequested) for e in events)
    assert sent(conn) == [
        connection_close(
            503, "COMMAND_INVALID - unknown authentication mechanism 'EXTERNAL'", 10, 11
        )
    ]
    # No tune for a refused start-ok, even if the shell asks.
    conn.accept_login()
    assert conn.data_to_send() == b""


def test_accept_login_outside_authentication_sends_nothing() -> None:
    conn = AMQPConnection(SETTINGS)
    conn.accept_login()
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    conn.accept_login()
    assert conn.data_to_send() == b""


@pytest.mark.parametrize(
    ("channel_max", "frame_max", "text"),
    [
        (0, 8 * KIB, "negotiated channel_max = 0 is higher than the maximum allowed value (8)"),
        (8, 0, "negotiated frame_max = 0 is higher than the maximum allowed value (8192)"),
        (8, 4095, "negotiated frame_max = 4095 is lower than the minimum allowed value (4096)"),
        (8, 1, "negotiated frame_max = 1 is lower than the minimum allowed value (4096)"),
        (9, 8 * KIB, "negotiated channel_max = 9 is higher than the maximum allowed value (8)"),
        (
            8,
            8 * KIB + 1,
            "negotiated frame_max = 8193 is higher than the maximum allowed value (8192)",
        ),
        (
            65535,
            8 * KIB,
            "negotiated channel_max = 65535 is higher than the maximum allowed value (8)",
        ),
    ],
)
def test_tune_ok_outside_the_server_limits_is_refused_with_530(
    channel_max: int, frame_max: int, text: str
) -> None:
    conn = awaiting_tune_ok()
    events = conn.receive_data(tune_ok(channel_max, frame_max))
    assert error_types(events) == [NotAllowed]
    assert sent(conn) == [connection_close(530, f"NOT_ALLOWED - {text}", 10, 31)]
    # The handshake does not go on.
    assert conn.receive_data(connection_open()) == []
    assert conn.data_to_send() == b""


def test_tune_ok_with_the_server_values_is_accepted() -> None:
    conn = awaiting_tune_ok()
    assert conn.receive_data(tune_ok(8, 8 * KIB, 30)) == []
    assert conn.data_to_send() == b""
    assert (conn.channel_max, conn.frame_max, conn.heartbeat) == (8, 8 * KIB, 30)


def test_tune_ok_with_lower_values_is_accepted_and_applied() -> None:
    conn = open_connection(channel_max=2, frame_max=4096)
    assert (conn.channel_max, conn.frame_max) == (2, 4096)
    open_channels(conn, 1, 2)
    # A frame of exactly the negotiated frame_max (4088 payload + 8) still goes through.
    payload = bytes(range(256)) * 15 + b"x" * 248
    assert len(payload) == 4096 - 8
    events = conn.receive_data(publish_frames(1, payload))
    assert [type(e) for e in events] == [ev.ContentReceived]
    assert events[0].body == payload
    # One byte more than the negotiated frame_max is refused at the frame header.
    events = conn.receive_data(marshal(1, body.ContentBody(payload + b"!")))
    assert error_types(events) == [FrameError]
    close = single_close(sent(conn))
    assert close["reply_code"] == 501
    assert conn.closed


def test_tune_ok_heartbeat_is_the_clients_choice() -> None:
    conn = awaiting_tune_ok()
    conn.receive_data(tune_ok(heartbeat=0))
    assert conn.heartbeat == 0


def test_lowered_channel_max_limits_how_many_channels_are_open() -> None:
    conn = open_connection(channel_max=2)
    open_channels(conn, 3, 65535)  # any number: RabbitMQ 3.10 counts channels
    conn.receive_data(marshal(1, commands.Channel.Open()))
    assert single_close(sent(conn))["reply_code"] == 530


def test_connection_open_asks_for_the_vhost_and_open_ok_waits_for_the_shell() -> None:
    conn = awaiting_tune_ok()
    conn.receive_data(tune_ok())
    conn.accept_open()  # too early: nothing happens
    assert conn.data_to_send() == b""
    assert conn.receive_data(connection_open("tenant/ns")) == [ev.OpenRequested("tenant/ns")]
    assert conn.virtual_host == "tenant/ns"
    assert conn.data_to_send() == b""
    assert not conn.is_open
    conn.accept_open()
    assert sent(conn) == [m(0, commands.Connection.OpenOk())]
    assert conn.is_open


def _after_header() -> AMQPConnection:
    conn = AMQPConnection(SETTINGS)
    conn.receive_data(PROTOCOL_HEADER)
    return conn


def _authenticating() -> AMQPConnection:
    conn = _after_header()
    conn.receive_data(start_ok())
    return conn


def _opening() -> AMQPConnection:
    conn = awaiting_tune_ok()
    conn.receive_data(tune_ok())
    conn.receive_data(connection_open())
    return conn


@pytest.mark.parametrize(
    ("make", "data", "ids"),
    [
        (_after_header, connection_open(), (10, 40)),
        (_after_header, tune_ok(), (10, 31)),
        (awaiting_tune_ok, connection_open(), (10, 40)),
        (awaiting_tune_ok, start_ok(), (10, 11)),
        (open_connection, start_ok(), (10, 11)),
        (open_connection, tune_ok(), (10, 31)),
        (open_connection, connection_open(), (10, 40)),
        (_after_header, marshal(0, commands.Channel.Open()), (20, 10)),
    ],
)
def test_method_out_of_handshake_order_closes_with_504_like_rabbitmq(
    make: Any, data: bytes, ids: tuple[int, int]
) -> None:
    conn = make()
    conn.data_to_send()
    events = conn.receive_data(data)
    assert error_types(events) == [ChannelStateError]
    close = single_close(sent(conn))
    assert (close["reply_code"], close["class_id"], close["method_id"]) == (504, *ids)
    assert "unexpected method in connection state" in close["reply_text"]


def test_a_pipelined_handshake_waits_for_the_shell_and_goes_on() -> None:
    # start-ok, tune-ok, connection.open and channel frames in one write, as some clients
    # send them without waiting for the replies (RabbitMQ accepts it).
    conn = _after_header()
    conn.data_to_send()
    events = conn.receive_data(
        start_ok()
        + tune_ok()
        + connection_open("v")
        + marshal(1, commands.Channel.Open())
        + marshal(1, commands.Basic.Qos(prefetch_count=5))
    )
    assert [type(e) for e in events] == [ev.LoginRequested]
    assert conn.resume() == []  # still waiting on the login
    conn.accept_login()
    assert conn.resume() == [ev.OpenRequested("v")]
    assert conn.resume() == []  # still waiting on the vhost
    conn.accept_open()
    events = conn.resume()
    assert [(type(e), getattr(e, "channel", None)) for e in events] == [
        (ev.ChannelOpened, 1),
        (ev.MethodReceived, 1),
    ]
    assert conn.resume() == []
    assert [name for _, name, _ in sent(conn)] == [
        "Connection.Tune",
        "Connection.OpenOk",
        "Channel.OpenOk",
    ]


@pytest.mark.parametrize(
    ("data", "accept", "ids"),
    [
        (tune_ok(), "", (10, 31)),
        (start_ok(), "login", (10, 11)),
        (connection_open(), "open", (10, 40)),
    ],
)
def test_a_method_pipelined_out_of_order_is_504_once_the_shell_answers(
    data: bytes, accept: str, ids: tuple[int, int]
) -> None:
    if accept == "open":
        conn = _opening()
        conn.receive_data(data)
        conn.accept_open()
    else:
        conn = _authenticating()
        conn.receive_data(data)
        conn.accept_login()
    conn.data_to_send()
    events = conn.resume()
    if accept == "":  # tune-ok in answer to the tune: fine
        assert events == [] and not conn.closed
        return
    assert error_types(events) == [ChannelStateError]
    close = single_close(sent(conn))
    assert (close["reply_code"], close["class_id"], close["method_id"]) == (504, *ids)


def test_frames_behind_a_refused_login_are_dropped() -> None:
    conn = _authenticating()
    conn.receive_data(tune_ok() + connection_open())
    conn.fail(ConnectionAccessRefused("refused", (10, 11)))
    conn.data_to_send()
    assert conn.resume() == []
    assert conn.data_to_send() == b""


def test_channel_frame_before_the_connection_is_open_closes_the_connection() -> None:
    conn = awaiting_tune_ok()
    events = conn.receive_data(marshal(1, commands.Channel.Open()))
    assert error_types(events) == [UnexpectedFrame]
    assert single_close(sent(conn))["reply_code"] == 505  # as RabbitMQ


def test_update_secret_on_an_open_connection_goes_to_the_shell() -> None:
    conn = open_connection()
    method = commands.Connection.UpdateSecret(new_secret="token", reason="refresh")
    events = conn.receive_data(marshal(0, method))
    assert len(events) == 1
    assert isinstance(events[0], ev.MethodReceived)
    assert events[0].channel == 0
    assert events[0].method.name == "Connection.UpdateSecret"
    assert conn.data_to_send() == b""


# ---- channels ------------------------------------------------------------------------------


def test_channel_open_is_answered_and_reported() -> None:
    conn = open_connection()
    events = conn.receive_data(marshal(1, commands.Channel.Open()))
    assert events == [ev.ChannelOpened(1)]
    assert sent(conn) == [m(1, commands.Channel.OpenOk())]
    assert conn.channel_is_open(1)
    assert conn.open_channels == [1]


def test_methods_on_an_open_channel_go_to_the_shell() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    events = conn.receive_data(queue_declare(1, "orders"))
    assert len(events) == 1
    assert isinstance(events[0], ev.MethodReceived)
    assert events[0].channel == 1
    assert events[0].method.name == "Queue.Declare"
    assert events[0].method.queue == "orders"
    assert conn.data_to_send() == b""


def test_a_channel_number_above_channel_max_opens_while_fewer_are_open() -> None:
    conn = open_connection()  # channel_max 8
    assert conn.receive_data(marshal(9, commands.Channel.Open())) == [ev.ChannelOpened(9)]
    assert conn.channel_is_open(9)


def test_more_channels_than_channel_max_is_refused_with_530() -> None:
    conn = open_connection(channel_max=3)
    open_channels(conn, 1, 2, 3)
    events = conn.receive_data(marshal(4, commands.Channel.Open()))
    assert error_types(events) == [NotAllowed]
    assert sent(conn) == [
        connection_close(
            530,
            "NOT_ALLOWED - number of channels opened (3) has reached the negotiated "
            "channel_max (3)",
            0,
            0,
        )
    ]


def test_second_channel_open_on_an_open_channel_is_504() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    events = conn.receive_data(marshal(1, commands.Channel.Open()))
    assert error_types(events) == [ChannelStateError]
    assert sent(conn) == [
        connection_close(504, "CHANNEL_ERROR - second 'channel.open' seen on channel 1", 20, 10)
    ]


def test_channel_open_while_the_server_closes_it_is_504() -> None:
    # RabbitMQ 3.10: the channel is still open until the client's close-ok.
    conn = open_connection()
    open_channels(conn, 1)
    conn.fail(NotFound("no queue 'q' in vhost '/'", (50, 10)), 1)
    sent(conn)
    events = conn.receive_data(marshal(1, commands.Channel.Open()))
    assert error_types(events) == [ChannelStateError]
    assert single_close(sent(conn))["reply_text"] == (
        "CHANNEL_ERROR - second 'channel.open' seen on channel 1"
    )


def test_crossing_channel_closes_end_with_the_clients_close_ok() -> None:
    # Our close (404) and the client's crossed: we answer its close, and its close-ok of
    # ours that follows is no stray frame (RabbitMQ 3.10 takes it the same way; aio-pika's
    # robust recovery probe does this).
    conn = open_connection()
    open_channels(conn, 1)
    conn.fail(NotFound("no queue 'q' in vhost '/'", (50, 10)), 1)
    sent(conn)
    close = commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
    assert conn.receive_data(marshal(1, close)) == []
    assert sent(conn) == [m(1, commands.Channel.CloseOk())]
    assert conn.receive_data(marshal(1, commands.Channel.CloseOk())) == [ev.ChannelClosed(1)]
    assert conn.receive_data(marshal(1, commands.Channel.Open())) == [ev.ChannelOpened(1)]


def test_method_on_a_channel_never_opened_is_504() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    events = conn.receive_data(queue_declare(2))
    assert error_types(events) == [ChannelStateError]
    assert single_close(sent(conn))["reply_code"] == 504
    assert not conn.channel_is_open(1)


@pytest.mark.parametrize(
    "frame_bytes",
    [
        marshal(2, header.ContentHeader(0, 1, commands.Basic.Properties())),
        marshal(2, body.ContentBody(b"x")),
    ],
)
def test_content_frame_on_a_channel_never_opened_is_504(frame_bytes: bytes) -> None:
    conn = open_connection()
    conn.receive_data(frame_bytes)
    assert single_close(sent(conn))["reply_code"] == 504


def test_client_channel_close_waits_for_the_shell_then_close_ok() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    close = commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
    assert conn.receive_data(marshal(1, close)) == [ev.ChannelCloseRequested(1, 200, "bye")]
    assert conn.data_to_send() == b""
    assert not conn.channel_is_open(1)
    # While the shell releases the channel, its frames are dropped and nothing is sent on it.
    assert conn.receive_data(queue_declare(1)) == []
    conn.send_method(1, commands.Basic.Ack(delivery_tag=1))
    assert conn.data_to_send() == b""
    conn.finish_channel_close(1)
    assert sent(conn) == [m(1, commands.Channel.CloseOk())]
    conn.finish_channel_close(1)  # a second call is a no-op
    assert conn.data_to_send() == b""
    # The number is free again.
    open_channels(conn, 1)


def test_finish_channel_close_for_an_open_channel_sends_nothing() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    conn.finish_channel_close(1)
    conn.finish_channel_close(5)
    assert conn.data_to_send() == b""
    assert conn.channel_is_open(1)


def test_fail_with_a_channel_error_closes_only_that_channel() -> None:
    conn = open_connection()
    open_channels(conn, 1, 2)
    conn.fail(NotFound("no queue 'q' in vhost '/'", (50, 10)), 1)
    assert sent(conn) == [
        m(
            1,
            commands.Channel.Close(
                reply_code=404,
                reply_text="NOT_FOUND - no queue 'q' in vhost '/'",
                class_id=50,
                method_id=10,
            ),
        )
    ]
    assert not conn.channel_is_open(1)
    assert conn.open_channels == [2]
    # Until the client's close-ok, everything else on channel 1 is discarded silently
    # (but a channel.open: test_channel_open_while_the_server_closes_it_is_504).
    discarded = (
        queue_declare(1) + publish_frames(1, b"payload") + marshal(1, body.ContentBody(b"stray"))
    )
    assert conn.receive_data(discarded) == []
    conn.send_method(1, commands.Basic.Ack(delivery_tag=1))
    assert conn.data_to_send() == b""
    # Channel 2 is unaffected.
    events = conn.receive_data(queue_declare(2))
    assert [(type(e), e.channel) for e in events] == [(ev.MethodReceived, 2)]
    assert conn.receive_data(marshal(1, commands.Channel.CloseOk())) == [ev.ChannelClosed(1)]
    assert conn.data_to_send() == b""
    assert conn.is_open
    open_channels(conn, 1)


def test_fail_on_a_channel_already_closing_sends_nothing_more() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    conn.fail(NotFound("no queue 'a'"), 1)
    conn.data_to_send()
    conn.fail(NotFound("no queue 'b'"), 1)
    conn.fail(NotFound("no channel"), 7)
    assert conn.data_to_send() == b""
    assert conn.is_open


def test_what_was_read_with_a_failing_method_is_discarded_by_the_shell() -> None:
    """One read can hold a method that fails and more after it (an unknown ack, then
    tx.commit): the events are out already, so the shell asks before carrying each out."""
    conn = open_connection()
    open_channels(conn, 1, 2)
    close = commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
    events = conn.receive_data(
        marshal(1, commands.Basic.Ack(delivery_tag=9))
        + marshal(1, commands.Tx.Commit())
        + queue_declare(2)
        + marshal(2, close)
    )
    assert [type(e) for e in events] == [
        ev.MethodReceived,
        ev.MethodReceived,
        ev.MethodReceived,
        ev.ChannelCloseRequested,
    ]
    assert not conn.discards_input_of(1)
    conn.fail(PreconditionFailed("unknown delivery tag 9", (60, 80)), 1)  # the shell's answer
    assert conn.discards_input_of(1)
    # Channel 2 is being closed by the client: what it sent before its close still counts.
    assert not conn.discards_input_of(2)
    assert conn.discards_input_of(3)  # never opened
    conn.fail(InternalError("boom"))
    assert conn.discards_input_of(2)


def test_fail_with_a_channel_error_during_the_handshake_closes_the_connection() -> None:
    conn = _authenticating()
    conn.data_to_send()
    conn.fail(AccessRefused("login refused"), 1)
    assert sent(conn) == [connection_close(403, "ACCESS_REFUSED - login refused")]
    conn.accept_login()
    assert conn.data_to_send() == b""


def test_fail_with_a_channel_error_on_channel_0_closes_the_connection() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    conn.fail(NotFound("no vhost", (10, 40)), 0)
    assert sent(conn) == [connection_close(404, "NOT_FOUND - no vhost", 10, 40)]
    assert not conn.channel_is_open(1)


def test_connection_error_closes_and_then_only_close_ok_is_honoured() -> None:
    conn = open_connection()
    open_channels(conn, 1, 2)
    conn.fail(InternalError("pulsar unavailable", (60, 40)), 1)
    assert sent(conn) == [connection_close(541, "INTERNAL_ERROR - pulsar unavailable", 60, 40)]
    assert conn.open_channels == []
    assert not conn.closed
    ignored = (
        queue_declare(2)
        + marshal(3, commands.Channel.Open())
        + publish_frames(1, b"x")
        + marshal(0, heartbeat.Heartbeat())
        + start_ok()
    )
    assert conn.receive_data(ignored) == []
    conn.send_method(0, commands.Connection.Blocked(reason="low memory"))
    conn.send_method(2, commands.Basic.Ack(delivery_tag=1))
    conn.send_content(2, commands.Basic.Deliver(), commands.Basic.Properties(), b"x")
    conn.fail(NotFound("later"), 2)
    assert conn.data_to_send() == b""
    assert not conn.closed
    assert conn.receive_data(marshal(0, commands.Connection.CloseOk())) == []
    assert conn.data_to_send() == b""
    assert conn.closed


def test_client_close_crossing_our_connection_close_is_confirmed() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    conn.fail(InternalError("boom"))
    conn.data_to_send()
    close = commands.Connection.Close(reply_code=200, class_id=0, method_id=0)
    # Whatever follows the close in the same read is not looked at.
    after = queue_declare(1) + marshal(0, commands.Connection.Open()) + b"garbage!"
    assert conn.receive_data(marshal(0, close) + after) == []
    assert sent(conn) == [m(0, commands.Connection.CloseOk())]
    assert conn.closed


def test_client_connection_close_waits_for_the_shell() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    close = commands.Connection.Close(reply_code=200, reply_text="Goodbye", class_id=0, method_id=0)
    assert conn.receive_data(marshal(0, close)) == [ev.ConnectionCloseRequested(200, "Goodbye")]
    assert conn.data_to_send() == b""
    assert not conn.closed
    # Frames after the client's close are ignored.
    assert conn.receive_data(queue_declare(1)) == []
    conn.finish_connection_close()
    assert sent(conn) == [m(0, commands.Connection.CloseOk())]
    assert conn.closed
    assert conn.open_channels == []
    conn.finish_connection_close()
    assert conn.data_to_send() == b""


def test_client_connection_close_during_the_handshake() -> None:
    conn = _authenticating()
    conn.data_to_send()
    close = commands.Connection.Close(
        reply_code=200, reply_text="never mind", class_id=0, method_id=0
    )
    # Handled in order: once the shell has answered the login.
    assert conn.receive_data(marshal(0, close)) == []
    conn.accept_login()
    assert conn.resume() == [ev.ConnectionCloseRequested(200, "never mind")]
    conn.finish_connection_close()
    assert [name for _, name, _ in sent(conn)] == ["Connection.Tune", "Connection.CloseOk"]
    assert conn.closed


def test_abort_stops_everything() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    conn.abort()
    assert conn.closed
    assert conn.open_channels == []
    assert conn.receive_data(queue_declare(1)) == []
    conn.send_method(0, commands.Connection.Blocked())
    conn.send_heartbeat()
    conn.fail(InternalError("late"))
    assert conn.data_to_send() == b""


# ---- content assembly ----------------------------------------------------------------------


def test_publish_header_and_several_bodies_make_one_content_event() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    payload = bytes(range(256)) * 40  # 10240 bytes, more than one frame
    props = commands.Basic.Properties(
        content_type="application/json",
        delivery_mode=2,
        headers={"x-trace": "abc", "n": 7},
        message_id="m-1",
    )
    events = conn.receive_data(publish_frames(1, payload, props, body_frame_size=1000))
    assert len(events) == 1
    content = events[0]
    assert isinstance(content, ev.ContentReceived)
    assert content.channel == 1
    assert content.method.name == "Basic.Publish"
    assert (content.method.exchange, content.method.routing_key) == ("ex", "rk")
    assert content.properties == props
    assert content.body == payload
    assert conn.data_to_send() == b""
    assert conn.buffered_input == 0


@pytest.mark.parametrize("chunk", [1, 2, 7, 13, 100, 4095])
def test_content_split_at_any_byte_position_is_assembled(chunk: int) -> None:
    conn = open_connection()
    open_channels(conn, 1, 2)
    payload = random.Random(chunk).randbytes(5000)
    props = commands.Basic.Properties(app_id="test", priority=3)
    data = publish_frames(1, payload, props, body_frame_size=1500) + queue_declare(2)
    events: list[ev.Event] = []
    for start in range(0, len(data), chunk):
        events += conn.receive_data(data[start : start + chunk])
    assert [type(e) for e in events] == [ev.ContentReceived, ev.MethodReceived]
    assert events[0] == ev.ContentReceived(
        1, events[0].method, props, payload, events[0].raw_properties
    )
    assert events[0].raw_properties == header.ContentHeader(0, 0, props).marshal()[12:]
    assert conn.buffered_input == 0


def test_content_split_at_random_positions_is_assembled() -> None:
    rng = random.Random(20240611)
    payload = rng.randbytes(20000)
    data = b"".join(publish_frames(1, payload, body_frame_size=3000) for _ in range(3))
    for _ in range(20):
        conn = open_connection()
        open_channels(conn, 1)
        cuts = sorted(rng.sample(range(1, len(data)), 15))
        events: list[ev.Event] = []
        for start, end in zip([0, *cuts], [*cuts, len(data)], strict=True):
            events += conn.receive_data(data[start:end])
        assert [type(e) for e in events] == [ev.ContentReceived] * 3
        assert all(e.body == payload for e in events if isinstance(e, ev.ContentReceived))


def test_interleaved_content_on_two_channels() -> None:
    conn = open_connection()
    open_channels(conn, 1, 2)
    one = publish_frames(1, b"a" * 30, body_frame_size=10, routing_key="one")
    two = publish_frames(2, b"b" * 30, body_frame_size=10, routing_key="two")
    split_one = decode_all(one)
    split_two = decode_all(two)
    data = b"".join(
        marshal(ch, value) for pair in zip(split_one, split_two, strict=True) for ch, value in pair
    )
    events = conn.receive_data(data)
    bodies = {e.channel: e.body for e in events if isinstance(e, ev.ContentReceived)}
    assert bodies == {1: b"a" * 30, 2: b"b" * 30}


def test_zero_length_body_completes_at_the_header() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    assert conn.receive_data(marshal(1, commands.Basic.Publish(routing_key="rk"))) == []
    events = conn.receive_data(marshal(1, header.ContentHeader(0, 0, commands.Basic.Properties())))
    assert len(events) == 1
    assert isinstance(events[0], ev.ContentReceived)
    assert events[0].body == b""
    # The channel is ready for the next method straight away.
    assert [type(e) for e in conn.receive_data(queue_declare(1))] == [ev.MethodReceived]


def test_partial_content_is_counted_in_buffered_input() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    frames = publish_frames(1, b"x" * 3000, body_frame_size=1000)
    whole_frames = decode_all(frames)
    conn.receive_data(b"".join(marshal(ch, v) for ch, v in whole_frames[:4]))
    assert conn.buffered_input == 2000
    conn.fail(NotFound("gone"), 1)
    assert conn.buffered_input == 0


def test_message_larger_than_max_message_size_closes_the_channel_with_406() -> None:
    conn = open_connection()
    open_channels(conn, 1, 2)
    declared = 64 * KIB + 1
    data = marshal(1, commands.Basic.Publish(routing_key="rk")) + marshal(
        1, header.ContentHeader(0, declared, commands.Basic.Properties())
    )
    events = conn.receive_data(data)
    assert error_types(events) == [PreconditionFailed]
    assert sent(conn) == [
        m(
            1,
            commands.Channel.Close(
                reply_code=406,
                reply_text=(
                    "PRECONDITION_FAILED - message size 65537 is larger than configured "
                    "max size 65536"
                ),
                class_id=60,
                method_id=40,
            ),
        )
    ]
    # The body the client keeps sending is discarded, not buffered.
    for _ in range(8):
        assert conn.receive_data(marshal(1, body.ContentBody(b"z" * 8000))) == []
    assert conn.buffered_input == 0
    assert conn.data_to_send() == b""
    # The connection and its other channels keep working.
    events = conn.receive_data(publish_frames(2, b"small"))
    assert [(type(e), e.channel) for e in events] == [(ev.ContentReceived, 2)]
    assert conn.receive_data(marshal(1, commands.Channel.CloseOk())) == [ev.ChannelClosed(1)]
    assert conn.is_open


def test_message_of_exactly_max_message_size_is_accepted() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    payload = b"m" * (64 * KIB)
    events = conn.receive_data(publish_frames(1, payload, body_frame_size=8000))
    assert [type(e) for e in events] == [ev.ContentReceived]
    assert events[0].body == payload


@pytest.mark.parametrize(
    "after_publish",
    [
        # header expected
        [],
        # body expected
        [marshal(1, header.ContentHeader(0, 10, commands.Basic.Properties()))],
        [
            marshal(1, header.ContentHeader(0, 10, commands.Basic.Properties())),
            marshal(1, body.ContentBody(b"12345")),
        ],
    ],
)
def test_method_while_content_is_expected_is_505(after_publish: list[bytes]) -> None:
    conn = open_connection()
    open_channels(conn, 1)
    data = marshal(1, commands.Basic.Publish()) + b"".join(after_publish)
    assert conn.receive_data(data) == []
    events = conn.receive_data(marshal(1, commands.Basic.Ack(delivery_tag=1)))
    assert error_types(events) == [UnexpectedFrame]
    close = single_close(sent(conn))
    assert (close["reply_code"], close["class_id"], close["method_id"]) == (505, 60, 80)


def test_body_frame_without_a_header_is_505() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    data = marshal(1, commands.Basic.Publish()) + marshal(1, body.ContentBody(b"x"))
    events = conn.receive_data(data)
    assert error_types(events) == [UnexpectedFrame]
    assert single_close(sent(conn))["reply_code"] == 505


def test_body_frame_without_a_publish_is_505() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    events = conn.receive_data(marshal(1, body.ContentBody(b"x")))
    assert error_types(events) == [UnexpectedFrame]
    assert single_close(sent(conn))["reply_code"] == 505


@pytest.mark.parametrize("prefix", [b"", marshal(1, commands.Basic.Publish())])
def test_content_header_without_a_publish_or_twice_is_505(prefix: bytes) -> None:
    conn = open_connection()
    open_channels(conn, 1)
    content_header = marshal(1, header.ContentHeader(0, 5, commands.Basic.Properties()))
    if prefix:
        prefix += content_header
    events = conn.receive_data(prefix + content_header)
    assert error_types(events) == [UnexpectedFrame]
    assert single_close(sent(conn))["reply_code"] == 505


def test_body_longer_than_declared_is_505() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    data = (
        marshal(1, commands.Basic.Publish())
        + marshal(1, header.ContentHeader(0, 4, commands.Basic.Properties()))
        + marshal(1, body.ContentBody(b"12"))
        + marshal(1, body.ContentBody(b"345"))
    )
    events = conn.receive_data(data)
    assert error_types(events) == [UnexpectedFrame]
    assert not any(isinstance(e, ev.ContentReceived) for e in events)
    assert single_close(sent(conn))["reply_code"] == 505
    assert conn.buffered_input == 0


def test_content_frame_on_channel_0_is_505() -> None:
    conn = open_connection()
    conn.receive_data(marshal(0, body.ContentBody(b"x")))
    assert single_close(sent(conn))["reply_code"] == 505


# ---- broken frames -------------------------------------------------------------------------


def test_heartbeat_on_channel_0_is_accepted_silently() -> None:
    conn = open_connection()
    assert conn.receive_data(marshal(0, heartbeat.Heartbeat())) == []
    assert conn.data_to_send() == b""
    assert conn.is_open


def test_heartbeat_on_another_channel_is_505_like_rabbitmq() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    events = conn.receive_data(b"\x08\x00\x01\x00\x00\x00\x00\xce")
    assert error_types(events) == [UnexpectedFrame]
    assert single_close(sent(conn))["reply_code"] == 505
    assert conn.closed


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x09\x00\x00\x00\x00\x00\x00\xce",  # frame type 9 does not exist
        b"GARBAGE!",
        b"\x01\x00\x00\x00\x00\x00\x04\x00\x0a\x00\x33\x00",  # bad end byte
    ],
)
def test_garbage_frame_is_501_and_the_socket_closes(garbage: bytes) -> None:
    conn = open_connection()
    events = conn.receive_data(garbage)
    assert error_types(events) == [FrameError]
    assert single_close(sent(conn))["reply_code"] == 501
    assert conn.closed
    # The stream cannot be parsed any more: nothing else is read.
    assert conn.receive_data(marshal(0, commands.Connection.CloseOk())) == []
    assert conn.data_to_send() == b""


def test_valid_frame_before_garbage_in_the_same_chunk_is_processed() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    events = conn.receive_data(queue_declare(1, "kept") + b"\xff\xff\xff\xff\xff\xff\xff\xff")
    assert [type(e) for e in events] == [ev.MethodReceived, ev.ErrorRaised]
    assert events[0].method.queue == "kept"
    assert isinstance(events[1].error, FrameError)
    assert single_close(sent(conn))["reply_code"] == 501
    assert conn.closed


def test_undecodable_method_fields_are_501_with_the_method_ids_like_rabbitmq() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    payload = struct.pack(">HH", 50, 10) + b"\x00"  # queue.declare cut short
    raw = struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce"
    events = conn.receive_data(raw)
    assert error_types(events) == [FrameError]
    close = single_close(sent(conn))
    assert (close["reply_code"], close["class_id"], close["method_id"]) == (501, 50, 10)
    assert "cannot decode" in close["reply_text"]
    assert conn.closed


def test_frame_larger_than_frame_max_during_the_handshake_is_refused() -> None:
    conn = AMQPConnection(SETTINGS)
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    events = conn.receive_data(struct.pack(">BHI", 1, 0, 1 << 30))
    assert error_types(events) == [FrameError]
    assert single_close(sent(conn))["reply_code"] == 501
    assert conn.closed
    assert conn.buffered_input == 0


def test_partial_huge_frame_header_is_refused_before_buffering() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    huge = struct.pack(">BHI", 3, 1, 0xFFFFFFFF)
    for byte in huge[:-1]:
        assert conn.receive_data(bytes([byte])) == []
    assert conn.buffered_input == len(huge) - 1
    events = conn.receive_data(huge[-1:])
    assert error_types(events) == [FrameError]
    assert conn.buffered_input == 0
    # The client keeps streaming the "payload": none of it is kept.
    for _ in range(16):
        assert conn.receive_data(b"\x00" * 65536) == []
    assert conn.buffered_input == 0
    assert single_close(sent(conn))["reply_code"] == 501


def test_buffered_input_stays_below_frame_max_for_a_partial_frame() -> None:
    conn = open_connection(frame_max=4096)
    open_channels(conn, 1)
    data = publish_frames(1, b"p" * 4088)
    body_start = len(data) - (4088 + 8)
    conn.receive_data(data[: body_start + 4000])
    assert conn.buffered_input <= 4096
    events = conn.receive_data(data[body_start + 4000 :])
    assert [type(e) for e in events] == [ev.ContentReceived]
    assert conn.buffered_input == 0


# ---- what the shell sends ------------------------------------------------------------------


def test_send_content_splits_bodies_to_the_negotiated_frame_max() -> None:
    conn = open_connection(frame_max=4096)
    open_channels(conn, 1)
    payload = random.Random(1).randbytes(10000)
    props = commands.Basic.Properties(content_type="text/plain", headers={"k": "v"})
    deliver = commands.Basic.Deliver(
        consumer_tag="ctag", delivery_tag=1, exchange="ex", routing_key="rk"
    )
    conn.send_content(1, deliver, props, payload)
    data = conn.data_to_send()
    frames = decode_all(data)
    assert summary(*frames[0]) == m(1, deliver)
    assert summary(*frames[1]) == (
        1,
        "ContentHeader",
        {"body_size": 10000, "properties": props},
    )
    bodies = [value.value for ch, value in frames[2:] if ch == 1]
    assert len(bodies) == len(frames) - 2
    assert [len(b) for b in bodies] == [4088, 4088, 1824]
    assert b"".join(bodies) == payload
    # Check the wire sizes too: no frame (header + payload + end byte) above frame_max.
    offset = 0
    while offset < len(data):
        (size,) = struct.unpack_from(">I", data, offset + 3)
        assert size + 8 <= 4096
        offset += size + 8
    assert offset == len(data)


def test_send_content_with_an_empty_body_sends_no_body_frame() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    conn.send_content(
        1,
        commands.Basic.GetOk(delivery_tag=1, exchange="", routing_key="q", message_count=0),
        commands.Basic.Properties(),
        b"",
    )
    assert [name for _, name, _ in sent(conn)] == ["Basic.GetOk", "ContentHeader"]


def test_send_on_a_channel_that_is_not_open_sends_nothing() -> None:
    conn = open_connection()
    open_channels(conn, 1, 2)
    conn.fail(NotFound("gone"), 1)
    conn.receive_data(marshal(2, commands.Channel.Close(reply_code=200, class_id=0, method_id=0)))
    conn.data_to_send()
    for channel in (1, 2, 3):
        conn.send_method(channel, commands.Basic.Ack(delivery_tag=1))
        conn.send_content(channel, commands.Basic.Deliver(), commands.Basic.Properties(), b"x")
    assert conn.data_to_send() == b""
    open_channels(conn, 3)
    conn.send_method(3, commands.Basic.Ack(delivery_tag=9))
    assert sent(conn) == [m(3, commands.Basic.Ack(delivery_tag=9))]


def test_send_method_on_channel_0() -> None:
    conn = open_connection()
    conn.send_method(0, commands.Connection.Blocked(reason="memory"))
    assert sent(conn) == [m(0, commands.Connection.Blocked(reason="memory"))]


def test_send_heartbeat() -> None:
    conn = AMQPConnection(SETTINGS)
    conn.send_heartbeat()  # nothing before the protocol header
    assert conn.data_to_send() == b""
    conn = open_connection()
    conn.send_heartbeat()
    assert conn.data_to_send() == b"\x08\x00\x00\x00\x00\x00\x00\xce"
    conn.abort()
    conn.send_heartbeat()
    assert conn.data_to_send() == b""


def test_data_to_send_is_drained() -> None:
    conn = open_connection()
    open_channels(conn, 1)
    conn.send_method(1, commands.Basic.Ack(delivery_tag=1))
    conn.send_method(1, commands.Basic.Ack(delivery_tag=2))
    assert sent(conn) == [
        m(1, commands.Basic.Ack(delivery_tag=1)),
        m(1, commands.Basic.Ack(delivery_tag=2)),
    ]
    assert conn.data_to_send() == b""
