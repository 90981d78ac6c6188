"""The RabbitMQ semantics of one AMQP channel, without I/O: the message core.

Theory of operation
-------------------
One `Channel` owns everything a channel's messages go through: the sequence numbers and
outcomes of its publishes (confirms), its consumers with their credit and the messages read
for them, its delivery tags and unacked deliveries, and its transaction. The gateway calls
it with what happened (usually a batch: every message Pulsar handed over, every outcome of
a flush) and it answers in two ways:

- frames for the client, written at once, in order, to its `FrameSink` (the sans-IO
  `AMQPConnection`), so a return is always written before the confirm of its publish and a
  consume-ok before the first delivery;
- `commands` for the gateway to carry out against Pulsar (acknowledge, requeue, reject,
  pause or resume reading, close a cancelled consumer's Pulsar consumers), taken with
  `take_commands()` after each call.

It never blocks, never reads a clock of its own (one is injected for priority queues) and
knows nothing of Pulsar: messages are opaque `sources` that come back in commands. Whether a
message read for a consumer is still the queue's to deliver (routing, expiry, delivery
limit) is the gateway's to say, through the injected `vet` function, asked at the moment of
delivery.

Errors a client caused (an unknown delivery tag, a mode switch RabbitMQ refuses) are raised
as `AMQPError`s; the connection's one `fail()` turns them into channel.close.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pamqp import commands as amqp

from starlight_py.amqp import hot_frames
from starlight_py.amqp.errors import NotAllowed, NotImplementedMethod, PreconditionFailed
from starlight_py.amqp.field_codec import unvalidated
from starlight_py.amqp.framing import encode_method
from starlight_py.amqp.method_ids import (
    BASIC_ACK,
    BASIC_CONSUME,
    BASIC_NACK,
    BASIC_RECOVER,
    BASIC_REJECT,
    CONFIRM_SELECT,
    TX_COMMIT,
    TX_ROLLBACK,
    TX_SELECT,
)
from starlight_py.amqp.transactions import (
    BufferedPublish,
    BufferedSettlement,
    ChannelTransaction,
    TransactionLimit,
)
from starlight_py.core.commands import (
    AckMessages,
    Command,
    ConsumerSettled,
    DrainLater,
    GiveBack,
    PauseReading,
    RejectMessages,
    RequeueMessages,
    ResumeReading,
    Unacked,
)
from starlight_py.core.confirms import Confirms
from starlight_py.core.consumer import Consumer, Deliverable, Vet
from starlight_py.core.held import HeldCounts

# A consumer without prefetch reads this many messages ahead at most.
UNLIMITED_READ_AHEAD = 1000
# Consumers stop while this much output waits for the client to read it.
MAX_OUTPUT_BACKLOG = 4 * 1024 * 1024
# How long a priority queue's consumer holds back lower bands after a higher one ran empty
# (model/priorities.py: a band's next message is a Pulsar round trip away).
BAND_REFILL_WAIT = 0.05
# How long a new consumer waits for the first messages of a band that had a backlog when it
# subscribed, before a lower band's message may go first (subscribing to many bands takes
# a while, more on a loaded machine; the wait ends as soon as they arrive).
BAND_FIRST_WAIT = 1.0


class FrameSink(Protocol):
    """Where the core writes frames: `AMQPConnection` (dropped once the channel closed)."""

    @property
    def pending_output(self) -> int: ...  # bytes written and not yet sent

    def write_channel(self, channel: int, data: bytes) -> None: ...


@dataclass(frozen=True, slots=True)
class Released:
    """What a closed channel held: its unacked deliveries go back to their queues (the
    gateway closes the Pulsar consumers, which requeues them), its waiting messages too."""

    unacked: list[Unacked]
    pending: list[Any]
    consumers: list[Consumer]


class Tally:
    """Counters for metrics, kept locally and published once per batch by the gateway."""

    __slots__ = ("delivered", "delivered_bytes", "redelivered")

    def __init__(self) -> None:
        self.delivered = 0
        self.delivered_bytes = 0
        self.redelivered = 0


class TransactionBudget:
    """The transaction buffer limit of one connection, shared by its channels."""

    def __init__(self, limit: TransactionLimit) -> None:
        self.limit = limit
        self.transactions: dict[int, ChannelTransaction] = {}

    def elsewhere(self, channel: int) -> int:
        return sum(t.size for n, t in self.transactions.items() if n != channel)


class Channel:
    """See the module docstring."""

    def __init__(
        self,
        number: int,
        sink: FrameSink,
        vet: Vet,
        *,
        frame_max: int,
        clock: Callable[[], float],
        tally: Tally | None = None,
        budget: TransactionBudget | None = None,
        held: HeldCounts | None = None,
    ) -> None:
        """`held`: the deliveries unacked in this process by queue (shared by every channel
        of the vhost here); the exact message counts subtract them."""
        self.number = number
        self.held = HeldCounts() if held is None else held
        self.sink = sink
        self.vet = vet
        self.frame_max = frame_max
        self.clock = clock
        self.tally = tally or Tally()
        self.budget = budget or TransactionBudget(TransactionLimit(1 << 62))
        self.confirms: Confirms | None = None
        # Publishes handed to Pulsar without an outcome yet (confirming or not), and who
        # waits for them all to have one (basic.get after basic.publish, as RabbitMQ keeps a
        # channel's commands in order).
        self.publishing = 0
        self.when_published: Callable[[], None] | None = None
        self.transaction: ChannelTransaction | None = None
        self.next_tag = 1
        # Insertion order is tag order: tags only grow and are never re-inserted.
        self.unacked: dict[int, Unacked] = {}
        self.consumers: dict[str, Consumer] = {}
        self.prefetch_consumer = 0  # basic.qos global=false: for consumers started later
        self.prefetch_global = 0  # basic.qos global=true: the whole channel
        self.closed = False
        self._commands: list[Command] = []
        # Cancelled consumers with deliveries still unacked.
        self._retired: dict[Consumer, int] = {}

    def take_commands(self) -> list[Command]:
        """The commands since the last call (see core/commands.py)."""
        taken, self._commands = self._commands, []
        return taken

    def _write(self, data: bytes) -> None:
        self.sink.write_channel(self.number, data)

    def write_method(self, method: Any) -> None:
        """Write a reply the gateway decided on (cancel-ok after its consumer is gone...)
        in order with the core's own frames."""
        self._write(encode_method(self.number, method))

    _reply = write_method

    # ---- publishing --------------------------------------------------------------------------

    def confirm_select(self, nowait: bool) -> None:
        """confirm.select. Raises PreconditionFailed on a transactional channel."""
        if self.transaction is not None:
            raise PreconditionFailed("cannot switch from tx to confirm mode", CONFIRM_SELECT)
        if self.confirms is None:
            self.confirms = Confirms()
        if not nowait:
            self._reply(amqp.Confirm.SelectOk())

    def reserve_publish(self) -> int:
        """The confirm sequence number of a publish, in publish order; 0 when the channel
        does not confirm."""
        self.publishing += 1
        confirms = self.confirms
        return 0 if confirms is None else confirms.reserve()

    def settle_publishes(self, outcomes: Sequence[tuple[int, bool]]) -> None:
        """Outcomes of publishes (sequence number, stored or not), in any order; writes the
        confirms they complete, one per run of equal outcomes."""
        self.publishing -= len(outcomes)
        if not self.publishing and self.when_published is not None:
            waiter, self.when_published = self.when_published, None
            waiter()
        confirms = self.confirms
        if confirms is None:
            return
        confirms.settle_all(outcomes)
        for last, multiple, ok in confirms.runs():
            self._write(hot_frames.encode_confirm(self.number, last, multiple, ok))

    @property
    def unconfirmed(self) -> int:
        return 0 if self.confirms is None else self.confirms.outstanding

    # ---- consumers ---------------------------------------------------------------------------

    def qos(self, prefetch_count: int, global_: bool) -> None:
        if global_:
            self.prefetch_global = prefetch_count
        else:
            self.prefetch_consumer = prefetch_count
        self._reply(amqp.Basic.QosOk())
        for consumer in list(self.consumers.values()):
            self._drain(consumer)

    def check_tag_free(self, tag: str) -> None:
        """Raises NotAllowed when a consumer of this channel has the tag."""
        if tag in self.consumers:
            raise NotAllowed(f"attempt to reuse consumer tag '{tag}'", BASIC_CONSUME)

    def add_consumer(
        self, tag: str, queue: str, no_ack: bool, exclusive: bool, link: Any = None
    ) -> Consumer:
        """A consumer being set up: messages handed in for it wait until `start_consumer`.
        Raises NotAllowed when the tag is in use on this channel."""
        self.check_tag_free(tag)
        consumer = Consumer(tag, queue, no_ack, self.prefetch_consumer, exclusive, link)
        self.consumers[tag] = consumer
        return consumer

    def reads_band(self, consumer: Consumer, rank: int, backlog: int | None = None) -> None:
        """The consumer reads priority band `rank` (1 + band) of a priority queue, which
        held `backlog` messages when it subscribed (Pulsar's stats; None: not known)."""
        if rank > 0:
            consumer.ranks.add(rank)
            consumer.refilling[rank] = self.clock() + BAND_REFILL_WAIT
            if backlog is not None:
                consumer.expected[rank] = max(0, backlog)

    def start_consumer(self, consumer: Consumer, nowait: bool) -> None:
        """Setting up succeeded: basic.consume-ok (unless nowait), then deliveries."""
        if not nowait:
            self._reply(amqp.Basic.ConsumeOk(consumer.tag))
        consumer.started = True
        # Subscribing to every band takes a while: a band's wait for its first messages
        # starts now, not when its subscription was made, and is longer for one that had
        # messages then.
        # A band known to have been empty, or whose messages all came, holds nothing back:
        # RabbitMQ hands a new consumer every band's messages at once.
        now = self.clock()
        for rank in consumer.refilling:
            if consumer.pending.count(rank) == 0:
                left = consumer.expected.get(rank)
                if left is None:
                    consumer.refilling[rank] = now + BAND_REFILL_WAIT
                elif left > 0:
                    consumer.refilling[rank] = now + BAND_FIRST_WAIT
                else:
                    consumer.refilling[rank] = now
                    del consumer.expected[rank]
        # RabbitMQ hands a new consumer every band's ready messages in one go, so a client
        # that cancels after its first delivery has had them all (kombu's
        # test_publish_requeue_consume): the first deliveries wait for the bands' known
        # messages, which Pulsar sends each band's subscription at its own moment.
        if any(left > 0 for left in consumer.expected.values()):
            consumer.first_until = now + BAND_FIRST_WAIT
        self._drain(consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        """Setting up failed: forget the consumer; what was read for it goes back."""
        if self.consumers.get(consumer.tag) is consumer:
            del self.consumers[consumer.tag]
        consumer.cancelled = True
        waiting = consumer.pending.take_all()
        if waiting:
            self._commands.append(GiveBack(waiting))

    def messages_arrived(self, consumer: Consumer, items: Iterable[tuple[int, Any]]) -> None:
        """Messages Pulsar handed over for a consumer: (rank, source) each, rank 0 for a
        binding subscription, 1 + band for a priority band. Delivered as credit allows."""
        if consumer.cancelled:
            self._commands.append(GiveBack([source for _, source in items]))
            return
        pending = consumer.pending
        expected = consumer.expected
        for rank, source in items:
            pending.put(rank, source)
            if expected and expected.get(rank, 0) > 0:
                expected[rank] -= 1
        self._drain(consumer)

    def messages_of_rank_arrived(self, consumer: Consumer, rank: int, sources: list[Any]) -> None:
        """`messages_arrived` for messages of one rank (one Pulsar consumer's batch)."""
        if consumer.cancelled:
            self._commands.append(GiveBack(list(sources)))
            return
        consumer.pending.extend(rank, sources)
        expected = consumer.expected
        if expected:
            left = expected.get(rank, 0)
            if left > 0:
                expected[rank] = max(0, left - len(sources))
        self._drain(consumer)

    def drain(self, consumer: Consumer) -> None:
        """Deliver what credit allows (after a DrainLater, or the output backlog shrank)."""
        consumer.wake_pending = False
        if not consumer.cancelled:
            self._drain(consumer)

    def output_drained(self) -> None:
        """The client read our output backlog: consumers may go on."""
        for consumer in list(self.consumers.values()):
            if consumer.pending or not all(consumer.reading.values()):
                self._drain(consumer)

    def _has_credit(self, consumer: Consumer, unwritten: int = 0) -> bool:
        """`unwritten`: bytes of frames made and not yet written (a drain's own)."""
        # While the client has not read this much, nobody delivers more (RabbitMQ's TCP
        # backpressure): output stays bounded whatever the prefetch and message size.
        if self.sink.pending_output + unwritten >= MAX_OUTPUT_BACKLOG:
            return False
        if consumer.no_ack:
            return True
        if consumer.prefetch and consumer.unacked >= consumer.prefetch:
            return False
        return not (self.prefetch_global and len(self.unacked) >= self.prefetch_global)

    def _drain(self, consumer: Consumer) -> None:
        pending = consumer.pending
        if pending and consumer.started and not consumer.cancelled:
            frames: list[bytes] = []
            try:
                self._deliver(consumer, frames)
            finally:
                # One write per drain; what was delivered is written even if vet raised.
                if frames:
                    self._write(b"".join(frames))
        self._flow(consumer)

    def _deliver(self, consumer: Consumer, frames: list[bytes]) -> None:
        """Deliver what credit allows, appending the frames to `frames` (counted towards the
        output backlog as if written)."""
        pending = consumer.pending
        banded = bool(consumer.ranks)
        acked: list[Any] = []
        acked_queue: str | None = None  # a consumer reads one queue
        vet = self.vet
        tally = self.tally
        number = self.number
        frame_max = self.frame_max
        held = self.held.counts
        unacked = self.unacked
        no_ack = consumer.no_ack
        encoded_tag = consumer.encoded_tag
        encode_deliver = hot_frames.encode_deliver
        written = 0  # bytes in `frames`
        while pending and self._has_credit(consumer, written):
            if banded and self._wait_for_higher_band(consumer):
                break
            rank, source = pending.pop_ranked()
            if rank > 0 and pending.count(rank) == 0:
                self._band_ran_empty(consumer, rank)
            deliverable = vet(consumer, source)
            if deliverable is None:
                continue
            tag = self.next_tag
            self.next_tag = tag + 1
            queue = deliverable.queue
            if no_ack:
                acked.append(source)
                if queue is not None:
                    acked_queue = queue.name
            else:
                unacked[tag] = Unacked(source, consumer, queue)
                consumer.unacked += 1
                if queue is not None:
                    held[queue.name] = held.get(queue.name, 0) + 1
            body = deliverable.body
            redelivered = deliverable.redelivered
            tally.delivered += 1
            tally.delivered_bytes += len(body)
            if redelivered:
                tally.redelivered += 1
            frame = encode_deliver(
                number,
                encoded_tag,
                tag,
                redelivered,
                deliverable.exchange,
                deliverable.routing_key,
                deliverable.raw_properties,
                body,
                frame_max,
            )
            frames.append(frame)
            written += len(frame)
        if acked:
            self._commands.append(AckMessages(acked))
            if acked_queue is not None:
                # Settled now, though Pulsar hears of it up to ~100 ms later: counts
                # taken meanwhile leave these out (RabbitMQ removes them at once).
                self.held.acknowledged(acked_queue, len(acked), self.clock())

    def _band_ran_empty(self, consumer: Consumer, rank: int) -> None:
        """A band's last waiting message goes out: lower bands wait BAND_REFILL_WAIT for
        its next one, unless every message it had when the consumer subscribed has come
        (then there is no next one to wait for; later publishes race, as on RabbitMQ)."""
        if consumer.expected.get(rank) == 0:
            del consumer.expected[rank]
            consumer.refilling[rank] = self.clock()
        else:
            consumer.refilling[rank] = self.clock() + BAND_REFILL_WAIT

    def _flow(self, consumer: Consumer) -> None:
        """Tell the gateway to stop or go on reading Pulsar for the consumer."""
        limit = max(1, consumer.prefetch or UNLIMITED_READ_AHEAD)
        if consumer.ranks:
            # A priority queue's consumer keeps up to `limit` messages of each band at hand
            # even without credit, so that a message of a higher band published meanwhile
            # is the next one delivered.
            for rank in consumer.ranks:
                wanted = not consumer.cancelled and consumer.pending.count(rank) < limit
                self._set_reading(consumer, rank, wanted)
            return
        full = not self._has_credit(consumer) or len(consumer.pending) > 2 * limit
        self._set_reading(consumer, None, not (full or consumer.cancelled))

    def _set_reading(self, consumer: Consumer, rank: int | None, wanted: bool) -> None:
        if consumer.reading.get(rank, True) is wanted:
            return
        consumer.reading[rank] = wanted
        self._commands.append(
            ResumeReading(consumer, rank) if wanted else PauseReading(consumer, rank)
        )

    def _wait_for_higher_band(self, consumer: Consumer) -> bool:
        """Whether to hold back the waiting message because a higher band ran empty less
        than BAND_REFILL_WAIT ago (Pulsar sends a band's next message only once the previous
        was taken, and that round trip must not let a lower band's message overtake it), or
        its first messages have not come yet (BAND_FIRST_WAIT), or, for a new consumer, any
        band's known messages have not all come (BAND_FIRST_WAIT). Asks for a later drain
        when holding back."""
        top = consumer.pending.top_rank()
        if top is None:
            return False
        now = self.clock()
        if consumer.first_until:
            if now < consumer.first_until and self._known_messages_missing(consumer):
                self._drain_later(consumer, consumer.first_until - now)
                return True
            consumer.first_until = 0.0
        until = max(
            (
                deadline
                for rank, deadline in consumer.refilling.items()
                if rank > top and now < deadline
            ),
            default=None,
        )
        if until is None:
            return False
        self._drain_later(consumer, until - now)
        return True

    def _drain_later(self, consumer: Consumer, delay: float) -> None:
        if not consumer.wake_pending:
            consumer.wake_pending = True
            self._commands.append(DrainLater(consumer, delay))

    @staticmethod
    def _known_messages_missing(consumer: Consumer) -> bool:
        """Whether a band still waits for messages it had when the consumer subscribed
        (as many as it reads ahead at most)."""
        limit = max(1, consumer.prefetch or UNLIMITED_READ_AHEAD)
        pending = consumer.pending
        return any(
            left > 0 and pending.count(rank) < limit for rank, left in consumer.expected.items()
        )

    # ---- settling deliveries ---------------------------------------------------------------

    def ack(self, tag: int, multiple: bool) -> None:
        """basic.ack. Raises PreconditionFailed for an unknown tag (406, as RabbitMQ)."""
        if self.transaction is not None:
            self.transaction.add_settlement(self.unacked, tag, multiple, None, BASIC_ACK)
            return
        taken = self._take(tag, multiple, BASIC_ACK, settled=True, acked=True)
        if taken:
            self._commands.append(AckMessages([item.source for item in taken]))
        self._after_settle()

    def nack(self, tag: int, multiple: bool, requeue: bool) -> None:
        """basic.nack. Raises PreconditionFailed for an unknown tag."""
        self._reject(tag, multiple, requeue, BASIC_NACK)

    def reject(self, tag: int, requeue: bool) -> None:
        """basic.reject. Raises PreconditionFailed for an unknown tag."""
        self._reject(tag, False, requeue, BASIC_REJECT)

    def _reject(self, tag: int, multiple: bool, requeue: bool, method: tuple[int, int]) -> None:
        if self.transaction is not None:
            self.transaction.add_settlement(self.unacked, tag, multiple, requeue, method)
            return
        self._reject_now(self._take(tag, multiple, method, settled=not requeue), requeue)
        self._after_settle()

    def _reject_now(self, taken: list[Unacked], requeue: bool) -> None:
        if taken:
            self._commands.append(RequeueMessages(taken) if requeue else RejectMessages(taken))

    def recover(self, requeue: bool, method: tuple[int, int] = BASIC_RECOVER) -> None:
        """basic.recover (or basic.recover-async, which has no reply): every unacked
        delivery goes back to its queue (on a transactional channel, those this transaction
        settled stay settled until commit or rollback). Raises NotImplementedMethod for
        requeue=false, which RabbitMQ refuses too."""
        if not requeue:
            raise NotImplementedMethod("requeue=false", method)
        settled = self.transaction.settled_tags if self.transaction is not None else set()
        taken = [self.unacked[t] for t in self.unacked if t not in settled]
        for tag in [t for t in self.unacked if t not in settled]:
            del self.unacked[tag]
        self._released(taken, settled=False)
        self._reject_now(taken, True)
        if method == BASIC_RECOVER:
            self._reply(amqp.Basic.RecoverOk())
        self._after_settle()

    def _take(
        self,
        tag: int,
        multiple: bool,
        method: tuple[int, int],
        settled: bool,
        acked: bool = False,
    ) -> list[Unacked]:
        unacked = self.unacked
        if multiple:
            tags: list[int] = []
            for held in unacked:
                if tag and held > tag:
                    break
                tags.append(held)
            if tag and not tags:
                raise PreconditionFailed(f"unknown delivery tag {tag}", method)
        else:
            if tag not in unacked:
                raise PreconditionFailed(f"unknown delivery tag {tag}", method)
            tags = [tag]
        taken = [unacked.pop(t) for t in tags]
        self._released(taken, settled, acked)
        return taken

    def _released(self, taken: list[Unacked], settled: bool, acked: bool = False) -> None:
        """`settled`: acknowledged or rejected (Pulsar will acknowledge them); else
        requeued. `acked`: by basic.ack."""
        self._unhold(taken, settled, acked)
        for item in taken:
            consumer = item.consumer
            if consumer is not None:
                consumer.unacked -= 1
                if consumer.cancelled and consumer.unacked == 0:
                    self._commands.append(ConsumerSettled(consumer))

    def _unhold(self, taken: list[Unacked], settled: bool, acked: bool = False) -> None:
        by_queue: dict[str, int] = {}
        heard: dict[str, int] = {}  # acked gets: Pulsar hears of them at once
        for item in taken:
            queue = item.queue
            if queue is not None:
                # basic.get's consumers do not group acknowledgements (gateway/consume/getting.py):
                # counted as settling, an ack Pulsar already heard of would be left out
                # twice.
                into = heard if acked and item.consumer is None else by_queue
                into[queue.name] = into.get(queue.name, 0) + 1
        at = self.clock() if settled else None
        for name, count in by_queue.items():
            self.held.release(name, count, at)
        for name, count in heard.items():
            self.held.release(name, count, None)

    def _after_settle(self) -> None:
        for consumer in list(self.consumers.values()):
            self._drain(consumer)

    # ---- cancel --------------------------------------------------------------------------------

    def cancel(self, tag: str) -> Consumer | None:
        """basic.cancel: the consumer stops; what it delivered stays unacked with the channel
        (RabbitMQ does not requeue it), what was read for it and not delivered goes back.
        None for an unknown tag (RabbitMQ answers cancel-ok all the same)."""
        consumer = self.consumers.pop(tag, None)
        if consumer is None:
            return None
        consumer.cancelled = True
        waiting = consumer.pending.take_all()
        if waiting:
            self._commands.append(GiveBack(waiting))
        if consumer.unacked == 0:
            self._commands.append(ConsumerSettled(consumer))
        return consumer

    def holding(self, consumer: Consumer) -> list[Any]:
        """The sources of the consumer's deliveries still unacked."""
        return [item.source for item in self.unacked.values() if item.consumer is consumer]

    # ---- basic.get ----------------------------------------------------------------------------

    def deliver_get(
        self, source: Any, deliverable: Deliverable, no_ack: bool, remaining: int
    ) -> int:
        """basic.get-ok for a message the gateway fetched; returns its delivery tag."""
        tag = self.next_tag
        self.next_tag = tag + 1
        if no_ack:
            self._commands.append(AckMessages([source]))
        else:
            queue = deliverable.queue
            self.unacked[tag] = Unacked(source, None, queue)
            if queue is not None:
                counts = self.held.counts
                counts[queue.name] = counts.get(queue.name, 0) + 1
        body = deliverable.body
        self.tally.delivered += 1
        self.tally.delivered_bytes += len(body)
        if deliverable.redelivered:
            self.tally.redelivered += 1
        method = unvalidated(
            amqp.Basic.GetOk,
            delivery_tag=tag,
            redelivered=deliverable.redelivered,
            exchange=deliverable.exchange,
            routing_key=deliverable.routing_key,
            message_count=remaining,
        )
        self._write(
            encode_method(self.number, method)
            + hot_frames.content_frames(
                self.number, deliverable.raw_properties, body, self.frame_max
            )
        )
        return tag

    def get_empty(self) -> None:
        self._reply(amqp.Basic.GetEmpty())

    # ---- transactions -------------------------------------------------------------------------

    @property
    def in_transaction(self) -> bool:
        return self.transaction is not None

    def tx_select(self) -> None:
        """tx.select. Raises PreconditionFailed on a confirm channel."""
        if self.confirms is not None:
            raise PreconditionFailed("cannot switch from confirm to tx mode", TX_SELECT)
        if self.transaction is None:
            self.transaction = ChannelTransaction()
            self.budget.transactions[self.number] = self.transaction
        self._reply(amqp.Tx.SelectOk())

    def tx_publish(self, publish: BufferedPublish) -> None:
        """Buffer a publish (already admitted) until commit. Raises PreconditionFailed past
        the connection's transaction limit."""
        assert self.transaction is not None
        self.transaction.add_publish(publish, self.budget.limit, self.budget.elsewhere(self.number))

    def tx_commit(self) -> tuple[list[BufferedPublish], list[BufferedSettlement]]:
        """tx.commit, first half: what the gateway publishes (waiting until Pulsar wrote all
        of it) before calling `tx_committed` with the settlements. Raises
        PreconditionFailed outside a transaction."""
        if self.transaction is None:
            raise PreconditionFailed("channel is not transactional", TX_COMMIT)
        return self.transaction.take()

    def tx_committed(
        self, settlements: list[BufferedSettlement], failed: int, published: int
    ) -> None:
        """tx.commit, second half: apply the buffered acks, nacks and rejects, then
        commit-ok. Raises PreconditionFailed when some publishes were not written (the
        settlements are then never applied: the channel closes and requeues them)."""
        if failed:
            raise PreconditionFailed(
                f"partial tx completion: Pulsar did not write {failed} of the "
                f"{published} messages published",
                TX_COMMIT,
            )
        for settlement in settlements:
            # A tag settled otherwise meanwhile (nothing else does) is skipped: the rest of
            # the commit still counts.
            taken = [self.unacked.pop(t) for t in settlement.tags if t in self.unacked]
            self._released(taken, settled=not settlement.requeue)
            if settlement.requeue is None:
                if taken:
                    self._commands.append(AckMessages([item.source for item in taken]))
            else:
                self._reject_now(taken, settlement.requeue)
        self._reply(amqp.Tx.CommitOk())
        self._after_settle()

    def tx_rollback(self) -> None:
        """tx.rollback: forget what the transaction buffered. Raises PreconditionFailed
        outside a transaction."""
        if self.transaction is None:
            raise PreconditionFailed("channel is not transactional", TX_ROLLBACK)
        self.transaction.discard()
        self._reply(amqp.Tx.RollbackOk())

    # ---- the end --------------------------------------------------------------------------------

    def close(self) -> Released:
        """The channel is gone: everything it held is handed back."""
        self.closed = True
        unacked = list(self.unacked.values())
        self.unacked.clear()
        self._unhold(unacked, settled=False)
        consumers = list(self.consumers.values())
        self.consumers.clear()
        pending: list[Any] = []
        for consumer in consumers:
            consumer.cancelled = True
            pending.extend(consumer.pending.take_all())
        self.transaction = None
        self.budget.transactions.pop(self.number, None)
        return Released(unacked, pending, consumers)
