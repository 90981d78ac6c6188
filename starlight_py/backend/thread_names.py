"""Names of the proxy's own OS threads, as `top -H`, `perf` and the bench show them."""

from __future__ import annotations

import contextlib
import ctypes
import functools
from typing import Any

_PR_SET_NAME = 15


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def name_native_thread(name: bytes) -> None:
    """Name the calling OS thread (what top -H and /proc/<pid>/task/*/comm show), so the
    bench and operators can tell the proxy's threads apart."""
    with contextlib.suppress(OSError, AttributeError):
        _libc().prctl(_PR_SET_NAME, name[:15], 0, 0, 0)
