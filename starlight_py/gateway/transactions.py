"""tx.commit for one channel (semantics: amqp/transactions.py; state: core/channel.py).

A commit replays the buffered publishes through the Publisher, in order, exactly as if
they were published now (routing, mandatory returns, alternate exchanges happen then), and
waits until Pulsar has written every one of them. Only then are the buffered acks, nacks
and rejects applied by the core, and commit-ok sent: a consume-transform-publish loop that
acks in the same transaction never loses a message to a failed write. A write that fails
closes the channel with 406 "partial tx completion" (as RabbitMQ does when a queue refuses
a transactional publish); the acks of that transaction are then never applied, so its
deliveries are requeued with the channel.

How the commit learns of the writes: the Publisher reports the outcome of every publish to
the target it was given (including messages routed nowhere); a commit's target is a
`CommitWrites`, which counts them instead of turning them into confirms.
"""

from __future__ import annotations

import trio

from starlight_py.gateway.channel_session import ChannelSession
from starlight_py.gateway.publish.publishing import Publisher


class CommitWrites:
    """The outcomes of one commit's publishes; `written` is set once every publish handed
    over (`all_handed`) has one."""

    def __init__(self) -> None:
        self.reserved = 0
        self.settled = 0
        self.failed = 0
        self.handed_all = False
        self.written = trio.Event()

    def reserve_publish(self) -> int:
        self.reserved += 1
        return self.reserved

    def settle_publishes(self, outcomes: list[tuple[int, bool]]) -> None:
        for _, ok in outcomes:
            self.settled += 1
            if not ok:
                self.failed += 1
        self._check()

    def all_handed(self) -> None:
        self.handed_all = True
        self._check()

    def _check(self) -> None:
        if self.handed_all and self.settled >= self.reserved:
            self.written.set()


async def commit(session: ChannelSession, publisher: Publisher) -> None:
    """tx.commit on `session`. Raises PreconditionFailed (not transactional, or a write
    failed) and what publishing raises."""
    core = session.core
    publishes, settlements = core.tx_commit()
    failed = 0
    if publishes:
        writes = CommitWrites()
        for publish in publishes:
            await publisher.publish(
                writes,
                publish.method,
                publish.properties,
                publish.body,
                publish.raw_properties,
                session.number,
            )
        publisher.flush()
        writes.all_handed()
        await writes.written.wait()
        failed = writes.failed
    core.tx_committed(settlements, failed, len(publishes))
