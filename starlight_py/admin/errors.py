"""What a `starlight-admin` command can fail with, and the exit code each one means."""

from __future__ import annotations


class AdminError(Exception):
    """The command was understood but could not be done (exit 1)."""

    exit_code = 1


class UsageError(AdminError):
    """The command line or the configuration is wrong (exit 2)."""

    exit_code = 2
