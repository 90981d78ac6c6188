"""The parts of the local launcher that need no running server."""

from __future__ import annotations

import os
import shutil
import socket
import stat
from pathlib import Path

import pytest

from starlight_py.local import (
    LocalInfraError,
    ServiceEndpoints,
    endpoints_from_env,
    ensure_port_free,
    ensure_pulsar_distribution,
    free_port,
    standalone_conf,
)
from starlight_py.local.__main__ import main
from starlight_py.local.distribution import default_cache_dir, java_major_version
from starlight_py.local.pulsar import override_properties
from starlight_py.local.zookeeper import ZooKeeperServer, zoo_cfg

TEMPLATE = """\
# The port on which the broker listens
brokerServicePort=6650
webServicePort=8080

bindAddress=0.0.0.0
advertisedAddress=
#managedLedgerDefaultEnsembleSize=3
brokerDeleteInactiveTopicsEnabled = true
managedLedgerDefaultEnsembleSize=2
managedLedgerDefaultWriteQuorum=2
clusterName=standalone
"""


def properties(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def test_standalone_conf_rewrites_existing_keys_and_appends_missing_ones():
    conf = standalone_conf(TEMPLATE, broker_port=16650, web_port=18080)

    assert properties(conf) == {
        "brokerServicePort": "16650",
        "webServicePort": "18080",
        "bindAddress": "127.0.0.1",
        "advertisedAddress": "127.0.0.1",
        "brokerDeleteInactiveTopicsEnabled": "false",
        "managedLedgerDefaultEnsembleSize": "1",
        "managedLedgerDefaultWriteQuorum": "1",
        "clusterName": "standalone",
        "managedLedgerDefaultAckQuorum": "1",
        "isDelayedDeliveryDeliverAtTimeStrict": "true",
        "delayedDeliveryTickTimeMillis": "100",
        "delayedDeliveryTrackerFactoryClassName": (
            "org.apache.pulsar.broker.delayed.BucketDelayedDeliveryTrackerFactory"
        ),
        "managedLedgerMinLedgerRolloverTimeMinutes": "0",
        "acknowledgmentAtBatchIndexLevelEnabled": "true",
        # Competing consumers get a burst in turns.
        "dispatcherMaxRoundRobinBatchSize": "1",
        "managedLedgerMaxUnackedRangesToPersistInMetadataStore": "-1",
        # Stream offsets: the message index on every entry, handed to clients too.
        "brokerEntryMetadataInterceptors": (
            "org.apache.pulsar.common.intercept.AppendIndexMetadataInterceptor"
        ),
        "exposingBrokerEntryMetadataToClientEnabled": "true",
        # Many idle topics: the entry cache's eviction 10 times a second.
        "managedLedgerCacheEvictionFrequency": "10",
        "managedLedgerCacheEvictionIntervalMs": "100",
        "statsUpdateFrequencyInSecs": "5",
        "statsUpdateInitialDelayInSecs": "5",
        "managedLedgerNewEntriesCheckDelayInMillis": "0",
        "journalFlushWhenQueueEmpty": "true",
    }
    # Rewritten in place, so the distribution's comments stay next to their keys.
    assert conf.splitlines()[:2] == [
        "# The port on which the broker listens",
        "brokerServicePort=16650",
    ]
    assert conf.endswith("journalFlushWhenQueueEmpty=true\n")


def test_override_properties_leaves_comments_and_other_keys_alone():
    text = "#a=1\na=2\nab=3\n  a : 4\n"

    assert override_properties(text, {"a": "9"}) == "#a=1\na=9\nab=3\na=9\n"


def test_override_properties_of_an_empty_text_appends_everything():
    assert properties(override_properties("", {"x": "1", "y": "2"})) == {"x": "1", "y": "2"}


def test_zoo_cfg_allows_short_sessions_on_loopback(tmp_path):
    cfg = properties(zoo_cfg(tmp_path, 12181))

    assert cfg["clientPort"] == "12181"
    assert cfg["clientPortAddress"] == "127.0.0.1"
    assert cfg["dataDir"] == str(tmp_path)
    assert int(cfg["minSessionTimeout"]) <= 4000
    assert cfg["admin.enableServer"] == "false"


ENDPOINT_VARIABLES = ("STARLIGHT_PULSAR_URL", "STARLIGHT_PULSAR_WEB_URL", "STARLIGHT_ZOOKEEPER")


@pytest.fixture
def clean_env(monkeypatch):
    for name in ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_endpoints_from_env_is_none_when_nothing_is_set(clean_env):
    assert endpoints_from_env() is None


def test_endpoints_from_env_uses_the_three_variables(clean_env):
    clean_env.setenv("STARLIGHT_PULSAR_URL", "pulsar://pulsar.example:6650")
    clean_env.setenv("STARLIGHT_PULSAR_WEB_URL", "http://pulsar.example:8080")
    clean_env.setenv("STARLIGHT_ZOOKEEPER", "zk1:2181,zk2:2181")

    assert endpoints_from_env() == ServiceEndpoints(
        pulsar_service_url="pulsar://pulsar.example:6650",
        pulsar_web_url="http://pulsar.example:8080",
        zookeeper="zk1:2181,zk2:2181",
    )


def test_endpoints_from_env_names_the_missing_variables(clean_env):
    clean_env.setenv("STARLIGHT_PULSAR_URL", "pulsar://pulsar.example:6650")
    clean_env.setenv("STARLIGHT_ZOOKEEPER", "")

    with pytest.raises(LocalInfraError) as raised:
        endpoints_from_env()

    message = str(raised.value)
    assert "STARLIGHT_PULSAR_WEB_URL" in message
    assert "STARLIGHT_ZOOKEEPER" in message
    assert message.startswith("STARLIGHT_PULSAR_URL is set but")


def test_ensure_port_free_accepts_a_free_port():
    ensure_port_free(free_port(), "Pulsar broker")


def test_ensure_port_free_refuses_a_port_someone_listens_on():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        with pytest.raises(LocalInfraError) as raised:
            ensure_port_free(port, "Pulsar broker")

    assert str(raised.value).startswith(
        f"port {port} (Pulsar broker) is already in use on 127.0.0.1; "
    )


def test_a_server_start_refuses_a_taken_port_before_launching_anything(tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        # A fake distribution folder: the port check comes before anything reads it.
        server = ZooKeeperServer(tmp_path / "zk", port, distribution=tmp_path, log=lambda _: None)

        with pytest.raises(LocalInfraError, match=rf"port {port} \(ZooKeeper\) is already in use"):
            server.start()

    assert not server.is_running()


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment', 17),
        ('java version "1.8.0_381"\nJava(TM) SE Runtime Environment', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ('openjdk version "11.0.2-ea"', 11),
        ("something else entirely", None),
    ],
)
def test_java_major_version(output, major):
    assert java_major_version(output) == major


@pytest.fixture
def bare_path(tmp_path, monkeypatch):
    """A PATH holding nothing; tests add the executables they want."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    return bin_dir


def add_real_java(bin_dir: Path) -> None:
    java = shutil.which("java", path=os.defpath + ":/usr/lib/jvm/default-java/bin")
    real = os.environ.get("JAVA_HOME")
    if java is None and real:
        java = str(Path(real) / "bin" / "java")
    if java is None:
        pytest.skip("no java on this machine")
    (bin_dir / "java").symlink_to(os.path.realpath(java))


def add_script(bin_dir: Path, name: str, body: str) -> None:
    script = bin_dir / name
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_missing_java_says_to_install_openjdk_17(bare_path, tmp_path):
    with pytest.raises(LocalInfraError) as raised:
        ensure_pulsar_distribution(cache_dir=tmp_path / "cache", log=lambda _: None)

    message = str(raised.value)
    assert "`java` was not found on PATH" in message
    assert "OpenJDK 17" in message
    assert not (tmp_path / "cache").exists()


def test_old_java_is_refused(bare_path, tmp_path):
    add_script(bare_path, "java", "echo 'java version \"1.8.0_381\"' >&2\n")

    with pytest.raises(LocalInfraError, match=r"is Java 8, but Pulsar needs Java 17 or newer"):
        ensure_pulsar_distribution(cache_dir=tmp_path / "cache", log=lambda _: None)


def test_missing_mvn_is_explained(bare_path, tmp_path):
    add_real_java(bare_path)

    with pytest.raises(LocalInfraError, match=r"`mvn` \(Apache Maven\) was not found on PATH"):
        ensure_pulsar_distribution(cache_dir=tmp_path / "cache", log=lambda _: None)


def test_failing_mvn_shows_its_last_lines_and_mentions_maven_central(bare_path, tmp_path):
    add_real_java(bare_path)
    add_script(
        bare_path,
        "mvn",
        'i=1; while [ $i -le 40 ]; do echo "maven line $i"; i=$((i+1)); done\n'
        'echo "[ERROR] Could not transfer artifact"\nexit 1\n',
    )
    logged: list[str] = []

    with pytest.raises(LocalInfraError) as raised:
        ensure_pulsar_distribution(cache_dir=tmp_path / "cache", log=logged.append)

    message = str(raised.value)
    assert "Maven Central" in message
    assert message.endswith("maven line 40\n[ERROR] Could not transfer artifact")
    assert "maven line 27" in message
    assert "maven line 26\n" not in message
    # The user saw a line saying what is fetched, then Maven's errors as they happened
    # (not its hundreds of other lines: a progress line follows the download instead).
    assert "about 250 MB" in logged[0]
    assert "once" in logged[0]
    assert "maven line 1" not in logged
    assert "[ERROR] Could not transfer artifact" in logged
    # Nothing half-done is left to be mistaken for a cache entry.
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".pulsar-4.0.8.lock"]


def test_a_complete_cache_entry_is_reused_without_maven(bare_path, tmp_path):
    add_real_java(bare_path)
    cached = tmp_path / "cache" / "apache-pulsar-4.0.8"
    cached.mkdir(parents=True)
    (cached / ".starlight-extract-complete").write_text("")

    assert ensure_pulsar_distribution(cache_dir=tmp_path / "cache") == cached


def test_a_half_extracted_cache_entry_is_redone(bare_path, tmp_path):
    add_real_java(bare_path)
    (tmp_path / "cache" / "apache-pulsar-4.0.8" / "lib").mkdir(parents=True)

    # Without mvn on PATH, "redone" shows as the attempt to fetch.
    with pytest.raises(LocalInfraError, match="mvn"):
        ensure_pulsar_distribution(cache_dir=tmp_path / "cache", log=lambda _: None)


def test_default_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("STARLIGHT_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "explicit"

    monkeypatch.delenv("STARLIGHT_CACHE_DIR")
    assert default_cache_dir() == tmp_path / "xdg" / "starlight-py"

    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "starlight-py"


def test_fetch_command_reports_a_clear_error(bare_path, tmp_path, capsys):
    assert main(["fetch", "--cache-dir", str(tmp_path / "cache")]) == 1

    err = capsys.readouterr().err
    assert err.startswith("error: `java` was not found on PATH")
    assert "Traceback" not in err


def test_fetch_command_prints_the_cached_folder(bare_path, tmp_path, capsys):
    add_real_java(bare_path)
    cached = tmp_path / "cache" / "apache-pulsar-4.0.8"
    cached.mkdir(parents=True)
    (cached / ".starlight-extract-complete").write_text("")

    assert main(["fetch", "--cache-dir", str(tmp_path / "cache")]) == 0

    assert capsys.readouterr().out == f"{cached}\n"


def test_fetch_command_without_a_subcommand_is_a_usage_error(capsys):
    assert main([]) == 2
    assert "usage:" in capsys.readouterr().err
