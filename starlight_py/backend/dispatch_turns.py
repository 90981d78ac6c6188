"""Whether the brokers hand a queue's messages to its consumers in turns, as RabbitMQ does.

A queue's subscription is Shared: the broker gives each consumer in turn up to
`dispatcherMaxRoundRobinBatchSize` entries of what it has read (20 by default). A burst
read at once then goes to one consumer whole: ten messages published together to two idle
consumers of prefetch 10 went ten to one and none to the other about one time in three,
where RabbitMQ gives five to each. With 1 the broker gives one entry per turn, so a burst is
spread as RabbitMQ spreads it (and batch entries, cut to the consumers' share by
model/batch_share.py, go one to each). docs/operations.md#what-pulsar-needs.
"""

from __future__ import annotations

from starlight_py.backend.pulsar_admin import PulsarAdmin

ROUND_ROBIN_BATCH = "dispatcherMaxRoundRobinBatchSize"
IN_TURNS = "1"


def turns_caveat(admin: PulsarAdmin) -> str | None:
    """What differs from RabbitMQ's dispatch with these brokers (a warning at start), or
    None when they give one entry per turn. Blocking (one admin request)."""
    value = admin.broker_setting_shown(ROUND_ROBIN_BATCH)
    if value == IN_TURNS:
        return None
    return (
        f"the broker has {ROUND_ROBIN_BATCH}={value}: a burst of messages read at once can go "
        "to one consumer of a queue rather than in turns to all of them, as RabbitMQ does "
        f"(set it to {IN_TURNS} on every broker)"
    )
