"""A connection's consumers found by queue (gateway/consume/consumer_link.py LinkSet)."""

from __future__ import annotations

from dataclasses import dataclass

from starlight_py.gateway.consume.consumer_link import LinkSet


@dataclass(eq=False)
class Link:
    queue: str


def test_consumers_are_found_by_queue_and_forgotten() -> None:
    links = LinkSet()
    a1, a2, b = Link("a"), Link("a"), Link("b")
    for link in (a1, a2, b):
        links.add(link)  # type: ignore[arg-type]
    assert set(links.of_queues({"a"})) == {a1, a2}
    assert set(links.of_queues(frozenset({"a", "b", "gone"}))) == {a1, a2, b}
    assert set(links.of_queues(None)) == {a1, a2, b} == set(links)
    assert len(links) == 3 and b in links

    links.discard(a1)  # type: ignore[arg-type]
    links.discard(a1)  # type: ignore[arg-type]
    assert links.of_queues({"a"}) == [a2] and a1 not in links
    links.discard(a2)  # type: ignore[arg-type]
    assert links.of_queues({"a"}) == [] and links._by_queue.keys() == {"b"}
