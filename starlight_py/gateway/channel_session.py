"""What the gateway keeps per open channel (confirm mode now; consumers and unacked
deliveries join it with message flow)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ChannelSession:
    number: int
    confirm_mode: bool = False
    # Publisher-confirm sequence numbers start at 1 once confirm.select is seen.
    next_publish_seq: int = 1
    # basic.qos: RabbitMQ semantics, global=false -> each new consumer, global=true -> channel.
    consumer_prefetch: int = 0
    channel_prefetch: int = 0
    # AMQP: an empty queue name in later methods means the last queue declared here.
    last_queue: str | None = None
