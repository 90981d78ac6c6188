# --- Appended by starlight-py's tests/peers/run_peers.py (tests/peers/docker_free_conftest.py).
# The suite normally starts RabbitMQ in Docker; these definitions replace the Docker fixtures
# with the broker named by PEERS_AMQP_* (later definitions of a name win in a module). Only
# the fixtures that start containers change; the tests themselves are untouched. Tests that
# start a broker of their own (to restart it) get an error naming the reason.
import os as _peers_os

import pytest as _peers_pytest
from yarl import URL as _PeersURL


class _PeersBroker:
    id = "peers-suite-broker"
    host = _peers_os.environ["PEERS_AMQP_HOST"]
    ports = {
        "5672/tcp": int(_peers_os.environ["PEERS_AMQP_PORT"]),
        # No TLS listener is given: nothing listens there, so amqps tests fail to connect.
        "5671/tcp": int(_peers_os.environ.get("PEERS_AMQPS_PORT", "1")),
    }


def pytest_configure(config):
    """The Docker check is not needed: the broker is given."""


@_peers_pytest.fixture(scope="session")
def docker():
    _peers_pytest.fail("needs Docker: this test starts and restarts a broker of its own")


@_peers_pytest.fixture(scope="session")
def rabbitmq_container():
    return _PeersBroker()


@_peers_pytest.fixture(scope="session")
def amqp_direct_url():
    return _PeersURL.build(
        scheme="amqp",
        user=_peers_os.environ["PEERS_AMQP_USER"],
        password=_peers_os.environ["PEERS_AMQP_PASSWORD"],
        path="/" + _peers_os.environ["PEERS_AMQP_VHOST"],
        host=_PeersBroker.host,
        port=_PeersBroker.ports["5672/tcp"],
    )
