"""The compiled sender's choices (starlight_py/backend/producer_send.py and
native/src/pulsar_send.rs), without a broker: messages are built with pulsar-client's C API
and kept, or refused for the binding to send; nothing here is ever handed to a producer."""

from __future__ import annotations

from collections.abc import Iterator

import _pulsar
import pytest

from starlight_py.amqp import compiled
from starlight_py.backend import consumer_ack, producer_send
from starlight_py.backend.pulsar_client import ConsumerHandle
from starlight_py.gateway.consume.consuming import runs_by_handle
from starlight_py.model.namespaces import NamespaceName
from starlight_py.model.naming import TopicName

# Never sent to: `send_pending` is not called on this sender.
NO_PRODUCER = 1

pytestmark = pytest.mark.skipif(
    compiled.pulsar_sender is None, reason="the compiled module is not in use"
)


@pytest.fixture
def sender() -> Iterator[producer_send.Sender]:
    assert producer_send.available() is None
    made = producer_send.make_sender(NO_PRODUCER)
    assert made is not None
    yield made
    made.discard()


def test_messages_with_text_properties_are_built_and_kept(sender: producer_send.Sender) -> None:
    assert sender.add(b"body", {"a": "1", "ünï": "çödé ✓"})
    assert sender.add(b"", {})
    assert sender.add(b"\x00" * 10_000, {"k": ""})
    assert sender.pending == 3
    assert sender.discard() == 3
    assert sender.pending == 0


@pytest.mark.parametrize(
    ("body", "properties"),
    [
        (b"x", {"k": "a\x00b"}),  # C strings end at a NUL
        (b"x", {"a\x00b": "v"}),
        (bytearray(b"x"), {}),  # not bytes
        (memoryview(b"x"), {}),
        (b"x", {"k": 1}),  # not str
        (b"x", {"k": "\ud800"}),  # not UTF-8
    ],
)
def test_what_the_c_api_cannot_carry_is_left_to_the_binding(
    sender: producer_send.Sender, body: object, properties: dict[str, str]
) -> None:
    assert not sender.add(body, properties)
    assert sender.pending == 0


def test_a_pulsar_client_whose_c_send_api_was_not_checked_sends_through_the_binding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer_send.available.cache_clear()
    monkeypatch.setattr(producer_send, "_version", lambda: "3.14.0")
    try:
        assert producer_send.available() == (
            "pulsar-client 3.14.0 is not one whose C send API was checked"
        )
        assert producer_send.make_sender(NO_PRODUCER) is None
    finally:
        producer_send.available.cache_clear()


def test_it_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    producer_send.available.cache_clear()
    monkeypatch.setenv("STARLIGHT_NATIVE_PULSAR", "0")
    try:
        assert producer_send.available() == "STARLIGHT_NATIVE_PULSAR=0"
    finally:
        producer_send.available.cache_clear()


class _Message:
    def __init__(self, handle: str, number: int) -> None:
        self.handle = handle
        self.number = number


def test_acknowledgements_go_in_runs_of_one_pulsar_consumer_in_order() -> None:
    messages = [_Message(h, n) for n, h in enumerate("aaabbacc")]
    runs = [(h, [m.number for m in run]) for h, run in runs_by_handle(messages)]
    assert runs == [("a", [0, 1, 2]), ("b", [3, 4]), ("a", [5]), ("c", [6, 7])]
    one = [_Message("a", 0), _Message("a", 1)]
    assert [run for _, run in runs_by_handle(one)] == [one]
    assert list(runs_by_handle([])) == []


class _Binding:
    def __init__(self) -> None:
        self.acknowledged: list[object] = []

    def acknowledge(self, raw: object) -> None:
        self.acknowledged.append(raw)


class _Failing:
    def acknowledge(self, messages: list[object]) -> int:
        raise TypeError("'NoneType' object cannot be converted to 'PyCapsule'")


def test_a_consumer_whose_ids_the_compiled_path_cannot_take_acknowledges_through_the_binding() -> (
    None
):
    handle = ConsumerHandle(TopicName(NamespaceName("public", "default"), "t"), "s")
    binding = _Binding()
    handle._consumer = binding
    handle._acknowledger = _Failing()  # type: ignore[assignment]
    messages = [_Received("a"), _Received("b")]
    handle.acknowledge_all(messages)  # type: ignore[arg-type]
    handle.acknowledge(_Received("c"))  # type: ignore[arg-type]
    assert binding.acknowledged == ["a", "b", "c"]
    assert handle._acknowledger is None


class _Received:
    def __init__(self, raw: object) -> None:
        self.raw = raw


def test_the_compiled_acknowledgement_reads_the_id_each_message_holds() -> None:
    assert consumer_ack.available() is None
    assert compiled.message_id_address is not None
    message = _pulsar.MessageBuilder().content(b"m").build()
    other = _pulsar.MessageBuilder().content(b"m").build()
    first = compiled.message_id_address(message)
    # The id inside the message (not a copy made per call), one per message.
    assert first == compiled.message_id_address(message)
    assert first != compiled.message_id_address(other)


def test_what_is_not_a_pulsar_message_is_refused_before_anything_is_acknowledged() -> None:
    assert consumer_ack.available() is None
    assert compiled.acknowledge is not None
    good = _Received(_pulsar.MessageBuilder().content(b"m").build())
    # A message id where a message belongs: the conduit hands out nothing for it, and the
    # call fails (ConsumerHandle then acknowledges through the binding) before any
    # acknowledgement reaches the consumer address, which is never used here.
    with pytest.raises((TypeError, RuntimeError)):
        compiled.acknowledge(NO_PRODUCER, [good, _Received(_pulsar.MessageId.earliest)])
