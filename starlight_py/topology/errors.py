"""Errors of the topology services that are not AMQP errors."""

from __future__ import annotations


class TopologyConflict(Exception):
    """Concurrent changes kept winning; the operation gave up (retry it)."""
