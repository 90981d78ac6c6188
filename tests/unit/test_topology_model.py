"""RabbitMQ's rules for exchanges, queues and bindings, with its exact reply texts.

The expected texts were read from RabbitMQ 3.10.8 (the version docs/compatibility.md checks
against); the integration tests check the same texts end to end through the proxy.
"""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import pytest

from starlight_py.amqp.errors import (
    AccessRefused,
    AMQPError,
    CommandInvalid,
    PreconditionFailed,
    ReplyCode,
    ResourceLocked,
)
from starlight_py.model.topology import (
    EXCHANGE_TYPES,
    MAX_EXPIRY,
    PREDECLARED_EXCHANGES,
    QUEUE_ARGUMENTS,
    Exchange,
    Queue,
    check_exchange_deletable,
    check_exchange_name_creatable,
    check_exchange_type,
    check_not_default_exchange,
    check_queue_name_declarable,
    queue_locked,
    validate_binding_arguments,
    validate_queue_arguments,
    wire_type,
)

VHOST = "/"


def raised(call: Any, *args: Any) -> AMQPError:
    with pytest.raises(AMQPError) as info:
        call(*args)
    return info.value


# ---- Exchange.check_equivalent ----------------------------------------------------------------

EXCHANGE = Exchange("x", "direct", durable=False, arguments={"alternate-exchange": "ae"})


def test_an_identical_exchange_redeclaration_is_equivalent() -> None:
    EXCHANGE.check_equivalent(
        Exchange("x", "direct", durable=False, arguments={"alternate-exchange": "ae"}), VHOST
    )


@pytest.mark.parametrize(
    ("redeclared", "text"),
    [
        (
            {"type": "fanout"},
            "inequivalent arg 'type' for exchange 'x' in vhost '/': "
            "received 'fanout' but current is 'direct'",
        ),
        (
            {"durable": True},
            "inequivalent arg 'durable' for exchange 'x' in vhost '/': "
            "received 'true' but current is 'false'",
        ),
        (
            {"auto_delete": True},
            "inequivalent arg 'auto_delete' for exchange 'x' in vhost '/': "
            "received 'true' but current is 'false'",
        ),
        (
            {"internal": True},
            "inequivalent arg 'internal' for exchange 'x' in vhost '/': "
            "received 'true' but current is 'false'",
        ),
        (
            # Several differ: RabbitMQ names the first in its order (type, durable, ...).
            {"type": "fanout", "durable": True, "internal": True},
            "inequivalent arg 'type' for exchange 'x' in vhost '/': "
            "received 'fanout' but current is 'direct'",
        ),
        (
            {"arguments": {"alternate-exchange": "other"}},
            "inequivalent arg 'alternate-exchange' for exchange 'x' in vhost '/': "
            "received 'other' but current is 'ae'",
        ),
        (
            {"arguments": {}},
            "inequivalent arg 'alternate-exchange' for exchange 'x' in vhost '/': "
            "received none but current is the value 'ae' of type 'longstr'",
        ),
        (
            {"arguments": {"alternate-exchange": True}},
            "inequivalent arg 'alternate-exchange' for exchange 'x' in vhost '/': "
            "received 'true' but current is 'ae'",
        ),
    ],
    ids=[
        "type",
        "durable",
        "auto-delete",
        "internal",
        "type-first",
        "ae-changed",
        "ae-removed",
        "ae-bool",
    ],
)
def test_an_inequivalent_exchange_redeclaration_is_406(
    redeclared: dict[str, Any], text: str
) -> None:
    fields: dict[str, Any] = {
        "name": "x",
        "type": "direct",
        "durable": False,
        "arguments": {"alternate-exchange": "ae"},
    }
    error = raised(EXCHANGE.check_equivalent, Exchange(**(fields | redeclared)), VHOST)
    assert isinstance(error, PreconditionFailed)
    assert error.reply_code == ReplyCode.PRECONDITION_FAILED == 406
    assert error.text == text
    assert error.reply_text == "PRECONDITION_FAILED - " + text
    assert error.method == (40, 10)
    assert not error.closes_connection


def test_an_argument_added_to_an_exchange_is_reported_with_its_type() -> None:
    current = Exchange("x", "direct")
    error = raised(
        current.check_equivalent,
        Exchange("x", "direct", arguments={"alternate-exchange": "ae"}),
        "v",
    )
    assert error.text == (
        "inequivalent arg 'alternate-exchange' for exchange 'x' in vhost 'v': "
        "received the value 'ae' of type 'longstr' but current is none"
    )


@pytest.mark.parametrize(
    "arguments",
    [
        {"alternate-exchange": "ae", "x-foo": 2},
        {"alternate-exchange": "ae", "x-other": "anything"},
        {"alternate-exchange": b"ae"},
        {"alternate-exchange": bytearray(b"ae")},
    ],
    ids=["x-foo-differs", "x-other-added", "ae-as-bytes", "ae-as-binary"],
)
def test_exchange_arguments_rabbitmq_does_not_compare_or_that_are_equal_pass(
    arguments: dict[str, Any],
) -> None:
    current = Exchange("x", "direct", arguments={"alternate-exchange": "ae", "x-foo": 1})
    current.check_equivalent(Exchange("x", "direct", arguments=arguments), VHOST)


# ---- Queue.check_equivalent -------------------------------------------------------------------

QUEUE_ARGS = {"x-message-ttl": 1000, "x-single-active-consumer": True, "x-foo": "a"}
QUEUE = Queue("q", durable=False, arguments=QUEUE_ARGS)


def redeclared_queue(**changes: Any) -> Queue:
    fields: dict[str, Any] = {"name": "q", "durable": False, "arguments": dict(QUEUE_ARGS)}
    return Queue(**(fields | changes))


def test_an_identical_queue_redeclaration_is_equivalent() -> None:
    QUEUE.check_equivalent(redeclared_queue(), VHOST)


@pytest.mark.parametrize(
    ("changes", "text"),
    [
        (
            {"durable": True},
            "inequivalent arg 'durable' for queue 'q' in vhost '/': "
            "received 'true' but current is 'false'",
        ),
        (
            {"auto_delete": True},
            "inequivalent arg 'auto_delete' for queue 'q' in vhost '/': "
            "received 'true' but current is 'false'",
        ),
        (
            {"arguments": QUEUE_ARGS | {"x-message-ttl": 2000}},
            "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
            "received '2000' but current is '1000'",
        ),
        (
            {"arguments": QUEUE_ARGS | {"x-message-ttl": 2**33}},
            "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
            "received '8589934592' but current is '1000'",
        ),
        (
            {"arguments": {"x-single-active-consumer": True}},
            "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
            "received none but current is the value '1000' of type 'signedint'",
        ),
        (
            {"arguments": QUEUE_ARGS | {"x-max-length": 5}},
            "inequivalent arg 'x-max-length' for queue 'q' in vhost '/': "
            "received the value '5' of type 'signedint' but current is none",
        ),
        (
            {"arguments": QUEUE_ARGS | {"x-max-length": 2**40}},
            "inequivalent arg 'x-max-length' for queue 'q' in vhost '/': "
            "received the value '1099511627776' of type 'long' but current is none",
        ),
        (
            {"arguments": QUEUE_ARGS | {"x-dead-letter-exchange": "d"}},
            "inequivalent arg 'x-dead-letter-exchange' for queue 'q' in vhost '/': "
            "received the value 'd' of type 'longstr' but current is none",
        ),
        (
            {"arguments": QUEUE_ARGS | {"x-single-active-consumer": False}},
            "inequivalent arg 'x-single-active-consumer' for queue 'q' in vhost '/': "
            "received 'false' but current is 'true'",
        ),
        (
            {"arguments": {"x-message-ttl": 1000}},
            "inequivalent arg 'x-single-active-consumer' for queue 'q' in vhost '/': "
            "received none but current is the value 'true' of type 'bool'",
        ),
        (
            # An absent x-queue-type equals classic, but the text shows what was sent.
            {"arguments": QUEUE_ARGS | {"x-queue-type": "quorum"}},
            "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': "
            "received the value 'quorum' of type 'longstr' but current is none",
        ),
    ],
    ids=[
        "durable",
        "auto-delete",
        "ttl-changed",
        "ttl-long",
        "ttl-removed",
        "max-length-added",
        "max-length-added-long",
        "dlx-added",
        "sac-changed",
        "sac-removed",
        "quorum-vs-absent",
    ],
)
def test_an_inequivalent_queue_redeclaration_is_406(changes: dict[str, Any], text: str) -> None:
    error = raised(QUEUE.check_equivalent, redeclared_queue(**changes), VHOST)
    assert isinstance(error, PreconditionFailed)
    assert error.text == text
    assert error.method == (50, 10)


@pytest.mark.parametrize(
    ("current", "received"),
    [
        ({}, {"x-queue-type": "classic"}),
        ({"x-queue-type": "classic"}, {}),
        ({"x-queue-type": "classic"}, {"x-queue-type": b"classic"}),
        ({"x-queue-type": "quorum"}, {"x-queue-type": "quorum"}),
        ({"x-foo": "a"}, {"x-foo": "b"}),
        ({}, {"x-foo": 1, "x-bar": [1, 2]}),
        ({"x-max-length": 5}, {"x-max-length": 5}),
        ({"x-dead-letter-exchange": "d"}, {"x-dead-letter-exchange": bytearray(b"d")}),
    ],
    ids=[
        "absent-vs-classic",
        "classic-vs-absent",
        "classic-as-bytes",
        "quorum-both",
        "x-foo-differs",
        "unknown-added",
        "same-value",
        "longstr-vs-binary",
    ],
)
def test_queue_arguments_that_are_equivalent_or_not_compared_pass(
    current: dict[str, Any], received: dict[str, Any]
) -> None:
    Queue("q", arguments=current).check_equivalent(Queue("q", arguments=received), VHOST)


def test_explicit_classic_against_quorum_shows_both_values() -> None:
    current = Queue("q", arguments={"x-queue-type": "classic"})
    error = raised(current.check_equivalent, Queue("q", arguments={"x-queue-type": "quorum"}), "/")
    assert error.text == (
        "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': "
        "received 'quorum' but current is 'classic'"
    )


LOCKED = (
    "cannot obtain exclusive access to locked queue 'q' in vhost '/'. It could be originally "
    "declared on another connection or the exclusive property value does not match that of "
    "the original declaration."
)


@pytest.mark.parametrize(("current", "received"), [(False, True), (True, False)])
def test_a_differing_exclusive_flag_is_405_and_checked_before_durable(
    current: bool, received: bool
) -> None:
    existing = Queue("q", durable=False, exclusive=current, owner="p/1" if current else None)
    # durable and auto_delete differ too: RabbitMQ answers about exclusivity first.
    wanted = Queue("q", durable=True, exclusive=received, auto_delete=True)
    error = raised(existing.check_equivalent, wanted, VHOST)
    assert isinstance(error, ResourceLocked)
    assert error.reply_code == 405
    assert error.text == LOCKED
    assert error.method == (50, 10)


def test_queue_locked_carries_the_method_it_is_given() -> None:
    error = queue_locked("q", "/", (50, 20))
    assert isinstance(error, ResourceLocked)
    assert (error.text, error.method) == (LOCKED, (50, 20))


# ---- validate_queue_arguments -----------------------------------------------------------------

VALID_ARGUMENTS: list[dict[str, Any]] = [
    {"x-expires": 1},
    {"x-expires": MAX_EXPIRY},
    {"x-message-ttl": 0},
    {"x-message-ttl": MAX_EXPIRY},
    {"x-dead-letter-exchange": "dlx"},
    {"x-dead-letter-exchange": ""},
    {"x-dead-letter-exchange": b"dlx"},
    {"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "k"},
    {"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": b"k"},
    {"x-max-length": 0},
    {"x-max-length": 2**40},
    {"x-max-length-bytes": 0},
    {"x-max-priority": 0},
    {"x-max-priority": 255},
    {"x-overflow": "drop-head"},
    {"x-overflow": "reject-publish"},
    {"x-overflow": "reject-publish-dlx"},
    {"x-overflow": b"drop-head"},
    {"x-queue-mode": "default"},
    {"x-queue-mode": "lazy"},
    {"x-queue-type": "classic"},
    {"x-queue-type": "quorum"},
    {"x-queue-type": "stream"},
    {"x-max-age": "7D"},
    {"x-max-age": b"1h"},
    {"x-stream-max-segment-size-bytes": 500_000},
    {"x-single-active-consumer": True},
    {"x-single-active-consumer": False},
    {"x-delivery-limit": 0},
    {"x-delivery-limit": 5},
    {"x-foo": "anything", "x-bar": [1, {"a": None}]},
    {},
]


@pytest.mark.parametrize("arguments", VALID_ARGUMENTS, ids=repr)
def test_valid_queue_arguments_pass(arguments: dict[str, Any]) -> None:
    validate_queue_arguments("q", VHOST, arguments)


def test_every_known_queue_argument_has_a_valid_case() -> None:
    assert {key for case in VALID_ARGUMENTS for key in case} >= set(QUEUE_ARGUMENTS)


def invalid_arg(key: str, problem: str) -> str:
    return f"invalid arg '{key}' for queue 'q' in vhost '/': {problem}"


INVALID_ARGUMENTS: list[tuple[dict[str, Any], str]] = [
    ({"x-expires": 0}, invalid_arg("x-expires", "{value_zero,0}")),
    ({"x-expires": -1}, invalid_arg("x-expires", "{value_negative,-1}")),
    ({"x-expires": "1"}, invalid_arg("x-expires", '"expected integer, got longstr"')),
    ({"x-expires": MAX_EXPIRY + 1}, invalid_arg("x-expires", "{value_too_large,315360000001}")),
    ({"x-message-ttl": "abc"}, invalid_arg("x-message-ttl", '"expected integer, got longstr"')),
    ({"x-message-ttl": -1}, invalid_arg("x-message-ttl", "{value_negative,-1}")),
    ({"x-message-ttl": True}, invalid_arg("x-message-ttl", '"expected integer, got bool"')),
    ({"x-message-ttl": 1.5}, invalid_arg("x-message-ttl", '"expected integer, got double"')),
    ({"x-message-ttl": None}, invalid_arg("x-message-ttl", '"expected integer, got void"')),
    ({"x-message-ttl": [1]}, invalid_arg("x-message-ttl", '"expected integer, got array"')),
    ({"x-message-ttl": {"a": 1}}, invalid_arg("x-message-ttl", '"expected integer, got table"')),
    (
        {"x-message-ttl": decimal.Decimal("1.5")},
        invalid_arg("x-message-ttl", '"expected integer, got decimal"'),
    ),
    (
        {"x-message-ttl": datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)},
        invalid_arg("x-message-ttl", '"expected integer, got timestamp"'),
    ),
    (
        {"x-message-ttl": bytearray(b"x")},
        invalid_arg("x-message-ttl", '"expected integer, got binary"'),
    ),
    (
        {"x-message-ttl": MAX_EXPIRY + 1},
        invalid_arg("x-message-ttl", "{value_too_large,315360000001}"),
    ),
    (
        {"x-message-ttl": -(2**40)},
        invalid_arg("x-message-ttl", "{value_negative,-1099511627776}"),
    ),
    (
        {"x-dead-letter-exchange": 5},
        "invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'",
    ),
    (
        {"x-dead-letter-exchange": True},
        "invalid type 'bool' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'",
    ),
    (
        {"x-dead-letter-exchange": bytearray(b"d")},
        "invalid type 'binary' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'",
    ),
    (
        {"x-dead-letter-exchange": None},
        "invalid type 'void' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'",
    ),
    (
        {"x-dead-letter-routing-key": "k"},
        invalid_arg("x-dead-letter-routing-key", "routing_key_but_no_dlx_defined"),
    ),
    (
        {"x-dead-letter-exchange": "d", "x-dead-letter-routing-key": 5},
        invalid_arg("x-dead-letter-routing-key", "{unacceptable_type,signedint}"),
    ),
    (
        {"x-dead-letter-exchange": "d", "x-dead-letter-routing-key": bytearray(b"k")},
        invalid_arg("x-dead-letter-routing-key", "{unacceptable_type,binary}"),
    ),
    ({"x-max-length": -1}, invalid_arg("x-max-length", "{value_negative,-1}")),
    ({"x-max-length": "5"}, invalid_arg("x-max-length", '"expected integer, got longstr"')),
    ({"x-max-length-bytes": -1}, invalid_arg("x-max-length-bytes", "{value_negative,-1}")),
    (
        {"x-max-length-bytes": "a"},
        invalid_arg("x-max-length-bytes", '"expected integer, got longstr"'),
    ),
    ({"x-max-priority": 300}, invalid_arg("x-max-priority", "{max_value_exceeded,300}")),
    ({"x-max-priority": 256}, invalid_arg("x-max-priority", "{max_value_exceeded,256}")),
    ({"x-max-priority": -1}, invalid_arg("x-max-priority", "{value_negative,-1}")),
    ({"x-max-priority": "a"}, invalid_arg("x-max-priority", '"expected integer, got longstr"')),
    ({"x-overflow": "bogus"}, invalid_arg("x-overflow", "invalid_overflow")),
    ({"x-overflow": 5}, invalid_arg("x-overflow", "{unacceptable_type,signedint}")),
    ({"x-overflow": bytearray(b"x")}, invalid_arg("x-overflow", "{unacceptable_type,binary}")),
    ({"x-queue-mode": "bogus"}, invalid_arg("x-queue-mode", "\"unsupported queue mode 'bogus'\"")),
    ({"x-queue-mode": 5}, invalid_arg("x-queue-mode", "{unacceptable_type,signedint}")),
    ({"x-queue-type": "bogus"}, invalid_arg("x-queue-type", "\"unsupported queue type 'bogus'\"")),
    ({"x-max-age": "7X"}, invalid_arg("x-max-age", "invalid_max_age")),
    ({"x-max-age": 5}, invalid_arg("x-max-age", "{unacceptable_type,signedint}")),
    (
        {"x-stream-max-segment-size-bytes": "x"},
        invalid_arg("x-stream-max-segment-size-bytes", '"expected integer, got longstr"'),
    ),
    ({"x-queue-type": 5}, invalid_arg("x-queue-type", "{unacceptable_type,signedint}")),
    (
        {"x-single-active-consumer": 5},
        invalid_arg("x-single-active-consumer", "{unacceptable_type,signedint}"),
    ),
    (
        {"x-single-active-consumer": "yes"},
        invalid_arg("x-single-active-consumer", "{unacceptable_type,longstr}"),
    ),
    ({"x-delivery-limit": -1}, invalid_arg("x-delivery-limit", "{value_negative,-1}")),
    ({"x-delivery-limit": "a"}, invalid_arg("x-delivery-limit", '"expected integer, got longstr"')),
    # The order RabbitMQ checks in: the dead-letter exchange's type before everything (its
    # channel checks it), then the arguments in declare order.
    (
        {"x-expires": -1, "x-dead-letter-exchange": 5},
        "invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'",
    ),
    (
        {"x-dead-letter-routing-key": "k", "x-max-length": -1},
        invalid_arg("x-dead-letter-routing-key", "routing_key_but_no_dlx_defined"),
    ),
    (
        {"x-max-length": -1, "x-expires": 0},
        invalid_arg("x-expires", "{value_zero,0}"),
    ),
]


@pytest.mark.parametrize(("arguments", "text"), INVALID_ARGUMENTS, ids=repr)
def test_invalid_queue_arguments_are_406_with_rabbitmqs_text(
    arguments: dict[str, Any], text: str
) -> None:
    error = raised(validate_queue_arguments, "q", VHOST, arguments)
    assert isinstance(error, PreconditionFailed)
    assert error.text == text
    assert error.method == (50, 10)


def test_every_known_queue_argument_has_an_invalid_case() -> None:
    assert {key for case, _ in INVALID_ARGUMENTS for key in case} >= set(QUEUE_ARGUMENTS)


def test_queue_argument_texts_name_the_queue_and_vhost() -> None:
    error = raised(validate_queue_arguments, "orders", "prod", {"x-max-length": -1})
    assert error.text == "invalid arg 'x-max-length' for queue 'orders' in vhost 'prod': " + (
        "{value_negative,-1}"
    )


# ---- validate_binding_arguments ---------------------------------------------------------------

HEADERS = Exchange("h", "headers")


@pytest.mark.parametrize("x_match", ["all", "any", "all-with-x", "any-with-x", b"any"])
def test_known_x_match_values_pass(x_match: Any) -> None:
    validate_binding_arguments(HEADERS, {"x-match": x_match, "a": 1})


@pytest.mark.parametrize(
    ("exchange", "arguments"),
    [
        (HEADERS, {}),
        (HEADERS, {"a": 1}),
        (Exchange("d", "direct"), {"x-match": "bogus"}),
        (Exchange("t", "topic"), {"x-match": 1}),
        (Exchange("f", "fanout"), {"x-match": None}),
    ],
    ids=["headers-no-x-match", "headers-only-headers", "direct", "topic", "fanout"],
)
def test_x_match_is_only_checked_on_headers_exchanges(
    exchange: Exchange, arguments: dict[str, Any]
) -> None:
    validate_binding_arguments(exchange, arguments)


@pytest.mark.parametrize(
    ("x_match", "text"),
    [
        (
            "bogus",
            'Invalid x-match field value <<"bogus">>; expected all, any, all-with-x, or any-with-x',
        ),
        (
            b"ALL",
            'Invalid x-match field value <<"ALL">>; expected all, any, all-with-x, or any-with-x',
        ),
        (1, "Invalid x-match field type signedint (value 1); expected longstr"),
        (2**40, "Invalid x-match field type long (value 1099511627776); expected longstr"),
        (True, "Invalid x-match field type bool (value true); expected longstr"),
    ],
    ids=["bogus-string", "bogus-bytes", "integer", "long", "bool"],
)
def test_invalid_x_match_is_406(x_match: Any, text: str) -> None:
    error = raised(validate_binding_arguments, HEADERS, {"x-match": x_match})
    assert isinstance(error, PreconditionFailed)
    assert error.text == text
    assert error.method == (50, 20)


# ---- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", [(40, 10), (40, 20), (50, 20), (50, 50)])
def test_the_default_exchange_refuses_every_operation(method: tuple[int, int]) -> None:
    error = raised(check_not_default_exchange, "", method)
    assert isinstance(error, AccessRefused)
    assert error.reply_code == 403
    assert error.text == "operation not permitted on the default exchange"
    assert error.method == method


def test_named_exchanges_are_not_the_default_one() -> None:
    check_not_default_exchange("x", (40, 10))
    check_not_default_exchange(" ", (40, 10))


@pytest.mark.parametrize("name", ["amq.foo", "amq.", "amq.direct"])
def test_new_exchanges_cannot_use_the_reserved_prefix(name: str) -> None:
    error = raised(check_exchange_name_creatable, name)
    assert isinstance(error, AccessRefused)
    assert error.text == f"exchange name '{name}' contains reserved prefix 'amq.*'"
    assert error.method == (40, 10)


@pytest.mark.parametrize("name", ["orders", "amq", "AMQ.foo", "xamq.foo", "amq-foo", ""])
def test_other_exchange_names_are_creatable(name: str) -> None:
    check_exchange_name_creatable(name)


def test_the_default_exchange_cannot_be_deleted() -> None:
    error = raised(check_exchange_deletable, "", VHOST)
    assert isinstance(error, AccessRefused)
    assert error.text == "operation not permitted on the default exchange"
    assert error.method == (40, 20)


@pytest.mark.parametrize("name", [name for name, _ in PREDECLARED_EXCHANGES] + ["amq.foo"])
def test_system_exchanges_cannot_be_deleted(name: str) -> None:
    error = raised(check_exchange_deletable, name, "v")
    assert isinstance(error, AccessRefused)
    assert error.text == f"deletion of system exchange '{name}' in vhost 'v' not allowed"
    assert error.method == (40, 20)


def test_other_exchanges_are_deletable() -> None:
    check_exchange_deletable("orders", VHOST)


def test_queues_cannot_use_the_reserved_prefix() -> None:
    error = raised(check_queue_name_declarable, "amq.foo")
    assert isinstance(error, AccessRefused)
    assert error.text == "queue name 'amq.foo' contains reserved prefix 'amq.*'"
    assert error.method == (50, 10)
    check_queue_name_declarable("q")
    check_queue_name_declarable("amq-q")


@pytest.mark.parametrize("type_name", EXCHANGE_TYPES)
def test_the_exchange_types_are_known(type_name: str) -> None:
    check_exchange_type(type_name)


@pytest.mark.parametrize("type_name", ["nope", "", "Direct", "x-consistent-hash"])
def test_an_unknown_exchange_type_closes_the_connection_with_503(type_name: str) -> None:
    error = raised(check_exchange_type, type_name)
    assert isinstance(error, CommandInvalid)
    assert error.reply_code == ReplyCode.COMMAND_INVALID == 503
    assert error.closes_connection
    assert error.reply_text == f"COMMAND_INVALID - unknown exchange type '{type_name}'"
    assert error.method == (40, 10)


def test_every_predeclared_exchange_is_reserved_and_of_a_known_type() -> None:
    assert [name for name, _ in PREDECLARED_EXCHANGES] == [
        "amq.direct",
        "amq.fanout",
        "amq.topic",
        "amq.headers",
        "amq.match",
    ]
    for name, type_name in PREDECLARED_EXCHANGES:
        assert name.startswith("amq.")
        check_exchange_type(type_name)


# ---- wire_type --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (True, "bool"),
        (False, "bool"),
        (0, "signedint"),
        (2**31 - 1, "signedint"),
        (-(2**31), "signedint"),
        (2**31, "long"),
        (-(2**31) - 1, "long"),
        (2**62, "long"),
        ("s", "longstr"),
        (b"\xff", "longstr"),  # pamqp's longstr when the bytes are not UTF-8
        (bytearray(b"x"), "binary"),
        (1.5, "double"),
        ({"a": 1}, "table"),
        ([1], "array"),
        (None, "void"),
        (decimal.Decimal("1.5"), "decimal"),
        (datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC), "timestamp"),
    ],
    ids=repr,
)
def test_wire_type_names_the_amqp_type_rabbitmq_reports(value: Any, name: str) -> None:
    assert wire_type(value) == name
