"""What the standalone decides when one of its servers dies: restart it or give up, and how
it says why (starlight_py/local/supervision.py)."""

from __future__ import annotations

import signal

import pytest

from starlight_py.local.supervision import (
    RestartBudget,
    RestartPolicy,
    ServerLost,
    cause_of_death,
)

POLICY = RestartPolicy(attempts=3, stable_after=60)


def test_a_server_that_dies_again_right_after_each_restart_gets_a_bounded_number_of_tries():
    budget = RestartBudget(POLICY)
    ready_at = 100.0

    decisions = [budget.allows_restart(ready_at + 5 * n, ready_at + 5 * n - 1) for n in range(4)]

    assert decisions == [True, True, True, False]


def test_failed_starts_count_like_early_deaths():
    budget = RestartBudget(POLICY)
    assert budget.allows_restart(1000.0, ready_at=10.0)  # after a long run: a first death

    decisions = [budget.allows_restart(1001.0 + n, ready_at=None) for n in range(3)]

    assert decisions == [True, True, False]


def test_a_server_that_ran_long_enough_starts_a_new_count_when_it_dies():
    budget = RestartBudget(POLICY)
    for n in range(3):
        assert budget.allows_restart(10.0 + n, 9.0 + n)

    # Restarted a fourth time it is lost; but having served a minute since, it is not.
    assert budget.allows_restart(200.0, ready_at=140.0)
    assert budget.failures == 1


@pytest.mark.parametrize(
    "field", [{"attempts": 0}, {"stable_after": 0}, {"delay": -1}, {"poll_interval": 0}]
)
def test_a_policy_that_could_never_restart_or_never_wait_is_refused(field):
    with pytest.raises(ValueError):
        RestartPolicy(**field)


def test_cause_of_death_names_the_signal_or_the_exit_code():
    assert cause_of_death(-signal.SIGKILL, []) == "was killed by SIGKILL"
    assert cause_of_death(1, ["Exception in thread main"]) == "exited with code 1"
    assert cause_of_death(None, []) == "stopped"


def test_cause_of_death_quotes_the_jvms_out_of_memory_line():
    tail = [
        "2026-11-27T22:01:13,120 [SyncThread:0] INFO  snapshot",
        "Terminating due to java.lang.OutOfMemoryError: Java heap space",
    ]

    assert cause_of_death(3, tail) == (
        "exited with code 3 after java.lang.OutOfMemoryError: Java heap space"
    )


def test_the_lost_server_message_says_which_how_and_what_its_log_said():
    lost = ServerLost(
        "ZooKeeper", "was killed by SIGKILL", 3, "Last lines of /d/zookeeper.log:\nboom"
    )

    assert lost.server == "ZooKeeper"
    assert str(lost).startswith(
        "ZooKeeper was killed by SIGKILL, and 3 restarts in a row did not bring it back"
    )
    assert str(lost).endswith("Last lines of /d/zookeeper.log:\nboom")
