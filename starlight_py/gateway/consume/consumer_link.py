"""The gateway's record of one AMQP consumer: its Pulsar consumers, what it reads, and
its place in a single-active queue's line (the core's `Consumer.link`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from starlight_py.backend.pulsar_client import ConsumerHandle, ReceivedMessage
from starlight_py.core.consumer import Consumer
from starlight_py.gateway.bridge import Batcher
from starlight_py.gateway.channel_session import ChannelSession
from starlight_py.gateway.consume.delivery_plans import DeliveryPlan
from starlight_py.gateway.consume.returns import Returns
from starlight_py.metadata.cache import PREFETCH_MARK
from starlight_py.metadata.records import BindingSet
from starlight_py.model.positions import MessageIdRecord
from starlight_py.model.streams import StreamStart
from starlight_py.model.topology import Queue
from starlight_py.topology.service import EXCLUSIVE_MARK


@dataclass(eq=False)
class ConsumerLink:
    """The gateway's side of one AMQP consumer (the core's `Consumer.link`)."""

    session: ChannelSession
    tag: str
    queue: str
    exclusive: bool
    record: Queue | None  # the queue as declared (auto-delete, x-expires, dead-lettering)
    prefetch: int = 0  # the consumer's, when it started (0: unlimited)
    core: Consumer | None = None
    handles: dict[str, ConsumerHandle] = field(default_factory=dict)  # by subscription
    ranks: dict[str, int] = field(default_factory=dict)  # by subscription: 1 + band, or 0
    known_sets: dict[str, BindingSet] = field(default_factory=dict)  # by topic
    # What `vet` works out once per Pulsar consumer and topology change (delivery_plans.py).
    plans: dict[ConsumerHandle, DeliveryPlan] = field(default_factory=dict)
    batcher: Batcher[tuple[ConsumerHandle, list[ReceivedMessage]]] | None = None
    registered: bool = False  # in ZooKeeper's consumers of the queue
    # x-single-active-consumer: its place in the queue's line, and whether it waits for
    # its turn (it reads nothing until it is first).
    place: str | None = None
    waiting: bool = False
    # A stream queue's consumer: where it starts (it reads through readers of its own).
    stream: StreamStart | None = None
    # Where it starts on each of the stream's topics (a numeric offset differs by topic).
    topic_starts: dict[str, StreamStart] = field(default_factory=dict)
    # A stream's first retained position on each subscription's topic (docs/mapping.md).
    floors: dict[str, MessageIdRecord] = field(default_factory=dict)
    opening: set[str] = field(default_factory=set)  # subscriptions being subscribed to
    # Messages its Pulsar consumers are handed again (returns.py).
    returns: Returns = field(default_factory=Returns)

    @property
    def registry_name(self) -> str:
        # The prefetch limits the batch entries of the queue's topics (TopologyCache).
        return f"{self.session.number}/{self.tag}{PREFETCH_MARK}{self.prefetch}" + (
            EXCLUSIVE_MARK if self.exclusive else ""
        )

    @property
    def cancelled(self) -> bool:
        return self.core is None or self.core.cancelled


class LinkSet:
    """A connection's consumers, found by queue too: a change to one queue's bindings
    looks at that queue's consumers, not at every consumer of the connection."""

    def __init__(self) -> None:
        self._links: set[ConsumerLink] = set()
        self._by_queue: dict[str, set[ConsumerLink]] = {}

    def add(self, link: ConsumerLink) -> None:
        self._links.add(link)
        self._by_queue.setdefault(link.queue, set()).add(link)

    def discard(self, link: ConsumerLink) -> None:
        self._links.discard(link)
        same = self._by_queue.get(link.queue)
        if same is not None:
            same.discard(link)
            if not same:
                del self._by_queue[link.queue]

    def of_queues(self, queues: set[str] | frozenset[str] | None) -> list[ConsumerLink]:
        """The consumers of `queues` (None: every consumer), as a list taken now."""
        if queues is None:
            return list(self._links)
        return [link for queue in queues for link in self._by_queue.get(queue, ())]

    def __iter__(self) -> Iterator[ConsumerLink]:
        return iter(self._links)

    def __contains__(self, link: object) -> bool:
        return link in self._links

    def __len__(self) -> int:
        return len(self._links)
