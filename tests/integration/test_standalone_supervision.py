"""`starlight-proxy standalone` survives its parts: a ZooKeeper or Pulsar killed with
SIGKILL is started again and nothing confirmed is lost; one that cannot start again ends
the standalone with a message naming it; a SIGKILL of the standalone takes both JVMs with
it (starlight_py/local/supervision.py, process.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from starlight_py.local import free_port
from tests.support.processes import (
    alive,
    children_of,
    living_processes_mentioning,
    process_group,
    still_alive,
)

pytestmark = pytest.mark.integration

QUEUE = "survivor"
ZOOKEEPER_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
PULSAR_MAIN = "org.apache.pulsar.PulsarStandaloneStarter"


class Standalone:
    """`starlight-proxy standalone` as a user runs it, its output read as it comes."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.amqp_port = free_port()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "starlight_py",
                "standalone",
                "--amqp-port",
                str(self.amqp_port),
                "--data-dir",
                str(data_dir),
                "--pulsar-port",
                str(free_port()),
                "--pulsar-web-port",
                str(free_port()),
                "--zookeeper-port",
                str(free_port()),
                "--management-port",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        # A reader of its own: an unread pipe would block the standalone once full.
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()

    def wait_for(self, needle: str, timeout: float = 240, after: int = 0) -> int:
        """Index of the first line from ``after`` on that contains ``needle``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for index in range(after, len(self.lines)):
                    if needle in self.lines[index]:
                        return index
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.process.poll() is not None and not remaining):
                    raise AssertionError(
                        f"{needle!r} not printed; output:\n{''.join(self.lines[-60:])}"
                    )
                self._changed.wait(min(remaining, 1.0))

    def server_pid(self, main_class: str) -> int:
        """Pid of the JVM running ``main_class``, a child of the standalone."""
        found = [
            pid
            for pid in children_of(self.process.pid)
            if main_class.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        assert len(found) == 1, (main_class, found)
        return found[0]

    def connect(self) -> pika.BlockingConnection:
        parameters = pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F")
        parameters.connection_attempts = 1
        parameters.socket_timeout = 10
        parameters.blocked_connection_timeout = 30
        return pika.BlockingConnection(parameters)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Standalone]:
    running = Standalone(tmp_path / "standalone-data")
    try:
        running.wait_for("is ready")
        yield running
    finally:
        running.kill()


def retried(action: Callable[[], None], timeout: float = 120) -> None:
    """Run ``action`` until it goes through: after a restart the proxy is back once its
    ZooKeeper session or Pulsar client has reconnected, which takes some seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            action()
            return
        except (pika.exceptions.AMQPError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def publish_confirmed(standalone: Standalone, bodies: list[bytes], confirmed: list[bytes]):
    """Publish ``bodies`` with confirms; those confirmed go to ``confirmed``."""

    def publish_rest() -> None:
        with contextlib.closing(standalone.connect()) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare(QUEUE, durable=True)
            for body in bodies:
                if body not in confirmed:
                    # Returns once the proxy confirmed it; raises on a nack or a lost link,
                    # and an unconfirmed message is simply published again.
                    channel.basic_publish(
                        "", QUEUE, body, pika.BasicProperties(delivery_mode=2), mandatory=True
                    )
                    confirmed.append(body)

    retried(publish_rest)


def read_everything(standalone: Standalone, expected: int) -> list[bytes]:
    received: list[bytes] = []

    def read_rest() -> None:
        with contextlib.closing(standalone.connect()) as connection:
            channel = connection.channel()
            deadline = time.monotonic() + 60
            while len(received) < expected and time.monotonic() < deadline:
                method, _, body = channel.basic_get(QUEUE, auto_ack=True)
                if method is None:
                    time.sleep(0.05)
                else:
                    received.append(body)

    retried(read_rest)
    return received


def test_killed_servers_are_started_again_and_a_killed_standalone_takes_them_along(
    standalone: Standalone,
) -> None:
    zookeeper = standalone.server_pid(ZOOKEEPER_MAIN)
    pulsar = standalone.server_pid(PULSAR_MAIN)
    # Nothing in their process groups but themselves: no grandchild the parent-death
    # signal would miss.
    assert process_group(zookeeper) == [zookeeper]
    assert process_group(pulsar) == [pulsar]
    confirmed: list[bytes] = []
    publish_confirmed(standalone, [f"before-{n}".encode() for n in range(50)], confirmed)

    os.kill(zookeeper, signal.SIGKILL)
    died = standalone.wait_for("ZooKeeper was killed by SIGKILL", timeout=60)
    standalone.wait_for("ZooKeeper is back", timeout=120, after=died)
    publish_confirmed(standalone, [f"zookeeper-{n}".encode() for n in range(50)], confirmed)

    os.kill(pulsar, signal.SIGKILL)
    died = standalone.wait_for("Pulsar was killed by SIGKILL", timeout=60)
    standalone.wait_for("Pulsar is back", timeout=240, after=died)
    publish_confirmed(standalone, [f"pulsar-{n}".encode() for n in range(50)], confirmed)

    received = read_everything(standalone, len(confirmed))
    assert sorted(set(confirmed) - set(received)) == []
    assert len(confirmed) == 150
    assert not alive(zookeeper) and not alive(pulsar)
    new_zookeeper = standalone.server_pid(ZOOKEEPER_MAIN)
    new_pulsar = standalone.server_pid(PULSAR_MAIN)
    assert standalone.process.poll() is None

    standalone.process.send_signal(signal.SIGKILL)
    standalone.process.wait()

    assert still_alive([new_zookeeper, new_pulsar]) == []
    assert living_processes_mentioning(str(standalone.data_dir)) == []


def test_a_server_that_cannot_start_again_ends_the_standalone_with_its_story(
    standalone: Standalone,
) -> None:
    zookeeper = standalone.server_pid(ZOOKEEPER_MAIN)
    pulsar = standalone.server_pid(PULSAR_MAIN)
    # Its data folder turned into a file: the running server keeps what it has open, but
    # a new one cannot start on it.
    data = standalone.data_dir / "zookeeper" / "data"
    shutil.move(data, data.with_name("data.moved"))
    data.write_text("not a folder\n")

    os.kill(zookeeper, signal.SIGKILL)

    assert standalone.process.wait(timeout=300) == 1
    output = "".join(standalone.lines)
    assert "starlight-proxy standalone: ZooKeeper was killed by SIGKILL, and 3 restarts" in output
    assert "ZooKeeper exited with code" in output  # each attempt's own failure
    assert f"Last lines of {standalone.data_dir / 'zookeeper' / 'zookeeper.log'}" in output
    assert still_alive([pulsar]) == []
    assert living_processes_mentioning(str(standalone.data_dir)) == []
