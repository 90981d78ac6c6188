"""The management API under test: our proxy's (`managementListener`) or RabbitMQ's when
STARLIGHT_TEST_MANAGEMENT_URL is set (http://user:password@host:port), so that what the tests
expect is what RabbitMQ answers. `management` is a module-scoped fixture: import it into a
test module."""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pika
import pika.exceptions
import pytest

from starlight_py.local import ServiceEndpoints
from starlight_py.local.ports import free_port
from tests.support.proxy_runner import ProxyThread, proxy_config

T = TypeVar("T")
NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]


@dataclass(frozen=True)
class Management:
    base: str
    user: str
    password: str
    is_rabbitmq: bool
    # Where AMQP clients of the same broker connect (RabbitMQ's: STARLIGHT_TEST_AMQP_URL).
    amqp_url: str = ""

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        auth: tuple[str, str] | None = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        request = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            request.add_header("content-type", "application/json")
        for key, value in (headers or {}).items():
            request.add_header(key, value)
        user, password = auth if auth is not None else (self.user, self.password)
        if user or password:
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            request.add_header("authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return _reply(answer.status, answer.read(), dict(answer.headers))
        except urllib.error.HTTPError as e:
            return _reply(e.code, e.read(), dict(e.headers))

    def wait_for(self, path: str, key: str, value: Any, timeout: float = 20.0) -> Reply:
        """GET `path` until its `key` has `value` (RabbitMQ's counts lag by up to 5 s)."""
        deadline = time.monotonic() + timeout
        while True:
            reply = self.call("GET", path)
            if reply.status == 200 and reply.body.get(key) == value:
                return reply
            if time.monotonic() > deadline:
                return reply
            time.sleep(0.25)


def wait_until(condition: Callable[[], T | None], timeout: float = 20.0) -> T | None:
    """`condition()` once it is not None (RabbitMQ's statistics lag by up to 5 s)."""
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found is not None or time.monotonic() > deadline:
            return found
        time.sleep(0.25)


def _reply(status: int, data: bytes, headers: dict[str, str]) -> Reply:
    lowered = {k.lower(): v for k, v in headers.items()}
    return Reply(status, json.loads(data) if data else None, lowered)


@pytest.fixture(scope="module")
def management(request: pytest.FixtureRequest) -> Iterator[Management]:
    target = os.environ.get("STARLIGHT_TEST_MANAGEMENT_URL")
    if target:
        parts = urlsplit(target)
        base = f"{parts.scheme}://{parts.hostname}:{parts.port}"
        amqp_url = os.environ.get("STARLIGHT_TEST_AMQP_URL", "")
        user, password = parts.username or "guest", parts.password or "guest"
        yield Management(base, user, password, True, amqp_url)
        return
    with our_management(request.getfixturevalue("services")) as ours:
        yield ours


@contextmanager
def our_management(services: ServiceEndpoints) -> Iterator[Management]:
    """A proxy of our own with its management listener (API and web UI) on a free port."""
    port = free_port()
    config = proxy_config(
        services.zookeeper,
        services.pulsar_service_url,
        services.pulsar_web_url,
        managementListener=f"http://127.0.0.1:{port}",
    )
    proxy = ProxyThread(config).start()
    try:
        yield Management(f"http://127.0.0.1:{port}", "guest", "guest", False, proxy.amqp_url())
    finally:
        proxy.stop()


def closed_by_broker(connection: pika.BlockingConnection, timeout: float = 15.0) -> Any:
    """(reply code, reply text) of the broker's connection.close, or None within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            connection.process_data_events(time_limit=0.2)
        except pika.exceptions.ConnectionClosedByBroker as e:
            return (e.reply_code, e.reply_text)
    return None
