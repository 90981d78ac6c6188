"""`definitions export FILE` / `definitions import FILE` (RabbitMQ's definitions.json)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from starlight_py.admin.context import AdminContext
from starlight_py.admin.definitions import DefinitionsError, export_definitions, import_definitions
from starlight_py.admin.errors import AdminError, UsageError
from starlight_py.admin.output import Report
from starlight_py.admin.parsing import Subcommands, add_command, add_group


def register(commands: Subcommands) -> None:
    group = add_group(
        commands, "definitions", "RabbitMQ definitions.json export and import (migration)"
    )
    export = add_command(
        group,
        "export",
        "write vhosts, exchanges, queues, bindings, permissions and policies as definitions.json",
        export_file,
    )
    export.add_argument("file", help="output file, or - for stdout")
    imported = add_command(
        group,
        "import",
        "create what a definitions.json defines (idempotent; reports what it created)",
        import_file,
    )
    imported.add_argument("file", help="a file from rabbitmqctl export_definitions, or -")
    imported.add_argument(
        "--skip-unsupported",
        action="store_true",
        help="exit 0 even when the file has things starlight-py cannot apply (users, "
        "parameters, policy keys such as ha-mode); they are still listed",
    )


def export_file(ctx: AdminContext, args: argparse.Namespace) -> Report:
    document = export_definitions(ctx)
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    if args.file == "-":
        sys.stdout.write(text)
    else:
        try:
            Path(args.file).write_text(text, encoding="utf-8")
        except OSError as e:
            raise AdminError(f"cannot write {args.file}: {e.strerror}") from e
    counts = {k: len(document[k]) for k in ("vhosts", "exchanges", "queues", "bindings")}
    counts["permissions"] = len(document["permissions"])
    counts["policies"] = len(document["policies"])
    summary = ", ".join(f"{n} {k}" for k, n in counts.items())
    return Report(
        "" if args.file == "-" else f"exported {summary} to {args.file}",
        None if args.file == "-" else {"file": args.file, **counts},
    )


def import_file(ctx: AdminContext, args: argparse.Namespace) -> Report:
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text("utf-8")
    except OSError as e:
        raise UsageError(f"cannot read {args.file}: {e.strerror}") from e
    try:
        document = json.loads(text)
    except ValueError as e:
        raise UsageError(f"{args.file} is not JSON: {e}") from e
    try:
        report = import_definitions(ctx, document)
    except DefinitionsError as e:
        raise UsageError(f"{args.file}: {e}") from e
    text = report.text()
    unsupported = report.skipped and not args.skip_unsupported
    if unsupported:
        text += (
            "\nnot everything was applied: see 'unsupported' above "
            "(--skip-unsupported accepts that)"
        )
    return Report(text, report.as_json(), exit_code=1 if report.failed or unsupported else 0)
