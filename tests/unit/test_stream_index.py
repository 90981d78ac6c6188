"""Reading Pulsar's message index (backend/stream_index.py) and numbering what a stream
reader reads (backend/stream_reader.py), against a fake admin API and fake messages."""

from __future__ import annotations

import email.message
from typing import Any

import pytest
import trio

from starlight_py.amqp.errors import PreconditionFailed
from starlight_py.backend.pulsar_admin import BackendUnavailable, PulsarAdminError
from starlight_py.backend.stream_index import (
    INDEX_INTERCEPTOR,
    NoStreamIndex,
    entry_index,
    locate,
    stream_index_refusal,
)
from starlight_py.backend.stream_reader import StreamMessage, StreamReaderHandle
from starlight_py.gateway.consume.stream_consuming import topic_starts
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import TopicName
from starlight_py.model.positions import MessageIdRecord
from starlight_py.model.streams import EntryIndex, IndexLookup, StreamStart

TOPIC = TopicName(NamespaceName("public", "default"), "amq.default~~s")


class FakeAdmin:
    """Entries of one topic: (ledger, entry) -> headers the admin API answers."""

    def __init__(self, entries: dict[tuple[int, int], dict[str, str]], setting: Any = "") -> None:
        self.entries = entries
        self.setting = setting
        self.asked: list[tuple[int, int]] = []

    def broker_setting(self, name: str) -> str | None:
        if isinstance(self.setting, Exception):
            raise self.setting
        assert name == "brokerEntryMetadataInterceptors"
        return str(self.setting)

    def get_entry(self, topic: TopicName, ledger: int, entry: int) -> tuple[int, Any, bytes]:
        self.asked.append((ledger, entry))
        if (ledger, entry) not in self.entries:
            raise PulsarAdminError(404, "Message not found")
        headers = email.message.Message()
        for key, value in self.entries[(ledger, entry)].items():
            headers[key] = value
        return 200, headers, b""

    def ledger_sizes(self, topic: TopicName) -> list[tuple[int, int]]:
        sizes: dict[int, int] = {}
        for ledger, entry in self.entries:
            sizes[ledger] = max(sizes.get(ledger, 0), entry + 1)
        return sorted(sizes.items())


def stored(index: int, batch: int = 0, published: str = "2026-11-27T12:00:00.250Z") -> dict:
    headers = {"X-Pulsar-publish-time": published}
    if index >= 0:
        headers["X-Pulsar-Broker-Entry-METADATA-index"] = str(index)
    if batch:
        headers["X-Pulsar-num-batch-message"] = str(batch)
    return headers


@pytest.mark.parametrize(
    ("setting", "refused"),
    [
        (f"[{INDEX_INTERCEPTOR}]", False),
        (
            f"[org.apache.pulsar.common.intercept.AppendBrokerTimestampMetadataInterceptor, "
            f"{INDEX_INTERCEPTOR}]",
            False,
        ),
        ("[]", True),
        ("", True),
        (PulsarAdminError(403, "not a super-user"), True),
    ],
)
def test_refusal_names_the_missing_interceptor(setting: Any, refused: bool) -> None:
    admin: Any = FakeAdmin({}, setting)
    reason = stream_index_refusal(admin)
    assert (reason is not None) == refused
    if refused:
        assert "brokerEntryMetadataInterceptors" in str(reason)


def test_entry_index_reads_the_headers() -> None:
    admin: Any = FakeAdmin({(3, 5): stored(11, batch=7), (3, 6): stored(12), (3, 7): stored(-1)})
    assert entry_index(admin, TOPIC, 3, 5) == EntryIndex(3, 5, 11, 7, 1795780800250)
    assert entry_index(admin, TOPIC, 3, 6).first_index == 12
    with pytest.raises(NoStreamIndex) as info:
        entry_index(admin, TOPIC, 3, 7)
    assert INDEX_INTERCEPTOR in str(info.value)


def test_locate_through_the_admin_api() -> None:
    admin: Any = FakeAdmin({(3, e): stored(e) for e in range(5)} | {(3, 5): stored(11, batch=7)})
    found = locate(admin, TOPIC, 8)
    assert found == IndexLookup("at", EntryIndex(3, 5, 11, 7, 1795780800250))


class FakeId:
    def __init__(self, ledger: int, entry: int, batch: int) -> None:
        self.values = (ledger, entry, batch)

    def ledger_id(self) -> int:
        return self.values[0]

    def entry_id(self) -> int:
        return self.values[1]

    def batch_index(self) -> int:
        return self.values[2]

    def partition(self) -> int:
        return -1


class FakeRaw:
    def __init__(self, ledger: int, entry: int, batch: int = -1) -> None:
        self.id = FakeId(ledger, entry, batch)

    def data(self) -> bytes:
        return b""

    def properties(self) -> dict[str, str]:
        return {}

    def redelivery_count(self) -> int:
        return 0

    def message_id(self) -> FakeId:
        return self.id


def indexes(handle: StreamReaderHandle, raws: list[FakeRaw]) -> list[int | None]:
    received = handle._received(raws)
    assert all(isinstance(m, StreamMessage) for m in received)
    return [m.index for m in received if isinstance(m, StreamMessage)]


def test_a_reader_asks_once_per_ledger_and_counts_the_rest() -> None:
    asked: list[tuple[int, int]] = []
    entries = {(3, 4): EntryIndex(3, 4, 4), (9, 0): EntryIndex(9, 0, 17, 3)}

    def probe(ledger: int, entry: int) -> EntryIndex:
        asked.append((ledger, entry))
        return entries[(ledger, entry)]

    handle = StreamReaderHandle(TOPIC, "sub", probe)
    batch = [FakeRaw(3, 4), FakeRaw(3, 5, 0), FakeRaw(3, 5, 1), FakeRaw(3, 6)]
    assert indexes(handle, batch) == [4, 5, 6, 7]
    assert indexes(handle, [FakeRaw(9, 0, 0), FakeRaw(9, 0, 2), FakeRaw(9, 1, 0)]) == [15, 17, 18]
    assert asked == [(3, 4), (9, 0)]


def test_a_reader_without_an_index_delivers_none_and_stops_asking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("starlight_py.backend.stream_reader.PROBE_RETRY_WAIT", 0)
    asked: list[tuple[int, int]] = []

    def unindexed(ledger: int, entry: int) -> EntryIndex:
        asked.append((ledger, entry))
        raise NoStreamIndex("no index")

    handle = StreamReaderHandle(TOPIC, "sub", unindexed)
    assert indexes(handle, [FakeRaw(3, 0), FakeRaw(3, 1)]) == [None, None]
    assert asked == [(3, 0)]  # not once per message

    def unavailable(ledger: int, entry: int) -> EntryIndex:
        asked.append((ledger, entry))
        raise BackendUnavailable("down")

    asked.clear()
    handle = StreamReaderHandle(TOPIC, "sub", unavailable)
    assert indexes(handle, [FakeRaw(3, 5, 0), FakeRaw(3, 5, 1)]) == [None, None]
    assert len(asked) == 5  # a few tries for the entry, not for each of its messages


def test_a_numeric_offset_without_an_index_is_a_clear_amqp_error() -> None:
    admin: Any = FakeAdmin({(3, 0): stored(-1), (3, 1): stored(-1)})
    start = StreamStart("offset", offset=1)
    with pytest.raises(PreconditionFailed) as info:
        trio.run(topic_starts, admin, TOPIC.namespace, "s", [TOPIC.local], start)
    assert info.value.text.startswith("cannot start queue 's' at x-stream-offset 1: topic ")
    assert "brokerEntryMetadataInterceptors=" + INDEX_INTERCEPTOR in info.value.text
    # With the index: where the offset is.
    admin = FakeAdmin({(3, 0): stored(0), (3, 1): stored(1)})
    starts = trio.run(topic_starts, admin, TOPIC.namespace, "s", [TOPIC.local], start)
    assert starts == {TOPIC.local: StreamStart("at", position=MessageIdRecord(3, 1), index=1)}
