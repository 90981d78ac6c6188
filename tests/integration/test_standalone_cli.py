"""`starlight-proxy standalone` as a user runs it: a subprocess, stopped by a signal."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pika
import pika.exceptions
import pytest

from starlight_py.local import free_port
from tests.support.allocator_checks import preloads, runs_on_jemalloc


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\x00", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def wait_for_line(
    process: subprocess.Popen[str], needle: str, timeout: float, seen: list[str] | None = None
) -> str:
    """The first line with `needle`; every line read goes to `seen`."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    seen = [] if seen is None else seen
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            if process.poll() is not None:
                break
            continue
        seen.append(line)
        if needle in line:
            return line
    raise AssertionError(f"{needle!r} not printed; output:\n{''.join(seen[-40:])}")


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_standalone_serves_clients_and_stops_everything(
    tmp_path: Path, stop_signal: signal.Signals
) -> None:
    data_dir = tmp_path / "standalone-data"
    amqp_port = free_port()
    management_port = free_port()
    command = [
        sys.executable,
        "-m",
        "starlight_py",
        "standalone",
        "--amqp-port",
        str(amqp_port),
        "--data-dir",
        str(data_dir),
        "--pulsar-port",
        str(free_port()),
        "--pulsar-web-port",
        str(free_port()),
        "--zookeeper-port",
        str(free_port()),
        "--management-port",
        str(management_port),
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        output: list[str] = []
        banner = wait_for_line(process, "is ready", timeout=240, seen=output)
        assert f"amqp://127.0.0.1:{amqp_port}" in banner
        assert len(processes_mentioning(str(data_dir))) >= 2  # ZooKeeper and Pulsar JVMs
        # The proxy runs on jemalloc (starlight_py/allocator.py); the JVMs it started do
        # not inherit the preload.
        assert runs_on_jemalloc(process.pid)
        for pid in set(processes_mentioning(str(data_dir))) - {process.pid}:
            assert "jemalloc" not in preloads(pid) and not runs_on_jemalloc(pid)
        assert any("memory allocator: jemalloc" in line for line in output), output
        # Each step is said once (not by the proxy's log and the servers' own lines both).
        assert sum("starting ZooKeeper" in line for line in output) == 1, output
        assert sum("starting Pulsar standalone" in line for line in output) == 1, output

        connection = pika.BlockingConnection(
            pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{amqp_port}/%2F")
        )
        assert connection.channel().is_open
        connection.close()
        # Like a fresh RabbitMQ: guest/guest was created, other credentials are refused.
        assert any("created user 'guest'" in line for line in output), output
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(
                pika.URLParameters(f"amqp://guest:wrong@127.0.0.1:{amqp_port}/%2F")
            )
        # A vhost nobody created is refused, as RabbitMQ does, and not made on the fly (a
        # typo must not turn into a namespace); the error says how to make one.
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
            pika.BlockingConnection(
                pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{amqp_port}/ordres")
            )
        assert "530" in str(refused.value) and "starlight-admin vhost create" in str(refused.value)

        # The management API is on by default in standalone (RabbitMQ's port 15672 unless
        # told otherwise).
        request = urllib.request.Request(f"http://127.0.0.1:{management_port}/api/overview")
        request.add_header("authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert json.loads(answer.read())["product_name"] == "starlight-py"

        process.send_signal(stop_signal)
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert processes_mentioning(str(data_dir)) == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", amqp_port), timeout=5)


def test_standalone_with_a_busy_port_fails_fast_with_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "starlight_py",
                "standalone",
                "--amqp-port",
                str(port),
                "--data-dir",
                str(tmp_path / "d"),
                "--management-port",
                str(free_port()),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert result.returncode == 1
    assert f"port {port}" in result.stderr and "in use" in result.stderr
    assert processes_mentioning(str(tmp_path / "d")) == []
