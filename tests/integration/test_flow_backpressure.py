"""When Pulsar cannot take publishes as fast as they come, the publisher is paused and, if
it understands connection.blocked, told so; nothing is lost."""

from __future__ import annotations

import uuid

from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from tests.integration.conftest import ProxyFactory
from tests.support.raw_amqp import PROTOCOL_HEADER, RawClient


def handshake_with_capabilities(client: RawClient) -> None:
    client.send(PROTOCOL_HEADER)
    client.read_method()
    client.send_method(
        0,
        commands.Connection.StartOk(
            client_properties={"capabilities": {"connection.blocked": True}},
            mechanism="PLAIN",
            response="\x00guest\x00guest",
        ),
    )
    _, tune = client.read_method()
    client.send_method(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
    client.send_method(0, commands.Connection.Open(virtual_host="/"))
    client.read_method()


def open_client(port: int) -> RawClient:
    """A connection (connection.blocked capability) with channel 1 open."""
    client = RawClient("127.0.0.1", port)
    handshake_with_capabilities(client)
    client.open_channel(1)
    return client


def _publishes(queue: str, count: int) -> bytes:
    frames = []
    for _ in range(count):
        frames.append(
            pamqp_frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
        )
        frames.append(
            pamqp_frame.marshal(pamqp_header.ContentHeader(0, 4, commands.Basic.Properties()), 1)
        )
        frames.append(b"\x03\x00\x01\x00\x00\x00\x04data\xce")
    return b"".join(frames)


def test_full_producer_queue_blocks_then_unblocks_and_loses_nothing(
    start_proxy: ProxyFactory,
) -> None:
    proxy = start_proxy(pulsarProducerMaxPendingMessages="1")
    queue = f"bp-{uuid.uuid4().hex[:8]}"
    client = open_client(proxy.port)
    client.send_method(1, commands.Queue.Declare(queue=queue, exclusive=True))
    client.read_method()
    client.send_method(1, commands.Confirm.Select())
    client.read_method()
    count = 60
    client.send(_publishes(queue, count))  # as fast as the socket takes it
    acked: set[int] = set()
    seen: list[str] = []
    while len(acked) < count:
        _, method = client.read_method(timeout=30)
        seen.append(method.name)
        if isinstance(method, commands.Basic.Ack):
            if method.multiple:
                acked.update(range(1, method.delivery_tag + 1))
            else:
                acked.add(method.delivery_tag)
        assert not isinstance(method, commands.Basic.Nack)
    assert acked == set(range(1, count + 1))
    assert "Connection.Blocked" in seen
    # Unblocked follows the last Blocked (it may come after the final acks).
    while seen.count("Connection.Unblocked") < seen.count("Connection.Blocked"):
        seen.append(client.read_method(timeout=30)[1].name)
    assert seen.index("Connection.Blocked") < len(seen) - 1 - seen[::-1].index(
        "Connection.Unblocked"
    )
    client.send_method(1, commands.Queue.Declare(queue=queue, passive=True))
    _, declare_ok = client.read_method()
    assert declare_ok.message_count == count
    client.close()


def test_connections_gone_before_their_publishes_are_stored_leave_the_producer_its_room(
    start_proxy: ProxyFactory,
) -> None:
    """A connection that publishes and goes at once (a crash, a short-lived script) leaves
    its sends to Pulsar in flight. Their room in the shared producer's queue must come back
    when Pulsar answers, though nobody is left to confirm to: it once did not, and after
    `pulsarProducerMaxPendingMessages` such messages every publisher of the queue was
    blocked for good."""
    proxy = start_proxy(pulsarProducerMaxPendingMessages="12")
    queue = f"bp-gone-{uuid.uuid4().hex[:8]}"
    setup = open_client(proxy.port)
    setup.send_method(1, commands.Queue.Declare(queue=queue, auto_delete=False))
    setup.read_method()
    rounds, each = 8, 5
    for _ in range(rounds):
        client = open_client(proxy.port)
        client.send(_publishes(queue, each))
        client.close()  # no connection.close, no waiting for anything
    last = open_client(proxy.port)
    last.send_method(1, commands.Confirm.Select())
    last.read_method()
    last.send(_publishes(queue, 1))
    seen: list[str] = []
    while "Basic.Ack" not in seen:
        _, method = last.read_method(timeout=30)
        seen.append(method.name)
    assert "Connection.Blocked" not in seen
    setup.send_method(1, commands.Queue.Declare(queue=queue, passive=True))
    _, declare_ok = setup.read_method()
    assert declare_ok.message_count == rounds * each + 1  # nothing lost either
    setup.send_method(1, commands.Queue.Delete(queue=queue))
    setup.read_method()
    setup.close()
    last.close()
