"""CPU per message from two /proc readings: the arithmetic, and the split by thread."""

from __future__ import annotations

import os
import threading

import pytest

from starlight_py.bench.cpu import (
    EXITED_THREADS,
    CpuMeter,
    CpuReading,
    ProcessStat,
    ThreadCpu,
    read_processes,
    read_threads,
    server_members,
    thread_group,
    us_per_message,
    window_between,
)


@pytest.mark.parametrize(
    ("comm", "group"),
    [
        ("python3", "python3"),
        ("Trio thread 12", "Trio thread"),
        ("pulsar-io-2-1", "pulsar-io"),
        ("pulsar-timer-4", "pulsar-timer"),
        ("pulsar-listener", "pulsar-listener"),
        ("starlight-read", "starlight-read"),
        ("subscribe from ", "subscribe from"),
        ("42", "42"),
    ],
)
def test_threads_are_grouped_by_name_without_trailing_numbers(comm: str, group: str) -> None:
    assert thread_group(comm) == group


def test_us_per_message() -> None:
    assert us_per_message(0.35, 10_000) == 35.0
    assert us_per_message(1.0, 3) == 333333.3
    assert us_per_message(1.0, 0) is None


def test_a_window_is_the_difference_of_two_readings() -> None:
    before = CpuReading(100.0, {"proxy": 10.0, "pulsar": 50.0})
    after = CpuReading(130.0, {"proxy": 13.5, "pulsar": 53.0})
    window = window_between(before, after, split=None)
    assert window.seconds == 30.0
    assert window.processes == {"proxy": pytest.approx(3.5), "pulsar": pytest.approx(3.0)}
    assert window.us_per_message(100_000) == {"proxy": 35.0, "pulsar": 30.0}
    assert window.percent_of_one_core() == {"proxy": 11.7, "pulsar": 10.0}
    assert window.threads == {}


def test_the_split_groups_threads_and_keeps_what_ended_threads_used() -> None:
    before = CpuReading(
        0.0,
        {"proxy": 10.0},
        {
            1: ThreadCpu("python3", 6.0),
            2: ThreadCpu("pulsar-io-1", 1.0),
            3: ThreadCpu("pulsar-io-2", 1.0),
            4: ThreadCpu("Trio thread 1", 1.0),  # ends inside the window
        },
    )
    after = CpuReading(
        10.0,
        {"proxy": 14.0},
        {
            1: ThreadCpu("python3", 8.0),
            2: ThreadCpu("pulsar-io-1", 1.5),
            3: ThreadCpu("pulsar-io-2", 1.25),
            5: ThreadCpu("Trio thread 2", 0.25),  # started inside the window
        },
    )
    window = window_between(before, after, split="proxy")
    assert window.threads == {
        "python3": 2.0,
        "pulsar-io": 0.75,
        "Trio thread": 0.25,
        EXITED_THREADS: 1.0,  # 4.0 for the process, 3.0 for the threads still there
    }
    assert window.threads_us_per_message(1000) == {
        "python3": 2000.0,
        "pulsar-io": 750.0,
        "Trio thread": 250.0,
        EXITED_THREADS: 1000.0,
    }


def test_a_reused_thread_id_counts_as_a_new_thread() -> None:
    before = CpuReading(0.0, {"proxy": 5.0}, {7: ThreadCpu("old", 4.0)})
    after = CpuReading(1.0, {"proxy": 5.5}, {7: ThreadCpu("new", 0.5)})
    window = window_between(before, after, split="proxy")
    assert window.threads == {"new": 0.5}


def test_the_threads_of_this_process_can_be_read() -> None:
    started = threading.Event()
    stop = threading.Event()

    def idle() -> None:
        started.set()
        stop.wait(10)

    thread = threading.Thread(target=idle, daemon=True)
    thread.start()
    started.wait(10)
    try:
        threads = read_threads([os.getpid()])
    finally:
        stop.set()
        thread.join(10)
    assert thread.native_id in threads
    assert os.getpid() in threads  # the main thread's id is the pid


def test_a_server_is_its_group_and_the_groups_of_its_descendants() -> None:
    table = {
        # a proxy supervisor (100) and two workers, each the leader of its own group
        100: ProcessStat(ppid=1, pgrp=100, cpu_seconds=1.0),
        101: ProcessStat(ppid=100, pgrp=101, cpu_seconds=5.0),
        102: ProcessStat(ppid=100, pgrp=102, cpu_seconds=6.0),
        103: ProcessStat(ppid=101, pgrp=101, cpu_seconds=0.5),  # a worker's helper
        # RabbitMQ: a script and the beam it started, one group
        200: ProcessStat(ppid=1, pgrp=200, cpu_seconds=0.0),
        201: ProcessStat(ppid=200, pgrp=200, cpu_seconds=9.0),
        # somebody else's process that happens to share nothing with either
        300: ProcessStat(ppid=1, pgrp=300, cpu_seconds=99.0),
    }
    assert server_members(100, table) == [100, 101, 102, 103]
    assert server_members(200, table) == [200, 201]
    assert server_members(999, table) == []  # gone


def test_this_process_is_in_the_process_table() -> None:
    table = read_processes()
    assert table[os.getpid()].ppid == os.getppid()
    assert table[os.getpid()].pgrp == os.getpgid(0)
    assert os.getpid() in server_members(os.getpgid(0), table)


def test_a_meter_needs_both_edges_of_the_window() -> None:
    meter = CpuMeter({"self": os.getpgid(0)}, split="self")
    assert meter.window() is None
    meter.open_window()
    assert meter.window() is None
    meter.close_window()
    window = meter.window()
    assert window is not None
    assert set(window.processes) == {"self"}
    assert window.processes["self"] >= 0


def test_a_split_of_an_unknown_server_is_ignored() -> None:
    assert CpuMeter({"rabbitmq": 1}, split="proxy").split is None
