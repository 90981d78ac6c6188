"""bench.floor's pure parts: per-message arithmetic, the floor block, the table, the
command line. No process is started here (tests/integration/test_bench_floor.py runs it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from starlight_py.bench.floor import Options, main, parse_options
from starlight_py.bench.floor_report import (
    EchoRow,
    FloorRow,
    ServerReading,
    figures,
    floor_rows,
    format_floor,
    format_table,
    measured_row,
)
from starlight_py.bench.floor_servers import C_EPOLL, SERVERS, server_argv


def row(server: str, rate: float, messages: int, cpu: float, switches: int = 0) -> EchoRow:
    return EchoRow(server, rate, messages, messages * 1024, 10.0, cpu, switches)


def test_a_row_divides_the_window_by_the_messages_echoed_in_it() -> None:
    before = ServerReading(at=100.0, cpu_seconds=1.25, context_switches=1000)
    after = ServerReading(at=110.0, cpu_seconds=1.325, context_switches=7000)
    measured = measured_row("c-epoll", 300, 3000, 3000 * 1024, before, after)
    assert measured.seconds == 10.0
    assert measured.cpu_seconds == pytest.approx(0.075)
    assert measured.context_switches == 6000
    assert measured.us_per_message == 25.0
    assert measured.switches_per_message == 2.0
    assert measured.achieved_rate == 300.0
    assert measured.error is None


def test_a_row_without_messages_or_with_an_error_has_no_figures() -> None:
    empty = row("trio-lean", 300, 0, 0.5)
    failed = EchoRow("trio-lean", 300, error="echo 3: the server closed the connection")
    for r in (empty, failed):
        assert r.us_per_message is None
        assert r.switches_per_message is None
    assert failed.achieved_rate is None


def test_the_floor_is_three_echoes_at_the_lowest_measured_rate() -> None:
    rows = [
        row("trio-lean", 3000, 30000, 3.0),  # 100 µs
        row("trio-lean", 300, 3000, 0.45),  # 150 µs: the lowest rate wins
        row("c-epoll", 300, 3000, 0.072),  # 24 µs
        EchoRow("python-selectors", 300, error="refused"),
        row("python-selectors", 3000, 30000, 1.5),  # 50 µs: its only measured rate
    ]
    assert floor_rows(rows) == [
        FloorRow("trio-lean", 300, 150.0, 450.0),
        FloorRow("c-epoll", 300, 24.0, 72.0),
        FloorRow("python-selectors", 3000, 50.0, 150.0),
    ]
    assert [f.percent_of_target for f in floor_rows(rows)] == [300, 48, 100]


def test_a_server_never_measured_has_no_floor() -> None:
    assert floor_rows([EchoRow(C_EPOLL, 300, error="no C compiler (cc or gcc) on PATH")]) == []


def test_the_table_has_a_line_per_row_and_the_error_of_a_failed_one() -> None:
    rows = [
        row("python-selectors", 300, 3000, 0.15, 6000),
        EchoRow(C_EPOLL, 300, error="no C compiler (cc or gcc) on PATH"),
    ]
    lines = format_table(rows, size=1024, warmup=2, duration=10).splitlines()
    assert "1024-byte" in lines[0]
    assert "10 s measured after 2 s of warm-up" in lines[0]
    assert lines[1].split() == [
        "server",
        "rate",
        "messages",
        "msg/s",
        "CPU",
        "ms",
        "CPU",
        "µs/msg",
        "ctx",
        "sw/msg",
    ]
    assert lines[2].split() == ["python-selectors", "300", "3000", "300.0", "150", "50.0", "2.00"]
    assert lines[3].split()[:2] == ["c-epoll", "300"]
    assert "error: no C compiler" in lines[3]
    assert "10 ms clock ticks" in lines[4]  # 150 ms of CPU is coarse


def test_the_table_has_no_coarseness_note_when_every_row_used_enough_cpu() -> None:
    text = format_table([row("trio-stream", 300, 3000, 0.6)], 1024, 2, 10)
    assert "clock ticks" not in text


def test_the_floor_block_names_the_target_and_why_three() -> None:
    text = format_floor([FloorRow("trio-lean", 300, 150.0, 450.0)])
    lines = text.splitlines()
    assert "150 µs per message at 300 msg/s" in lines[0]
    assert "three wake-ups and three writes that wake a peer per message" in lines[1]
    assert lines[3].split() == ["trio-lean", "300", "150.0", "450.0", "300%"]
    assert "no server was measured" in format_floor([])


def test_the_json_figures_hold_every_row_and_the_floor() -> None:
    rows = [row("c-epoll", 300, 3000, 0.072, 3000), EchoRow("trio-lean", 300, error="x")]
    report = json.loads(json.dumps(figures(rows, 1024, 2.0, 10.0)))
    assert report["size"] == 1024
    assert report["rows"][0]["us_per_message"] == 24.0
    assert report["rows"][0]["switches_per_message"] == 1.0
    assert report["rows"][1]["error"] == "x"
    assert report["rows"][1]["us_per_message"] is None
    assert report["floor"]["target_us_per_message"] == 150.0
    assert report["floor"]["servers"] == [
        {
            "server": "c-epoll",
            "rate": 300,
            "us_per_message": 24.0,
            "floor_us": 72.0,
            "percent_of_target": 48,
        }
    ]


def test_the_defaults() -> None:
    assert parse_options([]) == Options(SERVERS, (300.0,), 1024, 2.0, 20.0, None)


def test_servers_and_rates_are_comma_separated() -> None:
    options = parse_options(
        ["--servers", "trio-lean, c-epoll,trio-lean", "--rates", "300,3000", "--json", "f.json"]
    )
    assert isinstance(options, Options)
    assert options.servers == ("trio-lean", "c-epoll")
    assert options.rates == (300.0, 3000.0)
    assert options.json_path == Path("f.json")


@pytest.mark.parametrize(
    "argv",
    [
        ["--rates", "0"],
        ["--rates", "300,-5"],
        ["--rates", "300,fast"],
        ["--rates", "nan"],
        ["--servers", "c-epoll,nginx"],
        ["--servers", ","],
        ["--size", "0"],
        ["--warmup", "-1"],
        ["--duration", "0"],
    ],
)
def test_bad_arguments_are_refused_with_exit_code_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert isinstance(parse_options(argv), str)
    assert main(argv) == 2
    assert capsys.readouterr().err.strip()


def test_python_servers_run_as_modules_and_the_c_one_as_its_binary() -> None:
    argv = server_argv("trio-lean", 4321, None)
    assert argv[1:] == ["-m", "starlight_py.bench.floor_servers", "trio-lean", "4321"]
    assert server_argv(C_EPOLL, 4321, Path("/tmp/x/echo_epoll")) == ["/tmp/x/echo_epoll", "4321"]
    with pytest.raises(ValueError):
        server_argv(C_EPOLL, 4321, None)
    with pytest.raises(ValueError):
        server_argv("nginx", 4321, None)
