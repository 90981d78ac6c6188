"""The local launcher against real JVMs: Pulsar standalone and ZooKeeper."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from starlight_py.local import LocalInfraError, PulsarStandalone, ZooKeeperServer

pytestmark = pytest.mark.integration


def processes_mentioning(path: Path) -> list[int]:
    """Pids whose command line mentions ``path`` (our servers put their data dir there)."""
    needle = str(path).encode()
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if needle in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:  # the process exited while we looked
            continue
    return pids


@pytest.fixture(scope="module")
def pulsar_server(tmp_path_factory) -> Iterator[PulsarStandalone]:
    server = PulsarStandalone(tmp_path_factory.mktemp("pulsar"))
    server.start()
    yield server
    server.stop()


def pulsar_client(server: PulsarStandalone) -> pulsar.Client:
    return pulsar.Client(
        server.service_url,
        operation_timeout_seconds=30,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
    )


def test_pulsar_round_trips_a_message(pulsar_server):
    client = pulsar_client(pulsar_server)
    try:
        topic = "persistent://public/default/local-infra-round-trip"
        consumer = client.subscribe(topic, "round-trip")
        client.create_producer(topic).send(b"hello pulsar")

        message = consumer.receive(timeout_millis=15_000)

        assert message.data() == b"hello pulsar"
        consumer.acknowledge(message)
    finally:
        client.close()


def test_pulsar_keeps_unacknowledged_messages_across_a_restart(pulsar_server):
    topic = "persistent://public/default/local-infra-restart"
    client = pulsar_client(pulsar_server)
    try:
        client.subscribe(topic, "survivor").close()
        client.create_producer(topic).send(b"still here")
    finally:
        client.close()
    service_url = pulsar_server.service_url

    pulsar_server.stop()
    pulsar_server.start()

    assert pulsar_server.service_url == service_url
    client = pulsar_client(pulsar_server)
    try:
        consumer = client.subscribe(topic, "survivor")
        assert consumer.receive(timeout_millis=15_000).data() == b"still here"
    finally:
        client.close()


def test_pulsar_stop_leaves_no_jvm_behind(pulsar_server):
    assert pulsar_server.is_running()
    assert processes_mentioning(pulsar_server.data_dir) == [pulsar_server.pid]

    pulsar_server.stop()
    pulsar_server.stop()  # idempotent

    assert not pulsar_server.is_running()
    assert pulsar_server.pid is None
    assert processes_mentioning(pulsar_server.data_dir) == []


def kazoo(server: ZooKeeperServer) -> KazooClient:
    client = KazooClient(hosts=server.connect_string, timeout=4.0)
    client.start(timeout=10)
    return client


def test_zookeeper_keeps_znodes_across_a_restart(tmp_path):
    with ZooKeeperServer(tmp_path / "zk") as server:
        client = kazoo(server)
        try:
            client.create("/starlight/survivor", b"kept", makepath=True)
        finally:
            client.stop()
            client.close()
        first_pid = server.pid

        server.restart()

        assert server.pid != first_pid
        client = kazoo(server)
        try:
            data, _ = client.get("/starlight/survivor")
            assert data == b"kept"
        finally:
            client.stop()
            client.close()

    assert not server.is_running()
    assert processes_mentioning(server.data_dir) == []


def test_zookeeper_outage_is_visible_and_over_after_start(tmp_path):
    server = ZooKeeperServer(tmp_path / "zk")
    server.start()
    server.stop()
    server.stop()  # idempotent

    client = KazooClient(hosts=server.connect_string, timeout=4.0)
    with pytest.raises(KazooTimeoutError):
        client.start(timeout=1)
    client.stop()
    client.close()

    server.start()
    try:
        client = kazoo(server)
        assert client.connected
        client.stop()
        client.close()
    finally:
        server.stop()
    assert processes_mentioning(server.data_dir) == []


def test_a_server_that_is_not_ready_in_time_is_killed(tmp_path):
    server = ZooKeeperServer(tmp_path / "zk", log=lambda _: None)

    with pytest.raises(LocalInfraError, match=r"ZooKeeper was not ready after 0.01 s"):
        server.start(timeout=0.01)

    assert not server.is_running()
    assert processes_mentioning(server.data_dir) == []


def test_a_server_that_exits_early_is_reported_with_its_log(tmp_path):
    # A distribution without jars: the JVM starts, finds no main class and exits.
    empty_distribution = tmp_path / "empty-distribution"
    (empty_distribution / "lib").mkdir(parents=True)
    (empty_distribution / "conf").mkdir()
    server = ZooKeeperServer(tmp_path / "zk", distribution=empty_distribution, log=lambda _: None)

    with pytest.raises(LocalInfraError) as raised:
        server.start()

    message = str(raised.value)
    assert message.startswith("ZooKeeper exited with code 1 before it was ready.")
    assert f"Last lines of {server.log_path}:" in message
    assert "org.apache.zookeeper.server.ZooKeeperServerMain" in message
    assert not server.is_running()


def test_servers_left_running_are_stopped_when_python_exits(tmp_path):
    data_dir = tmp_path / "zk"
    # A separate interpreter that starts ZooKeeper and exits without stopping it.
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from starlight_py.local import ZooKeeperServer\n"
        f"server = ZooKeeperServer(Path({str(data_dir)!r}), log=lambda _: None)\n"
        "server.start()\n"
        "print(server.pid, flush=True)\n"
        "sys.exit(0)\n"
    )
    finished = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )

    pid = int(finished.stdout.strip())
    assert not Path(f"/proc/{pid}").exists()
    assert processes_mentioning(data_dir) == []
