"""The delivery plan `Consumers.vet` keeps per Pulsar consumer (gateway/consume/delivery_plans.py),
the shortcut through a message's properties it takes (`plain_delivery`), and the confirms
a batch of outcomes settles at once."""

from __future__ import annotations

import base64
import itertools
from dataclasses import dataclass, field

import pytest
from pamqp import commands

from starlight_py.backend.message_codec import (
    EXCHANGE_KEY,
    EXPIRATION_KEY,
    IN_PRIORITY_BAND_KEY,
    PROPERTIES_KEY,
    REFUSED_BY_KEY,
    ROUTED_ELSEWHERE_KEY,
    ROUTING_KEY_BASE64_KEY,
    ROUTING_KEY_KEY,
    decode,
    encode_properties,
    plain_delivery,
)
from starlight_py.core.confirms import Confirms
from starlight_py.gateway.consume.delivery_plans import DeliveryPlan, plan_deliveries
from starlight_py.metadata.records import BindingEntry, BindingSet, RetiredSubscription
from starlight_py.model import naming
from starlight_py.model.positions import MessageIdRecord
from starlight_py.model.priorities import PRIORITY_BAND_TYPE
from starlight_py.model.routing import any_binding_routes
from starlight_py.model.topology import Queue

TYPES = ("direct", "fanout", "topic", "headers", PRIORITY_BAND_TYPE)
AT = MessageIdRecord(5, 5, -1, -1)
ENTRIES = (
    BindingEntry("a.b"),
    BindingEntry("a.*"),
    BindingEntry("#"),
    BindingEntry("c", {"x-match": "all", "k": "v"}),
    BindingEntry("a.b", start=MessageIdRecord(3, 0, -1, -1)),  # bound later: a window
    BindingEntry("d", start=None, end=MessageIdRecord(9, 0, -1, -1), unbound=True),
    BindingEntry("e", end=None, unbound=True),
)
KEYS = ("a.b", "a.c", "c", "d", "e", "", "x.y.z")
POSITIONS = (None, MessageIdRecord(1, 0, -1, -1), AT, MessageIdRecord(20, 0, -1, -1))


def binding_set(kind: str, entries: tuple[BindingEntry, ...]) -> BindingSet:
    return BindingSet("q", "ex", "topic", "q~~sub", entries, exchange_type=kind)


def plan(kind: str, entries: tuple[BindingEntry, ...]) -> DeliveryPlan:
    return DeliveryPlan(0, "ex", "", None, binding_set(kind, entries))


def entry_sets() -> list[tuple[BindingEntry, ...]]:
    return [c for n in (1, 2, 3) for c in itertools.combinations(ENTRIES, n)]


@pytest.mark.parametrize("kind", TYPES)
def test_a_plan_says_routed_only_when_the_bindings_route_at_any_position(kind: str) -> None:
    # "Routed" from a plan is final (vet delivers at once); "not sure" goes the long way.
    checked = 0
    for entries in entry_sets():
        p = plan(kind, entries)
        for key in KEYS:
            if not p.routes(key):
                continue
            for position in POSITIONS:
                assert any_binding_routes(kind, entries, key, {"k": "v"}, position), (
                    kind,
                    entries,
                    key,
                    position,
                )
                checked += 1
    assert (checked > 0) == (kind != "headers")  # headers: the message's headers decide


@pytest.mark.parametrize("kind", ["direct", "fanout", "topic", PRIORITY_BAND_TYPE])
def test_without_windows_a_plan_routes_what_the_bindings_route(kind: str) -> None:
    unconditional = tuple(e for e in ENTRIES if e.start is None and not e.unbound)
    for n in (1, 2, 3):
        for entries in itertools.combinations(unconditional, n):
            p = plan(kind, entries)
            for key in KEYS:
                assert p.routes(key) == any_binding_routes(kind, entries, key, None, AT), (
                    kind,
                    entries,
                    key,
                )


def test_a_headers_exchange_and_windows_alone_are_left_to_the_long_way() -> None:
    assert not plan("headers", (BindingEntry("", {"x-match": "any"}),)).routes("k")
    assert not plan("fanout", (BindingEntry("", start=AT),)).routes("k")
    assert not plan("direct", (BindingEntry("k", unbound=True, end=AT),)).routes("k")


def test_a_topic_plan_remembers_a_bounded_number_of_keys() -> None:
    p = plan("topic", (BindingEntry("a.#"),))
    for i in range(1000):
        assert p.routes(f"a.{i}")
        assert not p.routes(f"b.{i}")
    assert len(p._matched) <= 256


def test_a_plan_without_a_binding_set_routes_everything() -> None:
    # A Pulsar-native topic, or a priority band's: no binding to ask.
    assert DeliveryPlan(0, "", "", None, None).routes("anything")


def test_a_plan_knows_whether_the_queue_checks_deliveries() -> None:
    assert not DeliveryPlan(0, "", "", Queue("q"), None).checks_deliveries
    ttl = Queue("q", arguments={"x-message-ttl": 1000})
    assert DeliveryPlan(0, "", "", ttl, None).checks_deliveries
    limit = Queue("q", arguments={"x-delivery-limit": 3})
    assert DeliveryPlan(0, "", "", limit, None).checks_deliveries


@dataclass
class Cache:
    changes: int = 7
    sets: dict[tuple[str, str, str], BindingSet] = field(default_factory=dict)
    retirements: dict[tuple[str, str], RetiredSubscription] = field(default_factory=dict)
    queues: dict[tuple[str, str], Queue] = field(default_factory=dict)

    def binding_set_reading(self, vhost: str, queue: str, topic: str) -> BindingSet | None:
        return self.sets.get((vhost, queue, topic))

    def retired(self, vhost: str, subscription: str) -> RetiredSubscription | None:
        return self.retirements.get((vhost, subscription))

    def queue(self, vhost: str, name: str) -> Queue | None:
        return self.queues.get((vhost, name))


@dataclass
class Link:
    queue: str = "q"
    record: Queue | None = None
    known_sets: dict[str, BindingSet] = field(default_factory=dict)


TOPIC = naming.exchange_topic("t/ns", "ex", "direct", "rk").local


def test_plan_deliveries_reads_the_cache_first() -> None:
    cached = binding_set("fanout", (BindingEntry(""),))
    known = binding_set("direct", (BindingEntry("other"),))
    cache = Cache(sets={("/", "q", TOPIC): cached}, queues={("/", "q"): Queue("q")})
    p = plan_deliveries(cache, "/", Link(known_sets={TOPIC: known}), TOPIC)
    assert p.version == 7 and p.exchange_type == "fanout" and p.routes("any")
    assert p.record == Queue("q")
    assert (p.exchange, p.key) == naming.exchange_and_key_of_topic(TOPIC)


def test_plan_deliveries_falls_back_to_a_retired_set_then_to_what_the_consumer_read() -> None:
    known = binding_set("direct", (BindingEntry("rk"),))
    link = Link(record=Queue("q", durable=False), known_sets={TOPIC: known})
    fresh = plan_deliveries(Cache(), "/", link, TOPIC)
    assert fresh.routes("rk") and not fresh.routes("other")
    assert fresh.record == Queue("q", durable=False)  # the cache has no record yet
    unbound = binding_set("direct", (BindingEntry("rk", end=AT, unbound=True),))
    retired = RetiredSubscription(TOPIC, known.subscription, "q", AT, True, 0.0, unbound)
    cache = Cache(retirements={("/", known.subscription): retired})
    draining = plan_deliveries(cache, "/", link, TOPIC)
    assert not draining.routes("rk")  # up to its end only: the long way decides


def properties_of(**values: object) -> commands.Basic.Properties:
    return commands.Basic.Properties(**values)  # type: ignore[arg-type]


def encoded(properties: commands.Basic.Properties) -> dict[str, str]:
    return encode_properties("ex", "rk", properties)


def test_plain_delivery_matches_decode_once_decode_has_seen_the_properties() -> None:
    pulsar = encoded(properties_of(delivery_mode=2, headers={"h": 1}, message_id="m-77"))
    assert plain_delivery(pulsar, "dx", "dk") is None  # not decoded yet
    full = decode(pulsar, b"body", "dx", "dk")
    assert plain_delivery(pulsar, "dx", "dk") == ("ex", "rk", full.raw_properties)
    raw = base64.b64decode(pulsar[PROPERTIES_KEY])
    assert full.raw_properties == raw


def test_plain_delivery_takes_the_topics_exchange_and_key_when_the_message_has_none() -> None:
    pulsar = encoded(properties_of(app_id="plain-default"))
    decode(pulsar, b"", "dx", "dk")
    del pulsar[EXCHANGE_KEY], pulsar[ROUTING_KEY_KEY]
    view = plain_delivery(pulsar, "dx", "dk")
    assert view is not None and view[:2] == ("dx", "dk")


@pytest.mark.parametrize(
    "key", [REFUSED_BY_KEY, IN_PRIORITY_BAND_KEY, ROUTED_ELSEWHERE_KEY, EXPIRATION_KEY]
)
def test_plain_delivery_leaves_special_messages_to_decode(key: str) -> None:
    pulsar = encoded(properties_of(app_id="plain-special"))
    decode(pulsar, b"", "dx", "dk")
    assert plain_delivery(pulsar, "dx", "dk") is not None
    pulsar[key] = '["q"]' if key != EXPIRATION_KEY else "1000"
    assert plain_delivery(pulsar, "dx", "dk") is None


def test_a_pulsar_native_message_is_left_to_decode() -> None:
    assert plain_delivery({"content-type": "text/plain"}, "dx", "dk") is None


def test_settle_all_records_each_outcome_and_skips_unnumbered_publishes() -> None:
    confirms = Confirms()
    for _ in range(4):
        confirms.reserve()
    confirms.settle_all([(2, True), (0, True), (1, True), (4, False)])
    assert confirms.runs() == [(2, True, True)]
    confirms.settle_all([(3, False)])
    assert confirms.runs() == [(4, True, False)]


@pytest.mark.parametrize("outcomes", [[(1, True), (1, True)], [(5, True)], [(-1, True)]])
def test_settle_all_refuses_what_was_never_reserved_or_settles_twice(
    outcomes: list[tuple[int, bool]],
) -> None:
    confirms = Confirms()
    for _ in range(3):
        confirms.reserve()
    with pytest.raises(ValueError):
        confirms.settle_all(outcomes)


def test_a_routing_key_with_a_nul_survives_properties_read_as_c_strings() -> None:
    """pulsar-client's C API (listened consumers) reads each property up to its first NUL:
    the routing key comes back whole from its base64 copy, and never through the plain
    shortcut, which reads the truncated one."""
    key = "a\x00b\x00"
    pulsar = encode_properties("ex", key, properties_of(app_id="nul"))
    assert ROUTING_KEY_BASE64_KEY in pulsar
    as_c_strings = {k: v.split("\x00", 1)[0] for k, v in pulsar.items()}
    assert as_c_strings[ROUTING_KEY_KEY] == "a"
    assert decode(as_c_strings, b"", "dx", "dk").routing_key == key
    assert plain_delivery(as_c_strings, "dx", "dk") is None
    plain = encode_properties("ex", "ab", properties_of(app_id="nul"))
    assert ROUTING_KEY_BASE64_KEY not in plain  # only keys with a NUL carry a copy
