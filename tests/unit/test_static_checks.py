"""The house rules that tools can check: ruff clean, formatted, mypy strict on the package;
the Rust of native/ formatted and clippy clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def cargo(*args: str) -> subprocess.CompletedProcess[str]:
    """cargo on the compiled frame codec (native/); `pip install` needed it too."""
    return subprocess.run(
        ["cargo", *args], cwd=ROOT / "native", capture_output=True, text=True, check=False
    )


def test_rust_format_is_clean() -> None:
    result = cargo("fmt", "--check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_clippy_is_clean() -> None:
    result = cargo("clippy", "--release", "--quiet", "--", "-D", "warnings")
    assert result.returncode == 0, result.stdout + result.stderr
