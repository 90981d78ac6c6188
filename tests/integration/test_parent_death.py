"""Servers die with the Python process that started them, however it dies (process.py's
parent-death signal), and not before: not when the thread that asked for them ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from starlight_py.local.process import (
    _ORPHANED_AT_BIRTH,
    _arm_parent_death_signal,
    _load_prctl,
)
from tests.support.processes import alive, living_processes_mentioning, still_alive

pytestmark = pytest.mark.integration

# Starts a server from a short-lived thread (as `trio.to_thread` would), reports the
# server's pid and the thread's id once the thread has ended, then waits to be killed.
LAUNCHER = """
import sys, threading, time
from pathlib import Path
from starlight_py.local.process import ServerProcess

folder = Path(sys.argv[1])
server = ServerProcess("sleeper", folder / "sleeper.log")
ids = []

def launch():
    ids.append(threading.get_native_id())
    sleep = "import time; time.sleep(3600)"
    server.launch([sys.executable, "-c", sleep, str(folder)], cwd=folder)

thread = threading.Thread(target=launch)
thread.start()
thread.join()
print(server.pid, ids[0], flush=True)
time.sleep(3600)
"""


def thread_gone(pid: int, tid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}/task/{tid}").exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_server_outlives_the_thread_that_started_it_but_not_a_sigkill_of_its_parent(
    tmp_path: Path,
) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert launcher.stdout is not None
        server_pid, thread_id = map(int, launcher.stdout.readline().split())
        assert thread_gone(launcher.pid, thread_id)
        # Had the signal been tied to that thread, it would have been sent as it ended.
        assert alive(server_pid)
        assert set(living_processes_mentioning(str(tmp_path))) == {launcher.pid, server_pid}

        launcher.send_signal(signal.SIGKILL)
        launcher.wait()

        assert still_alive([server_pid]) == []
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert living_processes_mentioning(str(tmp_path)) == []


def test_a_child_whose_parent_died_before_it_armed_the_signal_does_not_run() -> None:
    # The same check, shown a parent that is not ours: as if ours had died between fork
    # and prctl, and we had been handed to another reaper.
    prctl = _load_prctl()
    assert prctl is not None, "Linux only"
    not_our_parent = os.getpid() + 1  # the child's parent is os.getpid()

    child = subprocess.Popen(
        [sys.executable, "-c", "print('ran')"],
        stdout=subprocess.PIPE,
        preexec_fn=_arm_parent_death_signal(prctl, not_our_parent),  # noqa: PLW1509
    )

    out, _ = child.communicate(timeout=30)
    assert child.returncode == _ORPHANED_AT_BIRTH
    assert out == b""
