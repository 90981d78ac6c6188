"""The per-wake-up CPU floor of event loops at a low rate: ``python -m starlight_py.bench.floor``.

At a few hundred msg/s each message reaches the proxy alone, so its cost is mostly waking
up: a thread asleep in epoll is woken, reads, and writes something that wakes a peer. The
proxy's path needs three such wake-ups per message (the publish read, the Pulsar receipt,
the delivery) and three such writes (to Pulsar, the confirm, the delivery). This measures
what one costs in a C epoll loop, a Python ``selectors`` loop, trio's stream API (the
proxy's TLS path) and trio's ``wait_readable`` plus a plain read and write of the fd (its
plain-TCP path), so the floor under the proxy's CPU per message is a reproducible figure
rather than a hand experiment.

Each echo server (``floor_servers``) runs alone, as a process of its own on 127.0.0.1. A
client here sends one ``--size`` byte message per slot of each of ``--rates`` msg/s and
checks that every echo comes back whole; after ``--warmup`` s, the server's CPU (utime +
stime) and context switches are read from /proc at both ends of a ``--duration`` s window
and divided by the messages echoed in it. Then each server's floor for the proxy: three
times its CPU per message at the lowest rate, next to the target of 150 µs at 300 msg/s::

    python -m starlight_py.bench.floor --rates 300,3000 --duration 10 --json floor.json

CPU is counted in 10 ms clock ticks, so a fast server's row needs a long enough
``--duration``; other load on the host shows in the figures too.
"""

from __future__ import annotations

import argparse
import json
import math
import socket
import sys
import tempfile
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from starlight_py.bench.floor_report import (
    EchoRow,
    ServerReading,
    figures,
    floor_rows,
    format_floor,
    format_table,
    measured_row,
)
from starlight_py.bench.floor_servers import (
    C_EPOLL,
    SERVERS,
    ServerUnavailable,
    build_c_server,
    server_argv,
)
from starlight_py.bench.infra import (
    LOOPBACK,
    BenchError,
    GroupProcess,
    group_cpu_seconds,
    group_members,
    say,
    wait_tcp,
)
from starlight_py.local import free_port

START_TIMEOUT = 15.0  # seconds for a server to listen
ECHO_TIMEOUT = 5.0  # an echo not whole after this is lost
STOP_GRACE = 5.0  # SIGTERM, then SIGKILL after this


@dataclass(frozen=True)
class Options:
    servers: tuple[str, ...]
    rates: tuple[float, ...]
    size: int
    warmup: float
    duration: float
    json_path: Path | None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m starlight_py.bench.floor",
        description="Server CPU per message of echo servers at a low message rate.",
    )
    parser.add_argument(
        "--servers",
        default=",".join(SERVERS),
        help=f"comma-separated subset of {','.join(SERVERS)} (default: all)",
    )
    parser.add_argument("--rates", default="300", help="comma-separated msg/s (default 300)")
    parser.add_argument("--size", type=int, default=1024, help="bytes per message")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds not measured")
    # 20 s: a C server at 300 msg/s spends about 15 clock ticks of CPU in it.
    parser.add_argument("--duration", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE")
    return parser


def parse_options(argv: list[str] | None) -> Options | str:
    """The command line as Options, or what is wrong with it. argparse itself exits (2)
    on an unknown option or a value that is not a number."""
    args = build_parser().parse_args(argv)
    servers = tuple(dict.fromkeys(s.strip() for s in args.servers.split(",") if s.strip()))
    unknown = [s for s in servers if s not in SERVERS]
    if not servers or unknown:
        return f"--servers takes a subset of {','.join(SERVERS)}, not {args.servers!r}"
    try:
        rates = tuple(float(r) for r in args.rates.split(","))
    except ValueError:
        return f"--rates takes comma-separated msg/s, not {args.rates!r}"
    if not all(math.isfinite(r) and r > 0 for r in rates):
        return f"--rates must all be above 0 msg/s, not {args.rates!r}"
    if args.size < 1:
        return "--size needs at least 1 byte"
    if not (math.isfinite(args.warmup) and args.warmup >= 0):
        return "--warmup needs 0 or more seconds"
    if not (math.isfinite(args.duration) and args.duration > 0):
        return "--duration needs more than 0 seconds"
    return Options(servers, rates, args.size, args.warmup, args.duration, args.json)


# --- reading the server ------------------------------------------------------------------


def context_switches(pgid: int) -> int:
    """Voluntary + nonvoluntary context switches of every thread in the process group."""
    total = 0
    for pid in group_members(pgid):
        task_dir = Path(f"/proc/{pid}/task")
        try:
            tids = [p.name for p in task_dir.iterdir()]
        except OSError:
            continue  # ended meanwhile
        for tid in tids:
            try:
                lines = (task_dir / tid / "status").read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                    total += int(line.split()[1])
    return total


def read_server(pgid: int) -> ServerReading:
    """The server's CPU and context switches now (it runs in a session of its own)."""
    return ServerReading(time.monotonic(), group_cpu_seconds(pgid), context_switches(pgid))


# --- the client ----------------------------------------------------------------------------


class EchoError(Exception):
    """An echo came back short, different, or not at all."""


class PacedClient:
    """One connection; one message per slot of ``rate`` msg/s, each echo awaited whole."""

    def __init__(self, port: int, size: int, rate: float) -> None:
        self.sock = socket.create_connection((LOOPBACK, port), timeout=ECHO_TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.size = size
        self.interval = 1.0 / rate
        self.next_slot = time.monotonic()
        self.sent = 0
        # Each message is a different slice of this, so an echo of an earlier message, or
        # one with bytes lost in the middle, does not match.
        self._pattern = bytes(i % 251 for i in range(size + 251))

    def close(self) -> None:
        self.sock.close()

    def run_until(self, deadline: float) -> tuple[int, int]:
        """Echo a message per slot until ``deadline`` (time.monotonic()); returns the
        messages and bytes echoed. Raises EchoError or OSError."""
        messages = echoed = 0
        # Slots keep their schedule (next += interval), so a late echo does not lower the
        # rate; a client that cannot keep up still stops at the deadline.
        while self.next_slot < deadline and time.monotonic() < deadline:
            delay = self.next_slot - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            echoed += self._echo_one()
            messages += 1
            self.next_slot += self.interval
        return messages, echoed

    def _echo_one(self) -> int:
        start = self.sent % 251
        payload = self._pattern[start : start + self.size]
        self.sock.sendall(payload)
        self.sent += 1
        received = bytearray()
        while len(received) < self.size:
            try:
                chunk = self.sock.recv(self.size - len(received))
            except TimeoutError:
                raise EchoError(
                    f"echo {self.sent}: {len(received)} of {self.size} bytes came back "
                    f"within {ECHO_TIMEOUT:g} s"
                ) from None
            if not chunk:
                raise EchoError(
                    f"echo {self.sent}: the server closed the connection after "
                    f"{len(received)} of {self.size} bytes"
                )
            received += chunk
        if received != payload:
            raise EchoError(f"echo {self.sent}: the bytes that came back are not those sent")
        return len(received)


# --- the run -------------------------------------------------------------------------------


def measure(
    kind: str, rate: float, options: Options, work_dir: Path, c_binary: Path | None
) -> EchoRow:
    """Start ``kind``, warm it up, measure one window, stop it (whatever happens)."""
    port = free_port()
    log = work_dir / f"{kind}-{rate:g}.log"
    server = GroupProcess(kind, server_argv(kind, port, c_binary), log)
    say(f"{kind} at {rate:g} msg/s on {LOOPBACK}:{port}")
    try:
        server.start()
        if not wait_tcp(port, START_TIMEOUT, server.alive):
            raise BenchError(f"did not listen within {START_TIMEOUT:g} s: {server.log_tail(3)}")
        with closing(PacedClient(port, options.size, rate)) as client:
            client.run_until(time.monotonic() + options.warmup)
            before = read_server(server.pid)
            messages, echoed = client.run_until(before.at + options.duration)
            after = read_server(server.pid)
        if not server.alive():
            raise BenchError(f"exited in the window: {server.log_tail(3)}")
        return measured_row(kind, rate, messages, echoed, before, after)
    except (BenchError, EchoError, OSError) as e:
        # One line in the table, even with a server's traceback in it.
        return EchoRow(kind, rate, error=" ".join(str(e).split()) or type(e).__name__)
    finally:
        server.stop(STOP_GRACE)


def run(options: Options) -> list[EchoRow]:
    """Every (server, rate) row, one server process at a time."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="starlight-floor-") as tmp:
        work_dir = Path(tmp)
        c_binary: Path | None = None
        c_problem: str | None = None
        if C_EPOLL in options.servers:
            try:
                c_binary = build_c_server(work_dir)
            except ServerUnavailable as e:
                c_problem = str(e)
        for kind in options.servers:
            for rate in options.rates:
                if kind == C_EPOLL and c_problem is not None:
                    rows.append(EchoRow(kind, rate, error=c_problem))
                else:
                    rows.append(measure(kind, rate, options, work_dir, c_binary))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code: 0 when at least one row was measured (failed
    rows are in the table), 1 when none was, 2 for bad arguments, 130 on Ctrl-C."""
    options = parse_options(argv)
    if isinstance(options, str):
        print(options, file=sys.stderr)
        return 2
    try:
        rows = run(options)
    except KeyboardInterrupt:
        say("interrupted: the server under test has been stopped")
        return 130
    print(format_table(rows, options.size, options.warmup, options.duration))
    print()
    print(format_floor(floor_rows(rows)))
    if options.json_path is not None:
        report = figures(rows, options.size, options.warmup, options.duration)
        options.json_path.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if any(row.error is None for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
