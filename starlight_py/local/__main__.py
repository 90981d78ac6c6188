"""``python -m starlight_py.local fetch``: download and extract Pulsar ahead of time.

CI runs it as a warm-up step so the first test does not pay for a 250 MB download inside
its timeout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from starlight_py.local.distribution import (
    PULSAR_VERSION,
    default_cache_dir,
    ensure_pulsar_distribution,
)
from starlight_py.local.errors import LocalInfraError


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 failure, 2 usage).

    Raises nothing: failures are printed to stderr as one clear message.
    """
    parser = argparse.ArgumentParser(
        prog="python -m starlight_py.local",
        description="Manage the local Pulsar/ZooKeeper used by starlight-py.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser(
        "fetch",
        help="download and extract the Pulsar distribution into the cache (once)",
        description="Download and extract the Pulsar distribution; prints its folder.",
    )
    fetch.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help=f"cache folder (default: {default_cache_dir()})",
    )
    fetch.add_argument(
        "--pulsar-version",
        default=PULSAR_VERSION,
        help=f"Pulsar version to fetch (default: {PULSAR_VERSION})",
    )
    try:
        arguments = parser.parse_args(argv)
    except SystemExit as e:
        # argparse exits on --help (0) and on usage errors (2); callers want a return code.
        return e.code if isinstance(e.code, int) else 2
    try:
        folder = ensure_pulsar_distribution(arguments.cache_dir, arguments.pulsar_version)
    except LocalInfraError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
