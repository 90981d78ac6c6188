"""`starlight-proxy serve --workers N`: N proxy processes on the same ports, like
gunicorn's workers.

One Python process runs its AMQP work on one trio thread, so it uses about one core. The
proxy is stateless (everything shared lives in ZooKeeper and Pulsar), so N processes on one
host behave like N proxies behind a load balancer, and the kernel is that load balancer:
every worker opens the AMQP listeners with SO_REUSEPORT, and Linux spreads new connections
across them. Each worker is a full proxy: its own Pulsar client, ZooKeeper session and
registry entry (`starlight-admin proxies list` shows N), and its own metrics listener, on
the configured port + the worker's index (worker 0 on the port itself).

This module is the supervisor: it starts the workers (`serve` with STARLIGHT_WORKER_INDEX
set), forwards SIGTERM/SIGINT to them (each shuts down gracefully), restarts a worker that
dies on its own, and gives up (stopping the others, exit 1) when workers keep dying right
after they start. Its exit code is 0 when every worker stopped cleanly after a signal.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

log = logging.getLogger("starlight.workers")

WORKER_INDEX_ENV = "STARLIGHT_WORKER_INDEX"
"""Set in a worker's environment: its index, 0 to N-1 (absent for a single proxy)."""

SUPERVISOR_PID_ENV = "STARLIGHT_SUPERVISOR_PID"

RESTART_DELAY = 1.0  # seconds before a dead worker is started again
EARLY_DEATH = 10.0  # a worker that dies this soon after its start counts as a failed start
MAX_FAILED_STARTS = 3  # failed starts in a row (of any worker) before the supervisor gives up
POLL = 0.2

_PR_SET_PDEATHSIG = 1


def worker_index() -> int | None:
    """This process's worker index, None when it is not a worker of a supervisor."""
    value = os.environ.get(WORKER_INDEX_ENV)
    return int(value) if value is not None and value.isdigit() else None


def die_with_supervisor() -> None:
    """In a worker, first thing: get SIGTERM when the supervisor dies (even by SIGKILL), so
    that no worker outlives it; exit at once when it is already gone. Linux only."""
    supervisor = os.environ.get(SUPERVISOR_PID_ENV)
    if supervisor is None:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return  # not Linux: a worker then outlives a killed supervisor
    if str(os.getppid()) != supervisor:
        raise SystemExit("starlight-proxy: the supervisor of this worker is gone")


class Supervisor:
    def __init__(self, argv: Sequence[str], workers: int) -> None:
        self.argv = list(argv)  # the worker's command line
        self.count = workers
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.started_at: dict[int, float] = {}
        self.stopping = False
        self.failed_starts = 0
        self.exit_code = 0

    def _start(self, index: int) -> None:
        env = {**os.environ, WORKER_INDEX_ENV: str(index), SUPERVISOR_PID_ENV: str(os.getpid())}
        # Their own process group: a Ctrl-C or a group signal reaches the supervisor only,
        # which forwards it once (twice would skip the graceful drain).
        self.children[index] = subprocess.Popen(
            self.argv, env=env, stdin=subprocess.DEVNULL, process_group=0
        )
        self.started_at[index] = time.monotonic()
        log.info("started worker %d (pid %d)", index, self.children[index].pid)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if not self.stopping:
            log.info("received %s: stopping %d workers gracefully", name, len(self.children))
        self.stopping = True
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signum)  # a second one skips the drain, as for one proxy

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for index in range(self.count):
                self._start(index)
            while self.children:
                time.sleep(POLL)
                self._reap()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            for child in self.children.values():
                child.kill()
                child.wait()
        return self.exit_code

    def _reap(self) -> None:
        for index, child in list(self.children.items()):
            code = child.poll()
            if code is None:
                continue
            del self.children[index]
            if self.stopping:
                if code != 0:
                    log.warning("worker %d exited with %d while stopping", index, code)
                    self.exit_code = 1
                continue
            lived = time.monotonic() - self.started_at[index]
            log.error("worker %d exited with %d after %.1f s", index, code, lived)
            self.failed_starts = self.failed_starts + 1 if lived < EARLY_DEATH else 0
            if self.failed_starts >= MAX_FAILED_STARTS:
                log.error("workers keep failing right after they start: stopping")
                self.exit_code = 1
                self._on_signal(signal.SIGTERM, None)
                continue
            time.sleep(RESTART_DELAY)
            if not self.stopping:
                self._start(index)


def run_workers(serve_args: Sequence[str], workers: int) -> int:
    """Run `workers` proxy processes with `serve_args` (the `serve` arguments without
    `--workers`) until a signal stops them; returns the exit code."""
    argv = [sys.executable, "-m", "starlight_py", "serve", *serve_args]
    log.info("starting %d workers sharing the AMQP listeners (SO_REUSEPORT)", workers)
    return Supervisor(argv, workers).run()
