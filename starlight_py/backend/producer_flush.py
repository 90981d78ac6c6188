"""Flushing a pulsar-client producer without holding the GIL.

pulsar-client's Python binding of `Producer.flush_async` keeps the GIL while it waits for
the producer's lock. A pulsar-client thread can hold that lock and wait for the GIL: when
its batch timer closes a batch, it destroys the batch's send callbacks, and a callback that
is a Python function needs the GIL to be destroyed. The two threads then wait for each
other for ever, and the whole proxy stops (docs/history/performance-log.md, "The hang"). Its
other producer calls used here (`send_async`, `flush`, `close`) let go of the GIL first.

So flushes go through pulsar-client's C API, which the same library exports. The C API
takes the C++ producer the Python object wraps; pybind11's cross-module conduit hands out
its address, and `check` compares the topic the C API reads from it with the one Python
reads before it is used.

The call lets go of the GIL. It is made from the compiled module when it is there
(native/src/pulsar_flush.rs): the flush's outcome is then queued without the GIL, on
pulsar-client's thread, and a trio task takes the queue (gateway/bridge.py, which
calls `attach_outcomes` and `take_outcomes`). Without the compiled module, or while no task
takes the queue, the outcome comes through a callback with the GIL (ctypes' here, or the
compiled one's fallback), on pulsar-client's thread.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import _pulsar

from starlight_py.amqp import compiled

log = logging.getLogger("starlight.pulsar")

# (result, ctx): pulsar_result_callback in pulsar/c/result.h.
_RESULT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p)
_FUNCTION_RECORD_PREFIX = "pybind11_detail_function_record_v1_"
_TYPE_INFO_CAPSULE = b"St9type_info"  # typeid(std::type_info).name() with GCC
_PRODUCER_TYPE_INFO = "_ZTIN6pulsar8ProducerE"  # typeid(pulsar::Producer)

ResultCallback = Callable[[int], None]  # pulsar's result code: 0 is Ok

# Callbacks of flushes under way, by the key the C API hands back (`ctx`). Only the GIL
# guards it: an insert, a pop.
_waiting: dict[int, ResultCallback] = {}
_keys = itertools.count(1)


class Flusher(Protocol):
    def flush(self, callback: ResultCallback | None) -> None: ...


class NativeFlushUnavailable(Exception):
    """This pulsar-client does not let its producers be flushed without the GIL."""


def turned_off(*functions: object) -> str | None:
    """Why pulsar-client's calls cannot go through the compiled module (`functions` are
    the compiled ones a path needs), or None."""
    if any(function is None for function in functions):
        return "the compiled module is not in use"
    if os.environ.get("STARLIGHT_NATIVE_PULSAR", "1") == "0":
        return "STARLIGHT_NATIVE_PULSAR=0"
    return None


def _finished(key: int, result: int) -> None:
    callback = _waiting.pop(key, None)
    if callback is not None:
        callback(result)


def dispatch(outcomes: Iterable[tuple[int, int]]) -> None:
    """Run the callbacks of these flushes ((key, result) each), on this thread. A callback
    that fails is logged; the others still run."""
    for key, result in outcomes:
        try:
            _finished(key, result)
        except Exception:
            log.exception("a flush's callback failed")


@_RESULT_CALLBACK  # type: ignore[untyped-decorator]
def _on_flushed(result: int, ctx: int | None) -> None:
    _finished(ctx or 0, result)


@functools.cache
def compiled_flush() -> Callable[[int, int], None] | None:
    """`_native.flush(producer, key)` when flushes go through the compiled module, else
    None (they go through ctypes)."""
    if turned_off(compiled.flush_producer, compiled.bind_flush) is not None:
        return None
    assert compiled.bind_flush is not None and compiled.flush_producer is not None
    try:
        address = ctypes.cast(c_library().pulsar_producer_flush_async, ctypes.c_void_p).value
    except NativeFlushUnavailable:
        return None
    compiled.bind_flush(address or 0, _finished)
    return compiled.flush_producer


def attach_outcomes(fd: int) -> bool:
    """From now on, outcomes of compiled flushes are queued for `take_outcomes`, and the
    eventfd `fd` is written when the queue gets its first one. False, and nothing changes:
    flushes do not go through the compiled module here (their callbacks run on
    pulsar-client's thread), or another eventfd is attached."""
    if compiled_flush() is None or compiled.attach_flush_signal is None:
        return False
    return compiled.attach_flush_signal(fd)


def take_outcomes() -> list[tuple[int, int]]:
    """The queued outcomes, (key, result) each, for `dispatch`. Read the eventfd first."""
    assert compiled.take_flushed is not None
    return compiled.take_flushed()


def detach_outcomes() -> list[tuple[int, int]]:
    """Outcomes go to callbacks on pulsar-client's thread again; returns those still
    queued, for `dispatch`. The eventfd may be closed after this."""
    assert compiled.detach_flush_signal is not None
    return compiled.detach_flush_signal()


@functools.cache
def c_library() -> Any:
    """pulsar-client's library, through which its C API is called (flushes, and the
    compiled sends of producer_send.py)."""
    library = ctypes.CDLL(_pulsar.__file__)  # its symbols and those of libpulsar it loads
    try:
        flush = library.pulsar_producer_flush_async
        topic = library.pulsar_producer_get_topic
    except AttributeError as e:
        raise NativeFlushUnavailable(f"pulsar-client exports no C producer API: {e}") from e
    flush.argtypes = [ctypes.c_void_p, _RESULT_CALLBACK, ctypes.c_void_p]
    flush.restype = None
    topic.argtypes = [ctypes.c_void_p]
    topic.restype = ctypes.c_char_p
    return library


# Python's capsule functions, with prototypes of their own (setting restype on
# ctypes.pythonapi's shared attributes would change them for everyone in the process).
_capsule_new = ctypes.PYFUNCTYPE(
    ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p
)(("PyCapsule_New", ctypes.pythonapi))
_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
    ("PyCapsule_GetName", ctypes.pythonapi)
)
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


@functools.cache
def conduit_arguments(type_symbol: str) -> tuple[bytes, object]:
    """pybind11's platform ABI id and a capsule of the type_info named `type_symbol` (a C++
    type's mangled typeinfo symbol), what `_pybind11_conduit_v1_` asks for."""
    record = getattr(_pulsar.Producer.__dict__["topic"], "__func__", None)
    name = type(getattr(record, "__self__", None)).__name__
    if not name.startswith(_FUNCTION_RECORD_PREFIX):
        raise NativeFlushUnavailable("pulsar-client's binding is not the pybind11 it expects")
    try:
        type_info = ctypes.c_void_p.in_dll(c_library(), type_symbol)
    except ValueError as e:
        raise NativeFlushUnavailable(f"pulsar-client exports no {type_symbol}") from e
    capsule = _capsule_new(ctypes.addressof(type_info), _TYPE_INFO_CAPSULE, None)
    return name[len(_FUNCTION_RECORD_PREFIX) :].encode(), capsule


def conduit_address(raw: Any, type_symbol: str) -> int:
    """The address of the C++ object (of the type `type_symbol` names) that the pybind11
    object `raw` wraps. Raises NativeFlushUnavailable."""
    abi, type_info = conduit_arguments(type_symbol)
    conduit = getattr(raw, "_pybind11_conduit_v1_", None)
    if conduit is None:
        raise NativeFlushUnavailable(
            f"{type(raw).__name__} has no pybind11 conduit (pulsar-client built with a "
            "pybind11 before 2.13?)"
        )
    capsule = conduit(abi, type_info, b"raw_pointer_ephemeral")
    if capsule is None:
        raise NativeFlushUnavailable(
            f"pulsar-client's pybind11 did not hand out its {type(raw).__name__}"
        )
    address: int | None = _capsule_pointer(capsule, _capsule_name(capsule))
    if not address:
        raise NativeFlushUnavailable(f"pulsar-client's pybind11 handed out no {type(raw).__name__}")
    return address


def producer_address(raw: Any) -> int:
    """The address of the C++ producer a `_pulsar.Producer` wraps: what the C API takes as
    its pulsar_producer_t. Check it (`checked_producer_address`) before use."""
    return conduit_address(raw, _PRODUCER_TYPE_INFO)


def checked_producer_address(raw: Any) -> int:
    """`producer_address`, once the C API read the same topic from it as Python does.
    Raises NativeFlushUnavailable."""
    address = producer_address(raw)
    seen = c_library().pulsar_producer_get_topic(address)
    if seen is None or seen.decode() != raw.topic():
        raise NativeFlushUnavailable(
            f"pulsar-client's C API sees topic {seen!r} where Python sees {raw.topic()!r}"
        )
    return address


class ProducerFlusher:
    """Flushes one `_pulsar.Producer` (kept alive by its owner) through the C API. The
    producer must be one pulsar-client created: the C API does not check what it is given."""

    __slots__ = ("_address", "_compiled", "_flush")

    def __init__(self, raw: Any) -> None:
        """Raises NativeFlushUnavailable: this pulsar-client cannot do it (the message says
        why); the C API reads another topic from the address than Python does."""
        self._address = checked_producer_address(raw)
        self._flush = c_library().pulsar_producer_flush_async
        self._compiled = compiled_flush()

    @property
    def address(self) -> int:
        """The C++ producer's address, checked (the C API's pulsar_producer_t)."""
        return self._address

    def flush(self, callback: ResultCallback | None) -> None:
        """Ask pulsar-client to send what it batched; `callback(result)` runs when
        everything sent before is stored, or failed: on the trio thread when a task takes
        the outcomes (`attach_outcomes`), else on a pulsar thread (or at once)."""
        key = 0
        if callback is not None:
            key = next(_keys)
            _waiting[key] = callback
        if self._compiled is not None:
            self._compiled(self._address, key)
        else:
            self._flush(self._address, _on_flushed, key)


def result_text(result: int) -> str:
    """pulsar's name of a result code ("Result.Timeout"), as the Python binding prints it."""
    try:
        return str(_pulsar.Result(result))
    except (TypeError, ValueError):  # a code this binding does not name
        return f"Result {result}"
