"""gateway/errors.py: the one translation of failures into what a client is told."""

from __future__ import annotations

from starlight_py.amqp.errors import InternalError, NotFound
from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdminError
from starlight_py.gateway.errors import as_amqp_error


def test_known_failures_become_541_with_a_reason() -> None:
    error = as_amqp_error(BackendUnavailable("broker down"), (60, 70))
    assert isinstance(error, InternalError)
    assert "Pulsar unavailable: broker down" in str(error)
    assert as_amqp_error(ValueError("a bug")) is None


def test_a_group_of_failures_answers_with_its_first_known_one() -> None:
    # Several Pulsar calls at once (a trio nursery) fail together as an ExceptionGroup: the
    # client hears what Pulsar said, not "internal error (ExceptionGroup)".
    refused = PulsarAdminError(412, "Can't find owner for topic persistent://t/ns/q")
    group = ExceptionGroup("nursery", [ValueError("a bug"), ExceptionGroup("inner", [refused])])
    error = as_amqp_error(group, (60, 70))
    assert isinstance(error, InternalError)
    assert "Pulsar refused the operation: HTTP 412: Can't find owner" in str(error)
    not_found = NotFound("no queue 'q' in vhost '/'")
    assert as_amqp_error(ExceptionGroup("nursery", [not_found])) is not_found
    assert as_amqp_error(ExceptionGroup("nursery", [ValueError("a bug")])) is None
