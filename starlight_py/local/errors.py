"""The one error the local launcher raises."""

from __future__ import annotations


class LocalInfraError(Exception):
    """Local infrastructure could not be fetched, started or reached.

    The message is meant for a person: it says what went wrong and what to do about it, so
    callers (the CLI, test fixtures) can print it as is without a stack trace.
    """
