"""Untracked sends through pulsar-client's C API, compiled (native/src/pulsar_send.rs).

The binding's way costs five pybind11 calls per message, and its `send_async` lets go of
the GIL each time: a reader or pulsar-client thread waiting for it takes it, and the trio
thread then waits to get it back. A `Sender` builds each message at once with the C API
and hands a batch of them to the producer with one release of the GIL (before the batch's
flush, or before any other send on the producer, so the order stays the order of the
publishes).

It is used when the compiled module is there and this pulsar-client is one whose C send
callback was checked: on success it passes a message id made for the callback, which the
callback frees (pulsar-client 3.13). Otherwise, or with STARLIGHT_NATIVE=0 (no compiled
code) or STARLIGHT_NATIVE_PULSAR=0 (the compiled frame codec, but pulsar-client calls through
its binding), producers send through the binding.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
from typing import Any, Protocol

from starlight_py.amqp import compiled
from starlight_py.backend.producer_flush import NativeFlushUnavailable, c_library, turned_off

# pulsar-client versions (major.minor) whose pulsar_producer_send_async was checked: the
# callback is called on every outcome, with a message id it must free on success.
CHECKED_VERSIONS = ("3.13",)
_FUNCTIONS = (
    "pulsar_message_create",
    "pulsar_message_set_content",
    "pulsar_message_set_property",
    "pulsar_message_free",
    "pulsar_producer_send_async",
    "pulsar_message_id_free",
)


class Sender(Protocol):
    """What ProducerHandle uses of `_native.Sender`."""

    def add(self, body: object, properties: dict[str, str]) -> bool: ...
    def send_pending(self) -> int: ...
    @property
    def pending(self) -> int: ...
    def discard(self) -> int: ...


def _version() -> str:
    try:
        return importlib.metadata.version("pulsar-client")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _address(function: Any) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value or 0


@functools.cache
def available() -> str | None:
    """None when compiled sends can be used; else why not (the proxy logs it at start)."""
    reason = turned_off(compiled.pulsar_sender, compiled.bind_pulsar_api)
    if reason is not None:
        return reason
    version = _version()
    if ".".join(version.split(".")[:2]) not in CHECKED_VERSIONS:
        return f"pulsar-client {version} is not one whose C send API was checked"
    try:
        library = c_library()
        addresses = [_address(getattr(library, name)) for name in _FUNCTIONS]
    except (AttributeError, NativeFlushUnavailable) as e:
        return f"pulsar-client exports no C send API: {e}"
    assert compiled.bind_pulsar_api is not None  # turned_off said so
    compiled.bind_pulsar_api(addresses)
    return None


def make_sender(producer_address: int) -> Sender | None:
    """A compiled sender for the (checked) C++ producer at this address, or None when this
    installation sends through the binding."""
    if available() is not None:
        return None
    sender: Sender = compiled.pulsar_sender(producer_address)
    return sender
