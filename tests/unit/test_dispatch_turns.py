"""The start-up check that the brokers give a queue's consumers its messages in turns
(backend/dispatch_turns.py), against a stand-in broker's runtime configuration."""

from __future__ import annotations

from starlight_py.backend.dispatch_turns import IN_TURNS, ROUND_ROBIN_BATCH, turns_caveat
from starlight_py.backend.pulsar_admin import PulsarAdmin
from starlight_py.local.pulsar_cluster import BROKER_SETTINGS_THE_PROXY_NEEDS
from tests.support.stand_in_http import JsonHandler, serving


class Broker(JsonHandler):
    settings: dict[str, str] | None = None  # None: 403, as to a role that is no super-user

    def do_GET(self) -> None:
        if self.path != "/admin/v2/brokers/configuration/runtime":
            self.answer(404, {"reason": "not here"})
        elif self.settings is None:
            self.answer(403, {"reason": "Only super-user can access this"})
        else:
            self.answer(200, self.settings)


def test_brokers_giving_up_to_20_entries_a_turn_are_warned_of() -> None:
    handler = type("ThisBroker", (Broker,), {})
    with serving(handler) as url:
        admin = PulsarAdmin(url, timeout=2)
        handler.settings = {ROUND_ROBIN_BATCH: "20"}  # Pulsar's default
        assert turns_caveat(admin) == (
            "the broker has dispatcherMaxRoundRobinBatchSize=20: a burst of messages read at "
            "once can go to one consumer of a queue rather than in turns to all of them, as "
            "RabbitMQ does (set it to 1 on every broker)"
        )
        handler.settings = {ROUND_ROBIN_BATCH: IN_TURNS}
        assert turns_caveat(admin) is None


def test_a_configuration_that_cannot_be_read_is_said_so() -> None:
    handler = type("ThisBroker", (Broker,), {})
    with serving(handler) as url:
        caveat = turns_caveat(PulsarAdmin(url, timeout=2))
    assert caveat is not None and caveat.startswith(
        "the broker has dispatcherMaxRoundRobinBatchSize=unknown ("
    )


def test_the_local_brokers_dispatch_in_turns() -> None:
    assert BROKER_SETTINGS_THE_PROXY_NEEDS[ROUND_ROBIN_BATCH] == IN_TURNS
