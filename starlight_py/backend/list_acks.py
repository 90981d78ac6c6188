"""Acknowledgements as one command per list of messages, and no grouping timer
(native/src/pulsar_ack_list.rs, native/src/acknowledge_list.cpp).

pulsar-client groups a consumer's acknowledgements for its grouping time and re-arms a timer
per consumer each grouping time, busy or not: a proxy holding thousands of Pulsar consumers
(one per queue it serves a consumer of) spent most of its idle CPU on those timers. With the
grouping turned off there is no timer, but each acknowledge call is one command to the
broker, and pulsar-client's C API takes one id per call. Its C++ API also takes a vector of
ids (`pulsar::Consumer::acknowledgeAsync`), which, ungrouped, is one command for the whole
list. So listened consumers (backend/listened.py) are made without grouping, the gateway
gathers what a round of the trio loop acknowledges on each of them, and it goes to the
broker as one list (gateway/consume/consuming.py).

Used when listened consumers are, the compiled module has the list call, pulsar-client's
library exports the member function by its mangled name, and pulsar-client is a version it
was tested with (TESTED_VERSIONS); `STARLIGHT_LIST_ACKS=0` turns it off (to compare).
Otherwise consumers group their acknowledgements as before (`pulsarAckGroupingTimeMillis`).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import os

from starlight_py.amqp import compiled
from starlight_py.backend import listened
from starlight_py.backend.producer_flush import c_library, turned_off

__all__ = ["TESTED_VERSIONS", "available"]

# void pulsar::Consumer::acknowledgeAsync(const std::vector<MessageId>&,
#                                         const std::function<void(Result)>&)
_ACKNOWLEDGE_LIST = (
    "_ZN6pulsar8Consumer16acknowledgeAsyncERKSt6vectorINS_9MessageIdESaIS2_EERKSt8function"
    "IFvNS_6ResultEEE"
)
# pulsar-client versions (major, minor) whose ungrouped list acknowledgement is one command
# and whose classes have the layout native/src/acknowledge_list.cpp declares.
TESTED_VERSIONS = ((3, 13),)


@functools.cache
def available() -> str | None:
    """None when consumers acknowledge in lists, ungrouped; else why not."""
    reason = turned_off(compiled.bind_acknowledge_list, compiled.acknowledge_listened_list)
    if reason is not None:
        return reason
    if os.environ.get("STARLIGHT_LIST_ACKS", "1") == "0":
        return "STARLIGHT_LIST_ACKS=0"
    version = _client_version()
    if version not in TESTED_VERSIONS:
        return f"pulsar-client {version} is not one list acknowledgements were tested with"
    reason = listened.available()
    if reason is not None:
        return f"consumers are not listened to: {reason}"
    try:
        function = c_library()[_ACKNOWLEDGE_LIST]
    except AttributeError as e:
        return f"pulsar-client exports no list acknowledgement: {e}"
    address = ctypes.cast(function, ctypes.c_void_p).value or 0
    assert compiled.bind_acknowledge_list is not None  # turned_off said so
    compiled.bind_acknowledge_list(address)
    return None


def _client_version() -> tuple[int, int] | None:
    try:
        text = importlib.metadata.version("pulsar-client")
    except importlib.metadata.PackageNotFoundError:
        return None
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None
