"""The local cluster the fault tests stand on: three proxy processes behind HAProxy, with
their own ZooKeeper and Pulsar (`local_cluster` in conftest.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingConnection

from starlight_py.local.cluster import LocalCluster
from starlight_py.local.haproxy import find_haproxy, haproxy_config
from starlight_py.local.ports import free_port
from tests.support.amqp_fixtures import get_one, unique
from tests.support.processes import children_of, living_processes_mentioning, still_alive

pytestmark = pytest.mark.integration

ESTABLISHED = "01"


def connect(url: str) -> BlockingConnection:
    parameters = pika.URLParameters(url)
    parameters.connection_attempts = 1
    parameters.socket_timeout = 5
    parameters.blocked_connection_timeout = 10
    return pika.BlockingConnection(parameters)


@contextlib.contextmanager
def connections(url: str, count: int) -> Iterator[list[BlockingConnection]]:
    """`count` connections opened one after the other (round robin spreads them)."""
    opened: list[BlockingConnection] = []
    try:
        for _ in range(count):
            opened.append(connect(url))
        yield opened
    finally:
        for connection in opened:
            if connection.is_open:
                with contextlib.suppress(pika.exceptions.AMQPError):
                    connection.close()


def sessions_per_proxy(cluster: LocalCluster) -> dict[str, int]:
    """HAProxy's count of client connections each proxy serves right now."""
    return {server.name: server.current_sessions for server in cluster.haproxy.servers()}


def wait_until_idle(cluster: LocalCluster, timeout: float = 10.0) -> None:
    """Until HAProxy counts no client connection (an earlier test's may close late)."""
    deadline = time.monotonic() + timeout
    while sum((sessions := sessions_per_proxy(cluster)).values()) > 0:
        assert time.monotonic() < deadline, f"connections left open: {sessions}"
        time.sleep(0.05)


def accepted_connections(pid: int | None, port: int) -> int:
    """TCP connections process `pid` holds, established on its listening `port` (read from
    /proc: the proxy's own view, independent of HAProxy's)."""
    assert pid is not None, "the proxy is not running"
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    count = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == ESTABLISHED and fields[9] in inodes:
                count += 1
    return count


def declare_and_delete(connection: BlockingConnection) -> None:
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_delete(queue)
    channel.close()


def test_generated_haproxy_config_is_valid_for_haproxy(tmp_path):
    config = tmp_path / "haproxy.cfg"
    config.write_text(haproxy_config(free_port(), [free_port(), free_port()], tmp_path / "s"))

    result = subprocess.run(
        [find_haproxy(), "-c", "-f", str(config)], capture_output=True, text=True, check=False
    )

    assert result.returncode == 0, result.stdout + result.stderr


def test_every_proxy_is_a_separate_process_serving_its_own_port(healthy_cluster):
    pids = healthy_cluster.proxy_pids

    assert len(set(pids)) == 3
    assert os.getpid() not in pids
    for index in range(3):
        with contextlib.closing(connect(healthy_cluster.proxy_url(index))) as connection:
            declare_and_delete(connection)


def test_connections_through_haproxy_land_on_different_proxies(healthy_cluster):
    wait_until_idle(healthy_cluster)
    with connections(healthy_cluster.amqp_url, 6) as opened:
        for connection in opened:
            declare_and_delete(connection)
        sessions = sessions_per_proxy(healthy_cluster)
        held = [accepted_connections(proxy.pid, proxy.port) for proxy in healthy_cluster.proxies]

    assert sum(sessions.values()) == 6
    assert sum(1 for count in sessions.values() if count > 0) > 1, sessions
    # The proxies agree: each holds at least the connections HAProxy gave it (a health
    # check caught in flight can only add one).
    for index, count in enumerate(held):
        assert count >= sessions[healthy_cluster.haproxy_server_name(index)], (held, sessions)


def test_a_message_published_through_haproxy_is_consumed_through_haproxy(healthy_cluster):
    queue = unique("q", "local-cluster")
    with connections(healthy_cluster.amqp_url, 2) as (publisher, consumer):
        publishing = publisher.channel()
        publishing.confirm_delivery()
        publishing.queue_declare(queue, durable=True)
        publishing.basic_publish("", queue, b"through haproxy", mandatory=True)

        consuming = consumer.channel()
        _, _, body = get_one(consuming, queue, timeout=15, auto_ack=True)
        consuming.queue_delete(queue)

    assert body == b"through haproxy"


def test_a_killed_proxy_is_taken_out_and_start_proxy_brings_it_back(healthy_cluster):
    cluster = healthy_cluster
    old_pid = cluster.proxy_pids[0]
    wait_until_idle(cluster)
    # Round robin over three healthy proxies: three connections in a row, one on each.
    with connections(cluster.amqp_url, 3) as before:
        assert sorted(sessions_per_proxy(cluster).values()) == [1, 1, 1]

        cluster.kill_proxy(0)

        assert cluster.proxy_pids[0] is None
        # New connections work at once: a refused connect is redispatched to a live proxy.
        with connections(cluster.amqp_url, 4) as during:
            for connection in during:
                declare_and_delete(connection)
        cluster.haproxy.wait_until_server(cluster.haproxy_server_name(0), up=False, timeout=10)
        with connections(cluster.amqp_url, 4) as after_down:
            for connection in after_down:
                declare_and_delete(connection)
            assert sessions_per_proxy(cluster)[cluster.haproxy_server_name(0)] == 0
        # The client of the killed proxy lost its connection; the others kept theirs.
        lost = 0
        for connection in before:
            try:
                connection.process_data_events(time_limit=0.2)
                declare_and_delete(connection)
            except pika.exceptions.AMQPConnectionError:
                lost += 1
        assert lost == 1

    started = time.monotonic()
    cluster.start_proxy(0)

    assert time.monotonic() - started < 30
    assert cluster.proxy_pids[0] not in (None, old_pid)
    with connections(cluster.amqp_url, 6) as opened:
        for connection in opened:
            declare_and_delete(connection)
        assert sessions_per_proxy(cluster)[cluster.haproxy_server_name(0)] > 0


def test_a_hung_proxy_is_taken_out_until_it_answers_again(healthy_cluster):
    cluster = healthy_cluster
    name = cluster.haproxy_server_name(1)

    cluster.pause_proxy(1)
    try:
        # It still accepts TCP connections (the kernel does), so only the health check's
        # timeout can tell.
        cluster.haproxy.wait_until_server(name, up=False, timeout=15)
        with connections(cluster.amqp_url, 4) as opened:
            for connection in opened:
                declare_and_delete(connection)
            assert sessions_per_proxy(cluster)[name] == 0
    finally:
        cluster.resume_proxy(1)

    cluster.haproxy.wait_until_server(name, up=True, timeout=15)


def test_the_operator_script_leaves_nothing_running_when_killed_while_it_stops(tmp_path):
    """SIGTERM starts the orderly stop; a process manager that loses patience sends SIGKILL
    before it is over. Whatever had not been stopped yet goes with the script."""
    root = Path(__file__).resolve().parents[2]
    data = tmp_path / "cluster"
    script = subprocess.Popen(
        [
            sys.executable,
            str(root / "deploy/local/cluster.py"),
            "up",
            "--proxies",
            "1",
            "--port",
            "0",
            "--dir",
            str(data),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    try:
        assert script.stdout is not None
        for line in script.stdout:
            output.append(line)
            if "Ctrl-C stops everything" in line:
                break
        else:
            raise AssertionError("".join(output))
        # ZooKeeper, Pulsar, the proxy and HAProxy.
        parts = children_of(script.pid)
        assert len(parts) == 4, (parts, output)

        script.send_signal(signal.SIGTERM)
        for line in script.stdout:
            output.append(line)
            if "stopping" in line:
                break
        script.send_signal(signal.SIGKILL)
        script.wait()

        assert still_alive(parts) == [], output
        assert living_processes_mentioning(str(data)) == []
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
