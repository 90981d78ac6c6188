"""A queue's ready messages (AMQP's `message_count`) from Pulsar's statistics and the
proxies' unacked deliveries (docs/mapping.md#counts)."""

from __future__ import annotations


def ready_messages(waiting: int, undispatched: int, held: int, settling: int) -> int:
    """RabbitMQ's ready count of a queue.

    - `waiting`: Pulsar's backlog less the delayed messages it tracks (ready, read ahead by
      a proxy, delivered and unacked, or acknowledged but not yet heard of by Pulsar);
    - `undispatched`: the same less Pulsar's unacked (what no Pulsar consumer holds): never
      more than the ready count, since what a proxy read ahead is ready too;
    - `held`: AMQP deliveries unacked on every proxy;
    - `settling`: deliveries this process settled a moment ago, which Pulsar may still count.

    `waiting - held` is never less than the ready count (it is more by the acknowledgements
    Pulsar has not heard of); less `settling` it may undershoot once Pulsar heard of them,
    and `undispatched` is the floor."""
    return max(0, undispatched, waiting - held - settling)
