"""The proxy's choice of allocator (starlight_py/allocator.py) and the jemalloc library
`pip install` builds from native/jemalloc/.

The decision is pure and tested here. The library is tested in processes of its own: every
allocation entry point glibc lets a preloaded library replace, and a Python run on it.
Integration tests run every proxy they start on it (tests/integration/test_allocator.py
checks that they do)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from starlight_py import allocator, cli
from starlight_py.allocator import Restart, Stay, decide

JEMALLOC_MAPS = "7f00-7f10 r-xp 0 08:01 1 /x/starlight_py/_jemalloc.cpython-311.so\n"
GLIBC_MAPS = "7f00-7f10 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
BUILT = "/x/starlight_py/_jemalloc.cpython-311.so"


def test_a_proxy_restarts_with_the_built_jemalloc_preloaded() -> None:
    outcome = decide({"PATH": "/bin"}, GLIBC_MAPS, BUILT)
    assert outcome == Restart(
        {"PATH": "/bin", "LD_PRELOAD": BUILT, "STARLIGHT_PRELOAD_BEFORE": ""}, BUILT
    )


def test_a_preload_of_the_user_stays_after_jemalloc() -> None:
    outcome = decide({"LD_PRELOAD": "/opt/libtrace.so"}, GLIBC_MAPS, BUILT)
    assert isinstance(outcome, Restart)
    assert outcome.environ["LD_PRELOAD"] == f"{BUILT} /opt/libtrace.so"
    assert outcome.environ["STARLIGHT_PRELOAD_BEFORE"] == "/opt/libtrace.so"


def test_the_restarted_process_gives_its_children_the_environment_it_was_given() -> None:
    restart = decide({"LD_PRELOAD": "/opt/libtrace.so", "A": "1"}, GLIBC_MAPS, BUILT)
    assert isinstance(restart, Restart)
    outcome = decide(restart.environ, JEMALLOC_MAPS, BUILT)
    assert outcome == Stay({"LD_PRELOAD": "/opt/libtrace.so", "A": "1"}, "jemalloc", True)
    restart = decide({"A": "1"}, GLIBC_MAPS, BUILT)
    assert isinstance(restart, Restart)
    assert decide(restart.environ, JEMALLOC_MAPS, BUILT) == Stay({"A": "1"}, "jemalloc", True)


def test_a_restart_that_did_not_load_jemalloc_runs_on_and_says_so() -> None:
    restart = decide({}, GLIBC_MAPS, BUILT)
    assert isinstance(restart, Restart)
    outcome = decide(restart.environ, GLIBC_MAPS, BUILT)
    assert isinstance(outcome, Stay)
    assert outcome.environ == {}
    assert not outcome.preferred
    assert "did not load" in outcome.status


def test_system_keeps_glibc_malloc_without_a_warning() -> None:
    outcome = decide({"STARLIGHT_ALLOCATOR": "system"}, GLIBC_MAPS, BUILT)
    assert outcome == Stay(
        {"STARLIGHT_ALLOCATOR": "system"}, "glibc malloc (STARLIGHT_ALLOCATOR=system)", True
    )


def test_without_the_built_library_the_proxy_runs_on_glibc_and_says_how_to_fix_it() -> None:
    outcome = decide({}, GLIBC_MAPS, None)
    assert isinstance(outcome, Stay)
    assert not outcome.preferred
    assert "cargo" in outcome.status and "STARLIGHT_JEMALLOC" in outcome.status


def test_another_jemalloc_can_be_named() -> None:
    outcome = decide({"STARLIGHT_JEMALLOC": "/usr/lib/libjemalloc.so.2"}, GLIBC_MAPS, None)
    assert isinstance(outcome, Restart)
    assert outcome.library == "/usr/lib/libjemalloc.so.2"


def test_jemalloc_preloaded_by_the_environment_needs_no_restart() -> None:
    outcome = decide({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, "x libjemalloc.so.2\n", BUILT)
    assert outcome == Stay(
        {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, "jemalloc (preloaded by the environment)", True
    )


def test_prefer_jemalloc_executes_the_same_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.delenv("STARLIGHT_PRELOAD_BEFORE", raising=False)
    monkeypatch.delenv("STARLIGHT_ALLOCATOR", raising=False)
    monkeypatch.setenv("STARLIGHT_JEMALLOC", sys.executable)  # a file that exists
    monkeypatch.setattr(allocator, "_mapped", lambda: GLIBC_MAPS)
    allocator.prefer_jemalloc(lambda path, argv, env: calls.append((path, argv, env)))
    [(path, argv, env)] = calls
    assert path == sys.executable
    assert argv == sys.orig_argv
    assert env["LD_PRELOAD"].split()[0] == sys.executable


def test_the_restarted_process_cleans_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STARLIGHT_PRELOAD_BEFORE", "")
    monkeypatch.setenv("LD_PRELOAD", BUILT)
    monkeypatch.setattr(allocator, "_mapped", lambda: JEMALLOC_MAPS)
    allocator.prefer_jemalloc(lambda *_: pytest.fail("no second restart"))
    assert "LD_PRELOAD" not in os.environ and "STARLIGHT_PRELOAD_BEFORE" not in os.environ
    assert allocator.in_use() == "jemalloc" and allocator.as_chosen()


def test_a_named_library_that_does_not_exist_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STARLIGHT_PRELOAD_BEFORE", raising=False)
    monkeypatch.delenv("STARLIGHT_ALLOCATOR", raising=False)
    monkeypatch.setenv("STARLIGHT_JEMALLOC", "/nowhere/libjemalloc.so")
    monkeypatch.setattr(allocator, "_mapped", lambda: GLIBC_MAPS)
    allocator.prefer_jemalloc(lambda *_: pytest.fail("no restart without the library"))
    assert "/nowhere/libjemalloc.so does not exist" in allocator.in_use()
    assert not allocator.as_chosen()


def _run_on_jemalloc(code: str) -> subprocess.CompletedProcess[str]:
    library = allocator.built_library()
    assert library is not None, "pip install did not build native/jemalloc (is cargo on PATH?)"
    env = {**os.environ, "LD_PRELOAD": library}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_built_library_serves_every_allocation_entry_point() -> None:
    result = _run_on_jemalloc(
        """
        import ctypes
        libc = ctypes.CDLL(None)
        for name in ("malloc", "calloc", "realloc", "memalign", "valloc", "pvalloc",
                     "aligned_alloc"):
            getattr(libc, name).restype = ctypes.c_void_p
        usable = libc.malloc_usable_size
        usable.argtypes = [ctypes.c_void_p]
        usable.restype = ctypes.c_size_t
        free = libc.free
        free.argtypes = [ctypes.c_void_p]
        assert "jemalloc" in open("/proc/self/maps").read()
        block = libc.malloc(1100)
        assert usable(block) >= 1100
        block = libc.realloc(ctypes.c_void_p(block), 70000)
        assert usable(block) >= 70000
        free(block)
        block = libc.calloc(10, 100)
        assert ctypes.string_at(block, 1000) == bytes(1000)
        free(block)
        for alignment in (1, 3, 8, 64, 4096):
            block = libc.memalign(alignment, 100)
            assert block % max(alignment if alignment & (alignment - 1) == 0 else 4, 8) == 0
            free(block)
        block = libc.aligned_alloc(256, 512)
        assert block % 256 == 0
        free(block)
        block = ctypes.c_void_p()
        assert libc.posix_memalign(ctypes.byref(block), 128, 1000) == 0
        assert block.value % 128 == 0
        free(block)
        block = libc.valloc(10)
        assert block % 4096 == 0
        free(block)
        block = libc.pvalloc(1)
        assert block % 4096 == 0 and usable(block) >= 4096
        free(block)
        assert usable(None) == 0
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_built_library_serves_cpp_new_and_delete() -> None:
    result = _run_on_jemalloc(
        """
        import ctypes, _pulsar  # pulsar-client's C++: libstdc++ is loaded
        lib = ctypes.CDLL(None)
        new, new_array = lib._Znwm, lib._Znam
        for function in (new, new_array):
            function.restype = ctypes.c_void_p
            function.argtypes = [ctypes.c_size_t]
        for name in ("_ZdlPv", "_ZdaPv"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
        for name in ("_ZdlPvm", "_ZdaPvm"):
            getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        usable = lib.malloc_usable_size
        usable.argtypes = [ctypes.c_void_p]
        for size in (0, 1, 24, 1100, 70000):
            for allocate, free, sized in ((new, lib._ZdlPv, lib._ZdlPvm),
                                          (new_array, lib._ZdaPv, lib._ZdaPvm)):
                block = allocate(size)
                assert block and usable(block) >= size
                free(block)
                block = allocate(size)
                sized(block, size)
        print("ok", flush=True)
        new(1 << 62)  # jemalloc has none: libstdc++'s operator new throws std::bad_alloc
        """
    )
    assert result.stdout.strip() == "ok", result.stderr
    assert result.returncode != 0
    assert "std::bad_alloc" in result.stderr


def test_python_and_pulsar_client_run_on_the_built_library() -> None:
    result = _run_on_jemalloc(
        """
        import threading, _pulsar
        blocks = []
        def churn():
            for _ in range(20000):
                builder = _pulsar.MessageBuilder()
                builder.content(b"x" * 1100)
                builder.properties({"a": "1", "b": "2"})
                blocks.append(builder.build())
                if len(blocks) > 500:
                    del blocks[:250]
        threads = [threading.Thread(target=churn) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        print(len(blocks) > 0, "jemalloc" in open("/proc/self/maps").read())
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]


def test_a_restart_that_cannot_start_runs_on_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STARLIGHT_PRELOAD_BEFORE", raising=False)
    monkeypatch.delenv("STARLIGHT_ALLOCATOR", raising=False)
    monkeypatch.setenv("STARLIGHT_JEMALLOC", sys.executable)
    monkeypatch.setattr(allocator, "_mapped", lambda: GLIBC_MAPS)
    before = dict(os.environ)

    def refuse(path: str, argv: list[str], env: dict[str, str]) -> None:
        raise PermissionError(13, "Permission denied", path)

    allocator.prefer_jemalloc(refuse)
    assert allocator.in_use().startswith("glibc malloc: restarting on jemalloc failed (")
    assert "Permission denied" in allocator.in_use()
    assert not allocator.as_chosen()
    assert dict(os.environ) == before


def test_only_a_process_started_to_serve_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    """`main()` of a `serve` or `standalone` command line restarts on jemalloc; `main(argv)`
    called with other arguments (tests, embedding) never replaces the calling process."""
    restarts: list[str] = []
    monkeypatch.setattr(allocator, "prefer_jemalloc", lambda: restarts.append("restart"))
    bad = ["--set", "noSuchKey=1"]  # a configuration error: main returns before serving
    assert cli.main(["serve", *bad]) == 2
    assert restarts == []
    monkeypatch.setattr(sys, "argv", ["starlight-proxy", "serve", *bad])
    assert cli.main() == 2
    assert restarts == ["restart"]
    monkeypatch.setattr(sys, "argv", ["starlight-proxy", "serve", "--workers", "2", *bad])
    cli.main()  # the supervisor serves nothing itself: its workers restart
    monkeypatch.setattr(sys, "argv", ["starlight-proxy", "config", "check", *bad])
    cli.main()
    assert restarts == ["restart"]
