"""The proxy's memory allocator: jemalloc in place of glibc's malloc.

glibc's malloc costs the proxy several µs of CPU per message (docs/performance.md, "The
allocator"): message bodies of about 1 KiB are too large for its per-thread caches, and
pulsar-client frees on its threads what Python allocated on the trio thread. jemalloc does
the same work for less, but only a library loaded before the process starts can take
malloc's place. So a proxy process (`serve`, `standalone`, each `--workers` child) starts
once more, at once, with `LD_PRELOAD` naming jemalloc:

- the library is `starlight_py._jemalloc`, built by `pip install` from `native/jemalloc/`
  (jemalloc's sources come from crates.io), or the one `STARLIGHT_JEMALLOC` names;
- `STARLIGHT_ALLOCATOR=system` keeps glibc's malloc (to compare, or to rule it out);
- the restarted process removes what it added to `LD_PRELOAD` from its environment, so
  the programs it starts (Pulsar and ZooKeeper under `standalone`) keep their own.

The proxy logs which allocator it runs on (`in_use()`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

CHOICE = "STARLIGHT_ALLOCATOR"  # "jemalloc" (the default) or "system"
LIBRARY = "STARLIGHT_JEMALLOC"  # another jemalloc library to preload
# Set on the restart: LD_PRELOAD's value before it ("" when there was none), to restore.
_BEFORE = "STARLIGHT_PRELOAD_BEFORE"
_PRELOAD = "LD_PRELOAD"
_BUILT = "starlight_py._jemalloc"


@dataclass
class _InUse:
    status: str = "glibc malloc (the allocator was not chosen: not a proxy process)"
    as_chosen: bool = False


_in_use = _InUse()


@dataclass(frozen=True)
class Restart:
    """Start the process again with this environment (jemalloc preloaded)."""

    environ: dict[str, str]
    library: str


@dataclass(frozen=True)
class Stay:
    """Run on as is. `environ`: the environment to give the process from now on (without
    what the restart added), `status`: the allocator in use, for the log."""

    environ: dict[str, str]
    status: str
    preferred: bool  # True: jemalloc runs (or the user chose glibc's)


def decide(
    environ: Mapping[str, str],
    mapped: str,
    built: str | None,
) -> Restart | Stay:
    """What a proxy process does about its allocator. Pure: `environ` is the process's
    environment, `mapped` the text of /proc/self/maps, `built` the path of the library
    `pip install` built (None: not built)."""
    env = dict(environ)
    loaded = "jemalloc" in mapped
    if _BEFORE in env:
        # The restart: put LD_PRELOAD back as it was, for the programs this one starts.
        before = env.pop(_BEFORE)
        if before:
            env[_PRELOAD] = before
        else:
            env.pop(_PRELOAD, None)
        if loaded:
            return Stay(env, "jemalloc", True)
        return Stay(env, "glibc malloc: jemalloc was preloaded but did not load", False)
    choice = env.get(CHOICE, "jemalloc")
    if choice == "system":
        return Stay(env, f"glibc malloc ({CHOICE}=system)", True)
    if loaded:
        return Stay(env, "jemalloc (preloaded by the environment)", True)
    library = env.get(LIBRARY) or built
    if not library:
        reason = "not built: install with Rust's cargo on PATH, or set " + LIBRARY
        return Stay(env, f"glibc malloc: jemalloc {reason}", False)
    before = env.get(_PRELOAD, "")
    env[_BEFORE] = before
    env[_PRELOAD] = f"{library} {before}".strip()
    return Restart(env, library)


def built_library() -> str | None:
    """The jemalloc library `pip install` built, or None."""
    try:
        spec = importlib.util.find_spec(_BUILT)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    return spec.origin


def prefer_jemalloc(
    execute: Callable[[str, list[str], dict[str, str]], object] = os.execve,
) -> None:
    """Called first thing by a proxy process: restarts it on jemalloc (does not return),
    or puts its environment in order and notes the allocator in use. Not on Linux: nothing
    (LD_PRELOAD and /proc are Linux's)."""
    if not sys.platform.startswith("linux"):
        _in_use.status = "the system's malloc (not Linux)"
        return
    outcome = decide(os.environ, _mapped(), built_library())
    if isinstance(outcome, Restart):
        if not os.path.exists(outcome.library):
            _in_use.status = f"glibc malloc: {LIBRARY}={outcome.library} does not exist"
            _in_use.as_chosen = False
            return
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            execute(sys.executable, list(sys.orig_argv), outcome.environ)
        except OSError as e:  # the interpreter cannot be started again: run on as is
            _in_use.status = f"glibc malloc: restarting on jemalloc failed ({e})"
            _in_use.as_chosen = False
        return  # after a failure, or when `execute` is not os.execve (the tests)
    _in_use.status, _in_use.as_chosen = outcome.status, outcome.preferred
    if dict(os.environ) != outcome.environ:
        os.environ.clear()
        os.environ.update(outcome.environ)


def _mapped() -> str:
    """The libraries this process has loaded (/proc/self/maps)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return maps.read()
    except OSError:
        return ""


def in_use() -> str:
    """The allocator this process runs on, for the log."""
    return _in_use.status


def as_chosen() -> bool:
    """False: jemalloc was wanted and is not in use (the proxy warns)."""
    return _in_use.as_chosen
