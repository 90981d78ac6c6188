"""start_tree_cache: a ZooKeeper that goes away while a cache starts does not end the proxy
(metadata/zookeeper.py); other errors still surface."""

from __future__ import annotations

import inspect
import logging

import pytest
from kazoo.exceptions import ConnectionLoss, KazooException, SessionExpiredError

from starlight_py.metadata.watched_tree import WatchedTree
from starlight_py.metadata.zookeeper import start_tree_cache


class _Tree:
    def __init__(self, error: Exception | None) -> None:
        self.error = error
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        if self.error is not None:
            raise self.error


def _start(tree: _Tree) -> None:
    start_tree_cache(tree, "the test cache")  # type: ignore[arg-type]


@pytest.mark.parametrize("error", [ConnectionLoss(), SessionExpiredError()])
def test_a_connection_lost_while_starting_is_logged_not_raised(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    tree = _Tree(error)
    with caplog.at_level(logging.WARNING, logger="starlight.zookeeper"):
        _start(tree)
    assert tree.starts == 1
    assert "the test cache: ZooKeeper went away while it started" in caplog.text
    assert type(error).__name__ in caplog.text


def test_other_errors_surface() -> None:
    with pytest.raises(KazooException, match="already started"):
        _start(_Tree(KazooException("already started")))


def test_a_quiet_start_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    tree = _Tree(None)
    with caplog.at_level(logging.WARNING):
        _start(tree)
    assert tree.starts == 1 and caplog.text == ""


def test_the_tree_registers_its_session_listener_before_it_can_fail() -> None:
    """What makes a failed start safe: the listener that reads the tree again on
    reconnection is in place before the first ZooKeeper call of `start`."""
    source = inspect.getsource(WatchedTree.start)
    assert source.index("add_listener") < source.index("ensure_path")
