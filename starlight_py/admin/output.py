"""How commands answer: a `Table` (rows of plain values) or a `Report` (lines of text),
printed for people by default and as JSON with `--json`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO


@dataclass(frozen=True)
class Table:
    """Rows with named columns; `--json` prints a list of objects keyed by column."""

    columns: tuple[str, ...]
    rows: Sequence[Sequence[Any]] = ()

    def as_json(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


@dataclass(frozen=True)
class Report:
    """A free-form answer: `text` for people, `data` for `--json`."""

    text: str
    data: Any = field(default=None)
    # 1 when the command did part of its work and reports what it could not do.
    exit_code: int = 0


Result = Table | Report


def cell(value: Any) -> str:
    """A value as a table shows it: booleans as yes/no, tables as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return str(value)


def render_table(table: Table) -> str:
    """Aligned columns under an upper-case header; `(none)` under the header when empty."""
    header = [c.upper() for c in table.columns]
    body = [[cell(v) for v in row] for row in table.rows]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = [
        "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *body]
    ]
    if not body:
        lines.append("(none)")
    return "\n".join(lines)


def emit(result: Result, as_json: bool, stream: TextIO) -> None:
    if as_json:
        data = result.as_json() if isinstance(result, Table) else result.data
        if data is None and isinstance(result, Report):
            data = {"message": result.text}
        stream.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        return
    text = render_table(result) if isinstance(result, Table) else result.text
    if text:
        stream.write(text + "\n")
