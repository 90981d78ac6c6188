"""One benchmark case: N producer and N consumer processes on N queues (or topics).

Order: declare the queues (AMQP), start the consumers and wait until each is subscribed,
start the producers and wait until each is connected, then tell every producer ``go`` at
once. The case ends when every worker has exited, or at ``timeout`` seconds, when every
worker still running is killed and the case is reported as ``timeout``.

Throughput = measured messages consumed / (last consume - first measured publish), over all
pairs. Latency = consume time - the send time in the body, for every first delivery.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from starlight_py.bench.infra import GroupProcess, group_cpu_seconds, host_busy_seconds, say
from starlight_py.bench.worker import MIN_BODY, WorkerSpec

READY_TIMEOUT = 45.0
PROGRESS_EVERY = 2.0
SETUP_TIMEOUT = 20.0


@dataclass(frozen=True)
class Case:
    scenario: str  # "1x1", "4x4": producers x consumers, one queue per pair
    size: int
    mode: str  # "each" | "pipelined"
    target: str  # "proxy" | "rabbitmq" | "pulsar"

    @property
    def pairs(self) -> int:
        return int(self.scenario.split("x", 1)[0])

    def label(self) -> str:
        return f"{self.target} {self.scenario} {size_label(self.size)} {self.mode}"


def size_label(size: int) -> str:
    if size >= 1024 and size % 1024 == 0:
        return f"{size // 1024}KiB"
    return f"{size}B"


@dataclass(frozen=True)
class Target:
    name: str  # proxy | rabbitmq | pulsar
    kind: str  # amqp | pulsar
    url: str
    processes: dict[str, int]  # name -> process group id, for the CPU column
    process_alive: Callable[[], bool] | None = None  # the proxy: a dead proxy fails fast


@dataclass(frozen=True)
class Settings:
    messages: int  # per case, split among the producers
    duration: float  # producer cap in seconds (0 = none)
    warmup: int
    window: int
    prefetch: int
    timeout: float
    run_id: str
    work_dir: Path
    rate: float = 0.0
    progress_every: float = PROGRESS_EVERY
    pulsar_logger: str = "file"
    pulsar_batching: bool = False


@dataclass
class CaseResult:
    scenario: str
    size: int
    mode: str
    target: str
    status: str  # ok | timeout | error | skipped
    detail: str = ""
    msgs_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    sent: int = 0
    received: int = 0
    duplicates: int = 0
    seconds: float | None = None
    server_cpu: dict[str, float] = field(default_factory=dict)  # % of one core
    server_cpu_us_per_msg: dict[str, float] = field(default_factory=dict)
    client_cpu: float | None = None  # % of one core, all workers together
    host_cpu: float | None = None  # % of one core: every process on the host
    other_cpu: float | None = None  # host - server - client: someone else's load
    proxy_rss_max_kib: int | None = None

    @staticmethod
    def of(case: Case, status: str, detail: str = "") -> CaseResult:
        return CaseResult(case.scenario, case.size, case.mode, case.target, status, detail)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Worker:
    """A worker process: its stdout lines go to a shared queue through a reader thread."""

    def __init__(
        self, name: str, spec: WorkerSpec, log_dir: Path, lines: queue.Queue[tuple[str, str]]
    ) -> None:
        self.name = name
        self.spec = spec
        self.log_path = log_dir / f"{name}.log"
        self.ready = False
        self.progress = 0
        self.exited = False
        self._lines = lines
        with self.log_path.open("wb") as log_file:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "starlight_py.bench.worker", spec.to_json()],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                start_new_session=True,
            )
        threading.Thread(target=self._read, name=f"read-{name}", daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            self._lines.put((self.name, raw.decode(errors="replace").strip()))
        self._lines.put((self.name, "@exit"))

    def go(self) -> None:
        assert self.popen.stdin is not None
        with contextlib.suppress(OSError):
            self.popen.stdin.write(b"go\n")
            self.popen.stdin.flush()

    def kill(self) -> None:
        if self.popen.poll() is None:
            # Its own session: the group is the worker and nothing else.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def result(self) -> dict[str, Any] | None:
        try:
            loaded: dict[str, Any] = json.loads(Path(self.spec.out).read_text())
        except (OSError, ValueError):
            return None
        return loaded

    def log_tail(self, lines: int = 8) -> str:
        return GroupProcess(self.name, [], self.log_path).log_tail(lines)


def percentile(sorted_values: list[int], fraction: float) -> int:
    """Nearest-rank percentile of a sorted, non-empty list."""
    rank = max(1, int(-(-fraction * len(sorted_values) // 1)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def _queue_names(case: Case, target: Target, settings: Settings, index: int) -> list[str]:
    names = [f"bench-{settings.run_id}-{index}-{i}" for i in range(case.pairs)]
    if target.kind == "pulsar":
        return [f"persistent://public/default/direct-{name}" for name in names]
    return names


def _amqp_setup(url: str, names: list[str], delete: bool) -> None:
    """Declare (durable) or delete the queues through one pika connection."""
    import pika  # type: ignore[import-untyped]  # noqa: PLC0415

    params = pika.URLParameters(url)
    params.socket_timeout = 10
    params.stack_timeout = SETUP_TIMEOUT
    params.blocked_connection_timeout = SETUP_TIMEOUT
    conn = pika.BlockingConnection(params)
    try:
        channel = conn.channel()
        for name in names:
            if delete:
                channel.queue_delete(name)
            else:
                channel.queue_declare(name, durable=True)
    finally:
        if conn.is_open:
            conn.close()


Tick = Callable[[float, int], None]  # (seconds since go, messages consumed so far)


def run_case(
    case: Case, target: Target, settings: Settings, index: int, tick: Tick | None = None
) -> CaseResult:
    """Raises nothing but KeyboardInterrupt; failures become the result's status.
    ``tick`` is called about every half second while messages flow."""
    if case.size < MIN_BODY:
        return CaseResult.of(case, "error", f"body size must be >= {MIN_BODY} B")
    names = _queue_names(case, target, settings, index)
    log_dir = settings.work_dir / "cases" / f"{index:03d}-{case.label().replace(' ', '-')}"
    log_dir.mkdir(parents=True, exist_ok=True)
    if target.kind == "amqp":
        try:
            _amqp_setup(target.url, names, delete=False)
        except Exception as e:
            return CaseResult.of(case, "error", f"queue.declare failed: {type(e).__name__}: {e}")
    workers: list[Worker] = []
    try:
        return _run(case, target, settings, names, log_dir, workers, tick)
    finally:
        for worker in workers:
            worker.kill()
        if target.kind == "amqp" and (target.process_alive is None or target.process_alive()):
            try:
                _amqp_setup(target.url, names, delete=True)
            except Exception as e:
                say(f"  (could not delete the queues: {type(e).__name__}: {e})")


def _spec(
    case: Case, target: Target, settings: Settings, role: str, i: int, name: str, log_dir: Path
) -> WorkerSpec:
    return WorkerSpec(
        role=role,
        target=target.kind,
        mode=case.mode,
        url=target.url,
        queue=name,
        size=case.size,
        out=str(log_dir / f"{role}-{i}.json"),
        producer_index=i,
        count=max(1, settings.messages // case.pairs),
        duration=settings.duration,
        rate=settings.rate,
        warmup=settings.warmup,
        window=settings.window,
        prefetch=settings.prefetch,
        producers=1,
        deadline=max(5.0, settings.timeout - 3),
        pulsar_logger=settings.pulsar_logger,
        pulsar_batching=settings.pulsar_batching,
    )


class _Crew:
    """The worker processes of one case, and the lines they report."""

    def __init__(
        self,
        case: Case,
        target: Target,
        settings: Settings,
        log_dir: Path,
        workers: list[Worker],
        deadline: float,
    ) -> None:
        self.case = case
        self.target = target
        self.settings = settings
        self.log_dir = log_dir
        self.workers = workers  # every worker started, for the caller to kill
        self.deadline = deadline
        self.lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self.by_name: dict[str, Worker] = {}

    def launch(self, role: str, names: list[str]) -> list[Worker]:
        group = []
        for i, name in enumerate(names):
            spec = _spec(self.case, self.target, self.settings, role, i, name, self.log_dir)
            worker = Worker(f"{role}-{i}", spec, self.log_dir, self.lines)
            self.workers.append(worker)
            self.by_name[worker.name] = worker
            group.append(worker)
        return group

    def pump(self, until: float) -> None:
        """Handle worker lines until ``until`` (monotonic) or the next line."""
        try:
            name, line = self.lines.get(timeout=max(0.0, min(0.5, until - time.monotonic())))
        except queue.Empty:
            return
        worker = self.by_name[name]
        if line == "@ready":
            worker.ready = True
        elif line.startswith("@progress "):
            worker.progress = int(line.split()[1])
        elif line == "@exit":
            worker.exited = True

    def wait_ready(self, group: list[Worker]) -> str | None:
        until = min(self.deadline, time.monotonic() + READY_TIMEOUT)
        while not all(w.ready for w in group):
            failed = [w for w in group if w.exited and not w.ready]
            if failed:
                return f"{failed[0].name} exited before it was ready: {_why(failed[0])}"
            if time.monotonic() >= until:
                return "workers not ready in time"
            self.pump(until)
        return None


def _run(
    case: Case,
    target: Target,
    settings: Settings,
    names: list[str],
    log_dir: Path,
    workers: list[Worker],
    tick: Tick | None,
) -> CaseResult:
    crew = _Crew(case, target, settings, log_dir, workers, time.monotonic() + settings.timeout)
    consumers = crew.launch("consumer", names)
    problem = crew.wait_ready(consumers)
    if problem:
        return CaseResult.of(case, "error", problem)
    producers = crew.launch("producer", names)
    problem = crew.wait_ready(producers)
    if problem:
        return CaseResult.of(case, "error", problem)
    cpu_before = {name: group_cpu_seconds(pgid) for name, pgid in target.processes.items()}
    host_before = host_busy_seconds()
    go_at = time.monotonic()
    for worker in producers:
        worker.go()
    ending = _drive(crew, producers, consumers, go_at, tick)
    if ending == "died":
        return CaseResult.of(case, "error", f"{target.name} exited during the case")
    wall = time.monotonic() - go_at
    host = 100 * (host_busy_seconds() - host_before) / wall
    cpu = {
        name: round(100 * (group_cpu_seconds(pgid) - cpu_before[name]) / wall, 1)
        for name, pgid in target.processes.items()
    }
    for worker in workers:
        worker.kill()
    if ending == "timeout":
        result = CaseResult.of(case, "timeout", f"not finished after {settings.timeout:g} s")
    else:
        result = CaseResult.of(case, "ok")
    _fill(result, producers, consumers, wall)
    result.server_cpu = cpu
    if result.received:
        result.server_cpu_us_per_msg = {
            name: round(percent / 100 * wall / result.received * 1e6, 1)
            for name, percent in cpu.items()
        }
    result.host_cpu = round(host, 1)
    if result.client_cpu is not None:
        result.other_cpu = round(max(0.0, host - sum(cpu.values()) - result.client_cpu), 1)
    return result


def _drive(
    crew: _Crew,
    producers: list[Worker],
    consumers: list[Worker],
    go_at: float,
    tick: Tick | None,
) -> str:
    """Follow the workers until all have exited ("done"), the case's deadline passes
    ("timeout") or the target dies ("died"), reporting progress meanwhile."""
    target, settings, deadline = crew.target, crew.settings, crew.deadline
    next_report = go_at + settings.progress_every
    while not all(w.exited for w in crew.workers):
        now = time.monotonic()
        if now >= deadline:
            return "timeout"
        if target.process_alive is not None and not target.process_alive():
            return "died"
        if tick is not None:
            tick(now - go_at, sum(w.progress for w in consumers))
        if now >= next_report:
            next_report = now + settings.progress_every
            consumed = sum(w.progress for w in consumers)
            sent = sum(w.progress for w in producers)
            say(
                f"  {crew.case.label()}: {consumed} consumed, {sent} confirmed, "
                f"{now - go_at:.0f} s / timeout {deadline - go_at:.0f} s"
            )
        crew.pump(min(deadline, next_report))
    return "done"


def _why(worker: Worker) -> str:
    res = worker.result()
    if res is not None and not res.get("ok"):
        return str(res.get("error"))
    return worker.log_tail(3) or f"exit code {worker.popen.poll()}"


def _fill(
    result: CaseResult, producers: list[Worker], consumers: list[Worker], wall: float
) -> None:
    p_results = [w.result() for w in producers]
    c_results = [w.result() for w in consumers]
    problems = [
        f"{w.name}: {_why(w)}"
        for w, r in zip(producers + consumers, p_results + c_results, strict=True)
        if r is None or not r.get("ok")
    ]
    if problems:
        if result.status == "ok":
            result.status = "error"
        result.detail = "; ".join([result.detail, *problems]).strip("; ")
    ok_p = [r for r in p_results if r is not None and r.get("ok")]
    ok_c = [r for r in c_results if r is not None and r.get("ok")]
    result.sent = sum(int(r["sent"]) for r in ok_p)
    result.received = sum(int(r["received"]) for r in ok_c)
    result.duplicates = sum(int(r["duplicates"]) for r in ok_c)
    cpu_s = [float(r.get("cpu_s", 0.0)) for r in ok_p + ok_c]
    if any(r.get("timed_out") for r in ok_c) and result.status == "ok":
        result.status = "timeout"
        result.detail = f"consumers got {result.received} of {result.sent}"
    if len(ok_p) != len(producers) or len(ok_c) != len(consumers) or result.received == 0:
        return
    first = min(int(r["first_ns"]) for r in ok_p)
    last = max(int(r["last_ns"]) for r in ok_c)
    if last <= first:
        return
    seconds = (last - first) / 1e9
    result.seconds = round(seconds, 3)
    result.msgs_per_s = round(result.received / seconds, 1)
    latencies = sorted(v for r in ok_c for v in r["latencies_us"])
    result.p50_ms = round(percentile(latencies, 0.50) / 1000, 3)
    result.p99_ms = round(percentile(latencies, 0.99) / 1000, 3)
    result.max_ms = round(latencies[-1] / 1000, 3)
    result.client_cpu = round(100 * sum(cpu_s) / wall, 1)
