"""Consumers whose messages pulsar-client's listener thread hands over, compiled
(native/src/pulsar_listen.rs).

A reader thread per consumer, blocked in `batch_receive`, costs a wake-up, a timer and a
hand-over of the GIL for each few messages of each consumer (docs/performance.md). Here
each consumer is subscribed with a compiled C API message listener instead: pulsar-client's
listener thread puts each message into one queue, without the GIL, and `ListenedReader`
takes everything there at once and hands each consumer its batch: in the proxy, on the trio
thread, when the bridge's eventfd says the queue got messages (gateway/bridge.py); elsewhere
(a consumer used outside the proxy, or after it stopped), on one reader thread per process.
A message taken this way is a `ListenedMessage`: it owns the C API's message, and
its consumer acknowledges it through the C API.

Used when the compiled module is there (and STARLIGHT_NATIVE_PULSAR is not 0), once the C
API reads from a pybind11 consumer configuration what Python reads, and prints message ids
as the binding does. Otherwise each consumer has a reader thread of its own
(pulsar_client.ConsumerHandle).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import itertools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import _pulsar

from starlight_py.amqp import compiled
from starlight_py.backend.producer_flush import (
    NativeFlushUnavailable,
    c_library,
    conduit_address,
    turned_off,
)
from starlight_py.backend.thread_names import name_native_thread
from starlight_py.model.positions import MessageIdRecord

log = logging.getLogger("starlight.pulsar")

_CONFIGURATION_TYPE_INFO = "_ZTIN6pulsar21ConsumerConfigurationE"
# In the order native/src/pulsar_listen.rs `bind_listening` takes them.
_BOUND = (
    "pulsar_message_get_data",
    "pulsar_message_get_length",
    "pulsar_message_get_properties",
    "pulsar_string_map_size",
    "pulsar_string_map_get_key",
    "pulsar_string_map_get_value",
    "pulsar_string_map_free",
    "pulsar_message_get_redelivery_count",
    "pulsar_message_get_publish_timestamp",
    "pulsar_message_get_message_id",
    "pulsar_message_id_str",
    "pulsar_message_id_free",
    "pulsar_message_free",
    "pulsar_consumer_acknowledge_async",
    "pulsar_consumer_negative_acknowledge",
    "pulsar_consumer_pause_message_listener",
)
# Idle, the reader waits this long (ms) for a message before it looks again, and hands
# over the first at once.
_READER_WAIT_MS = 1000
# Busy (its last take found more than one message), it waits this long (µs) for up to
# this many and takes what there is then: a few larger hand-overs cost trio less than many
# small ones.
# As each consumer's reader thread did with `receive()` and `batch_receive`
# (pulsar_client.READ_BATCH, READ_BATCH_WAIT_MS).
_GATHER_US = 1000
_GATHER_MOST = 256


@functools.cache
def available() -> str | None:
    """None when consumers can be listened to; else why not."""
    reason = turned_off(
        compiled.bind_listening,
        compiled.next_batches,
        compiled.wake_reader,
        compiled.budget_listened,
    )
    if reason is not None:
        return reason
    try:
        library = c_library()
        addresses = [_address_of(getattr(library, name)) for name in _BOUND]
        addresses.append(_address_of(ctypes.CDLL(None).free))
        setter = library.pulsar_consumer_configuration_set_message_listener
        queue_size = library.pulsar_consumer_configuration_get_receiver_queue_size
        earliest = library.pulsar_message_id_earliest
        to_text = library.pulsar_message_id_str
    except AttributeError as e:
        return f"pulsar-client exports no C consumer API: {e}"
    setter.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    setter.restype = None
    queue_size.argtypes = [ctypes.c_void_p]
    queue_size.restype = ctypes.c_int
    earliest.argtypes = []
    earliest.restype = ctypes.c_void_p
    to_text.argtypes = [ctypes.c_void_p]
    to_text.restype = ctypes.c_void_p
    # Ids are read as pulsar-client prints them: the C API must print them as the binding.
    # (pulsar_message_id_earliest is a static id of the C API's own: not to be freed.)
    text = to_text(earliest())
    if not text:
        return "pulsar-client printed no message id"
    try:
        printed = ctypes.string_at(text).decode()
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(text))
    if printed != str(_pulsar.MessageId.earliest):
        return f"the C API prints ids as {printed!r}, the binding as {_pulsar.MessageId.earliest}"
    try:
        configuration_address(_pulsar.ConsumerConfiguration())
    except NativeFlushUnavailable as e:
        return str(e)
    assert compiled.bind_listening is not None  # turned_off said so
    compiled.bind_listening(addresses, MessageIdRecord)
    return None


def budget(key: int, most: int) -> bool:
    """From now on pulsar-client's listener hands over at most `most` messages of the
    consumer `key` before it pauses it (0: no limit). True when it had paused it: the
    caller resumes it unless it wants it paused.

    A listened consumer's receiver queue does not bound what the proxy takes from the
    broker: each message the listener hands over frees a place, and pulsar-client asks the
    broker for the next. The proxy pauses a consumer whose AMQP consumer has no room, but
    only once the trio thread takes what came; on a busy machine the listener meanwhile
    took a whole burst for one prefetch-1 consumer, and a second consumer of the queue got
    none of it. With a budget of the receiver queue's size, given again at each take, the
    proxy holds no more than that ahead of its decision."""
    assert compiled.budget_listened is not None  # available() said so
    return compiled.budget_listened(key, max(0, most))


def _address_of(function: Any) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value or 0


def configuration_address(conf: Any) -> int:
    """The address of the C++ configuration a `_pulsar.ConsumerConfiguration` wraps (the C
    API's pulsar_consumer_configuration_t), once the C API read its receiver queue size as
    Python does. Raises NativeFlushUnavailable."""
    address = conduit_address(conf, _CONFIGURATION_TYPE_INFO)
    expected = conf.receiver_queue_size()
    conf.receiver_queue_size(expected + 1)
    try:
        seen = c_library().pulsar_consumer_configuration_get_receiver_queue_size(address)
    finally:
        conf.receiver_queue_size(expected)
    if seen != expected + 1:
        raise NativeFlushUnavailable(
            f"pulsar-client's C API reads receiver queue size {seen} where Python set "
            f"{expected + 1}"
        )
    return address


def listen(conf: Any, key: int) -> None:
    """Have the consumer made from `conf` hand its messages to the reader, as `key`'s."""
    assert compiled.listener_address is not None
    c_library().pulsar_consumer_configuration_set_message_listener(
        configuration_address(conf), compiled.listener_address(), key
    )


def ungroup_acknowledgements(conf: Any) -> None:
    """Have the consumer made from `conf` send each acknowledgement at once (pulsar-client
    groups them for up to 100 ms by default). Raises NativeFlushUnavailable."""
    group_acknowledgements(conf, 0)


def group_acknowledgements(conf: Any, grouping_ms: int) -> None:
    """Have the consumer made from `conf` group its acknowledgements for up to
    `grouping_ms` (0: send each at once, with no timer). Raises NativeFlushUnavailable."""
    library = c_library()
    try:
        setter = library.pulsar_configure_set_ack_grouping_time_ms
        queue_size = library.pulsar_consumer_configuration_get_receiver_queue_size
    except AttributeError as e:
        raise NativeFlushUnavailable(f"pulsar-client cannot set ack grouping: {e}") from e
    setter.argtypes = [ctypes.c_void_p, ctypes.c_long]
    setter.restype = None
    queue_size.argtypes = [ctypes.c_void_p]  # configuration_address reads it
    queue_size.restype = ctypes.c_int
    setter(configuration_address(conf), grouping_ms)


# A consumer's key, and where its batches go: (handle, batch) -> None, on the reader thread.
Deliver = Callable[[Any, list[Any]], None]


class ListenedReader:
    """The process's one reader of listened consumers: it takes what pulsar-client handed
    over and gives each consumer its batch (`deliver(handle, batch)`). A trio task does it
    when one is attached (`attach`: gateway/bridge.py), on the trio thread;
    otherwise a thread of its own."""

    def __init__(self) -> None:
        self._keys = itertools.count(1)
        self._handles: dict[int, Any] = {}  # key -> the handle (read by the compiled take)
        self._deliveries: dict[int, Deliver] = {}  # id(handle) -> where its batches go
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._stopping = False
        self._by_task = False  # a trio task takes the messages: no thread

    def register(self, handle: Any, deliver: Deliver) -> int:
        """A key for `handle`'s messages (give it to `listen`); starts the thread unless a
        trio task takes the messages."""
        with self._lock:
            key = next(self._keys)
            self._handles[key] = handle
            self._deliveries[id(handle)] = deliver
            if not self._by_task:
                self._start_thread()
        return key

    def _start_thread(self) -> None:
        """With the lock held."""
        if self._thread is None or self._pid != os.getpid():
            # Not yet in this process (a worker forked after its parent started one).
            self._pid = os.getpid()
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="starlight-read", daemon=True)
            self._thread.start()
            atexit.register(self.stop)

    def stop(self) -> None:
        """Stop the thread (at exit, or when a trio task takes over): a daemon thread that
        woke up while the interpreter finalizes would be ended by an exception thrown
        through the compiled frames it is in, which aborts the process."""
        thread = self._thread
        if thread is None or self._pid != os.getpid():
            return
        self._stopping = True
        assert compiled.wake_reader is not None
        compiled.wake_reader()
        thread.join(timeout=5)
        with self._lock:
            if self._thread is thread and not thread.is_alive():
                self._thread = None

    def attach(self, fd: int) -> bool:
        """From now on the messages are taken by a trio task with `take`, when the eventfd
        `fd` is readable; the thread stops. False, and nothing changes: listening is not
        available, or another eventfd is attached."""
        attach = compiled.attach_listen_signal
        if available() is not None or attach is None or not attach(fd):
            return False
        with self._lock:
            self._by_task = True
        self.stop()
        return True

    def take(self) -> None:
        """On the trio thread of the attached task, once it read the eventfd: hand each
        consumer what is there for it."""
        assert compiled.take_listened is not None
        try:
            batches = compiled.take_listened(self._handles)
        except Exception:  # as the thread: a failed take freed its messages
            log.exception("taking received messages")
            return
        self._deliver(batches)

    def detach(self) -> None:
        """The task ends: a thread takes the messages again (started now if consumers are
        registered). Hands over what is there first."""
        assert compiled.detach_listen_signal is not None
        compiled.detach_listen_signal()
        self.take()
        with self._lock:
            self._by_task = False
            if self._handles:
                self._start_thread()

    def unregister(self, key: int) -> None:
        """No more batches for this key: what pulsar-client hands over for it from now on
        is freed unread (the broker redelivers it once the consumer is closed)."""
        budget(key, 0)
        with self._lock:
            handle = self._handles.pop(key, None)
            if handle is not None:
                self._deliveries.pop(id(handle), None)

    def _run(self) -> None:
        name_native_thread(b"starlight-read")
        next_batches = compiled.next_batches
        assert next_batches is not None
        batches: list[tuple[Any, list[Any]]] = []
        while not self._stopping:
            # Gather only while messages come faster than they are handed over (the last
            # take found more than one): after a take of one, the next waits as when idle,
            # so a few hundred messages a second cost no gathering timer each.
            gather = _GATHER_US if len(batches) > 1 or (batches and len(batches[0][1]) > 1) else 0
            try:
                batches = next_batches(self._handles, _READER_WAIT_MS, gather, _GATHER_MOST)
            except Exception:  # never lose the reader: a failed take freed its messages
                log.exception("taking received messages")
                batches = []
                continue
            self._deliver(batches)

    def _deliver(self, batches: list[tuple[Any, list[Any]]]) -> None:
        for handle, batch in batches:
            deliver = self._deliveries.get(id(handle))
            if deliver is not None:
                try:
                    deliver(handle, batch)
                except Exception:
                    log.exception("handing over messages of %s", handle)
                # After the proxy decided whether it wants more (a pause is made by then).
                handle.taken_from_listener()


READER = ListenedReader()
