"""The fields the gateway takes of received messages, compiled (native/src/pulsar_read.rs).

A reader thread takes each message's body, properties and redelivery count. Through the
binding that is three pybind11 calls per message; `read_fields` reads them from the C++
`pulsar::Message` behind each `_pulsar.Message`, one call per batch. It is used when the
compiled module is there (and STARLIGHT_NATIVE_PULSAR is not 0), on a pulsar-client whose
version was checked, and once a message built here reads the same both ways; otherwise
the reader threads read through the binding.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import _pulsar

from starlight_py.amqp import compiled
from starlight_py.backend.producer_flush import (
    NativeFlushUnavailable,
    c_library,
    conduit_address,
    conduit_arguments,
)
from starlight_py.backend.producer_send import turned_off

_MESSAGE_TYPE_INFO = "_ZTIN6pulsar7MessageE"  # typeid(pulsar::Message)
# pulsar::Message's const accessors, in the order native/src/pulsar_read.rs binds them.
_ACCESSORS = (
    "_ZNK6pulsar7Message7getDataEv",
    "_ZNK6pulsar7Message9getLengthEv",
    "_ZNK6pulsar7Message18getRedeliveryCountEv",
    "_ZNK6pulsar7Message13getPropertiesB5cxx11Ev",
)

Fields = tuple[bytes, dict[str, str], int]


@functools.cache
def available() -> str | None:
    """None when received messages are read through the compiled module; else why not."""
    reason = turned_off(compiled.message_fields, compiled.bind_read)
    if reason is not None:
        return reason
    try:
        library = c_library()
        addresses = [ctypes.cast(library[name], ctypes.c_void_p).value or 0 for name in _ACCESSORS]
        abi, type_info = conduit_arguments(_MESSAGE_TYPE_INFO)
        sample = _sample()
        conduit_address(sample, _MESSAGE_TYPE_INFO)
    except (AttributeError, NativeFlushUnavailable) as e:
        return f"pulsar-client exports no pulsar::Message accessors: {e}"
    assert compiled.bind_read is not None  # turned_off said so
    compiled.bind_read(addresses, abi, type_info)
    return _check(sample)


def read_fields(raws: list[Any]) -> list[Fields]:
    """(body, properties, redelivery count) of each `_pulsar.Message`, in order. Raises
    RuntimeError (a property that is not UTF-8...): read those through the binding."""
    assert compiled.message_fields is not None
    return compiled.message_fields(raws)


def binding_fields(raw: Any) -> Fields:
    """The same fields, read through the binding."""
    return raw.data(), raw.properties(), raw.redelivery_count()


def _sample() -> Any:
    """A message with a body and properties enough to fill a tree of several levels."""
    builder = _pulsar.MessageBuilder()
    builder.content(b"starlight \x00 sample")
    builder.properties({f"key-{n:02d}": f"value {n} \u00e9" for n in range(13)} | {"": ""})
    return builder.build()


def _check(sample: Any) -> str | None:
    """None when the compiled path reads what the binding reads of `sample`."""
    try:
        (compiled_fields,) = read_fields([sample])
    except RuntimeError as e:
        return f"reading a message through the compiled module failed: {e}"
    expected = binding_fields(sample)
    if compiled_fields != expected or list(compiled_fields[1]) != list(expected[1]):
        return "the compiled module reads a message differently from the binding"
    return None
