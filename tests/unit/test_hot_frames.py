"""The struct codec of the per-message frames must be byte for byte what pamqp makes, and
decode what pamqp decodes (amqp/hot_frames.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands, header
from pamqp import frame as pamqp_frame

from starlight_py.amqp import hot_frames
from starlight_py.amqp.errors import FrameError
from starlight_py.amqp.framing import FRAME_OVERHEAD, encode_content_raw

# Names pamqp agrees to encode (it checks exchange names against [a-zA-Z0-9-_.:]); the
# struct codec takes any UTF-8 name of up to 255 bytes (test below).
NAMES = st.text("abcXYZ019-_.:", max_size=60)
TAGS = st.integers(0, 2**63 - 1)  # pamqp packs long-longs signed
CHANNELS = st.integers(1, 65535)
FRAME_MAXES = st.sampled_from([4096, 131072]) | st.integers(FRAME_OVERHEAD + 1, 300)


@given(
    channel=CHANNELS,
    consumer_tag=NAMES,
    delivery_tag=TAGS,
    redelivered=st.booleans(),
    exchange=NAMES,
    routing_key=NAMES,
    body=st.binary(max_size=1000),
    frame_max=FRAME_MAXES,
)
def test_deliver_is_what_pamqp_encodes(
    channel: int,
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    body: bytes,
    frame_max: int,
) -> None:
    raw_properties = header.ContentHeader(
        0, 0, commands.Basic.Properties(content_type="text/plain", delivery_mode=2)
    ).marshal()[12:]
    method = commands.Basic.Deliver(consumer_tag, delivery_tag, redelivered, exchange, routing_key)
    expected = encode_content_raw(channel, method, raw_properties, body, frame_max)
    assert (
        hot_frames.encode_deliver(
            channel,
            hot_frames.short_string(consumer_tag),
            delivery_tag,
            redelivered,
            exchange,
            routing_key,
            raw_properties,
            body,
            frame_max,
        )
        == expected
    )


@given(channel=CHANNELS, tag=TAGS, multiple=st.booleans(), ok=st.booleans())
def test_confirms_are_what_pamqp_encodes(channel: int, tag: int, multiple: bool, ok: bool) -> None:
    method = (
        commands.Basic.Ack(tag, multiple)
        if ok
        else commands.Basic.Nack(tag, multiple, requeue=False)
    )
    assert hot_frames.encode_confirm(channel, tag, multiple, ok) == pamqp_frame.marshal(
        method, channel
    )


def _payload(method: object) -> bytes:
    data = pamqp_frame.marshal(method, 1)  # type: ignore[arg-type]
    return data[7:-1]


@given(exchange=NAMES, routing_key=NAMES, mandatory=st.booleans(), immediate=st.booleans())
def test_publish_decodes_as_pamqp_does(
    exchange: str, routing_key: str, mandatory: bool, immediate: bool
) -> None:
    payload = _payload(commands.Basic.Publish(0, exchange, routing_key, mandatory, immediate))
    assert hot_frames.decode_publish(payload) == hot_frames.Publish(
        exchange, routing_key, mandatory, immediate
    )


@given(tag=TAGS, multiple=st.booleans(), requeue=st.booleans())
def test_acks_nacks_and_rejects_decode_as_pamqp_does(
    tag: int, multiple: bool, requeue: bool
) -> None:
    ack = hot_frames.decode_ack(_payload(commands.Basic.Ack(tag, multiple)))
    assert (ack.delivery_tag, ack.multiple) == (tag, multiple)
    nack = hot_frames.decode_nack(_payload(commands.Basic.Nack(tag, multiple, requeue)))
    assert (nack.delivery_tag, nack.multiple, nack.requeue) == (tag, multiple, requeue)
    reject = hot_frames.decode_reject(_payload(commands.Basic.Reject(tag, requeue)))
    assert (reject.delivery_tag, reject.requeue) == (tag, requeue)


def test_any_utf8_name_is_encoded_and_decoded() -> None:
    name = "café{1} ✓"
    data = hot_frames.encode_deliver(
        1, hot_frames.short_string(name), 1, False, name, name, b"\x00\x00", b"", 4096
    )
    assert hot_frames.short_string(name) in data
    payload = b"\x00\x3c\x00\x28\x00\x00" + 2 * hot_frames.short_string(name) + b"\x01"
    assert hot_frames.decode_publish(payload) == hot_frames.Publish(name, name, True, False)


def test_hot_methods_carry_the_spec_names_and_ids() -> None:
    assert (hot_frames.Publish.name, hot_frames.Publish.index) == ("Basic.Publish", 0x3C0028)
    assert dict(hot_frames.Ack(5, True)) == {"delivery_tag": 5, "multiple": True}


@pytest.mark.parametrize(
    "payload",
    [
        b"\x00\x3c\x00\x28\x00\x00",  # no exchange length
        b"\x00\x3c\x00\x28\x00\x00\x05ab",  # exchange cut short
        b"\x00\x3c\x00\x28\x00\x00\x00\x00",  # no bits
        b"\x00\x3c\x00\x28\x00\x00\x02\xff\xfe\x00\x00",  # exchange not UTF-8
    ],
)
def test_malformed_publish_is_a_frame_error(payload: bytes) -> None:
    with pytest.raises(FrameError) as raised:
        hot_frames.decode_publish(payload)
    assert raised.value.method == (60, 40)
    assert "cannot decode Basic.Publish" in raised.value.reply_text


@pytest.mark.parametrize(
    ("decode", "ids"),
    [
        (hot_frames.decode_ack, (60, 80)),
        (hot_frames.decode_nack, (60, 120)),
        (hot_frames.decode_reject, (60, 90)),
    ],
)
def test_short_acks_are_frame_errors(decode: object, ids: tuple[int, int]) -> None:
    with pytest.raises(FrameError) as raised:
        decode(b"\x00\x3c\x00\x50\x00\x00\x00")  # type: ignore[operator]
    assert raised.value.method == ids
