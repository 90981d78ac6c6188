"""The options whose meaning depends on the suite (Java load generators or Python clients)."""

from __future__ import annotations

import argparse

import pytest

from starlight_py.bench.infra import BenchError, pulsar_settings
from starlight_py.bench.options import build_parser, resolve_suite_options


def parse(*argv: str) -> tuple[argparse.Namespace, str | None]:
    args = build_parser().parse_args(list(argv))
    return args, resolve_suite_options(args)


def test_the_java_suite_is_the_default() -> None:
    args, problem = parse()
    assert problem is None
    assert args.clients == "java"
    assert args.scenarios == [
        "1p1c",
        "4p4c",
        "1p1c-300",
        "1p1c-fanout",
        "1p4c-work",
        "1p10c-fanout",
    ]
    assert (args.duration, args.warmup) == (30, 10)
    assert args.targets == ["proxy", "rabbitmq", "pulsar"]


def test_quick_is_a_smoke_run_and_explicit_seconds_win() -> None:
    args, _ = parse("--quick")
    assert (args.duration, args.warmup) == (5, 2)
    args, _ = parse("--quick", "--duration", "7.5")
    assert (args.duration, args.warmup) == (8, 2)  # whole seconds


def test_the_python_suite_keeps_its_meanings() -> None:
    args, problem = parse("--clients", "python")
    assert problem is None
    assert args.scenarios == ["1x1", "4x4"]
    assert (args.duration, args.warmup) == (4.0, 20)
    args, _ = parse("--clients", "python", "--duration", "0", "--warmup", "5")
    assert (args.duration, args.warmup) == (0.0, 5)


def test_the_soak_uses_the_python_clients() -> None:
    args, problem = parse("--soak", "60")
    assert problem is None
    assert args.warmup == 20


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--scenarios", "1x1"],
            "--clients java takes --scenarios from "
            "1p1c,4p4c,1p1c-300,1p1c-fanout,1p4c-work,1p10c-fanout",
        ),
        (["--clients", "python", "--scenarios", "4p4c"], "--clients python and --soak"),
        (["--warmup", "0"], "1 second or more"),
    ],
)
def test_mismatched_options_are_refused(argv: list[str], message: str) -> None:
    _, problem = parse(*argv)
    assert problem is not None and message in problem


def test_bench_main_refuses_them_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    from starlight_py.bench import main  # noqa: PLC0415

    assert main(["--scenarios", "1x1"]) == 2
    assert "--scenarios" in capsys.readouterr().err


def test_pulsar_settings_are_key_value_pairs() -> None:
    assert pulsar_settings([]) == {}
    assert pulsar_settings(["journalSyncData=true", " a = b=c "]) == {
        "journalSyncData": "true",
        "a": "b=c",
    }
    for bad in ("journalSyncData", "=1"):
        with pytest.raises(BenchError, match="KEY=VALUE"):
            pulsar_settings([bad])
