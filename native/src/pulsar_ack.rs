//! Acknowledgements of received messages through pulsar-client's C API, one GIL release per
//! batch.
//!
//! The binding's `Consumer.acknowledge` waits for the acknowledgement's result (a promise
//! and a future per message) and lets go of the GIL while it waits. Here the ids of a batch
//! are taken with the GIL: pybind11's conduit hands out the C++ `pulsar::Message` each
//! Python message wraps, and `pulsar::Message::getMessageId()` the id it holds (the C API's
//! pulsar_message_id_t wraps a `pulsar::MessageId` as its only member). They are given to
//! `pulsar_consumer_acknowledge_async_id` with the GIL let go once. pulsar-client groups
//! acknowledgements itself and sends them within its grouping time. (`message_id()` on the
//! Python message would make a new Python id per message.)

use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyList, PyTuple};
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

type ResultCallback = extern "C" fn(c_int, *mut c_void);
type AcknowledgeId = unsafe extern "C" fn(*mut c_void, *mut c_void, ResultCallback, *mut c_void);
/// `const pulsar::MessageId& pulsar::Message::getMessageId() const`: `this` in, the id's
/// address out (the Itanium C++ ABI passes `this` as the first argument).
type GetMessageId = unsafe extern "C" fn(*const c_void) -> *const c_void;

struct AckApi {
    acknowledge_id: AcknowledgeId,
    get_message_id: GetMessageId,
    /// The conduit's arguments: (pybind11's ABI id, a capsule of pulsar::Message's
    /// type_info, b"raw_pointer_ephemeral").
    conduit_args: Py<PyTuple>,
}

static ACK_API: OnceLock<AckApi> = OnceLock::new();

/// Set the addresses of pulsar_consumer_acknowledge_async_id and of
/// pulsar::Message::getMessageId, and the conduit's ABI id and type_info capsule for
/// pulsar::Message. Only the first call counts.
#[pyfunction]
pub fn bind_acknowledge(
    py: Python<'_>,
    address: usize,
    get_id_address: usize,
    abi: &Bound<'_, PyBytes>,
    type_info: &Bound<'_, PyCapsule>,
) -> PyResult<()> {
    if address == 0 || get_id_address == 0 {
        return Err(PyRuntimeError::new_err("no acknowledge function"));
    }
    let args = PyTuple::new(
        py,
        [
            abi.clone().into_any(),
            type_info.clone().into_any(),
            PyBytes::new(py, b"raw_pointer_ephemeral").into_any(),
        ],
    )?;
    // SAFETY: the caller passes the address of pulsar_consumer_acknowledge_async_id, whose
    // C prototype is `AcknowledgeId`.
    let acknowledge_id = unsafe { std::mem::transmute::<usize, AcknowledgeId>(address) };
    // SAFETY: the caller passes the address of pulsar::Message::getMessageId, whose ABI is
    // `GetMessageId`.
    let get_message_id = unsafe { std::mem::transmute::<usize, GetMessageId>(get_id_address) };
    let _ = ACK_API.set(AckApi {
        acknowledge_id,
        get_message_id,
        conduit_args: args.unbind(),
    });
    Ok(())
}

/// The address of the pulsar::Message a `_pulsar.Message` wraps, from pybind11's conduit.
fn message_address(
    py: Python<'_>,
    raw: &Bound<'_, PyAny>,
    args: &Bound<'_, PyTuple>,
) -> PyResult<*const c_void> {
    let capsule = raw.call_method1(intern!(py, "_pybind11_conduit_v1_"), args)?;
    let pointer = capsule.downcast::<PyCapsule>()?.pointer() as *const c_void;
    if pointer.is_null() {
        return Err(PyRuntimeError::new_err(
            "pybind11's conduit handed out no message",
        ));
    }
    Ok(pointer)
}

/// The address of the pulsar::MessageId that `raw` (a `_pulsar.Message`) holds: to check,
/// at start, that the compiled path reads the id the binding's `message_id()` copies.
#[pyfunction]
pub fn message_id_address(py: Python<'_>, raw: &Bound<'_, PyAny>) -> PyResult<usize> {
    let api = ACK_API.get().ok_or_else(|| {
        PyRuntimeError::new_err("acknowledgements are not bound (call bind_acknowledge first)")
    })?;
    let message = message_address(py, raw, api.conduit_args.bind(py))?;
    // SAFETY: a live pulsar::Message (held by `raw`).
    Ok(unsafe { (api.get_message_id)(message) } as usize)
}

/// pulsar-client calls it with the acknowledgement's outcome, on one of its threads:
/// nothing to do (a consumer closed meanwhile: the broker redelivers, at-least-once holds).
extern "C" fn on_acknowledged(_result: c_int, _ctx: *mut c_void) {}

/// Acknowledge each `message.raw` (a `_pulsar.Message`) of `messages` on the consumer at
/// `consumer` (the C API's pulsar_consumer_t, which must outlive the call); returns how many.
#[pyfunction]
pub fn acknowledge(
    py: Python<'_>,
    consumer: usize,
    messages: &Bound<'_, PyList>,
) -> PyResult<usize> {
    let api = ACK_API.get().ok_or_else(|| {
        PyRuntimeError::new_err("acknowledgements are not bound (call bind_acknowledge first)")
    })?;
    if consumer == 0 {
        return Err(PyRuntimeError::new_err("no consumer"));
    }
    let args = api.conduit_args.bind(py);
    // The Python messages stay alive (held here) until the C API has copied their ids.
    let mut raws = Vec::with_capacity(messages.len());
    let mut pointers = Vec::with_capacity(messages.len());
    for message in messages.iter() {
        let raw = message.getattr(intern!(py, "raw"))?;
        let address = message_address(py, &raw, args)?;
        // SAFETY: a live pulsar::Message (held in `raws`); the id lives as long as it.
        let id = unsafe { (api.get_message_id)(address) };
        if id.is_null() {
            return Err(PyRuntimeError::new_err("a message without an id"));
        }
        pointers.push(id as usize);
        raws.push(raw);
    }
    let count = pointers.len();
    let acknowledge_id = api.acknowledge_id;
    py.allow_threads(move || {
        for pointer in pointers {
            // SAFETY: a live pulsar::MessageId (its message held in `raws`), which the C API's
            // pulsar_message_id_t wraps as its only member; the consumer outlives the call.
            unsafe {
                acknowledge_id(
                    consumer as *mut c_void,
                    pointer as *mut c_void,
                    on_acknowledged,
                    std::ptr::null_mut(),
                )
            };
        }
    });
    drop(raws);
    Ok(count)
}
