"""Debian packages some tests drive (chromium for the web UI, rabbitmq-server for
`rabbitmqadmin`): when a program is missing and we run as root with apt-get, it is
installed (once, tens of seconds); otherwise the test fails saying what to install. A test
that needs one never skips: a skipped integration test would hide what CI did not check."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

import pytest

APT_TIMEOUT = 900  # s


def ensure_installed(programs: Sequence[str], packages: Sequence[str]) -> None:
    """Make sure every path in `programs` is an executable, installing `packages` with
    apt-get when one is not; pytest.fail when they cannot be."""
    if _present(programs):
        return
    hint = f"install them: apt-get install -y {' '.join(packages)}"
    apt_get = shutil.which("apt-get")
    if apt_get is None or os.geteuid() != 0:
        pytest.fail(f"{', '.join(programs)} missing (not root with apt-get to fix it): {hint}")
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in ([apt_get, "update"], [apt_get, "install", "-y", *packages]):
        result = subprocess.run(
            argv, capture_output=True, text=True, env=environment, timeout=APT_TIMEOUT, check=False
        )
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
            pytest.fail(f"`{' '.join(argv)}` exited with {result.returncode}: {tail}")
    if not _present(programs):
        pytest.fail(f"apt-get ran but one of {', '.join(programs)} is still missing")


def _present(programs: Sequence[str]) -> bool:
    return all(os.access(path, os.X_OK) for path in programs)
