"""pytest plugin for the peer suites: one JSON line per finished test, written as it finishes.

Loaded with `-p pytest_outcomes` into a peer suite's own pytest run (tests/peers/run_peers.py
puts this folder on PYTHONPATH and sets PEERS_OUTCOMES to the output file). Lines are flushed
one by one so that a suite killed by its time limit still leaves the results it had. A test's
outcome is "error" when its setup or teardown failed, otherwise the call's outcome; reruns by
pytest-rerunfailures count only by their last attempt.
"""

from __future__ import annotations

import json
import os
from typing import Any

_reports: dict[str, str] = {}


def pytest_runtest_logreport(report: Any) -> None:
    if report.outcome == "rerun":
        _reports.pop(report.nodeid, None)
        return
    if report.when == "call":
        outcome = report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "skipped" if report.skipped else "passed"
        if _reports.get(report.nodeid) != "error":
            _reports[report.nodeid] = outcome
    elif report.failed:
        _reports[report.nodeid] = "error"
    elif report.skipped and report.when == "setup":
        _reports[report.nodeid] = "skipped"


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    path = os.environ.get("PEERS_OUTCOMES")
    if not path:
        return
    outcome = _reports.pop(nodeid, "error")
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps({"id": nodeid, "outcome": outcome}) + "\n")
