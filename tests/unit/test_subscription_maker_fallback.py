"""When the binary protocol cannot make a binding subscription, SubscriptionMaker asks the
admin API; a refusal of the proxy's credentials is not asked again. (The two ways
themselves are tested against a real Pulsar in tests/integration/test_subscription_maker.py.)"""

from __future__ import annotations

from typing import Any, cast

import pytest

from starlight_py.backend.pulsar_admin import (
    BackendUnavailable,
    PulsarAdmin,
    PulsarAuthenticationRefused,
)
from starlight_py.backend.pulsar_client import BackendError, PulsarBackend
from starlight_py.backend.subscription_maker import SubscriptionMaker
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import TopicName

TOPIC = TopicName(NamespaceName("public", "default"), "x~~q~~1")


class Backend:
    def __init__(self, error: Exception | None) -> None:
        self.error = error
        self.asked = 0

    def create_subscription(self, topic: TopicName, subscription: str) -> None:
        self.asked += 1
        if self.error is not None:
            raise self.error


class Admin:
    def __init__(self) -> None:
        self.made: list[tuple[str, str]] = []

    def create_subscription(self, topic: TopicName, subscription: str) -> bool:
        self.made.append((topic.local, subscription))
        return True


def maker(error: Exception | None) -> tuple[SubscriptionMaker, Backend, Admin]:
    backend, admin = Backend(error), Admin()
    made = SubscriptionMaker(cast(PulsarAdmin, admin), cast(PulsarBackend, cast(Any, backend)))
    return made, backend, admin


def test_made_over_the_binary_protocol_the_admin_api_is_not_asked() -> None:
    made, backend, admin = maker(None)
    made.create(TOPIC, "s")
    assert (backend.asked, admin.made) == (1, [])


@pytest.mark.parametrize(
    "error",
    [
        BackendError("cannot consume from x: TopicNotFound"),
        BackendUnavailable("cannot consume from x: Pulsar did not answer in time"),
    ],
)
def test_a_refusal_or_a_timeout_of_the_binary_protocol_asks_the_admin_api(
    error: Exception,
) -> None:
    made, backend, admin = maker(error)
    made.create(TOPIC, "s")
    assert (backend.asked, admin.made) == (1, [(TOPIC.local, "s")])


def test_refused_credentials_are_not_tried_again_over_http() -> None:
    made, _, admin = maker(PulsarAuthenticationRefused("Pulsar refused authentication"))
    with pytest.raises(PulsarAuthenticationRefused):
        made.create(TOPIC, "s")
    assert admin.made == []
