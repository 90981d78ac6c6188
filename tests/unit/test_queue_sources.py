"""gateway/queue_sources.py: how many binding sets the cache must show before it is used."""

from __future__ import annotations

from starlight_py.gateway.queue_sources import expected_set_count
from starlight_py.model.topology import Queue


def queue(**arguments: object) -> Queue:
    return Queue("q", True, False, False, dict(arguments))


def test_an_ordinary_queue_has_at_least_its_default_binding() -> None:
    assert expected_set_count(queue()) == 1
    assert expected_set_count(queue(**{"x-max-priority": 0})) == 1


def test_a_priority_queue_has_its_default_binding_and_every_band() -> None:
    assert expected_set_count(queue(**{"x-max-priority": 5})) == 1 + 6
    assert expected_set_count(queue(**{"x-max-priority": 255})) == 1 + 11
