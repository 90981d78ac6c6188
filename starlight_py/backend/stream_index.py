"""Pulsar's message index, which stream offsets are made of (docs/mapping.md#stream-queues).

With `AppendIndexMetadataInterceptor` among the brokers' `brokerEntryMetadataInterceptors`,
every entry a broker writes carries, in its broker entry metadata, the index of its last
message in the topic: 0, 1, 2, ... per topic, counting each message of a batch. The proxy's
pulsar-client (3.x for Python) does not hand that metadata over with a message, so the index
is read here through the admin API's `GET .../ledger/{l}/entry/{e}` (its
`X-Pulsar-Broker-Entry-METADATA-index` header) and the topic's ledgers (internalStats):

- `entry_index`: one entry's index, batch size and publish time (a reader reads it once per
  ledger it enters, then counts: `IndexCounter`);
- `locate`: the entry holding the message of a given index (a binary search, a few dozen
  requests for millions of entries), for a consumer starting at a numeric offset.
"""

from __future__ import annotations

import datetime
import logging

from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdmin, PulsarAdminError
from starlight_py.model.naming import TopicName
from starlight_py.model.streams import EntryIndex, IndexLookup, locate_index

log = logging.getLogger("starlight.backend")

INDEX_INTERCEPTOR = "org.apache.pulsar.common.intercept.AppendIndexMetadataInterceptor"
INTERCEPTORS_SETTING = "brokerEntryMetadataInterceptors"
# What stream offsets need of every broker: the index on every entry (the proxy reads it
# through the admin API) and, for Pulsar clients reading the same topics, the index handed
# to them too (Message.getIndex() in the Java client: the offset of the stream's own topic).
STREAM_OFFSET_BROKER_SETTINGS = {
    INTERCEPTORS_SETTING: INDEX_INTERCEPTOR,
    "exposingBrokerEntryMetadataToClientEnabled": "true",
}

_INDEX_HEADER = "X-Pulsar-Broker-Entry-METADATA-index"
_BATCH_HEADER = "X-Pulsar-num-batch-message"
_PUBLISH_TIME_HEADER = "X-Pulsar-publish-time"


class NoStreamIndex(Exception):
    """An entry of a stream's topic carries no message index: the broker that wrote it did
    not have `AppendIndexMetadataInterceptor` (or the entry predates it)."""


def stream_index_refusal(admin: PulsarAdmin) -> str | None:
    """Why the brokers cannot number streams, or None when they can. Blocking (one admin
    request); raises nothing."""
    try:
        value = admin.broker_setting(INTERCEPTORS_SETTING)
    except (PulsarAdminError, BackendUnavailable) as e:
        return (
            f"the broker's {INTERCEPTORS_SETTING} cannot be read ({e}; the proxy's Pulsar role "
            "needs to read the broker configuration)"
        )
    interceptors = {part.strip() for part in (value or "").strip("[]").split(",")}
    if INDEX_INTERCEPTOR in interceptors:
        return None
    return f"the broker has {INTERCEPTORS_SETTING}={value or ''} without {INDEX_INTERCEPTOR}"


def missing_index_text(topic: TopicName) -> str:
    return (
        f"topic {topic} has messages without Pulsar's message index, which stream offsets are "
        f"made of: every broker needs {INTERCEPTORS_SETTING}={INDEX_INTERCEPTOR} (messages "
        "written before it was set have no index)"
    )


def entry_index(admin: PulsarAdmin, topic: TopicName, ledger: int, entry: int) -> EntryIndex:
    """The index, batch size and publish time of entry `ledger:entry` of `topic`. Blocking.
    Raises NoStreamIndex (the entry has no index), PulsarAdminError (404: no such entry),
    BackendUnavailable."""
    status, headers, _ = admin.get_entry(topic, ledger, entry)
    index = headers.get(_INDEX_HEADER)
    if index is None:
        raise NoStreamIndex(missing_index_text(topic))
    try:
        published = datetime.datetime.fromisoformat(str(headers[_PUBLISH_TIME_HEADER]))
        return EntryIndex(
            ledger,
            entry,
            int(index),
            int(headers.get(_BATCH_HEADER) or 1),
            round(published.timestamp() * 1000),
        )
    except (KeyError, ValueError) as e:
        raise PulsarAdminError(status, f"unexpected entry answer for {topic}: {e}") from e


def locate(admin: PulsarAdmin, topic: TopicName, index: int) -> IndexLookup:
    """Where the message of `index` is in `topic` (model/streams.py's `locate_index`).
    Blocking. Raises NoStreamIndex, PulsarAdminError, BackendUnavailable."""
    ledgers = admin.ledger_sizes(topic)
    return locate_index(
        ledgers, index, lambda ledger, entry: entry_index(admin, topic, ledger, entry)
    )
