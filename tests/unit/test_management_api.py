"""Pure parts of the management API: path decoding and routing, JSON shapes, listing
options, error mapping, HTTP basic credentials, message properties; and the HTTP shell
(keep-alive, limits) over an in-memory stream."""

from __future__ import annotations

import base64
import datetime

import h11
import pytest
import trio
import trio.testing

from starlight_py.amqp.errors import AccessRefused, CommandInvalid, NotFound, PreconditionFailed
from starlight_py.auth.authenticator import AcceptAnyAuthenticator
from starlight_py.cluster import connection_reports
from starlight_py.cluster.connection_reports import decode_report, encode_report
from starlight_py.management import http_server
from starlight_py.management.auth import basic_credentials, log_in
from starlight_py.management.errors import (
    BadRequest,
    LoginFailed,
    MethodNotAllowed,
    NotAuthorised,
    NotFoundError,
    ObjectNotFound,
    ServiceUnavailable,
    as_api_error,
)
from starlight_py.management.http_server import HttpRequest, HttpResponse, serve_connection
from starlight_py.management.loopback import GotMessage
from starlight_py.management.messages import (
    message_json,
    payload_from_json,
    properties_from_json,
    properties_to_json,
)
from starlight_py.management.rates import CountRates
from starlight_py.management.routing import Router, parse_target
from starlight_py.management.shapes import flag, integer, json_body, listed, properties_key
from starlight_py.metadata.zookeeper import MetadataUnavailable
from starlight_py.topology.errors import TopologyConflict

# ---- paths and routes ---------------------------------------------------------------------


def test_each_segment_is_decoded_on_its_own() -> None:
    target = parse_target("/api/queues/%2F/my%20q%2Fx?columns=name,messages&sort=name")
    assert target.segments == ("api", "queues", "/", "my q/x")
    assert target.query == {"columns": "name,messages", "sort": "name"}
    assert parse_target("/api/vhosts/").segments == ("api", "vhosts")


def test_router_binds_parameters_and_tells_405_from_404() -> None:
    router: Router[str] = Router()
    router.add("/api/queues/{vhost}", GET="list")
    router.add("/api/queues/{vhost}/{name}", GET="show", PUT="declare")
    router.add("/api/queues/{vhost}/{name}/contents", DELETE="purge")
    matched = router.match("PUT", ("api", "queues", "/", "q"))
    assert (matched.handler, dict(matched.params)) == ("declare", {"vhost": "/", "name": "q"})
    assert router.match("HEAD", ("api", "queues", "/")).handler == "list"
    assert router.match("DELETE", ("api", "queues", "v", "q", "contents")).handler == "purge"
    with pytest.raises(MethodNotAllowed):
        router.match("POST", ("api", "queues", "/", "q"))
    with pytest.raises(ObjectNotFound):
        router.match("GET", ("api", "queues", "/", "q", "nothing"))


# ---- shapes -------------------------------------------------------------------------------


def test_properties_key_is_rabbitmqs_for_bindings_without_arguments() -> None:
    assert properties_key("a.*", {}) == "a.%2A"
    assert properties_key("", {}) == ""
    assert properties_key("a b/c", {}) == "a%20b%2Fc"
    with_args = properties_key("k", {"x-match": "all", "a": 1})
    assert with_args.startswith("k~") and with_args == properties_key(
        "k", {"a": 1, "x-match": "all"}
    )
    assert with_args != properties_key("k", {"x-match": "any", "a": 1})


def test_listing_options_sort_and_cut_columns() -> None:
    items = [
        {"name": "b", "messages": 2, "totals": {"ready": 1, "unacked": 1}},
        {"name": "a", "messages": 5, "totals": {"ready": 5, "unacked": 0}},
    ]
    assert listed(items, {"sort": "name", "columns": "name"}) == [{"name": "a"}, {"name": "b"}]
    assert listed(
        items, {"sort": "messages", "sort_reverse": "true", "columns": "totals.ready"}
    ) == [
        {"totals": {"ready": 5}},
        {"totals": {"ready": 1}},
    ]
    assert listed(items, {"columns": "nothing"}) == [{}, {}]


def test_request_fields_take_rabbitmqadmins_strings() -> None:
    assert flag({"durable": "false"}, "durable", True) is False
    assert flag({}, "durable", True) is True
    assert integer({"count": "3"}, "count", 1) == 3
    with pytest.raises(BadRequest):
        flag({"durable": "maybe"}, "durable", True)
    with pytest.raises(BadRequest):
        integer({"count": "x"}, "count", 1)
    with pytest.raises(BadRequest, match="not_json"):
        json_body(b"notjson")
    assert json_body(b"") == {}


# ---- errors -------------------------------------------------------------------------------


def test_errors_map_to_rabbitmqs_statuses_and_bodies() -> None:
    inequivalent = as_api_error(PreconditionFailed("inequivalent arg 'durable' for queue 'q'"))
    assert isinstance(inequivalent, BadRequest)
    assert inequivalent.body() == {
        "error": "bad_request",
        "reason": "inequivalent arg 'durable' for queue 'q'",
    }
    missing = as_api_error(NotFound("no queue 'q' in vhost '/'"))
    assert isinstance(missing, NotFoundError) and missing.status == 404
    assert missing.body() == {
        "error": "not_found",
        "reason": "NOT_FOUND - no queue 'q' in vhost '/'",
    }
    assert ObjectNotFound().body() == {"error": "Object Not Found", "reason": "Not Found"}
    assert isinstance(as_api_error(AccessRefused("no")), NotAuthorised)
    assert isinstance(as_api_error(CommandInvalid("unknown exchange type 'x'")), BadRequest)
    unavailable = as_api_error(MetadataUnavailable("ZooKeeper is away"))
    assert isinstance(unavailable, ServiceUnavailable) and unavailable.status == 503
    assert isinstance(as_api_error(TopologyConflict("busy")), ServiceUnavailable)
    assert as_api_error(KeyError("bug")) is None


# ---- credentials --------------------------------------------------------------------------


def basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


def test_basic_credentials_are_parsed_and_bad_ones_refused() -> None:
    credentials = basic_credentials(basic("guest:pa:ss"))
    assert (credentials.username, credentials.password) == ("guest", "pa:ss")
    for header in (None, "", "Bearer x", "Basic !!!", basic("no-colon")):
        with pytest.raises(LoginFailed):
            basic_credentials(header)


def test_with_authentication_off_anyone_is_an_administrator() -> None:
    user = log_in(basic("whoever:x"), AcceptAnyAuthenticator(), None, ())
    assert (user.name, user.tags, user.administrator) == ("whoever", ["administrator"], True)
    user.require_administrator()
    user.require_vhost("any")


# ---- messages -----------------------------------------------------------------------------


def test_message_properties_round_trip_in_rabbitmqs_json() -> None:
    given = {
        "content_type": "text/plain",
        "headers": {"a": 1, "b": "x"},
        "delivery_mode": 2,
        "type": "order",
        "timestamp": 1700000000,
    }
    properties = properties_from_json(given)
    assert properties.message_type == "order"
    assert properties.timestamp == datetime.datetime.fromtimestamp(1700000000, tz=datetime.UTC)
    assert properties_to_json(properties) == given
    assert properties_to_json(properties_from_json({})) == []
    with pytest.raises(BadRequest):
        properties_from_json({"colour": "red"})
    with pytest.raises(BadRequest):
        properties_from_json({"delivery_mode": "2"})


def test_payloads_in_string_or_base64() -> None:
    assert payload_from_json({"payload": "hé", "payload_encoding": "string"}) == "hé".encode()
    assert payload_from_json({"payload": "aGk=", "payload_encoding": "base64"}) == b"hi"
    with pytest.raises(BadRequest):
        payload_from_json({"payload": "x", "payload_encoding": "rot13"})
    binary = GotMessage(b"\xff\x00", properties_from_json({}), "", "q", False, 0)
    shaped = message_json(binary, "auto", None)
    assert (shaped["payload"], shaped["payload_encoding"]) == ("/wA=", "base64")
    text = GotMessage(b"hello", properties_from_json({}), "x", "k", True, 4)
    assert message_json(text, "auto", 2) | {} == {
        "payload_bytes": 5,
        "redelivered": True,
        "exchange": "x",
        "routing_key": "k",
        "message_count": 4,
        "properties": [],
        "payload": "he",
        "payload_encoding": "string",
    }


# ---- the HTTP shell -----------------------------------------------------------------------


async def echo(request: HttpRequest) -> HttpResponse:
    body = f"{request.method} {request.target} {len(request.body)}".encode()
    return HttpResponse(200, body, (("content-type", "text/plain"),))


async def exchange(raw: bytes) -> list[h11.Response | h11.Data]:
    """Send `raw` to a server connection, read until it closes; the responses' events."""
    return responses(await exchange_bytes(raw))


async def exchange_bytes(raw: bytes) -> bytes:
    """Send `raw` to a server connection; what it sent back until it closed."""
    client, server = trio.testing.memory_stream_pair()
    received = bytearray()

    async def serve() -> None:
        await serve_connection(server, echo)
        await server.aclose()  # as serve_http does after each connection

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await client.send_all(raw)
        await client.send_eof()
        while chunk := await client.receive_some(65536):
            received += chunk
    return bytes(received)


def responses(data: bytes) -> list[h11.Response | h11.Data]:
    """The responses in `data`, read as a client that sent one request per response."""
    reader = h11.Connection(h11.CLIENT)
    reader.receive_data(data)
    reader.receive_data(b"")
    events: list[h11.Response | h11.Data] = []
    while True:
        reader.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
        reader.send(h11.EndOfMessage())
        while True:
            event = reader.next_event()
            if event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
                return events
            if isinstance(event, h11.Response | h11.Data):
                events.append(event)
            if isinstance(event, h11.EndOfMessage):
                break
        if reader.their_state is not h11.DONE or reader.our_state is not h11.DONE:
            return events
        reader.start_next_cycle()


def test_keep_alive_answers_several_requests_in_order() -> None:
    raw = (
        b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
        b"PUT /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
        b"GET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    events = trio.run(exchange, raw)
    bodies = [e.data for e in events if isinstance(e, h11.Data)]
    assert bodies == [b"GET /a 0", b"PUT /b 3", b"GET /c 0"]
    assert [e.status_code for e in events if isinstance(e, h11.Response)] == [200, 200, 200]


def test_head_answers_say_the_length_and_send_no_body() -> None:
    data = trio.run(exchange_bytes, b"HEAD /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-length: 9\r\n" in data  # len(b"HEAD /a 0")
    assert data.endswith(b"\r\n\r\n")


def test_too_large_bodies_get_413(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "MAX_BODY", 10)
    events = trio.run(
        exchange, b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n0123456789a"
    )
    assert [e.status_code for e in events if isinstance(e, h11.Response)] == [413]


def test_garbage_gets_400() -> None:
    events = trio.run(exchange, b"NOT HTTP AT ALL\r\n\r\n")
    assert [e.status_code for e in events if isinstance(e, h11.Response)] == [400]


# ---- connection reports -------------------------------------------------------------------


def test_connection_reports_round_trip_and_stay_under_the_znode_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    report = [
        {"connection": {"name": f"c{i}", "pad": "x" * 50}, "channels": [], "consumers": []}
        for i in range(40)
    ]
    assert decode_report(encode_report("proxy-1", report)) == ("proxy-1", report)
    monkeypatch.setattr(connection_reports, "MAX_REPORT", 200)
    proxy, kept = decode_report(encode_report("proxy-1", report))
    assert proxy == "proxy-1" and 0 < len(kept) < len(report) and kept == report[: len(kept)]
    with pytest.raises(ValueError):
        decode_report(b"not zlib")


# ---- rates --------------------------------------------------------------------------------


def test_count_rates_compare_with_a_reading_at_least_five_seconds_old() -> None:
    now = [100.0]
    rates = CountRates(clock=lambda: now[0])
    assert rates.observe("q", {"messages": 10}) == {"messages": 0.0}
    now[0] = 102.0
    assert rates.observe("q", {"messages": 30}) == {"messages": 0.0}  # too recent a base
    now[0] = 110.0
    # the latest reading at least 5 s old: (60 - 30) / 8
    assert rates.observe("q", {"messages": 60}) == {"messages": 3.8}
    now[0] = 116.0
    assert rates.observe("q", {"messages": 0}) == {"messages": -10.0}  # (0 - 60) / 6
    now[0] = 300.0
    assert rates.observe("q", {"messages": 5}) == {"messages": 0.0}  # older than the window
    assert rates.observe("other", {"messages": 1}) == {"messages": 0.0}
