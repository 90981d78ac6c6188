"""The management API: an `HttpRequest` in, an `HttpResponse` out. Logs the caller in,
finds the endpoint (routing.py), runs it and shapes the answer; errors become RabbitMQ's
error bodies in one place (errors.py).

Endpoints are plain functions of an `ApiCall`. Blocking ones (ZooKeeper, Pulsar admin) run
in a worker thread under a limiter of their own, so a burst of management requests never
takes the threads AMQP connections need; `async` ones (publish, get, aliveness) talk AMQP to
this proxy over loopback (loopback.py).
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import trio

from starlight_py.admin.context import AdminContext
from starlight_py.management.auth import ApiUser, log_in
from starlight_py.management.errors import (
    ApiError,
    InternalServerError,
    ObjectNotFound,
    as_api_error,
)
from starlight_py.management.http_server import HttpRequest, HttpResponse
from starlight_py.management.rates import CountRates
from starlight_py.management.routing import Router, parse_target
from starlight_py.management.samples import SampleHistory
from starlight_py.management.shapes import json_body
from starlight_py.model.addresses import host_port

if TYPE_CHECKING:
    from starlight_py.gateway.proxy_services import ProxyServices

log = logging.getLogger("starlight.management")

WORKER_THREADS = 4
JSON_HEADERS = (
    ("content-type", "application/json"),
    ("cache-control", "no-cache"),
    ("vary", "accept, accept-encoding, origin"),
)


@dataclass(frozen=True)
class Answer:
    """What an endpoint answers: a status and a JSON value (None: no body)."""

    status: int = 200
    value: Any = None
    headers: tuple[tuple[str, str], ...] = ()


NO_CONTENT = Answer(204)
CREATED = Answer(201)


@dataclass
class ApiContext:
    """What endpoints work with: the proxy's services, an admin context sharing its
    ZooKeeper session (for admin/inventory.py and admin/definitions.py), and where this
    proxy's AMQP listener is (for publish and get)."""

    services: ProxyServices
    amqp_urls: list[str]
    readiness: Callable[[], list[str]]  # blocking: what keeps the proxy from serving
    admin: AdminContext = field(init=False)
    default_vhost_seen: bool = False  # vhost_access.ensure_default_vhost
    rates: CountRates = field(default_factory=CountRates)
    samples: SampleHistory = field(default_factory=SampleHistory)  # for charts

    def __post_init__(self) -> None:
        self.admin = AdminContext.sharing(self.services.config, self.services.topology)


@dataclass(frozen=True)
class ApiCall:
    context: ApiContext
    request: HttpRequest
    params: Mapping[str, str]
    query: Mapping[str, str]
    user: ApiUser

    def body(self) -> dict[str, Any]:
        """The JSON object sent; raises BadRequest("not_json")."""
        return json_body(self.request.body)


Endpoint = Callable[[ApiCall], Answer] | Callable[[ApiCall], Awaitable[Answer]]


class ManagementApi:
    def __init__(self, context: ApiContext, router: Router[Endpoint]) -> None:
        self.context = context
        self.router = router
        self._threads = trio.CapacityLimiter(WORKER_THREADS)

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            answer = await self._answer(request)
        except Exception as e:
            error = as_api_error(e)
            if error is None:
                log.exception("management request %s %s failed", request.method, request.target)
                error = InternalServerError("internal error; see the proxy's log")
            return error_response(error)
        return answer_response(answer)

    async def _answer(self, request: HttpRequest) -> Answer:
        target = parse_target(request.target)
        if not target.segments or target.segments[0] != "api":
            raise ObjectNotFound()
        matched = self.router.match(request.method, target.segments)
        services = self.context.services
        # In a worker thread: a password login may ask ZooKeeper for the user.
        user = await trio.to_thread.run_sync(
            log_in,
            request.headers.get("authorization"),
            services.authenticator,
            services.permissions,
            services.config.management_administrators,
            host_port(request.peer)[0] if request.peer else None,
            limiter=self._threads,
        )
        call = ApiCall(self.context, request, matched.params, target.query, user)
        endpoint = matched.handler
        if inspect.iscoroutinefunction(endpoint):
            result: Answer = await endpoint(call)
            return result
        blocking = cast(Callable[[ApiCall], Answer], endpoint)
        return await trio.to_thread.run_sync(blocking, call, limiter=self._threads)


def answer_response(answer: Answer) -> HttpResponse:
    if answer.value is None:
        return HttpResponse(answer.status, b"", answer.headers)
    body = json.dumps(answer.value, separators=(",", ":")).encode()
    return HttpResponse(answer.status, body, JSON_HEADERS + answer.headers)


def error_response(error: ApiError) -> HttpResponse:
    headers: tuple[tuple[str, str], ...] = ()
    if error.status == 401:
        headers = (("www-authenticate", 'Basic realm="RabbitMQ Management"'),)
    body = json.dumps(error.body()).encode()
    return HttpResponse(error.status, body, JSON_HEADERS + headers)
