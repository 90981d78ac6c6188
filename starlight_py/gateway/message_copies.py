"""Where a routed message is written: the exchange's topic and, for priority queues, the
topic of the message's priority band (docs/mapping.md#priority-queues)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from starlight_py.backend.message_codec import (
    IN_PRIORITY_BAND_KEY,
    REFUSED_BY_KEY,
    refused_by_value,
)
from starlight_py.model import naming
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.priorities import band_of
from starlight_py.model.topology import Exchange


def message_copies(
    namespace: NamespaceName,
    topic: naming.TopicName,
    target: Exchange,
    pulsar_properties: dict[str, str],
    routed: set[str],
    refusing: set[str],
    priorities: dict[str, int],
    priority: int | None,
) -> list[tuple[naming.TopicName, dict[str, str]]]:
    """Where a message routed by `target` is written: the exchange's `topic` (whose binding
    subscriptions skip it for the queues in `refusing`), and, for each of the `routed`
    queues that is a priority queue (`priorities`: queue -> x-max-priority), the topic of
    the message's priority band (docs/mapping.md#priority-queues).

    A message for the default exchange that only priority queues take is not written to the
    exchange's topic at all. For any other exchange it is, marked as skipped by those
    queues, because a binding made a moment ago may not be in this proxy's cache yet."""
    banded = {
        q: band_of(priority, priorities[q]) for q in sorted(routed - refusing) if q in priorities
    }
    copies = []
    if not banded or target.name != "" or routed - refusing - banded.keys():
        main = pulsar_properties
        if refusing or banded:
            main = dict(pulsar_properties)
            if refusing:
                main[REFUSED_BY_KEY] = refused_by_value(refusing)
            if banded:
                main[IN_PRIORITY_BAND_KEY] = refused_by_value(set(banded))
        copies.append((topic, main))
    for queue, band in banded.items():
        copies.append((naming.priority_band_topic(namespace, queue, band), pulsar_properties))
    return copies


def joined(copies: int, done: Callable[[bool, str], None]) -> Callable[[bool, str], None]:
    """A send callback for each of the `copies` of one message that calls `done` once, after
    the last, with ok only when Pulsar stored every copy (the first error otherwise). One
    copy, the usual case, is `done` itself. Callbacks come from pulsar-client's threads."""
    if copies == 1:
        return done
    lock = threading.Lock()
    left, stored, first_error = copies, True, ""

    def each(ok: bool, error: str) -> None:
        nonlocal left, stored, first_error
        with lock:
            if not ok and stored:
                stored, first_error = False, error
            left -= 1
            if left:
                return
        done(stored, first_error)

    return each
