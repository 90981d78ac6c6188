"""The management listener's HTTP/1.1 shell: h11 parses, trio carries bytes, and one
`Handler` (the API) turns each `HttpRequest` into an `HttpResponse`.

Theory of operation: one task per TCP connection reads events from h11 until a whole request
is in (head at most MAX_HEAD bytes, body at most MAX_BODY: larger requests get 413 and the
connection closes), calls the handler, writes the response and, when both sides allow it,
starts over on the same connection (keep-alive). A connection that has not sent a whole
request READ_TIMEOUT after the previous response (or after connecting) is closed. Handler
bugs become 500 with no details (those go to the log), never a dropped connection.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from http import HTTPStatus

import h11
import trio

from starlight_py.units import KIB, MIB, SECONDS

log = logging.getLogger("starlight.management")

MAX_HEAD = 16 * KIB
MAX_BODY = 32 * MIB  # definitions of large installations
READ_TIMEOUT = 60 * SECONDS
READ_SIZE = 64 * KIB
MAX_CONNECTIONS = 256  # more at once get BUSY and are closed
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n"
    b"content-length: 32\r\nconnection: close\r\n\r\ntoo many management connections\n"
)
SERVER_NAME = b"starlight-py"
_KNOWN = frozenset(status.value for status in HTTPStatus)


@dataclass(frozen=True)
class HttpRequest:
    method: str
    target: str  # raw, still %-encoded: "/api/queues/%2F/q?columns=name"
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes = b""
    peer: str = ""


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = field(default_factory=tuple)


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


class RequestTooLarge(Exception):
    """The request head or body is over its limit."""


async def serve_http(
    host: str,
    port: int,
    handler: Handler,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `handler` on host:port until cancelled; `task_status.started` gets the bound
    URL. Raises OSError when the port cannot be bound."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound_host, bound_port = listeners[0].socket.getsockname()[:2]
    url = f"http://{bound_host}:{bound_port}"
    task_status.started(url)
    open_connections = 0

    async def handle(stream: trio.SocketStream) -> None:
        nonlocal open_connections
        try:
            peer_host, peer_port = stream.socket.getpeername()[:2]
            peer = f"{peer_host}:{peer_port}"
        except OSError:
            peer = "?"
        open_connections += 1
        try:
            if open_connections > MAX_CONNECTIONS:
                await stream.send_all(BUSY)
            else:
                await serve_connection(stream, handler, peer)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception:
            log.exception("management connection from %s failed", peer)
        finally:
            open_connections -= 1
            await trio.aclose_forcefully(stream)

    await trio.serve_listeners(handle, listeners)


async def serve_connection(stream: trio.abc.Stream, handler: Handler, peer: str = "") -> None:
    """Requests and responses on one connection until either side ends it."""
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    while True:
        try:
            with trio.fail_after(READ_TIMEOUT):
                request = await _read_request(stream, connection, peer)
        except trio.TooSlowError:
            return
        except RequestTooLarge:
            await _send(stream, connection, _plain(413, b"request too large\n"), close=True)
            return
        except h11.RemoteProtocolError as e:
            if connection.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                status = e.error_status_hint
                await _send(stream, connection, _plain(status, b"bad request\n"), close=True)
            return
        if request is None:
            return
        try:
            response = await handler(request)
        except Exception:
            log.exception("management request %s %s failed", request.method, request.target)
            response = _plain(500, b"internal error\n")
        await _send(stream, connection, response, close=False, head=request.method == "HEAD")
        if connection.our_state is h11.MUST_CLOSE or connection.their_state is h11.MUST_CLOSE:
            return
        try:
            connection.start_next_cycle()
        except h11.LocalProtocolError:
            return


async def _read_request(
    stream: trio.abc.Stream,
    connection: h11.Connection,
    peer: str,
) -> HttpRequest | None:
    """The next whole request, or None when the client closed the connection. Raises
    RequestTooLarge, h11.RemoteProtocolError."""
    head: h11.Request | None = None
    body = bytearray()
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            if connection.they_are_waiting_for_100_continue:
                await stream.send_all(
                    connection.send(h11.InformationalResponse(status_code=100, headers=[])) or b""
                )
            connection.receive_data(bytes(await stream.receive_some(READ_SIZE)))
            continue
        if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None
        if isinstance(event, h11.Request):
            head = event
            length = _header(event.headers, b"content-length")
            if length is not None and length.isdigit() and int(length) > MAX_BODY:
                raise RequestTooLarge
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY:
                raise RequestTooLarge
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            headers: dict[str, str] = {}
            for name, value in head.headers:
                key = name.decode("latin-1").lower()
                text = value.decode("latin-1")
                headers[key] = f"{headers[key]}, {text}" if key in headers else text
            return HttpRequest(
                head.method.decode("ascii"),
                head.target.decode("latin-1"),
                headers,
                bytes(body),
                peer,
            )


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _plain(status: int, text: bytes) -> HttpResponse:
    return HttpResponse(status, text, (("content-type", "text/plain; charset=utf-8"),))


async def _send(
    stream: trio.abc.Stream,
    connection: h11.Connection,
    response: HttpResponse,
    *,
    close: bool,
    head: bool = False,
) -> None:
    """`head`: the answer to a HEAD request, sent without its body (its length said)."""
    if connection.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    headers = [
        (name.encode("latin-1"), value.encode("latin-1")) for name, value in response.headers
    ]
    headers.append((b"server", SERVER_NAME))
    # 204 and 304 have no body and no content-length (RFC 9110).
    if response.status not in (204, 304):
        headers.append((b"content-length", str(len(response.body)).encode()))
    if close:
        headers.append((b"connection", b"close"))
    reason = HTTPStatus(response.status).phrase.encode() if response.status in _KNOWN else b""
    start = h11.Response(status_code=response.status, headers=headers, reason=reason)
    data = connection.send(start) or b""
    if response.body and response.status not in (204, 304) and not head:
        data += connection.send(h11.Data(data=response.body)) or b""
    data += connection.send(h11.EndOfMessage()) or b""
    await stream.send_all(data)
