"""What allocator a running process uses, read from /proc (starlight_py/allocator.py)."""

from __future__ import annotations

from pathlib import Path


def runs_on_jemalloc(pid: int) -> bool:
    return "jemalloc" in Path(f"/proc/{pid}/maps").read_text(errors="replace")
