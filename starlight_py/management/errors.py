"""The one translation of errors into management API answers: RabbitMQ's status codes and
its JSON error body, `{"error": ..., "reason": ...}`.

`ApiError` subclasses carry their status and `error` word as class attributes. Errors of the
topology (AMQPError subclasses, with RabbitMQ's texts) become what RabbitMQ's management
plugin answers for the same refusal; unavailable ZooKeeper or Pulsar become 503 with the
reason (through gateway/errors.py, the translation the AMQP side uses); anything else is a
bug and becomes 500 with no details.
"""

from __future__ import annotations

from typing import ClassVar

from starlight_py.amqp.errors import (
    AccessRefused,
    AMQPError,
    ConnectionAccessRefused,
    InternalError,
    NotAllowed,
    NotFound,
)
from starlight_py.gateway.errors import as_amqp_error


class ApiError(Exception):
    status: ClassVar[int] = 500
    error: ClassVar[str] = "internal_server_error"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def body(self) -> dict[str, str]:
        return {"error": self.error, "reason": self.reason}


class ObjectNotFound(ApiError):
    """What RabbitMQ answers for a path naming something that does not exist."""

    status = 404
    error = "Object Not Found"

    def __init__(self, reason: str = "Not Found") -> None:
        super().__init__(reason)


class NotFoundError(ApiError):
    """An operation on something missing (RabbitMQ's `not_found`, with the AMQP text)."""

    status = 404
    error = "not_found"


class BadRequest(ApiError):
    status = 400
    error = "bad_request"


class LoginFailed(ApiError):
    status = 401
    error = "not_authorized"  # sic: RabbitMQ spells it so for failed logins

    def __init__(self, reason: str = "Login failed") -> None:
        super().__init__(reason)


class NotAuthorised(ApiError):
    """Logged in, but not allowed to do this."""

    status = 401
    error = "not_authorised"

    def __init__(self, reason: str = "Access refused.") -> None:
        super().__init__(reason)


class MethodNotAllowed(ApiError):
    status = 405
    error = "method_not_allowed"

    def __init__(self, reason: str = "Method Not Allowed") -> None:
        super().__init__(reason)


class ServiceUnavailable(ApiError):
    status = 503
    error = "service_unavailable"


class InternalServerError(ApiError):
    status = 500
    error = "internal_server_error"


def as_api_error(error: Exception) -> ApiError | None:
    """The answer for `error`, or None when it is unexpected (a bug: log it, answer 500)."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, NotFound):
        return NotFoundError(error.reply_text)
    if isinstance(error, AccessRefused | ConnectionAccessRefused | NotAllowed):
        return NotAuthorised(error.text)
    translated = as_amqp_error(error)
    if translated is None:
        return None
    if isinstance(translated, InternalError):
        return ServiceUnavailable(translated.text)
    if isinstance(translated, AMQPError):
        # PRECONDITION_FAILED, RESOURCE_LOCKED, COMMAND_INVALID...: RabbitMQ answers 400
        # with the AMQP text (without the reply code's name).
        return BadRequest(translated.text)
    return None
