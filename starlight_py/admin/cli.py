"""`starlight-admin`: the operators' CLI. Commands arrive with the admin issue; for now it
prints its help and says so, instead of pretending."""

from __future__ import annotations

import argparse
import sys

from starlight_py import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="starlight-admin",
        description=(
            "Manage starlight-py: vhost-to-namespace mappings, topology, permissions. "
            "No commands are available in this version yet."
        ),
    )
    parser.add_argument("--version", action="version", version=f"starlight-py {__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `starlight-admin`; returns the exit code."""
    parser = build_parser()
    parser.parse_args(argv)
    parser.print_help(sys.stdout)
    return 0
