"""bench.floor run for real: three echo servers, one after another, each echoing every
message whole at 200 msg/s, with server CPU and context switches read from /proc. No
Pulsar (no fixture of conftest.py is used) and no timing asserted: the figures only have to
be there. A server that loses or changes bytes is an error, not a figure."""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest

from starlight_py.bench import floor
from starlight_py.bench.floor import main

RATE = 200
DURATION = 1.0
SIZE = 1024
SERVERS = ("python-selectors", "trio-lean", "c-epoll")


def children_left() -> list[str]:
    """This process's children that are still floor servers."""
    left = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        if ppid == os.getpid() and (b"floor_servers" in cmdline or b"echo_epoll" in cmdline):
            left.append(cmdline.decode(errors="replace"))
    return left


def test_each_server_echoes_every_message_and_has_cpu_figures(tmp_path: Path) -> None:
    out = tmp_path / "floor.json"
    argv = ["--servers", ",".join(SERVERS), "--rates", str(RATE)]
    argv += ["--duration", str(DURATION), "--warmup", "0.5", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    rows = {row["server"]: row for row in report["rows"]}
    assert sorted(rows) == sorted(SERVERS)
    has_compiler = bool(shutil.which("cc") or shutil.which("gcc"))
    measured = [s for s in SERVERS if s != "c-epoll" or has_compiler]
    if not has_compiler:
        assert "C compiler" in rows["c-epoll"]["error"]
    for server in measured:
        row = rows[server]
        assert row["error"] is None, (server, row["error"])
        assert row["rate"] == RATE
        assert row["messages"] >= RATE * DURATION / 2, row
        assert row["bytes_echoed"] == row["messages"] * SIZE, row
        assert row["cpu_seconds"] >= 0, row
        assert row["us_per_message"] is not None and row["us_per_message"] >= 0, row
        assert row["context_switches"] >= 0, row
    floors = {f["server"]: f for f in report["floor"]["servers"]}
    assert sorted(floors) == sorted(measured)
    for implied in floors.values():
        assert implied["floor_us"] == round(3 * implied["us_per_message"], 1)
    assert children_left() == []


def serve_once(listener: socket.socket, reply: Callable[[bytes], bytes]) -> None:
    conn, _ = listener.accept()
    with conn:
        while data := conn.recv(65536):
            conn.sendall(reply(data))


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (lambda data: data[:-1], "within"),  # a byte lost: the echo never completes
        (lambda data: data[::-1], "not those sent"),
    ],
)
def test_an_echo_short_or_wrong_is_an_error(
    reply: Callable[[bytes], bytes], error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(floor, "ECHO_TIMEOUT", 0.5)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        server = threading.Thread(target=serve_once, args=(listener, reply), daemon=True)
        server.start()
        client = floor.PacedClient(listener.getsockname()[1], SIZE, RATE)
        with closing(client), pytest.raises(floor.EchoError, match=error):
            client.run_until(time.monotonic() + 1)
        server.join(5)
