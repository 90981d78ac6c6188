"""Keeping the standalone's servers up: a dead ZooKeeper or Pulsar is started again.

Theory of operation: the standalone's proxy runs in the process that started ZooKeeper and
Pulsar, so it is also the one that can notice them die (a JVM out of heap exits, see
``-XX:+ExitOnOutOfMemoryError``; the OOM killer; a stray ``kill``). :func:`supervise` polls
each server; a dead one is started again on the same ports with the same data, and the
proxy's clients reconnect to it by themselves (kazoo and pulsar-client retry), so what was
confirmed before the death is still there after it.

Some deaths are not worth retrying: a server that dies again right after each restart (a
corrupt data folder, a port someone else took, a heap too small for what it holds) would
otherwise be restarted forever while the proxy turns every client away. The
:class:`RestartBudget` counts restarts in a row that did not lead to a stable run; when it
runs out, :func:`supervise` raises :class:`ServerLost`, whose message says which server,
how it died and what its log said last, and the standalone exits with it.

The budget and the messages are pure (unit-tested); only :func:`supervise` waits.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Protocol

import trio

from starlight_py.local.errors import LocalInfraError
from starlight_py.local.process import Startup, log_excerpt
from starlight_py.units import MILLISECONDS, SECONDS

OUT_OF_MEMORY = "OutOfMemoryError"
_WARNING_LINES = 10


@dataclass(frozen=True)
class RestartPolicy:
    """How hard :func:`supervise` tries before it gives up on a server."""

    attempts: int = 3
    """Restarts in a row that may end in a failed start or an early death; one more death
    and the server is lost."""
    stable_after: float = 60 * SECONDS
    """A server that served this long after its start has recovered: its next death starts
    a new count."""
    delay: float = 1 * SECONDS
    """Pause before each restart: lets the kernel release the dead server's ports."""
    poll_interval: float = 500 * MILLISECONDS
    """How often each server is checked."""

    def __post_init__(self) -> None:
        """Raises ValueError: a negative or zero value."""
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if min(self.stable_after, self.delay, self.poll_interval) <= 0:
            raise ValueError("stable_after, delay and poll_interval must be positive")


class RestartBudget:
    """Counts the restarts in a row of one server that did not lead to a stable run."""

    def __init__(self, policy: RestartPolicy) -> None:
        """Raises nothing."""
        self._policy = policy
        self._failures = 0

    @property
    def failures(self) -> int:
        """Deaths and failed starts counted so far in this row."""
        return self._failures

    def allows_restart(self, died_at: float, ready_at: float | None) -> bool:
        """Record a death (or a failed start: ``ready_at`` None) at ``died_at``; whether to
        try again. ``ready_at`` is when the run that died had become ready (monotonic
        seconds). Raises nothing."""
        if ready_at is not None and died_at - ready_at >= self._policy.stable_after:
            self._failures = 0
        self._failures += 1
        return self._failures <= self._policy.attempts


def cause_of_death(exit_code: int | None, log_tail: Sequence[str]) -> str:
    """How a server's run ended, for a person: "was killed by SIGKILL", "exited with code 3
    after java.lang.OutOfMemoryError: Java heap space". Raises nothing."""
    if exit_code is None:
        how = "stopped"
    elif exit_code < 0:
        try:
            how = f"was killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            how = f"was killed by signal {-exit_code}"
    else:
        how = f"exited with code {exit_code}"
    out_of_memory = next((line for line in reversed(log_tail) if OUT_OF_MEMORY in line), None)
    if out_of_memory is not None:
        # The JVM's own words are the most precise: which memory ran out (heap, metaspace).
        start = out_of_memory.find("java.lang.")
        how += f" after {out_of_memory[start:].strip()}" if start >= 0 else " out of memory"
    return how


class ServerLost(LocalInfraError):
    """A server died and could not be started again; the message says which, how, and
    what its log said last."""

    def __init__(self, name: str, how: str, attempts: int, detail: str) -> None:
        """``detail``: the last start error, or the end of the log. Raises nothing."""
        self.server = name
        super().__init__(
            f"{name} {how}, and {attempts} restart{'s' if attempts != 1 else ''} in a row "
            f"did not bring it back, so the standalone stops. {detail}"
        )


class Restartable(Protocol):
    """What :func:`supervise` needs of a server (ZooKeeperServer, PulsarStandalone)."""

    @property
    def log_path(self) -> Path:
        """Its log file."""
        ...

    def is_running(self) -> bool:
        """Whether its process runs."""
        ...

    def exit_code(self) -> int | None:
        """How its last run ended."""
        ...

    def log_tail(self) -> list[str]:
        """The last lines of its current or last run."""
        ...

    def launch(self) -> Startup:
        """Start it without waiting."""
        ...


async def supervise(
    servers: Sequence[tuple[str, Restartable]],
    log: logging.Logger,
    policy: RestartPolicy | None = None,
) -> NoReturn:
    """Watch the named ``servers`` (all running and ready now) until cancelled, starting a
    dead one again (see the module docstring).

    Raises:
        ServerLost: one died and :class:`RestartBudget` ran out.
    """
    policy = policy or RestartPolicy()
    budgets = {name: RestartBudget(policy) for name, _ in servers}
    ready_at = dict.fromkeys(budgets, time.monotonic())
    while True:
        await trio.sleep(policy.poll_interval)
        for name, server in servers:
            if not server.is_running():
                ready_at[name] = await _bring_back(
                    name, server, budgets[name], ready_at[name], policy, log
                )


async def _bring_back(
    name: str,
    server: Restartable,
    budget: RestartBudget,
    ready_at: float | None,
    policy: RestartPolicy,
    log: logging.Logger,
) -> float:
    """Restart ``server`` until it is ready; returns when it became ready. Raises
    ServerLost."""
    tail = server.log_tail()
    how = cause_of_death(server.exit_code(), tail)
    detail = log_excerpt(server.log_path, tail)
    # Enough to see what happened while it is being restarted; the whole excerpt goes into
    # the message if it is lost.
    log.warning("%s %s. %s", name, how, log_excerpt(server.log_path, tail[-_WARNING_LINES:]))
    died_at = time.monotonic()
    while budget.allows_restart(died_at, ready_at):
        log.warning("starting %s again (restart %d of %d)", name, budget.failures, policy.attempts)
        await trio.sleep(policy.delay)
        try:
            # The spawner thread forks the JVM (see process.py); each readiness probe may
            # block for a second or two, so it runs off the event loop too.
            startup = await trio.to_thread.run_sync(server.launch)
            while not await trio.to_thread.run_sync(startup.ready):
                await trio.sleep(policy.poll_interval)
        except LocalInfraError as e:
            detail = str(e)
            log.warning("%s did not start again: %s", name, e)
            died_at, ready_at = time.monotonic(), None
            continue
        now = time.monotonic()
        log.warning("%s is back after %.1f s", name, now - startup.started)
        return now
    raise ServerLost(name, how, budget.failures - 1, detail)
