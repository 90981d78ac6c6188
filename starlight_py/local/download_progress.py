"""How far a download that Maven makes has come: instead of Maven's own lines (hundreds,
one per plugin file), one progress line, from the size of the files Maven writes into the
artifact's folder of its local repository (whatever their temporary names).

On a terminal the line is rewritten in place; elsewhere (CI logs) a line is written at each
quarter. `maven_local_repository` finds the repository as Maven does: `-Dmaven.repo.local`
in MAVEN_OPTS, else `<localRepository>` in ~/.m2/settings.xml, else ~/.m2/repository."""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

MIB = 1024 * 1024
POLL_INTERVAL = 1.0  # seconds between two looks at the folder

_REPO_LOCAL = re.compile(r"-Dmaven\.repo\.local=(\S+)")
_LOCAL_REPOSITORY = re.compile(r"<localRepository>\s*([^<]+?)\s*</localRepository>")


def maven_local_repository(env: Mapping[str, str], home: Path) -> Path:
    found = _REPO_LOCAL.search(env.get("MAVEN_OPTS", ""))
    if found:
        return Path(found.group(1).strip("\"'")).expanduser()
    settings = home / ".m2" / "settings.xml"
    try:
        text = settings.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    # A commented-out example must not count.
    text = re.sub(r"<!--.*?-->", "", text, flags=re.DOTALL)
    found = _LOCAL_REPOSITORY.search(text)
    if found:
        return Path(found.group(1).replace("${user.home}", str(home))).expanduser()
    return home / ".m2" / "repository"


def artifact_folder(repository: Path, coordinates: str) -> Path:
    """`group:artifact:version[:...]` -> its folder in the repository."""
    group, artifact, version = coordinates.split(":")[:3]
    return repository.joinpath(*group.split("."), artifact, version)


def progress_text(what: str, done: int, expected: int) -> str:
    percent = min(99, done * 100 // expected) if expected > 0 else 0
    return f"{what}: {done // MIB} of about {expected // MIB} MB ({percent} %)"


class DownloadProgress:
    """Watches `folder` on a thread of its own until `stop()`; reports through `line`
    (terminal: rewritten in place on `stream`; otherwise `log` at each quarter)."""

    def __init__(
        self,
        what: str,
        folder: Path,
        expected: int,
        log: Callable[[str], None],
        stream: TextIO | None = None,
        interval: float = POLL_INTERVAL,
    ) -> None:
        self.what = what
        self.folder = folder
        self.expected = expected
        self.log = log
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.live = self.stream.isatty()
        self.reported_quarter = 0
        self.last_size = 0
        self.shown = False  # a live line was written
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="download-progress", daemon=True)

    def __enter__(self) -> DownloadProgress:
        # A file already there (Maven's cache) is no progress of this download.
        self.last_size = self.size()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self.live and self.shown:
            self.stream.write("\n")
            self.stream.flush()

    def size(self) -> int:
        """The largest file in the folder now (the download being written)."""
        try:
            return max((f.stat().st_size for f in self.folder.iterdir() if f.is_file()), default=0)
        except OSError:
            return 0

    def _watch(self) -> None:
        while not self._stopped.wait(self.interval):
            self.observe(self.size())

    def observe(self, size: int) -> None:
        if size <= self.last_size:
            return
        self.last_size = size
        text = progress_text(self.what, size, self.expected)
        if self.live:
            self.shown = True
            self.stream.write("\r" + text)
            self.stream.flush()
            return
        quarter = min(3, size * 4 // self.expected) if self.expected > 0 else 0
        if quarter > self.reported_quarter:
            self.reported_quarter = quarter
            self.log(text)
