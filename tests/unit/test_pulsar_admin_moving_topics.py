"""The admin client asks again when a topic has no owner for a moment (its bundle is being
split or unloaded): reads only, for a bounded time. Against a stand-in broker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from starlight_py.backend import pulsar_admin
from starlight_py.backend.pulsar_admin import PulsarAdmin, PulsarAdminError
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import TopicName
from tests.support.stand_in_http import JsonHandler, serving

TOPIC = TopicName(NamespaceName("public", "default"), "orders")
NO_OWNER = (412, "Can't find owner for topic persistent://public/default/orders")


class MovingBroker(JsonHandler):
    """Answers each request with the next of `refusals`, then with stats."""

    refusals: list[tuple[int, str]] = []
    requests: list[str] = []

    def do_GET(self) -> None:
        self.requests.append("GET")
        if self.refusals:
            status, reason = self.refusals.pop(0)
            self.answer(status, {"reason": reason})
        else:
            self.answer(200, {"subscriptions": {"q1": {"msgBacklog": 3, "unackedMessages": 1}}})

    def do_PUT(self) -> None:
        self.requests.append("PUT")
        status, reason = self.refusals.pop(0) if self.refusals else (204, "")
        self.answer(status, {"reason": reason})


@pytest.fixture
def broker() -> Iterator[tuple[type[MovingBroker], PulsarAdmin]]:
    handler = type("ThisBroker", (MovingBroker,), {"refusals": [], "requests": []})
    with serving(handler) as url:
        admin = PulsarAdmin(url, timeout=2)
        admin.message_backlogs = False
        yield handler, admin


def test_stats_of_a_moving_topic_are_asked_again_until_it_has_an_owner(
    broker: tuple[type[MovingBroker], PulsarAdmin],
) -> None:
    handler, admin = broker
    handler.refusals += [NO_OWNER, (503, "Namespace bundle is being unloaded"), NO_OWNER]
    stats = admin.subscription_stats(TOPIC)
    assert stats["q1"].backlog == 3 and stats["q1"].unacked == 1
    assert handler.requests == ["GET"] * 4


def test_other_refusals_and_writes_are_not_asked_again(
    broker: tuple[type[MovingBroker], PulsarAdmin],
) -> None:
    handler, admin = broker
    handler.refusals += [(412, "Topic does not exist and cannot be auto-created")]
    with pytest.raises(PulsarAdminError, match="412"):
        admin.subscription_stats(TOPIC)
    handler.refusals += [NO_OWNER]
    with pytest.raises(PulsarAdminError, match="owner"):
        admin._request("PUT", "/admin/v2/persistent/public/default/orders")
    assert handler.requests == ["GET", "PUT"]


def test_a_topic_that_stays_without_an_owner_is_refused_after_a_while(
    broker: tuple[type[MovingBroker], PulsarAdmin], monkeypatch: pytest.MonkeyPatch
) -> None:
    handler, admin = broker
    monkeypatch.setattr(pulsar_admin, "MOVING_TOPIC_RETRY_SECONDS", 0.3)
    handler.refusals += [NO_OWNER] * 100
    with pytest.raises(PulsarAdminError, match="owner"):
        admin.subscription_stats(TOPIC)
    # Waits of 0.05 and 0.1 s fit in 0.3 s, the next 0.2 does not: at most three requests
    # (two when the machine is slow to answer).
    assert handler.requests in (["GET"] * 2, ["GET"] * 3)


class PingPongBroker(MovingBroker):
    """Sends the first `loops` requests back to itself (as two brokers that each think the
    other owns a moving topic), then answers."""

    loops = 0

    def do_GET(self) -> None:
        if type(self).loops > 0:
            type(self).loops -= 1
            self.requests.append("GET")
            self.send_response(307)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()


def test_a_read_sent_back_and_forth_is_asked_again() -> None:
    handler = type("ThisBroker", (PingPongBroker,), {"refusals": [], "requests": []})
    handler.loops = pulsar_admin.MAX_REDIRECTS + 1  # one whole read's redirects
    with serving(handler) as url:
        admin = PulsarAdmin(url, timeout=2)
        admin.message_backlogs = False
        assert admin.subscription_stats(TOPIC)["q1"].backlog == 3
    assert handler.requests == ["GET"] * (pulsar_admin.MAX_REDIRECTS + 2)
