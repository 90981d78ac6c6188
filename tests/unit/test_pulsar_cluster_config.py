"""The parts of the local Pulsar cluster that need no running server: its configuration
files, and the admin client's list of brokers' URLs."""

from __future__ import annotations

from pathlib import Path

import pytest

from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdmin, split_web_urls
from starlight_py.local.cluster import LocalCluster
from starlight_py.local.ports import free_port
from starlight_py.local.pulsar import PulsarStandalone
from starlight_py.local.pulsar_cluster import (
    CLUSTER_NAME,
    PulsarCluster,
    bookie_conf,
    broker_conf,
)
from tests.support.stand_in_http import JsonHandler, serving


def settings(text: str) -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")
    )


def test_broker_conf_points_at_zookeeper_with_quorums_for_three_bookies() -> None:
    conf = settings(
        broker_conf(
            "brokerServicePort=6650\nmanagedLedgerDefaultEnsembleSize=2\n",
            broker_port=1234,
            web_port=5678,
            zookeeper="127.0.0.1:2181",
            bookies=3,
            extra_properties={"metadataStoreSessionTimeoutMillis": "10000"},
        )
    )
    assert conf["brokerServicePort"] == "1234"
    assert conf["webServicePort"] == "5678"
    assert conf["metadataStoreUrl"] == "zk:127.0.0.1:2181"
    assert conf["configurationMetadataStoreUrl"] == "zk:127.0.0.1:2181"
    assert conf["clusterName"] == CLUSTER_NAME
    assert (
        conf["managedLedgerDefaultEnsembleSize"],
        conf["managedLedgerDefaultWriteQuorum"],
        conf["managedLedgerDefaultAckQuorum"],
    ) == ("3", "2", "2")
    # What the proxy relies on, as the standalone sets it.
    assert conf["acknowledgmentAtBatchIndexLevelEnabled"] == "true"
    assert conf["managedLedgerMaxUnackedRangesToPersistInMetadataStore"] == "-1"
    assert conf["brokerDeleteInactiveTopicsEnabled"] == "false"
    assert conf["metadataStoreSessionTimeoutMillis"] == "10000"
    # Latency at low rates, as the standalone sets it.
    assert conf["managedLedgerNewEntriesCheckDelayInMillis"] == "0"


def test_broker_conf_with_one_bookie_writes_to_it_alone() -> None:
    conf = settings(broker_conf("", broker_port=1, web_port=2, zookeeper="z:1", bookies=1))
    assert conf["managedLedgerDefaultEnsembleSize"] == "1"
    assert conf["managedLedgerDefaultAckQuorum"] == "1"


def test_bookie_conf_keeps_its_data_and_ports_to_itself(tmp_path: Path) -> None:
    conf = settings(
        bookie_conf(
            "bookiePort=3181\nprometheusStatsHttpPort=8000\n",
            port=4000,
            data_dir=tmp_path,
            zookeeper="127.0.0.1:2181",
            stats_port=4001,
        )
    )
    assert conf["bookiePort"] == "4000"
    assert conf["prometheusStatsHttpPort"] == "4001"
    assert conf["journalDirectories"] == str(tmp_path / "journal")
    assert conf["ledgerDirectories"] == str(tmp_path / "ledgers")
    assert conf["metadataServiceUri"] == "zk+hierarchical://127.0.0.1:2181/ledgers"
    assert conf["allowLoopback"] == "true"
    assert conf["journalFlushWhenQueueEmpty"] == "true"


def test_a_cluster_gives_clients_every_broker(tmp_path: Path) -> None:
    cluster = PulsarCluster(tmp_path, "127.0.0.1:2181", brokers=2, bookies=3)
    first, second = cluster.brokers
    assert cluster.service_url == (
        f"pulsar://127.0.0.1:{first.broker_port},127.0.0.1:{second.broker_port}"
    )
    assert split_web_urls(cluster.web_url) == [first.web_url, second.web_url]
    assert len(cluster.bookies) == 3
    assert len({b.port for b in cluster.bookies}) == 3


def test_a_cluster_needs_a_broker_and_a_bookie(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        PulsarCluster(tmp_path, "z:1", brokers=0)
    with pytest.raises(ValueError):
        PulsarCluster(tmp_path, "z:1", bookies=0)


def test_the_local_cluster_runs_standalone_unless_asked_for_more(tmp_path: Path) -> None:
    assert isinstance(LocalCluster(tmp_path / "a", proxies=1).pulsar, PulsarStandalone)
    many = LocalCluster(tmp_path / "b", proxies=1, brokers=2, bookies=3)
    assert isinstance(many.pulsar, PulsarCluster)
    assert many.pulsar.service_url in many.proxies[0].settings["brokerServiceURL"]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://a:8080", ["http://a:8080"]),
        ("http://a:8080/", ["http://a:8080"]),
        ("http://a:8080,b:8081", ["http://a:8080", "http://b:8081"]),
        ("https://a:1, https://b:2", ["https://a:1", "https://b:2"]),
        ("https://a:1,b:2", ["https://a:1", "https://b:2"]),
    ],
)
def test_admin_urls_split_like_pulsars_own_tools(given: str, expected: list[str]) -> None:
    assert split_web_urls(given) == expected


def test_the_admin_client_moves_on_from_a_broker_that_does_not_answer() -> None:
    class Clusters(JsonHandler):
        def do_GET(self) -> None:
            self.answer(200, ["starlight-local"])

    with serving(Clusters) as live:
        dead = f"http://127.0.0.1:{free_port()}"
        admin = PulsarAdmin(f"{dead},{live}", timeout=2)
        assert admin.clusters() == ["starlight-local"]
        assert admin.web_url == live  # and it stays with the one that answered
        assert admin.clusters() == ["starlight-local"]
        with pytest.raises(BackendUnavailable):
            PulsarAdmin(f"{dead},{dead}", timeout=2).clusters()
