"""The house rules that tools can check: ruff clean, formatted, mypy strict on the package;
the Rust of native/ and native/jemalloc/ formatted and clippy clean; no call of the
pulsar-client bindings that hold the GIL while they wait for a lock."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_ruff_lint_is_clean() -> None:
    result = run("ruff", "check", "starlight_py", "tests")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    result = run("ruff", "format", "--check", "starlight_py", "tests")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean() -> None:
    result = run("mypy", "starlight_py")
    assert result.returncode == 0, result.stdout + result.stderr


# The compiled frame codec and the jemalloc library; `pip install` needed cargo for both.
CRATES = pytest.mark.parametrize("crate", ["native", "native/jemalloc"])


def cargo(crate: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["cargo", *args], cwd=ROOT / crate, capture_output=True, text=True, check=False
    )


@CRATES
def test_rust_format_is_clean(crate: str) -> None:
    result = cargo(crate, "fmt", "--check")
    assert result.returncode == 0, result.stdout + result.stderr


@CRATES
def test_clippy_is_clean(crate: str) -> None:
    result = cargo(crate, "clippy", "--release", "--quiet", "--", "-D", "warnings")
    assert result.returncode == 0, result.stdout + result.stderr


# pulsar-client binding calls that wait for a producer's lock with the GIL held: a
# pulsar-client thread holding that lock can wait for the GIL (producer_flush.py).
GIL_HOLDING_CALLS = (".flush_async(", ".close_async(")


def test_no_code_calls_the_bindings_that_hold_the_gil_while_they_wait() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "starlight_py").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(call in line for call in GIL_HOLDING_CALLS)
    ]
    assert not offenders, offenders
