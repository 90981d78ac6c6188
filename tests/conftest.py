"""Test-session rules shared by every suite."""

from __future__ import annotations

import os

import pytest


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # A skipped integration test in CI is a failure of CI, not a pass.
    if not os.environ.get("CI"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        if reporter is not None:
            reporter.write_line(
                f"CI=true and {len(skipped)} test(s) were skipped: failing the run", red=True
            )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
