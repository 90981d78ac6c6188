"""The parts of the local cluster that need no running server: HAProxy's configuration,
its `show stat` answers, the cluster's ports and settings, the operator's script."""

from __future__ import annotations

import importlib.util
import re
import signal
from pathlib import Path
from types import ModuleType

import pytest
from pamqp import commands

from starlight_py.amqp.framing import encode_method
from starlight_py.local import LocalInfraError
from starlight_py.local.cluster import LocalCluster, distinct_free_ports
from starlight_py.local.haproxy import (
    BackendServer,
    HAProxy,
    haproxy_config,
    parse_show_stat,
    server_name,
)
from starlight_py.local.proxy import ProxyProcess

ROOT = Path(__file__).resolve().parents[2]


def config_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


@pytest.fixture
def config() -> str:
    return haproxy_config(5672, [40001, 40002, 40003], Path("/run/test/haproxy.sock"))


def test_the_frontend_is_tcp_on_the_loopback_port(config):
    lines = config_lines(config)

    assert "mode tcp" in lines
    assert "bind 127.0.0.1:5672" in lines
    assert "default_backend proxies" in lines


def test_one_server_per_proxy_with_health_checks_balanced_round_robin(config):
    lines = config_lines(config)

    servers = [line for line in lines if line.startswith("server ")]
    assert servers == [
        "server proxy0 127.0.0.1:40001 check",
        "server proxy1 127.0.0.1:40002 check",
        "server proxy2 127.0.0.1:40003 check",
    ]
    assert "balance roundrobin" in lines
    assert "default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions" in lines


def test_the_health_check_sends_the_amqp_header_and_expects_connection_start(config):
    lines = config_lines(config)

    assert "option tcp-check" in lines
    assert "tcp-check send-binary 414d515000000901" in lines  # "AMQP\0\0\x09\x01"
    expect = next(line for line in lines if line.startswith("tcp-check expect"))
    pattern = expect.split(" rbinary ", 1)[1]
    # HAProxy matches the regex on the reply in hexadecimal, case unspecified.
    start = encode_method(0, commands.Connection.Start(locales="en_US")).hex()
    assert re.match(pattern, start)
    assert re.match(pattern, start.upper())
    close = encode_method(0, commands.Connection.Close(541, "x", 0, 0)).hex()
    assert not re.match(pattern, close)
    assert not re.match(pattern, b"AMQP\x00\x00\x09\x01".hex())


def test_timeouts_outlast_amqp_heartbeats(config):
    lines = config_lines(config)

    assert "timeout client 3h" in lines
    assert "timeout server 3h" in lines
    assert "timeout connect 2s" in lines


def test_the_admin_socket_is_configured(config):
    assert "stats socket /run/test/haproxy.sock mode 600 level admin" in config_lines(config)


def test_leastconn_and_the_check_interval_are_options():
    text = haproxy_config(1, [2], Path("s"), check_interval=0.25, balance="leastconn")

    assert "balance leastconn" in config_lines(text)
    assert "inter 250ms" in text


@pytest.mark.parametrize(
    ("ports", "options"),
    [([], {}), ([2], {"balance": "random"}), ([2], {"check_interval": 0.0})],
)
def test_unusable_arguments_are_refused(ports, options):
    with pytest.raises(ValueError):
        haproxy_config(1, ports, Path("s"), **options)


SHOW_STAT = """\
# pxname,svname,qcur,qmax,scur,smax,slim,stot,status,check_status,check_code
amqp,FRONTEND,,,2,3,100,7,OPEN,,
proxies,proxy0,0,0,0,1,,4,DOWN,L4CON,
proxies,proxy1,0,0,2,2,,3,UP,L7OK,
proxies,proxy2,0,0,0,0,,0,UP 1/2,L4TOUT,
proxies,BACKEND,0,0,2,3,10,7,UP,,
"""


def test_show_stat_gives_each_proxy_state_and_sessions():
    servers = parse_show_stat(SHOW_STAT)

    assert servers == [
        BackendServer("proxy0", "DOWN", "L4CON", 0, 4),
        BackendServer("proxy1", "UP", "L7OK", 2, 3),
        BackendServer("proxy2", "UP 1/2", "L4TOUT", 0, 0),
    ]
    assert [(s.is_up, s.is_down) for s in servers] == [(False, True), (True, False), (False, False)]


def test_an_answer_that_is_not_show_stat_is_an_error():
    with pytest.raises(LocalInfraError):
        parse_show_stat("Unknown command\n")


def test_a_long_data_folder_gets_a_short_admin_socket(tmp_path):
    deep = tmp_path.joinpath(*["a-rather-long-folder-name"] * 6)

    haproxy = HAProxy(deep, [1])

    assert len(str(haproxy.stats_socket)) < 108
    assert HAProxy(tmp_path, [1]).stats_socket == tmp_path.resolve() / "haproxy.sock"


def test_free_ports_are_distinct_and_avoid_taken_ones():
    ports = distinct_free_ports(20, taken=[5672])

    assert len(set(ports)) == 20
    assert 5672 not in ports


def test_a_cluster_gives_every_part_its_own_port_and_every_proxy_the_shared_services(tmp_path):
    cluster = LocalCluster(tmp_path, 3, proxy_settings={"zooKeeperSessionTimeoutMillis": "4000"})

    ports = [
        cluster.port,
        cluster.zookeeper.port,
        cluster.pulsar.broker_port,
        cluster.pulsar.web_port,
        *(proxy.port for proxy in cluster.proxies),
    ]
    assert len(set(ports)) == len(ports) == 7
    assert cluster.amqp_url == f"amqp://guest:guest@127.0.0.1:{cluster.port}/%2F"
    assert cluster.proxy_url(1) == f"amqp://guest:guest@127.0.0.1:{cluster.proxies[1].port}/%2F"
    assert cluster.haproxy.backend_ports == tuple(proxy.port for proxy in cluster.proxies)
    for proxy in cluster.proxies:
        assert proxy.settings == {
            "amqpAutoCreateNamespaces": "true",
            "zooKeeperSessionTimeoutMillis": "4000",
            "configurationStoreServers": cluster.zookeeper.connect_string,
            "brokerServiceURL": cluster.pulsar.service_url,
            "brokerWebServiceURL": cluster.pulsar.web_url,
            "amqpListeners": f"amqp://127.0.0.1:{proxy.port}",
        }
    assert cluster.proxy_pids == [None, None, None]
    assert cluster.not_running() == [
        "ZooKeeper",
        "Pulsar",
        "proxy 0",
        "proxy 1",
        "proxy 2",
        "HAProxy",
    ]
    assert cluster.haproxy_server_name(2) == server_name(2) == "proxy2"


def test_given_ports_are_kept(tmp_path):
    cluster = LocalCluster(
        tmp_path, 2, port=5999, proxy_ports=[6001, 6002], zookeeper_port=6003, pulsar_port=6004
    )

    assert (cluster.port, cluster.zookeeper.port, cluster.pulsar.broker_port) == (5999, 6003, 6004)
    assert [proxy.port for proxy in cluster.proxies] == [6001, 6002]


@pytest.mark.parametrize(
    ("proxies", "options"),
    [
        (0, {}),
        (2, {"proxy_ports": [6001]}),
        (1, {"proxy_settings": {"brokerServiceURL": "pulsar://elsewhere:6650"}}),
    ],
)
def test_unusable_cluster_arguments_are_refused(tmp_path, proxies, options):
    with pytest.raises(ValueError):
        LocalCluster(tmp_path, proxies, **options)


def test_a_proxy_listener_comes_from_its_port(tmp_path):
    with pytest.raises(ValueError):
        ProxyProcess("p", tmp_path / "p.log", {"amqpListeners": "amqp://0.0.0.0:1"})


def test_killing_with_a_signal_that_does_not_end_a_proxy_needs_wait_false(tmp_path):
    cluster = LocalCluster(tmp_path, 1)

    with pytest.raises(ValueError):
        cluster.kill_proxy(0, signal.SIGSTOP)


def load_deploy_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "deploy_cluster", ROOT / "deploy/local/cluster.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_operator_script_explains_itself_and_refuses_bad_settings(capsys):
    script = load_deploy_script()

    assert script.main(["up", "--help"]) == 0
    assert "--proxies" in capsys.readouterr().out
    assert script.main(["up", "--set", "no-equals-sign"]) == 2
    assert script.main(["down"]) == 2
