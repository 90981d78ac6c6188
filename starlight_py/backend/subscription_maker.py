"""Where binding subscriptions are made: over the binary protocol when the process has a
Pulsar client (the proxy), through the admin API otherwise (starlight-admin).

A binding's subscription must exist before its bind-ok (or declare-ok, or the publish that
first uses a queue's default-exchange binding), so that every message written after it
counts. Made by subscribing a consumer, it costs the broker about two thirds of the CPU
that the admin API's `PUT .../subscription/<s>` does (docs/performance.md, "Setup and delete"),
and a topic-bound queue's setup is mostly that. When the broker refuses the consumer (no
such topic and no auto-creation, no such namespace), the admin API is asked instead: it
creates the topic explicitly where auto-creation is off, and its errors say why. So it is
when the binary protocol gives up without an answer (its operation timeout): a broker that
keeps failing one topic's lookups, or is slow to answer while it makes a thousand topics at
once, gets a second way in before a publish that waits for the subscription fails; a
broker that is down fails the admin request too, at once.
"""

from __future__ import annotations

import logging

from starlight_py.backend.pulsar_admin import (
    BackendUnavailable,
    PulsarAdmin,
    PulsarAuthenticationRefused,
)
from starlight_py.backend.pulsar_client import BackendError, PulsarBackend
from starlight_py.model.naming import TopicName

__all__ = ["SubscriptionMaker"]

log = logging.getLogger("starlight.pulsar")


class SubscriptionMaker:
    """Makes and deletes the proxy's binding subscriptions."""

    def __init__(self, admin: PulsarAdmin, backend: PulsarBackend | None = None) -> None:
        self.admin = admin
        self.backend = backend

    def create(self, topic: TopicName, subscription: str) -> None:
        """Blocking: a durable subscription at the topic's latest position (an existing one
        keeps its cursor), and the topic when needed. Raises BackendUnavailable or
        PulsarAdminError (404: no such namespace)."""
        if self.backend is not None:
            try:
                self.backend.create_subscription(topic, subscription)
            except BackendError as e:
                log.debug("%s; asking the admin API", e)
            except PulsarAuthenticationRefused:
                raise
            except BackendUnavailable as e:
                log.warning("%s; asking the admin API", e)
            else:
                return
        self.admin.create_subscription(topic, subscription)

    def delete(self, topic: TopicName, subscription: str, force: bool = True) -> bool:
        """`PulsarAdmin.delete_subscription`: False when it did not exist."""
        return self.admin.delete_subscription(topic, subscription, force)
