"""How many messages of one socket read may share a Pulsar batch entry on a topic, from the
prefetches of the consumers of the queues that read it.

Pulsar hands an entry to one consumer whole. So an entry must not carry more than a
consumer of the queue would take at once, or it keeps messages from the others:

- a queue without consumers: one message per entry, so that the backlog it builds is spread
  over the consumers that come later (and over competing basic.get clients);
- one consumer: up to its prefetch (unlimited for prefetch 0);
- n competing consumers: up to the smallest prefetch divided by n (at least 1), so a burst
  that one read publishes is still spread over all of them, about as RabbitMQ round-robins
  it (a burst of 10 to four idle consumers of prefetch 10 goes out 4/2/2/2 in entries of 2
  where RabbitMQ gives 3/3/2/2). An unlimited prefetch counts as `SHARED_UNLIMITED` here.

A topic read by several queues takes the smallest of their shares.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

# The prefetch an unlimited consumer (prefetch 0) counts as when it competes with others.
SHARED_UNLIMITED = 100
UNBATCHED = 1


def queue_share(prefetches: Collection[int]) -> int | None:
    """Most messages of one read in an entry for a queue whose consumers (on every proxy)
    have these prefetches (0: unlimited); None: no limit."""
    if not prefetches:
        return UNBATCHED
    limited = [p for p in prefetches if p > 0]
    if len(prefetches) == 1:
        return limited[0] if limited else None
    smallest = min(limited) if limited else SHARED_UNLIMITED
    return max(UNBATCHED, smallest // len(prefetches))


def topic_share(shares: Iterable[int | None]) -> int | None:
    """The entry limit of a topic from the shares of the queues that read it (None: no
    limit). A topic nobody reads is unbatched."""
    limit: int | None = None
    seen = False
    for share in shares:
        seen = True
        if share is not None and (limit is None or share < limit):
            limit = share
            if limit <= UNBATCHED:
                return UNBATCHED
    return limit if seen else UNBATCHED
