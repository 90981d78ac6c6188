"""The compiled per-message frame work (native/, Rust through PyO3), when it is there.

`pip install` builds `starlight_py.amqp._native` with Rust's cargo. Without it (no Rust on
the machine that installed the package), or with `STARLIGHT_NATIVE=0` in the environment
(to compare both), the same work is done in Python, slower, with the same results: the
equivalence is tested (tests/unit/test_native_frames.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

try:
    from starlight_py.amqp import _native
except ImportError:  # not built: the Python paths do the same work
    _native = None  # type: ignore[assignment]

if os.environ.get("STARLIGHT_NATIVE", "1") == "0":
    _native = None  # type: ignore[assignment]

# `_native.scan` and `_native.encode_deliver` (their types: _native.pyi), or None.
scan: Callable[[bytearray, int, int], tuple[list[Any], int]] | None = (
    _native.scan if _native is not None else None
)
encode_deliver: Callable[[int, bytes, int, bool, str, str, bytes, bytes, int], bytes] | None = (
    _native.encode_deliver if _native is not None else None
)

# `_native.Sender` and `_native.bind` (untracked Pulsar sends through pulsar-client's C API:
# backend/producer_send.py), or None.
pulsar_sender: Any = _native.Sender if _native is not None else None
bind_pulsar_api: Callable[[list[int]], None] | None = _native.bind if _native is not None else None

# `_native.ParkedBeats` (the heartbeats of parked connections:
# gateway/connection/parked_beats.py), or None.
parked_beats: Any = _native.ParkedBeats if _native is not None else None

# `_native.bind_acknowledge`, `_native.acknowledge` and `_native.message_id_address`
# (acknowledgements through pulsar-client's C API: backend/consumer_ack.py), or None.
bind_acknowledge: Callable[[int, int, bytes, Any], None] | None = (
    _native.bind_acknowledge if _native is not None else None
)
acknowledge: Callable[[int, list[Any]], int] | None = (
    _native.acknowledge if _native is not None else None
)
message_id_address: Callable[[Any], int] | None = (
    _native.message_id_address if _native is not None else None
)


# `_native.bind_listening`, `_native.listener_address`, `_native.next_batches`,
# `_native.wake_reader`, `_native.acknowledge_listened` and
# `_native.negative_acknowledge_listened` (consumers pulsar-client's listener thread hands
# messages over for: backend/listened.py), or None.
bind_listening: Callable[[list[int], type], None] | None = (
    _native.bind_listening if _native is not None else None
)
listener_address: Callable[[], int] | None = (
    _native.listener_address if _native is not None else None
)
next_batches: Callable[[dict[int, Any], int, int, int], list[tuple[Any, list[Any]]]] | None = (
    _native.next_batches if _native is not None else None
)
wake_reader: Callable[[], None] | None = _native.wake_reader if _native is not None else None
# `_native.budget_listened`: how many messages of a consumer the listener hands over
# before it pauses it (backend/listened.py), or None.
budget_listened: Callable[[int, int], bool] | None = (
    getattr(_native, "budget_listened", None) if _native is not None else None
)
acknowledge_listened: Callable[[int, list[Any]], int] | None = (
    _native.acknowledge_listened if _native is not None else None
)
# `_native.bind_acknowledge_list` and `_native.acknowledge_listened_list` (one
# acknowledgement command per list of listened messages: backend/list_acks.py), or None.
bind_acknowledge_list: Callable[[int], None] | None = (
    _native.bind_acknowledge_list if _native is not None else None
)
acknowledge_listened_list: Callable[[int, list[Any]], int] | None = (
    _native.acknowledge_listened_list if _native is not None else None
)
negative_acknowledge_listened: Callable[[int, Any], None] | None = (
    _native.negative_acknowledge_listened if _native is not None else None
)
# `_native.attach_listen_signal`, `_native.take_listened` and `_native.detach_listen_signal`
# (a trio task takes those messages: gateway/bridge.py), or None.
attach_listen_signal: Callable[[int], bool] | None = (
    _native.attach_listen_signal if _native is not None else None
)
take_listened: Callable[[dict[int, Any]], list[tuple[Any, list[Any]]]] | None = (
    _native.take_listened if _native is not None else None
)
detach_listen_signal: Callable[[], None] | None = (
    _native.detach_listen_signal if _native is not None else None
)

# `_native.bind_flush`, `_native.flush`, `_native.attach_flush_signal`,
# `_native.take_flushed` and `_native.detach_flush_signal` (flushes whose outcomes reach
# trio without the GIL: backend/producer_flush.py), or None.
bind_flush: Callable[[int, Callable[[int, int], None]], None] | None = (
    _native.bind_flush if _native is not None else None
)
flush_producer: Callable[[int, int], None] | None = _native.flush if _native is not None else None
attach_flush_signal: Callable[[int], bool] | None = (
    _native.attach_flush_signal if _native is not None else None
)
take_flushed: Callable[[], list[tuple[int, int]]] | None = (
    _native.take_flushed if _native is not None else None
)
detach_flush_signal: Callable[[], list[tuple[int, int]]] | None = (
    _native.detach_flush_signal if _native is not None else None
)


def loaded() -> bool:
    """True when the compiled module is in use (the proxy logs which at start)."""
    return scan is not None
