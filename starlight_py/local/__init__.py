"""Local infrastructure: Apache Pulsar standalone and ZooKeeper on this machine, and a
whole cluster of proxy processes behind HAProxy (:class:`LocalCluster`).

Used by ``starlight-proxy standalone``, ``deploy/local/cluster.py`` and by the
integration-test fixtures. Pulsar's
binary distribution is fetched once through Maven and cached (see :mod:`.distribution`);
every process started here is stopped when the Python process exits normally, and killed by
the kernel when it dies any other way (see :mod:`.process`). The standalone's ZooKeeper and
Pulsar are started again when they die (see :mod:`.supervision`).
"""

from starlight_py.local.cluster import LocalCluster
from starlight_py.local.distribution import (
    PULSAR_VERSION,
    default_cache_dir,
    ensure_pulsar_distribution,
    find_java,
)
from starlight_py.local.errors import LocalInfraError
from starlight_py.local.external import ServiceEndpoints, endpoints_from_env
from starlight_py.local.haproxy import HAProxy, find_haproxy
from starlight_py.local.ports import ensure_port_free, free_port
from starlight_py.local.process import stop_all_servers
from starlight_py.local.proxy import ProxyProcess
from starlight_py.local.pulsar import PulsarStandalone, standalone_conf
from starlight_py.local.zookeeper import ZooKeeperServer

__all__ = [
    "PULSAR_VERSION",
    "HAProxy",
    "LocalCluster",
    "LocalInfraError",
    "ProxyProcess",
    "PulsarStandalone",
    "ServiceEndpoints",
    "ZooKeeperServer",
    "default_cache_dir",
    "endpoints_from_env",
    "ensure_port_free",
    "ensure_pulsar_distribution",
    "find_haproxy",
    "find_java",
    "free_port",
    "standalone_conf",
    "stop_all_servers",
]
