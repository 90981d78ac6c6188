"""Acknowledgements through pulsar-client's C API, compiled (native/src/pulsar_ack.rs).

The binding's `Consumer.acknowledge` waits for each acknowledgement's result and lets go of
the GIL while it waits, once per message. `Acknowledger` hands a batch of acknowledgements
to pulsar-client with one release of the GIL, without waiting: pulsar-client groups them
and sends them within its grouping time, as it does for the binding's.

It is used when the compiled module is there (and STARLIGHT_NATIVE_PULSAR is not 0); the
consumer's address comes from pybind11's conduit and is checked against the C API's view
of its topic and subscription before use. Otherwise consumers acknowledge through the
binding.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import Any

import _pulsar

from starlight_py.amqp import compiled
from starlight_py.backend.producer_flush import (
    NativeFlushUnavailable,
    c_library,
    conduit_address,
    conduit_arguments,
    turned_off,
)

log = logging.getLogger("starlight.pulsar")

CONSUMER_TYPE_INFO = "_ZTIN6pulsar8ConsumerE"  # typeid(pulsar::Consumer)
_MESSAGE_TYPE_INFO = "_ZTIN6pulsar7MessageE"  # typeid(pulsar::Message)
# const pulsar::MessageId& pulsar::Message::getMessageId() const
_GET_MESSAGE_ID = "_ZNK6pulsar7Message12getMessageIdEv"


@functools.cache
def available() -> str | None:
    """None when compiled acknowledgements can be used; else why not."""
    reason = turned_off(compiled.acknowledge, compiled.bind_acknowledge)
    if reason is not None:
        return reason
    try:
        library = c_library()
        function = library.pulsar_consumer_acknowledge_async_id
        get_id = library[_GET_MESSAGE_ID]
        for name in ("pulsar_consumer_get_topic", "pulsar_consumer_get_subscription_name"):
            getattr(library, name).argtypes = [ctypes.c_void_p]
            getattr(library, name).restype = ctypes.c_char_p
        abi, type_info = conduit_arguments(_MESSAGE_TYPE_INFO)
        # The conduit hands out a message (what every acknowledgement relies on).
        sample = _pulsar.MessageBuilder().content(b"").build()
        conduit_address(sample, _MESSAGE_TYPE_INFO)
    except (AttributeError, NativeFlushUnavailable) as e:
        return f"pulsar-client exports no C acknowledgement API: {e}"
    assert compiled.bind_acknowledge is not None  # turned_off said so
    compiled.bind_acknowledge(_address_of(function), _address_of(get_id), abi, type_info)
    return _check_message_ids(library, sample)


def _address_of(function: Any) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value or 0


def _check_message_ids(library: Any, sample: Any) -> str | None:
    """None when the id the compiled path reads from a message is the one the binding's
    `message_id()` copies (compared as pulsar-client prints them); else why not."""
    assert compiled.message_id_address is not None
    to_text = library.pulsar_message_id_str
    to_text.argtypes = [ctypes.c_void_p]
    to_text.restype = ctypes.c_void_p
    text = to_text(compiled.message_id_address(sample))
    if not text:
        return "pulsar-client printed no message id"
    try:
        seen = ctypes.string_at(text).decode()
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(text))
    expected = str(sample.message_id())
    if seen != expected:
        return f"the compiled path reads message id {seen!r} where the binding has {expected!r}"
    return None


class Acknowledger:
    """Acknowledges messages of one `_pulsar.Consumer` (kept alive by its owner)."""

    __slots__ = ("_address",)

    def __init__(self, address: int) -> None:
        self._address = address

    def acknowledge(self, messages: list[Any]) -> int:
        """Acknowledge each `message.raw` (a `_pulsar.Message` this consumer received)."""
        assert compiled.acknowledge is not None
        return compiled.acknowledge(self._address, messages)


class ListenedAcknowledger(Acknowledger):
    """Acknowledges ListenedMessages (backend/listened.py) of one consumer."""

    __slots__ = ()

    def acknowledge(self, messages: list[Any]) -> int:
        assert compiled.acknowledge_listened is not None
        return compiled.acknowledge_listened(self._address, messages)


class ListedAcknowledger(Acknowledger):
    """Acknowledges ListenedMessages of one ungrouped consumer with one command per call
    (backend/list_acks.py)."""

    __slots__ = ()

    def acknowledge(self, messages: list[Any]) -> int:
        assert compiled.acknowledge_listened_list is not None
        return compiled.acknowledge_listened_list(self._address, messages)


def make_acknowledger(raw: Any) -> Acknowledger | None:
    """An Acknowledger for a `_pulsar.Consumer`, or None when this installation (or this
    consumer: the C API must see the topic and subscription Python sees) acknowledges
    through the binding."""
    if available() is not None:
        return None
    try:
        return Acknowledger(checked_consumer_address(raw))
    except NativeFlushUnavailable as e:
        log.warning("acknowledging through the binding: %s", e)
        return None


def checked_consumer_address(raw: Any) -> int:
    """The address of the C++ consumer a `_pulsar.Consumer` wraps (the C API's
    pulsar_consumer_t), once the C API read the topic and subscription Python reads from
    it. Raises NativeFlushUnavailable."""
    address = conduit_address(raw, CONSUMER_TYPE_INFO)
    library = c_library()
    for name in ("pulsar_consumer_get_topic", "pulsar_consumer_get_subscription_name"):
        getattr(library, name).argtypes = [ctypes.c_void_p]
        getattr(library, name).restype = ctypes.c_char_p
    topic = library.pulsar_consumer_get_topic(address)
    subscription = library.pulsar_consumer_get_subscription_name(address)
    if (
        topic is None
        or topic.decode() != raw.topic()
        or (subscription is None or subscription.decode() != raw.subscription_name())
    ):
        raise NativeFlushUnavailable(
            f"pulsar-client's C API sees {topic!r}/{subscription!r} where Python sees "
            f"{raw.topic()!r}/{raw.subscription_name()!r}"
        )
    return address
