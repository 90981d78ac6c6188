"""What allocator a running process uses, read from /proc (starlight_py/allocator.py)."""

from __future__ import annotations

from pathlib import Path


def runs_on_jemalloc(pid: int) -> bool:
    return "jemalloc" in Path(f"/proc/{pid}/maps").read_text(errors="replace")


def preloads(pid: int) -> str:
    """LD_PRELOAD in the environment `pid` was started with ("" when none)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    for entry in environ:
        if entry.startswith(b"LD_PRELOAD="):
            return entry.partition(b"=")[2].decode()
    return ""
