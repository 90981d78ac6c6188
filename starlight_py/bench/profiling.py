"""Profiling the proxy during a benchmark run: cProfile (main thread) or py-spy (every
thread), and the short summary printed at the end of the run."""

from __future__ import annotations

import contextlib
import os
import pstats
import shutil
import signal
import subprocess
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from starlight_py.bench.infra import BenchError, GroupProcess, say


def start_py_spy(stack: ExitStack, out_dir: Path, pid: int) -> None:
    """Attach py-spy to ``pid`` until ``stack`` closes. Raises BenchError without py-spy."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        raise BenchError("--profile py-spy: py-spy is not on PATH (pip install py-spy)")
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir.resolve() / "proxy.py-spy.txt"
    argv = [py_spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "200"]
    argv += ["--output", str(output), "--nonblocking"]
    spy = GroupProcess("py-spy", argv, out_dir.resolve() / "py-spy.log")
    spy.start()
    say(f"py-spy is sampling the proxy into {output}")

    def stop() -> None:
        # py-spy writes its file on SIGINT; SIGTERM would lose it.
        if spy.popen is not None and spy.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(spy.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.popen.wait(30)
        spy.stop(5)

    stack.callback(stop)


def profile_summary(kind: str, out_dir: Path, cprofile_out: Path | None) -> list[str]:
    """Print the top of the profile the proxy left and return those lines."""
    if kind == "cprofile":
        assert cprofile_out is not None
        return _cprofile_summary(cprofile_out)
    return _py_spy_summary(out_dir.resolve() / "proxy.py-spy.txt")


def _cprofile_summary(path: Path) -> list[str]:
    if not path.exists():
        say(f"no cProfile output at {path} (did the proxy exit cleanly?)")
        return []
    text_path = path.with_suffix(".txt")
    with text_path.open("w") as out:
        stats = pstats.Stats(str(path), stream=out)
        stats.sort_stats("cumulative").print_stats(40)
        stats.sort_stats("tottime").print_stats(40)
    rows: list[tuple[float, float, int, str]] = []
    raw: dict[Any, Any] = getattr(pstats.Stats(str(path)), "stats")  # noqa: B009
    for (filename, line, function), (_cc, calls, tottime, cumtime, _callers) in raw.items():
        where = f"{_short(filename)}:{line}({function})"
        if not _is_entry(where):
            rows.append((cumtime, tottime, calls, where))
    rows.sort(reverse=True)
    lines = [f"{'cumtime s':>10} {'tottime s':>10} {'calls':>9}  function"]
    lines += [f"{c:10.2f} {t:10.2f} {n:9d}  {w}" for c, t, n, w in rows[:25]]
    print(
        f"\nproxy cProfile (main thread; entry frames left out), top 25 by cumulative time; "
        f"full: {text_path}"
    )
    print("\n".join(lines))
    return lines


# Entry frames every sample or call passes through: they say nothing about the hot path.
_ENTRY_FRAMES = (
    "<frozen runpy>",
    "<frozen importlib",
    "builtins.exec>",
    "<string>:1(<module>)",
    "starlight_py/__main__.py",
    "starlight_py/cli.py",
    "run (trio/_core/_run.py)",
    "trio/_core/_run.py:2424(run)",
)


def _is_entry(where: str) -> bool:
    return any(marker in where for marker in _ENTRY_FRAMES)


def _short(filename: str) -> str:
    for marker in ("site-packages/", "starlight_py/", "lib/python3"):
        if marker in filename:
            return filename[filename.index(marker) :]
    return filename


def _py_spy_summary(path: Path) -> list[str]:
    if not path.exists():
        say(f"no py-spy output at {path}")
        return []
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not stack_text or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_frame(f) for f in stack_text.split(";") if f]
        for frame in set(frames):
            inclusive[frame] += count
        if frames:
            own[frames[-1]] += count
    if total == 0:
        return []
    lines = [f"py-spy: {total} samples (all threads, idle excluded)", "inclusive %  function"]
    top = [(f, n) for f, n in inclusive.most_common() if not _is_entry(f)][:25]
    lines += [f"{100 * n / total:10.1f}  {f}" for f, n in top]
    lines += ["self %       function"]
    lines += [f"{100 * n / total:10.1f}  {f}" for f, n in own.most_common(25)]
    print("\nproxy py-spy profile")
    print("\n".join(lines))
    return lines


def _frame(text: str) -> str:
    # "function (path/to/file.py:123)" -> "function (file path shortened)"; line dropped so
    # one function is one row.
    name, _, where = text.partition(" (")
    filename = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({_short(filename)})"
