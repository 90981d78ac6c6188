"""What basic.get (`getting.py`) and single active consumers (`single_active.py`) use of a
connection's consuming side: an interface that `consuming.Consumers` satisfies, so that
those modules need not import it (it imports them)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlight_py.backend.message_codec import DecodedMessage
from starlight_py.backend.pulsar_client import PulsarBackend, ReceivedMessage
from starlight_py.core.commands import Command
from starlight_py.gateway.channel_session import ChannelSession
from starlight_py.gateway.consume.consumer_link import ConsumerLink, LinkSet
from starlight_py.gateway.consume.queue_sources import QueueSources
from starlight_py.gateway.dead_lettering import DeadLetters
from starlight_py.gateway.topology_methods import VhostContext
from starlight_py.metadata.cache import TopologyCache
from starlight_py.metadata.records import BindingSet
from starlight_py.topology.service import TopologyService


class ConsumingServices(Protocol):
    ctx: VhostContext
    cache: TopologyCache
    topology: TopologyService
    backend: PulsarBackend
    dead_letters: DeadLetters
    sources: QueueSources
    prefix: str  # consumer names' prefix on this proxy
    links: LinkSet
    kick: Callable[[], None]
    spawn: Callable[..., None]
    # Waits for a drop-head trim of the queue running on this proxy (QueueLengths).
    trimmed: Callable[[str, str], Awaitable[None]] | None

    def execute(self, session: ChannelSession, commands: list[Command]) -> None: ...

    def route(
        self, queue: str, known_sets: dict[str, BindingSet], message: Any
    ) -> DecodedMessage | None: ...

    def redelivered(self, message: ReceivedMessage, link: ConsumerLink | None = None) -> bool: ...

    async def subscribe(
        self, link: ConsumerLink, binding_set: BindingSet, backlog: int | None = None
    ) -> None: ...
