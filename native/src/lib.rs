//! The per-message AMQP frame work of starlight-py, compiled.
//!
//! `starlight_py.amqp._native` does two things the interpreter spends most of a message's
//! codec time on (docs/performance.md, "The hot frames in Rust"):
//!
//! - `scan` splits a connection's input buffer into frames and joins each complete, regular
//!   basic.publish (method, content header, one body frame or none, all on one channel) into
//!   one item, with its exchange and routing key decoded;
//! - `encode_deliver` writes basic.deliver with its content header and body frames.
//!
//! It also holds the untracked Pulsar sends (`Sender`, in `pulsar_send`): messages built with
//! pulsar-client's C API and handed to the producer a batch per release of the GIL; and the
//! acknowledgements of received messages (`acknowledge`, in `pulsar_ack`), the same way, and
//! as one list per call (`acknowledge_listened_list`, in `pulsar_ack_list`, through a little
//! C++: src/acknowledge_list.cpp); and
//! the messages pulsar-client's listener thread hands over (`next_batches`, in `pulsar_listen`);
//! and producer flushes whose outcomes reach trio without the GIL (`flush`, in `pulsar_flush`);
//! and the heartbeats of parked client connections (`ParkedBeats`, in `parked_beats`).
//!
//! `scan` and `encode_deliver` are pure: bytes in, Python values out, no state and no I/O. `scan` never reports an
//! error: it stops at the first frame that is incomplete or breaks the stream, and the
//! Python decoder (`starlight_py.amqp.framing.FrameDecoder`) takes the rest from there, so
//! every error keeps one wording, in one place. Anything irregular about a publish (another
//! channel in between, a body in several frames, a name that is not UTF-8, a size over the
//! limit) leaves its frames as they came, for the Python checks to judge.

mod handover_signal;
mod parked_beats;
mod pulsar_ack;
mod pulsar_ack_list;
mod pulsar_flush;
mod pulsar_listen;
mod pulsar_send;

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

const FRAME_METHOD: u8 = 1;
const FRAME_HEADER: u8 = 2;
const FRAME_BODY: u8 = 3;
const FRAME_HEARTBEAT: u8 = 8;
const FRAME_END: u8 = 0xCE;
/// The item type of a joined publish (`framing.FRAME_MESSAGE`): no AMQP frame has type 0.
const FRAME_MESSAGE: u8 = 0;
const BASIC_CLASS: u16 = 60;
const BASIC_PUBLISH: u32 = (60 << 16) | 40;

/// One complete, well-formed frame of the buffer.
struct Frame<'a> {
    kind: u8,
    channel: u16,
    payload: &'a [u8],
    /// Offset just past its end byte.
    next: usize,
}

/// The frame at `offset`, or None when it is incomplete or breaks the stream (the Python
/// decoder then reports it, or waits for more bytes).
fn frame_at(buf: &[u8], offset: usize, size_limit: u64) -> Option<Frame<'_>> {
    if buf.len() < offset + 7 {
        return None;
    }
    let kind = buf[offset];
    if !matches!(
        kind,
        FRAME_METHOD | FRAME_HEADER | FRAME_BODY | FRAME_HEARTBEAT
    ) {
        return None;
    }
    let channel = u16::from_be_bytes([buf[offset + 1], buf[offset + 2]]);
    let size = u32::from_be_bytes([
        buf[offset + 3],
        buf[offset + 4],
        buf[offset + 5],
        buf[offset + 6],
    ]);
    if u64::from(size) > size_limit {
        return None;
    }
    let end = offset + 7 + size as usize;
    if buf.len() <= end || buf[end] != FRAME_END {
        return None;
    }
    Some(Frame {
        kind,
        channel,
        payload: &buf[offset + 7..end],
        next: end + 1,
    })
}

/// A shortstr at `pos`: its text and the position after it, if it is there and UTF-8.
fn short_string(data: &[u8], pos: usize) -> Option<(&str, usize)> {
    let length = *data.get(pos)? as usize;
    let text = data.get(pos + 1..pos + 1 + length)?;
    Some((std::str::from_utf8(text).ok()?, pos + 1 + length))
}

/// basic.publish's exchange, routing key and bits (mandatory 1, immediate 2).
fn publish_fields(payload: &[u8]) -> Option<(&str, &str, u8)> {
    // class and method ids (4 bytes), then the deprecated ticket (2 bytes)
    let (exchange, pos) = short_string(payload, 6)?;
    let (routing_key, pos) = short_string(payload, pos)?;
    Some((exchange, routing_key, *payload.get(pos)?))
}

fn method_index(payload: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(payload.get(0..4)?.try_into().ok()?))
}

/// The publish starting with the method frame `method`, when it is regular and whole in the
/// buffer: (exchange, routing key, bits, raw properties, body size, body, next offset).
#[allow(clippy::type_complexity)]
fn joined_publish<'a>(
    buf: &'a [u8],
    method: &Frame<'a>,
    size_limit: u64,
    max_message_size: u64,
) -> Option<(&'a str, &'a str, u8, &'a [u8], u64, &'a [u8], usize)> {
    if method.channel == 0 || method_index(method.payload)? != BASIC_PUBLISH {
        return None;
    }
    let (exchange, routing_key, bits) = publish_fields(method.payload)?;
    let header = frame_at(buf, method.next, size_limit)?;
    if header.kind != FRAME_HEADER || header.channel != method.channel || header.payload.len() < 14
    {
        return None;
    }
    let class_id = u16::from_be_bytes([header.payload[0], header.payload[1]]);
    let body_size = u64::from_be_bytes(header.payload[4..12].try_into().ok()?);
    if class_id != BASIC_CLASS || body_size > max_message_size {
        return None;
    }
    let raw_properties = &header.payload[12..];
    if body_size == 0 {
        return Some((
            exchange,
            routing_key,
            bits,
            raw_properties,
            0,
            &[],
            header.next,
        ));
    }
    let body = frame_at(buf, header.next, size_limit)?;
    if body.kind != FRAME_BODY
        || body.channel != method.channel
        || body.payload.len() as u64 != body_size
    {
        return None;
    }
    Some((
        exchange,
        routing_key,
        bits,
        raw_properties,
        body_size,
        body.payload,
        body.next,
    ))
}

/// Split `buffer` (a bytearray, not changed) into items, from its start: `(frame type,
/// channel, payload)` for a frame, `(0, channel, exchange, routing key, bits, raw properties,
/// body size, body)` for a whole regular basic.publish. Returns the items and how many
/// bytes they took; what follows is an incomplete frame or one the caller must judge.
#[pyfunction]
fn scan<'py>(
    py: Python<'py>,
    buffer: &Bound<'py, PyAny>,
    size_limit: u64,
    max_message_size: u64,
) -> PyResult<(Bound<'py, PyList>, usize)> {
    // While the buffer is exported, a bytearray cannot be resized: the slice stays valid.
    let view = PyBuffer::<u8>::get(buffer)?;
    let buf: &[u8] = if view.len_bytes() == 0 {
        &[]
    } else if view.is_c_contiguous() {
        // SAFETY: a contiguous buffer of u8 held exported for the lifetime of `view`.
        unsafe { std::slice::from_raw_parts(view.buf_ptr() as *const u8, view.len_bytes()) }
    } else {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "scan needs a contiguous buffer",
        ));
    };
    let items = PyList::empty(py);
    let mut offset = 0;
    while let Some(frame) = frame_at(buf, offset, size_limit) {
        if frame.kind == FRAME_METHOD {
            if let Some((exchange, routing_key, bits, raw, body_size, body, next)) =
                joined_publish(buf, &frame, size_limit, max_message_size)
            {
                let item = PyTuple::new(
                    py,
                    [
                        FRAME_MESSAGE.into_pyobject(py)?.into_any(),
                        frame.channel.into_pyobject(py)?.into_any(),
                        PyString::new(py, exchange).into_any(),
                        PyString::new(py, routing_key).into_any(),
                        bits.into_pyobject(py)?.into_any(),
                        PyBytes::new(py, raw).into_any(),
                        body_size.into_pyobject(py)?.into_any(),
                        PyBytes::new(py, body).into_any(),
                    ],
                )?;
                items.append(item)?;
                offset = next;
                continue;
            }
        }
        let item = PyTuple::new(
            py,
            [
                frame.kind.into_pyobject(py)?.into_any(),
                frame.channel.into_pyobject(py)?.into_any(),
                PyBytes::new(py, frame.payload).into_any(),
            ],
        )?;
        items.append(item)?;
        offset = frame.next;
    }
    drop(view);
    Ok((items, offset))
}

/// Writes into a buffer of the exact size needed.
struct Writer<'a> {
    out: &'a mut [u8],
    pos: usize,
}

impl Writer<'_> {
    fn put(&mut self, data: &[u8]) {
        self.out[self.pos..self.pos + data.len()].copy_from_slice(data);
        self.pos += data.len();
    }

    fn frame_header(&mut self, kind: u8, channel: u16, size: usize) {
        self.put(&[kind]);
        self.put(&channel.to_be_bytes());
        self.put(&(size as u32).to_be_bytes());
    }
}

/// basic.deliver with its content header and body frames, as `hot_frames.encode_deliver`
/// (the Python reference): `consumer_tag` is already a shortstr.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn encode_deliver<'py>(
    py: Python<'py>,
    channel: u16,
    consumer_tag: &[u8],
    delivery_tag: u64,
    redelivered: bool,
    exchange: &str,
    routing_key: &str,
    raw_properties: &[u8],
    body: &[u8],
    frame_max: usize,
) -> PyResult<Bound<'py, PyBytes>> {
    if exchange.len() > 255 || routing_key.len() > 255 {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "a name longer than a shortstr",
        ));
    }
    let chunk = frame_max.saturating_sub(8).max(1);
    let arguments = consumer_tag.len() + 9 + 1 + exchange.len() + 1 + routing_key.len();
    let body_frames = body.len().div_ceil(chunk);
    let size =
        7 + 4 + arguments + 1 + 7 + 12 + raw_properties.len() + 1 + body.len() + 8 * body_frames;
    PyBytes::new_with(py, size, |out: &mut [u8]| {
        let mut w = Writer { out, pos: 0 };
        w.frame_header(FRAME_METHOD, channel, 4 + arguments);
        w.put(&BASIC_CLASS.to_be_bytes());
        w.put(&60u16.to_be_bytes());
        w.put(consumer_tag);
        w.put(&delivery_tag.to_be_bytes());
        w.put(&[u8::from(redelivered)]);
        for name in [exchange, routing_key] {
            w.put(&[name.len() as u8]);
            w.put(name.as_bytes());
        }
        w.put(&[FRAME_END]);
        w.frame_header(FRAME_HEADER, channel, 12 + raw_properties.len());
        w.put(&BASIC_CLASS.to_be_bytes());
        w.put(&0u16.to_be_bytes());
        w.put(&(body.len() as u64).to_be_bytes());
        w.put(raw_properties);
        w.put(&[FRAME_END]);
        for piece in body.chunks(chunk) {
            w.frame_header(FRAME_BODY, channel, piece.len());
            w.put(piece);
            w.put(&[FRAME_END]);
        }
        debug_assert_eq!(w.pos, size);
        Ok(())
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(scan, m)?)?;
    m.add_function(wrap_pyfunction!(encode_deliver, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_send::bind, m)?)?;
    m.add_class::<pulsar_send::Sender>()?;
    m.add_class::<parked_beats::ParkedBeats>()?;
    m.add_function(wrap_pyfunction!(pulsar_ack::bind_acknowledge, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_ack::acknowledge, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_ack::message_id_address, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_listen::bind_listening, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_listen::listener_address, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_listen::wake_reader, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_listen::budget_listened, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_listen::next_batches, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_listen::take_listened, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_listen::attach_listen_signal, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_listen::detach_listen_signal, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_listen::acknowledge_listened, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_ack_list::bind_acknowledge_list, m)?)?;
    m.add_function(wrap_pyfunction!(
        pulsar_ack_list::acknowledge_listened_list,
        m
    )?)?;
    m.add_function(wrap_pyfunction!(
        pulsar_listen::negative_acknowledge_listened,
        m
    )?)?;
    m.add_class::<pulsar_listen::ListenedMessage>()?;
    m.add_function(wrap_pyfunction!(pulsar_flush::bind_flush, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_flush::flush, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_flush::attach_flush_signal, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_flush::detach_flush_signal, m)?)?;
    m.add_function(wrap_pyfunction!(pulsar_flush::take_flushed, m)?)?;
    Ok(())
}
