"""Real clients open, use and close connections (pika, aio-pika, kombu)."""

from __future__ import annotations

import asyncio
import logging

import aio_pika
import kombu
import pika
import pika.exceptions
import pytest
from pamqp import commands, frame

from starlight_py.backend.pulsar_admin import PulsarAdmin
from starlight_py.local.ports import free_port
from tests.integration.conftest import Broker, ProxyFactory


def test_pika_opens_channels_and_closes_cleanly(broker: Broker) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    channels = [connection.channel() for _ in range(5)]
    assert [c.channel_number for c in channels] == [1, 2, 3, 4, 5]
    assert connection._impl.server_properties["capabilities"]["publisher_confirms"] is True
    channels[2].close()
    assert channels[2].is_closed and channels[3].is_open
    # A channel number freed by close can be opened again.
    assert connection.channel(channel_number=3).is_open
    connection.close()
    assert connection.is_closed


def test_aio_pika_connect_robust_opens_channels_and_closes(broker: Broker) -> None:
    async def scenario() -> list[int]:
        connection = await aio_pika.connect_robust(broker.url())
        # aio-pika channels send confirm.select by default: the proxy must answer it.
        first = await connection.channel()
        second = await connection.channel(publisher_confirms=False)
        numbers = [first.number, second.number]
        await first.close()
        await connection.close()
        assert connection.is_closed
        return numbers

    assert asyncio.run(scenario()) == [1, 2]


def test_kombu_connects_with_amqplain(broker: Broker) -> None:
    # py-amqp (kombu's transport) logs in with AMQPLAIN when the server offers it.
    with kombu.Connection(broker.url(), connect_timeout=10) as connection:
        connection.connect()
        channel = connection.channel()
        assert channel.is_open
        channel.close()


def test_pika_negotiates_lower_limits_the_client_asks_for(broker: Broker) -> None:
    params = pika.URLParameters(broker.url(channel_max=7, frame_max=8192, heartbeat=5))
    connection = pika.BlockingConnection(params)
    assert connection._impl.params.channel_max == 7
    assert connection._impl.params.frame_max == 8192
    connection.close()


def test_unknown_vhost_is_refused_with_530(broker: Broker, start_proxy: ProxyFactory) -> None:
    if broker.is_rabbitmq:
        url = broker.url(vhost="no-such-vhost")
    else:
        # With namespace creation off, a vhost whose namespace is missing does not exist.
        proxy = start_proxy(amqpAutoCreateNamespaces="false")
        url = proxy.amqp_url(vhost="no-such-vhost")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        pika.BlockingConnection(pika.URLParameters(url))
    assert "530" in str(info.value) and "no-such-vhost" in str(info.value)


def test_invalid_vhost_name_gets_a_clear_530(proxy_only: None, broker: Broker) -> None:
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        pika.BlockingConnection(pika.URLParameters(broker.url(vhost="a%2Fb%2Fc")))
    text = str(info.value)
    assert "530" in text and "more than one '/'" in text


def test_vhost_maps_to_pulsar_namespace_created_on_demand(
    proxy_only: None, broker: Broker, services: object
) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url(vhost="orders")))
    assert connection.channel().is_open
    connection.close()
    admin = PulsarAdmin(services.pulsar_web_url)  # type: ignore[attr-defined]
    assert admin.namespace_exists("public", "orders")


def test_unimplemented_method_answers_540_with_its_name(broker: Broker) -> None:
    client = broker.raw()
    client.handshake()
    client.open_channel(1)
    client.send_method(1, commands.Basic.Recover(requeue=False))  # RabbitMQ: 540 too
    close = client.expect_connection_close()
    assert close.reply_code == 540
    assert "requeue=false" in close.reply_text
    client.close()


def test_a_pipelined_handshake_is_accepted(broker: Broker) -> None:
    # tune-ok, connection.open and the first channel's frames in one write, without
    # waiting for open-ok: RabbitMQ handles them in order.
    client = broker.raw()
    tune = client.login()
    assert isinstance(tune, commands.Connection.Tune), tune
    methods = [
        (0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0)),
        (0, commands.Connection.Open(virtual_host="/")),
        (1, commands.Channel.Open()),
        (1, commands.Queue.Declare(queue="", exclusive=True)),
        (2, commands.Channel.Open()),
    ]
    client.send(b"".join(frame.marshal(method, channel) for channel, method in methods))
    replies = [client.read_method() for _ in range(4)]
    # In order within each channel; channels go on independently.
    replies.sort(key=lambda reply: reply[0])
    assert [(channel, type(method)) for channel, method in replies] == [
        (0, commands.Connection.OpenOk),
        (1, commands.Channel.OpenOk),
        (1, commands.Queue.DeclareOk),
        (2, commands.Channel.OpenOk),
    ]
    client.close()


def test_client_connection_close_gets_close_ok(broker: Broker) -> None:
    client = broker.raw()
    client.handshake()
    client.open_channel(1)
    client.send_method(0, commands.Connection.Close(200, "bye", 0, 0))
    _, method = client.read_method()
    assert isinstance(method, commands.Connection.CloseOk)
    client.close()


def test_proxy_hangs_up_after_close_ok(proxy_only: None, broker: Broker) -> None:
    # RabbitMQ leaves closing the socket to the client; the proxy closes it itself so that
    # a client that forgets does not hold a socket.
    client = broker.raw()
    client.handshake()
    client.send_method(0, commands.Connection.Close(200, "bye", 0, 0))
    assert isinstance(client.read_method()[1], commands.Connection.CloseOk)
    assert client.wait_closed(timeout=10) < 10
    client.close()


def test_client_channel_close_gets_close_ok_and_connection_lives(broker: Broker) -> None:
    client = broker.raw()
    client.handshake()
    client.open_channel(1)
    client.send_method(1, commands.Channel.Close(200, "done", 0, 0))
    channel, method = client.read_method()
    assert (channel, type(method)) == (1, commands.Channel.CloseOk)
    assert isinstance(client.open_channel(1), commands.Channel.OpenOk)
    client.close()


def test_the_proxy_says_at_startup_that_pulsar_does_not_answer(
    start_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    with caplog.at_level(logging.ERROR, logger="starlight.server"):
        start_proxy(brokerWebServiceURL=nowhere)
    said = [r.getMessage() for r in caplog.records if "unreachable at startup" in r.getMessage()]
    assert len(said) == 1 and nowhere in said[0] and "541" in said[0]


def test_no_startup_warning_when_pulsar_answers(
    start_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="starlight.server"):
        start_proxy()
    assert not [r for r in caplog.records if "unreachable at startup" in r.getMessage()]


def test_crossing_channel_closes_end_with_the_clients_close_ok(broker: Broker) -> None:
    # The server closes channel 3 (404) while the client closes it too: both answer the
    # other's close, and the client's close-ok that follows is no stray frame; until it
    # came, the channel was still open (a channel.open on it is 504). aio-pika's robust
    # recovery probe does this.
    client = broker.raw()
    try:
        client.handshake()
        client.open_channel(3)
        client.send_method(3, commands.Queue.Declare(queue="no-such-queue-x", passive=True))
        bye = commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
        client.send_method(3, bye)
        replies = [client.read_method()[1] for _ in range(2)]
        assert [type(r).__name__ for r in replies] == ["Close", "CloseOk"]
        assert replies[0].reply_code == 404
        client.send_method(3, commands.Channel.CloseOk())
        assert isinstance(client.open_channel(4), commands.Channel.OpenOk)
        assert isinstance(client.open_channel(3), commands.Channel.OpenOk)
    finally:
        client.close()


def test_channel_open_on_a_channel_the_server_is_closing_is_504(broker: Broker) -> None:
    client = broker.raw()
    try:
        client.handshake()
        client.open_channel(3)
        client.send_method(3, commands.Queue.Declare(queue="no-such-queue-x", passive=True))
        assert isinstance(client.read_method()[1], commands.Channel.Close)
        client.send_method(3, commands.Channel.Open())
        close = client.expect_connection_close()
        assert close.reply_code == 504
        assert close.reply_text.startswith("CHANNEL_ERROR - second 'channel.open' seen")
    finally:
        client.close()
