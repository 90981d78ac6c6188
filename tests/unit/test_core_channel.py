"""Playbooks for the message core (core/channel.py): feed what happened, expect the frames
written and the commands asked for. No Pulsar, no ZooKeeper, no event loop."""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import commands as amqp

from starlight_py.amqp.errors import NotAllowed, NotImplementedMethod, PreconditionFailed
from starlight_py.amqp.framing import BodyFrame, FrameDecoder, HeaderFrame, MethodFrame
from starlight_py.amqp.hot_frames import Publish
from starlight_py.amqp.transactions import BufferedPublish, TransactionLimit
from starlight_py.core.channel import (
    BAND_FIRST_WAIT,
    BAND_REFILL_WAIT,
    MAX_OUTPUT_BACKLOG,
    Channel,
    TransactionBudget,
)
from starlight_py.core.commands import (
    AckMessages,
    ConsumerSettled,
    DrainLater,
    GiveBack,
    PauseReading,
    RejectMessages,
    RequeueMessages,
    ResumeReading,
    Unacked,
)
from starlight_py.core.consumer import Consumer, Deliverable
from starlight_py.core.held import HeldCounts


class Wire:
    """The client's side: what the core wrote, decoded back into frames."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.pending_output = 0

    def write_channel(self, channel: int, data: bytes) -> None:
        self.data += data

    def take(self) -> list[tuple[Any, ...]]:
        """(method name, fields) per method frame; a delivery's content as ("content",
        body) after its method."""
        frames, error = FrameDecoder(1 << 20).feed(bytes(self.data))
        assert error is None
        self.data.clear()
        seen: list[tuple[Any, ...]] = []
        body = b""
        for frame in frames:
            if isinstance(frame, MethodFrame):
                fields = {k: v for k, v in dict(frame.method).items() if k != "ticket"}
                seen.append((frame.method.name, fields))
            elif isinstance(frame, HeaderFrame):
                body = b""
                if frame.body_size == 0:
                    seen.append(("content", b""))
            elif isinstance(frame, BodyFrame):
                body += frame.payload
                seen.append(("content", body))
        return seen


class Source:
    """A message as the gateway hands it in (opaque to the core)."""

    def __init__(self, name: str, *, redelivered: bool = False, drop: bool = False) -> None:
        self.name = name
        self.redelivered = redelivered
        self.drop = drop  # vet says: not the queue's any more

    def __repr__(self) -> str:
        return self.name


class QueueRecord:
    """Stands for the queue record a delivery keeps (the core reads its name)."""

    name = "q"


QUEUE = QueueRecord()


def vet(consumer: Consumer, source: Source) -> Deliverable | None:
    if source.drop:
        return None
    return Deliverable("ex", "rk", b"\x00\x00", source.name.encode(), source.redelivered, QUEUE)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def new_channel(clock: Clock | None = None) -> tuple[Channel, Wire]:
    wire = Wire()
    return Channel(7, wire, vet, frame_max=4096, clock=clock or Clock()), wire


def deliver(tag: int, body: bytes, ctag: str = "c1", redelivered: bool = False) -> list[Any]:
    return [
        (
            "Basic.Deliver",
            {
                "consumer_tag": ctag,
                "delivery_tag": tag,
                "redelivered": redelivered,
                "exchange": "ex",
                "routing_key": "rk",
            },
        ),
        ("content", body),
    ]


def started(
    ch: Channel, tag: str = "c1", *, no_ack: bool = False, prefetch: int | None = None
) -> Consumer:
    if prefetch is not None:
        ch.qos(prefetch, False)
    consumer = ch.add_consumer(tag, "q", no_ack, False, link=f"link-{tag}")
    ch.start_consumer(consumer, nowait=True)
    return consumer


def sources(*names: str) -> list[tuple[int, Source]]:
    return [(0, Source(name)) for name in names]


# ---- publish and confirm ------------------------------------------------------------------


def test_without_confirm_mode_publishes_are_not_numbered_and_settle_silently() -> None:
    ch, wire = new_channel()
    assert ch.reserve_publish() == 0
    ch.settle_publishes([(0, True)])
    assert wire.take() == []
    assert ch.unconfirmed == 0


@pytest.mark.parametrize("confirming", [False, True])
def test_a_waiter_learns_when_every_publish_has_its_outcome(confirming: bool) -> None:
    ch, _ = new_channel()
    if confirming:
        ch.confirm_select(nowait=True)
    woken: list[int] = []
    first, second = ch.reserve_publish(), ch.reserve_publish()
    ch.when_published = lambda: woken.append(ch.publishing)
    ch.settle_publishes([(second, True)])
    assert woken == [] and ch.publishing == 1
    ch.settle_publishes([(first, False)])
    assert woken == [0] and ch.when_published is None


def test_confirms_wait_for_earlier_publishes_and_use_multiple_for_runs() -> None:
    ch, wire = new_channel()
    ch.confirm_select(nowait=False)
    assert wire.take() == [("Confirm.SelectOk", {})]
    assert [ch.reserve_publish() for _ in range(6)] == [1, 2, 3, 4, 5, 6]
    ch.settle_publishes([(2, True), (3, True)])
    assert wire.take() == []  # 1 is still open
    ch.settle_publishes([(1, True), (5, False), (6, False)])
    assert wire.take() == [("Basic.Ack", {"delivery_tag": 3, "multiple": True})]
    assert ch.unconfirmed == 3
    ch.settle_publishes([(4, False)])
    assert wire.take() == [
        ("Basic.Nack", {"delivery_tag": 6, "multiple": True, "requeue": False}),
    ]
    assert ch.unconfirmed == 0


def test_a_single_outcome_is_confirmed_without_multiple() -> None:
    ch, wire = new_channel()
    ch.confirm_select(nowait=True)
    seq = ch.reserve_publish()
    ch.settle_publishes([(seq, True)])
    assert wire.take() == [("Basic.Ack", {"delivery_tag": 1, "multiple": False})]


def test_alternating_outcomes_are_confirmed_one_by_one_in_order() -> None:
    ch, wire = new_channel()
    ch.confirm_select(nowait=True)
    for _ in range(3):
        ch.reserve_publish()
    ch.settle_publishes([(3, True), (2, False), (1, True)])
    assert wire.take() == [
        ("Basic.Ack", {"delivery_tag": 1, "multiple": False}),
        ("Basic.Nack", {"delivery_tag": 2, "multiple": False, "requeue": False}),
        ("Basic.Ack", {"delivery_tag": 3, "multiple": False}),
    ]


def test_settling_a_publish_twice_is_our_bug() -> None:
    ch, _ = new_channel()
    ch.confirm_select(nowait=True)
    seq = ch.reserve_publish()
    ch.settle_publishes([(seq, True)])
    with pytest.raises(ValueError):
        ch.settle_publishes([(seq, True)])


def test_confirm_mode_and_tx_mode_exclude_each_other() -> None:
    ch, _ = new_channel()
    ch.confirm_select(nowait=True)
    with pytest.raises(PreconditionFailed) as raised:
        ch.tx_select()
    assert raised.value.method == (90, 10)
    other, _ = new_channel()
    other.tx_select()
    with pytest.raises(PreconditionFailed) as raised:
        other.confirm_select(nowait=True)
    assert raised.value.method == (85, 10)


# ---- consuming and credit -----------------------------------------------------------------


def test_consume_ok_comes_before_the_first_delivery() -> None:
    ch, wire = new_channel()
    consumer = ch.add_consumer("c1", "q", False, False)
    ch.messages_arrived(consumer, sources("m1"))  # read while the consumer is set up
    assert wire.take() == []
    ch.start_consumer(consumer, nowait=False)
    assert wire.take() == [("Basic.ConsumeOk", {"consumer_tag": "c1"}), *deliver(1, b"m1")]


def test_a_reused_consumer_tag_is_refused() -> None:
    ch, _ = new_channel()
    started(ch, "c1")
    with pytest.raises(NotAllowed):
        ch.add_consumer("c1", "q", False, False)


def test_prefetch_limits_deliveries_and_pauses_reading_until_acks_come() -> None:
    ch, wire = new_channel()
    consumer = started(ch, prefetch=2)
    wire.take()
    ch.messages_arrived(consumer, sources("m1", "m2", "m3", "m4", "m5", "m6"))
    assert wire.take() == [*deliver(1, b"m1"), *deliver(2, b"m2")]
    # 4 waiting is more than twice the prefetch: stop reading Pulsar for it.
    assert ch.take_commands() == [PauseReading(consumer)]
    ch.ack(2, multiple=True)
    assert wire.take() == [*deliver(3, b"m3"), *deliver(4, b"m4")]
    commands = ch.take_commands()
    assert isinstance(commands[0], AckMessages)
    assert [str(s) for s in commands[0].sources] == ["m1", "m2"]
    assert commands[1:] == []  # no credit left: still paused
    ch.ack(4, multiple=True)
    assert wire.take() == [*deliver(5, b"m5"), *deliver(6, b"m6")]
    ch.take_commands()
    ch.ack(6, multiple=True)
    assert ch.take_commands()[1:] == [ResumeReading(consumer)]  # credit, nothing waiting


def test_global_prefetch_counts_every_consumer_of_the_channel() -> None:
    ch, wire = new_channel()
    ch.qos(3, True)
    wire.take()
    a = started(ch, "a")
    b = started(ch, "b")
    ch.messages_arrived(a, sources("a1", "a2"))
    ch.messages_arrived(b, sources("b1", "b2"))
    assert wire.take() == [
        *deliver(1, b"a1", "a"),
        *deliver(2, b"a2", "a"),
        *deliver(3, b"b1", "b"),
    ]
    ch.ack(1, multiple=False)
    assert wire.take() == [*deliver(4, b"b2", "b")]


def test_no_ack_consumers_ack_at_delivery_and_stop_on_a_full_output() -> None:
    ch, wire = new_channel()
    consumer = started(ch, no_ack=True)
    ch.messages_arrived(consumer, sources("m1", "m2"))
    assert wire.take() == [*deliver(1, b"m1"), *deliver(2, b"m2")]
    commands = ch.take_commands()
    assert isinstance(commands[0], AckMessages) and len(commands[0].sources) == 2
    assert ch.unacked == {}
    wire.pending_output = MAX_OUTPUT_BACKLOG
    ch.messages_arrived(consumer, sources("m3"))
    assert wire.take() == []
    wire.pending_output = 0
    ch.output_drained()
    assert wire.take() == deliver(3, b"m3")


def test_consumers_without_prefetch_stop_on_a_full_output_too() -> None:
    # Output is bounded whatever the message size (a 128 MiB body is one delivery): an
    # acking consumer without prefetch waits for the client to read, as on RabbitMQ's TCP.
    ch, wire = new_channel()
    consumer = started(ch)
    wire.pending_output = MAX_OUTPUT_BACKLOG
    ch.messages_arrived(consumer, sources("m1"))
    assert wire.take() == []
    wire.pending_output = 0
    ch.output_drained()
    assert wire.take() == deliver(1, b"m1")


def test_one_drain_writes_its_deliveries_at_once() -> None:
    ch, wire = new_channel()
    writes: list[bytes] = []
    write = wire.write_channel
    wire.write_channel = lambda channel, data: (writes.append(data), write(channel, data))  # type: ignore[method-assign]
    consumer = started(ch)
    ch.messages_arrived(consumer, sources("m1", "m2", "m3"))
    assert len(writes) == 1
    assert wire.take() == [*deliver(1, b"m1"), *deliver(2, b"m2"), *deliver(3, b"m3")]


def test_a_drain_counts_its_own_frames_towards_the_output_backlog() -> None:
    # The frames of one drain are written together at its end: the backlog they make
    # stops the drain all the same (the wire's pending_output stays 0 here).
    ch, wire = new_channel()
    consumer = started(ch, no_ack=True)
    big = "x" * (MAX_OUTPUT_BACKLOG // 4)
    ch.messages_arrived(consumer, sources(*(f"{big}{i}" for i in range(6))))
    delivered = [f for f in wire.take() if f[0] == "Basic.Deliver"]
    assert len(delivered) == 4  # the fifth would start with 4 MiB and more unread
    ch.take_commands()
    ch.output_drained()
    assert len([f for f in wire.take() if f[0] == "Basic.Deliver"]) == 2


def test_deliveries_made_before_vet_fails_are_written() -> None:
    def failing(consumer: Consumer, source: Source) -> Deliverable | None:
        if source.name == "boom":
            raise RuntimeError("vet failed")
        return vet(consumer, source)

    wire = Wire()
    ch = Channel(7, wire, failing, frame_max=4096, clock=Clock())
    consumer = started(ch)
    with pytest.raises(RuntimeError):
        ch.messages_arrived(consumer, sources("m1", "boom", "m3"))
    assert wire.take() == deliver(1, b"m1")
    assert list(ch.unacked) == [1]


@pytest.mark.parametrize("one_rank", [False, True])
def test_a_batch_of_one_rank_counts_down_its_bands_known_messages(one_rank: bool) -> None:
    # messages_of_rank_arrived (one Pulsar consumer's batch) does what messages_arrived
    # does with the same messages.
    ch, _ = new_channel()
    consumer = banded_consumer(ch, {2: 3, 1: 5})
    batch = [Source(f"m{i}") for i in range(4)]
    if one_rank:
        ch.messages_of_rank_arrived(consumer, 1, batch)
        ch.messages_of_rank_arrived(consumer, 2, batch[:2])
    else:
        ch.messages_arrived(consumer, [(1, s) for s in batch])
        ch.messages_arrived(consumer, [(2, s) for s in batch[:2]])
    assert consumer.expected == {1: 1, 2: 1}
    if one_rank:
        ch.messages_of_rank_arrived(consumer, 1, batch)
    else:
        ch.messages_arrived(consumer, [(1, s) for s in batch])
    assert consumer.expected == {1: 0, 2: 1}


def test_a_cancelled_consumers_batch_goes_back() -> None:
    ch, wire = new_channel()
    consumer = started(ch)
    ch.remove_consumer(consumer)
    ch.take_commands()
    batch = [Source("m1"), Source("m2")]
    ch.messages_of_rank_arrived(consumer, 0, batch)
    assert ch.take_commands() == [GiveBack(batch)]
    assert wire.take() == []


def test_a_batch_of_one_rank_is_delivered_in_order() -> None:
    ch, wire = new_channel()
    consumer = started(ch, prefetch=2)
    wire.take()  # qos-ok
    ch.messages_of_rank_arrived(consumer, 0, [Source("m1"), Source("m2"), Source("m3")])
    assert wire.take() == [*deliver(1, b"m1"), *deliver(2, b"m2")]
    ch.ack(2, multiple=True)
    assert wire.take() == deliver(3, b"m3")


def test_vet_drops_messages_that_are_no_longer_the_queues() -> None:
    ch, wire = new_channel()
    consumer = started(ch)
    ch.messages_arrived(consumer, [(0, Source("gone", drop=True)), (0, Source("m2"))])
    assert wire.take() == deliver(1, b"m2")


def test_redelivered_flag_comes_from_the_gateway() -> None:
    ch, wire = new_channel()
    consumer = started(ch)
    ch.messages_arrived(consumer, [(0, Source("again", redelivered=True))])
    assert wire.take() == deliver(1, b"again", redelivered=True)
    assert ch.tally.redelivered == 1 and ch.tally.delivered == 1


def test_higher_priority_bands_are_delivered_first_and_a_refilling_band_is_waited_for() -> None:
    clock = Clock()
    ch, wire = new_channel(clock)
    consumer = ch.add_consumer("c1", "q", False, False)
    for rank in (1, 2):
        ch.reads_band(consumer, rank)
    ch.start_consumer(consumer, nowait=True)
    # Band 2 just started: it may be refilling, so band 1 waits a moment.
    ch.messages_arrived(consumer, [(1, Source("low"))])
    assert wire.take() == []
    assert ch.take_commands() == [DrainLater(consumer, pytest.approx(BAND_REFILL_WAIT))]
    ch.messages_arrived(consumer, [(2, Source("high"))])
    assert wire.take() == deliver(1, b"high")
    clock.now += BAND_REFILL_WAIT * 1.01
    ch.drain(consumer)
    assert wire.take() == deliver(2, b"low")


def test_a_bands_wait_for_its_first_messages_starts_with_the_consumer() -> None:
    clock = Clock()
    ch, wire = new_channel(clock)
    consumer = ch.add_consumer("c1", "q", False, False)
    ch.reads_band(consumer, 2)
    clock.now += BAND_REFILL_WAIT * 3  # subscribing to the other bands took long
    ch.reads_band(consumer, 1)
    ch.start_consumer(consumer, nowait=True)
    ch.messages_arrived(consumer, [(1, Source("low"))])
    assert wire.take() == []
    ch.messages_arrived(consumer, [(2, Source("high"))])
    assert wire.take() == deliver(1, b"high")


def banded_consumer(ch: Channel, backlogs: dict[int, int]) -> Consumer:
    """A new consumer of a priority queue, started: rank -> that band's known backlog."""
    consumer = ch.add_consumer("c1", "q", False, False)
    for rank, backlog in backlogs.items():
        ch.reads_band(consumer, rank, backlog=backlog)
    ch.start_consumer(consumer, nowait=True)
    return consumer


def test_a_band_that_had_messages_is_waited_for_longer_at_the_start() -> None:
    clock = Clock()
    ch, wire = new_channel(clock)
    consumer = banded_consumer(
        ch,
        {
            3: 2,  # had messages: they are on their way
            2: 0,  # empty: only the short refill wait
            1: 5,
        },
    )
    ch.messages_arrived(consumer, [(1, Source("low"))])
    clock.now += BAND_REFILL_WAIT * 2  # past the short wait, not the first-message one
    ch.drain(consumer)
    assert wire.take() == []
    assert ch.take_commands()[-1] == DrainLater(consumer, pytest.approx(BAND_FIRST_WAIT - 0.1))
    ch.messages_arrived(consumer, [(3, Source("high"))])
    assert wire.take() == []  # four of band 1's messages, and band 3's second, still to come
    clock.now += BAND_FIRST_WAIT
    ch.drain(consumer)
    # The wait for the first messages is over: what came goes, highest band first (then
    # band 3's second message is waited for as any band's next one is).
    assert wire.take() == deliver(1, b"high")
    clock.now += BAND_REFILL_WAIT * 1.01
    ch.drain(consumer)
    assert wire.take() == deliver(2, b"low")


def test_a_new_consumer_gets_every_bands_known_messages_in_one_go() -> None:
    # RabbitMQ hands a new consumer of a priority queue all its ready messages at once, so
    # a client that cancels after its first delivery has had them all before cancel-ok
    # (kombu's test_publish_requeue_consume); Pulsar sends each band's at its own moment.
    clock = Clock()
    ch, wire = new_channel(clock)
    consumer = banded_consumer(ch, {10: 1, 7: 1, 4: 2})
    ch.messages_arrived(consumer, [(10, Source("fourth"))])
    assert wire.take() == []
    ch.messages_arrived(consumer, [(7, Source("second")), (4, Source("first"))])
    assert wire.take() == []  # band 4's second message is still on its way
    ch.messages_arrived(consumer, [(4, Source("third"))])
    assert wire.take() == [
        *deliver(1, b"fourth"),
        *deliver(2, b"second"),
        *deliver(3, b"first"),
        *deliver(4, b"third"),
    ]
    # Later messages are not held for the others: the first deliveries are done.
    ch.messages_arrived(consumer, [(10, Source("fifth"))])
    assert wire.take() == deliver(5, b"fifth")


def test_a_new_consumer_waits_for_no_more_known_messages_than_it_reads_ahead() -> None:
    clock = Clock()
    ch, wire = new_channel(clock)
    ch.qos(2, False)
    wire.take()  # qos-ok
    consumer = banded_consumer(ch, {2: 1, 1: 500})
    ch.messages_arrived(consumer, [(2, Source("high")), (1, Source("low1"))])
    assert wire.take() == []
    ch.messages_arrived(consumer, [(1, Source("low2"))])  # band 1 reads 2 ahead: enough
    assert wire.take() == deliver(1, b"high") + deliver(2, b"low1")


def test_bands_whose_known_messages_all_came_hold_nothing_back() -> None:
    # RabbitMQ hands a new consumer every band's ready messages at once: a band known to be
    # empty, or whose backlog at subscribing has all arrived, is not waited for.
    clock = Clock()
    ch, wire = new_channel(clock)
    consumer = banded_consumer(ch, {3: 1, 2: 0, 1: 1})
    ch.messages_arrived(consumer, [(1, Source("low"))])
    assert wire.take() == []  # band 3's message is on its way
    ch.messages_arrived(consumer, [(3, Source("high"))])
    assert wire.take() == deliver(1, b"high") + deliver(2, b"low")
    # Later, band 3 is waited for again each time it runs empty (its next message may be
    # a round trip away).
    ch.messages_arrived(consumer, [(3, Source("high2"))])
    assert wire.take() == deliver(3, b"high2")
    ch.messages_arrived(consumer, [(1, Source("low2"))])
    assert wire.take() == []
    clock.now += BAND_REFILL_WAIT * 1.01
    ch.drain(consumer)
    assert wire.take() == deliver(4, b"low2")


# ---- ack, nack, reject, recover ------------------------------------------------------------


def delivered(ch: Channel, wire: Wire, *names: str, prefetch: int = 0) -> Consumer:
    consumer = started(ch, prefetch=prefetch or None)
    ch.messages_arrived(consumer, sources(*names))
    wire.take()
    ch.take_commands()
    return consumer


def test_unknown_delivery_tags_close_the_channel_with_406() -> None:
    ch, wire = new_channel()
    delivered(ch, wire, "m1")
    for settle, ids in (
        (lambda: ch.ack(5, False), (60, 80)),
        (lambda: ch.nack(5, False, True), (60, 120)),
        (lambda: ch.reject(5, True), (60, 90)),
        (lambda: ch.ack(5, True), None),  # multiple reaches m1 (tag 1): fine
    ):
        if ids is None:
            settle()
            continue
        with pytest.raises(PreconditionFailed) as raised:
            settle()
        assert raised.value.method == ids
        assert "unknown delivery tag 5" in raised.value.reply_text


def test_a_tag_acked_twice_is_unknown_the_second_time() -> None:
    ch, wire = new_channel()
    delivered(ch, wire, "m1")
    ch.ack(1, False)
    with pytest.raises(PreconditionFailed):
        ch.ack(1, False)


def test_ack_multiple_with_tag_zero_takes_everything() -> None:
    ch, wire = new_channel()
    delivered(ch, wire, "m1", "m2", "m3")
    ch.ack(0, True)
    [ack] = ch.take_commands()
    assert isinstance(ack, AckMessages) and [str(s) for s in ack.sources] == ["m1", "m2", "m3"]
    ch.ack(0, True)  # nothing outstanding: nothing to do, no error
    assert ch.take_commands() == []


def test_nack_with_requeue_requeues_and_without_rejects() -> None:
    ch, wire = new_channel()
    consumer = delivered(ch, wire, "m1", "m2", "m3")
    ch.nack(2, True, True)
    [requeue] = ch.take_commands()
    assert isinstance(requeue, RequeueMessages)
    assert [str(d.source) for d in requeue.deliveries] == ["m1", "m2"]
    assert requeue.deliveries[0] == Unacked(requeue.deliveries[0].source, consumer, QUEUE)
    ch.reject(3, False)
    [reject] = ch.take_commands()
    assert isinstance(reject, RejectMessages)
    assert [str(d.source) for d in reject.deliveries] == ["m3"]


def test_recover_requeues_every_unacked_delivery_and_answers() -> None:
    ch, wire = new_channel()
    delivered(ch, wire, "m1", "m2")
    ch.recover(True)
    assert wire.take() == [("Basic.RecoverOk", {})]
    [requeue] = ch.take_commands()
    assert isinstance(requeue, RequeueMessages) and len(requeue.deliveries) == 2
    assert ch.unacked == {}
    with pytest.raises(NotImplementedMethod):
        ch.recover(False)


def test_recover_async_requeues_without_an_answer() -> None:
    ch, wire = new_channel()
    delivered(ch, wire, "m1")
    ch.recover(True, (60, 100))
    assert wire.take() == []
    [requeue] = ch.take_commands()
    assert isinstance(requeue, RequeueMessages) and len(requeue.deliveries) == 1
    with pytest.raises(NotImplementedMethod) as raised:
        ch.recover(False, (60, 100))
    assert raised.value.method == (60, 100)


# ---- cancel and close ----------------------------------------------------------------------


def test_cancel_keeps_delivered_messages_unacked_and_gives_back_the_rest() -> None:
    ch, wire = new_channel()
    consumer = delivered(ch, wire, "m1", "m2", "m3", prefetch=2)
    assert ch.cancel("c1") is consumer
    [give_back] = ch.take_commands()
    assert isinstance(give_back, GiveBack) and [str(s) for s in give_back.sources] == ["m3"]
    assert sorted(ch.unacked) == [1, 2]  # RabbitMQ does not requeue them
    assert [str(s) for s in ch.holding(consumer)] == ["m1", "m2"]
    ch.ack(1, False)
    assert [type(c) for c in ch.take_commands()] == [AckMessages]
    ch.nack(2, False, True)
    # The last one settled: its Pulsar consumers may close now.
    assert [type(c) for c in ch.take_commands()] == [ConsumerSettled, RequeueMessages]
    assert ch.cancel("c1") is None


def test_cancelling_a_consumer_with_nothing_unacked_settles_it_at_once() -> None:
    ch, _ = new_channel()
    consumer = started(ch)
    ch.cancel("c1")
    assert ch.take_commands() == [ConsumerSettled(consumer)]


def test_messages_for_a_cancelled_consumer_go_back() -> None:
    ch, wire = new_channel()
    consumer = started(ch)
    ch.cancel("c1")
    ch.take_commands()
    ch.messages_arrived(consumer, sources("late"))
    assert wire.take() == []
    [give_back] = ch.take_commands()
    assert isinstance(give_back, GiveBack)


def test_closing_the_channel_hands_back_everything_it_held() -> None:
    ch, wire = new_channel()
    consumer = delivered(ch, wire, "m1", "m2", "m3", prefetch=2)
    released = ch.close()
    assert [str(item.source) for item in released.unacked] == ["m1", "m2"]
    assert [str(s) for s in released.pending] == ["m3"]
    assert released.consumers == [consumer]
    assert ch.unacked == {} and ch.consumers == {}


# ---- basic.get -----------------------------------------------------------------------------


def test_get_numbers_its_delivery_with_the_channels_tags() -> None:
    ch, wire = new_channel()
    delivered(ch, wire, "m1")
    message = Source("g1")
    deliverable = vet(None, message)  # type: ignore[arg-type]
    assert deliverable is not None
    assert ch.deliver_get(message, deliverable, False, 4) == 2
    assert wire.take() == [
        (
            "Basic.GetOk",
            {
                "delivery_tag": 2,
                "redelivered": False,
                "exchange": "ex",
                "routing_key": "rk",
                "message_count": 4,
            },
        ),
        ("content", b"g1"),
    ]
    assert ch.unacked[2].consumer is None
    ch.deliver_get(Source("g2"), deliverable, True, 0)
    [ack] = ch.take_commands()
    assert isinstance(ack, AckMessages)
    ch.get_empty()
    assert wire.take()[-1] == ("Basic.GetEmpty", {"cluster_id": ""})


# ---- transactions --------------------------------------------------------------------------


def test_a_transaction_settles_at_commit_and_forgets_at_rollback() -> None:
    ch, wire = new_channel()
    delivered(ch, wire, "m1", "m2", "m3")
    ch.tx_select()
    assert wire.take() == [("Tx.SelectOk", {})]
    ch.ack(1, False)
    ch.reject(2, False)
    assert ch.take_commands() == []  # nothing happens before commit
    with pytest.raises(PreconditionFailed):
        ch.ack(1, False)  # already settled in this transaction
    publishes, settlements = ch.tx_commit()
    assert publishes == []
    ch.tx_committed(settlements, failed=0, published=0)
    assert wire.take() == [("Tx.CommitOk", {})]
    assert [type(c) for c in ch.take_commands()] == [AckMessages, RejectMessages]
    ch.ack(3, False)
    ch.tx_rollback()
    assert wire.take() == [("Tx.RollbackOk", {})]
    assert sorted(ch.unacked) == [3]  # unacked again, not requeued


def test_a_commit_whose_publishes_failed_applies_nothing() -> None:
    ch, wire = new_channel()
    delivered(ch, wire, "m1")
    ch.tx_select()
    ch.ack(1, False)
    _, settlements = ch.tx_commit()
    with pytest.raises(PreconditionFailed) as raised:
        ch.tx_committed(settlements, failed=1, published=2)
    assert "partial tx completion" in raised.value.reply_text
    assert ch.take_commands() == []


def test_recover_in_a_transaction_leaves_what_it_settled() -> None:
    ch, wire = new_channel()
    delivered(ch, wire, "m1", "m2")
    ch.tx_select()
    ch.ack(1, False)
    ch.recover(True)
    [requeue] = ch.take_commands()
    assert isinstance(requeue, RequeueMessages)
    assert [str(d.source) for d in requeue.deliveries] == ["m2"]


def test_transactions_of_a_connection_share_one_buffer_limit() -> None:
    budget = TransactionBudget(TransactionLimit(1000))
    wire = Wire()
    one = Channel(1, wire, vet, frame_max=4096, clock=Clock(), budget=budget)
    two = Channel(2, wire, vet, frame_max=4096, clock=Clock(), budget=budget)
    for ch in (one, two):
        ch.tx_select()
    publish = BufferedPublish(
        Publish("", "q", False, False), amqp.Basic.Properties(), b"x" * 400, b""
    )
    one.tx_publish(publish)
    with pytest.raises(PreconditionFailed):
        two.tx_publish(publish)  # 2 x (400 + overhead) > 1000
    one.tx_rollback()
    two.tx_publish(publish)


def test_commands_are_taken_once() -> None:
    ch, wire = new_channel()
    delivered(ch, wire, "m1")
    ch.ack(1, False)
    assert len(ch.take_commands()) == 1
    assert ch.take_commands() == []


# ---- unacked deliveries by queue (the exact counts) ----------------------------------------


def test_held_counts_follow_deliveries_acks_and_requeues() -> None:
    held = HeldCounts()
    wire = Wire()
    clock = Clock()
    ch = Channel(7, wire, vet, frame_max=4096, clock=clock, held=held)
    delivered(ch, wire, "m1", "m2", "m3", "m4")
    assert held.counts == {"q": 4}
    ch.ack(1, False)
    assert held.counts == {"q": 3}
    assert list(held.settled) == [(clock.now, "q", 1)]  # Pulsar may still count it
    ch.nack(3, True, True)  # m2 and m3 go back to the queue: ready again, not settled
    assert held.counts == {"q": 1}
    ch.reject(4, False)
    assert held.counts == {}
    assert held.settled_since("q", clock.now) == 2
    assert held.settled_since("other", clock.now) == 0
    held.forget_settled(clock.now + 1)
    assert not held.settled


def test_dead_letters_on_their_way_are_held_then_settled() -> None:
    held = HeldCounts()
    held.counts["q"] = 2  # deliveries of the queue unacked on channels
    held.hold("q", 1)  # an expired message being dead-lettered
    assert held.counts == {"q": 3}
    held.release("q", 1, 10.0)  # its source acknowledged once the dead letter is stored
    assert held.counts == {"q": 2}
    held.acknowledged("q", 1, 10.0)  # an expired message dropped (no dead-letter exchange)
    assert held.settled_since("q", 10.0) == 2
    held.forget_settled(10.5)
    assert held.settled_since("q", 10.0) == 0


def test_held_counts_include_gets_and_end_with_the_channel() -> None:
    held = HeldCounts()
    held.counts["q"] = 5  # another channel of the vhost holds five
    wire = Wire()
    ch = Channel(7, wire, vet, frame_max=4096, clock=Clock(), held=held)
    delivered(ch, wire, "m1")
    deliverable = vet(None, Source("g1"))  # type: ignore[arg-type]
    assert deliverable is not None
    ch.deliver_get(Source("g1"), deliverable, False, 0)
    ch.deliver_get(Source("g2"), deliverable, True, 0)  # no-ack: never held
    assert held.counts == {"q": 7}
    ch.close()  # requeued: not settled
    assert held.counts == {"q": 5}
    assert not held.settled


def test_an_acked_get_is_not_counted_as_settling() -> None:
    """basic.get's Pulsar consumers acknowledge at once: a count right after the ack sees
    the backlog without it already, so leaving it out again would count one too few. A
    rejected get is dead-lettered first and settles later, as a consumer's ack does."""
    held = HeldCounts()
    wire = Wire()
    clock = Clock()
    ch = Channel(7, wire, vet, frame_max=4096, clock=clock, held=held)
    deliverable = vet(None, Source("g1"))  # type: ignore[arg-type]
    assert deliverable is not None
    first = ch.deliver_get(Source("g1"), deliverable, False, 1)
    second = ch.deliver_get(Source("g2"), deliverable, False, 0)
    assert held.counts == {"q": 2}
    ch.ack(first, False)
    assert held.counts == {"q": 1}
    assert not held.settled
    ch.reject(second, False)
    assert held.counts == {}
    assert list(held.settled) == [(clock.now, "q", 1)]


def test_no_ack_deliveries_are_never_held_and_transactions_settle_at_commit() -> None:
    held = HeldCounts()
    wire = Wire()
    ch = Channel(7, wire, vet, frame_max=4096, clock=Clock(), held=held)
    consumer = started(ch, "auto", no_ack=True)
    ch.messages_arrived(consumer, sources("a1", "a2"))
    assert held.counts == {}
    # ... but settled at once: a count taken before Pulsar hears of the acks leaves them out.
    assert list(held.settled) == [(100.0, "q", 2)]
    held.settled.clear()
    delivered(ch, wire, "m1")
    ch.tx_select()
    ch.ack(3, False)
    assert held.counts == {"q": 1}  # acked only when the transaction commits
    _, settlements = ch.tx_commit()
    ch.tx_committed(settlements, 0, 0)
    assert held.counts == {}
    assert len(held.settled) == 1
