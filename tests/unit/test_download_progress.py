"""local/download_progress.py: where Maven writes, and one progress line instead of its own."""

from __future__ import annotations

import io
from pathlib import Path

from starlight_py.local.download_progress import (
    MIB,
    DownloadProgress,
    artifact_folder,
    maven_local_repository,
)


def test_the_local_repository_is_found_as_maven_finds_it(tmp_path: Path) -> None:
    home = tmp_path
    assert maven_local_repository({}, home) == home / ".m2" / "repository"
    (home / ".m2").mkdir()
    (home / ".m2" / "settings.xml").write_text(
        "<settings><!-- <localRepository>/not/this</localRepository> -->"
        "<localRepository>${user.home}/repo</localRepository></settings>"
    )
    assert maven_local_repository({}, home) == home / "repo"
    opts = {"MAVEN_OPTS": "-Xmx1g -Dmaven.repo.local=/tmp/m2 -Dx=y"}
    assert maven_local_repository(opts, home) == Path("/tmp/m2")


def test_artifact_folder() -> None:
    folder = artifact_folder(
        Path("/r"), "org.apache.pulsar:pulsar-server-distribution:4.0.8:tar.gz:bin"
    )
    assert folder == Path("/r/org/apache/pulsar/pulsar-server-distribution/4.0.8")


class Pipe(io.StringIO):
    def isatty(self) -> bool:
        return False


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_in_a_log_one_line_per_quarter(tmp_path: Path) -> None:
    lines: list[str] = []
    progress = DownloadProgress("Pulsar", tmp_path, 100 * MIB, lines.append, stream=Pipe())
    for mib in (1, 10, 20, 26, 30, 60, 99, 100):
        progress.observe(mib * MIB)
    assert lines == [
        "Pulsar: 26 of about 100 MB (26 %)",
        "Pulsar: 60 of about 100 MB (60 %)",
        "Pulsar: 99 of about 100 MB (99 %)",
    ]


def test_on_a_terminal_one_line_rewritten(tmp_path: Path) -> None:
    terminal = Terminal()
    lines: list[str] = []
    with DownloadProgress("Pulsar", tmp_path, 100 * MIB, lines.append, stream=terminal) as p:
        p.observe(5 * MIB)
        p.observe(50 * MIB)
    assert lines == []
    assert terminal.getvalue() == (
        "\rPulsar: 5 of about 100 MB (5 %)\rPulsar: 50 of about 100 MB (50 %)\n"
    )


def test_a_file_already_there_is_no_progress(tmp_path: Path) -> None:
    (tmp_path / "cached.tar.gz").write_bytes(b"x" * 1000)
    lines: list[str] = []
    with DownloadProgress("Pulsar", tmp_path, 1000, lines.append, stream=Pipe()) as p:
        p.observe(p.size())
    assert lines == []
