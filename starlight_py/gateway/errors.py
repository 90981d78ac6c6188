"""The one translation of infrastructure failures into what a client is told.

AMQPError subclasses pass through unchanged (they already carry their reply code); known
failures of ZooKeeper, Pulsar and of our own conflict handling become 541 INTERNAL_ERROR
with a reason, so the client gets an answer, never a hang. Anything else is a bug: 541 with
no details (those go to the proxy log)."""

from __future__ import annotations

from starlight_py.amqp.errors import AMQPError, InternalError
from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdminError
from starlight_py.backend.pulsar_client import BackendError
from starlight_py.metadata.records import RecordError
from starlight_py.metadata.zookeeper import MetadataUnavailable, TransactionFailed
from starlight_py.topology.service import TopologyConflict


def as_amqp_error(error: Exception, method: tuple[int, int] = (0, 0)) -> AMQPError | None:
    """The AMQP error to answer with, or None when `error` is unexpected (a bug). A group
    of errors (from a trio nursery doing several things at once) answers with its first
    known one."""
    if isinstance(error, AMQPError):
        return error
    if isinstance(error, ExceptionGroup):
        for part in error.exceptions:
            found = as_amqp_error(part, method)
            if found is not None:
                return found
        return None
    if isinstance(error, MetadataUnavailable):
        return InternalError(f"metadata store unavailable: {error}", method)
    if isinstance(error, BackendUnavailable):
        return InternalError(f"Pulsar unavailable: {error}", method)
    if isinstance(error, PulsarAdminError | BackendError):
        return InternalError(f"Pulsar refused the operation: {error}", method)
    if isinstance(error, TopologyConflict | TransactionFailed):
        return InternalError(f"concurrent topology change, retry: {error}", method)
    if isinstance(error, RecordError):
        return InternalError(f"unreadable metadata: {error}", method)
    return None
