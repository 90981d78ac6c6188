//! Acknowledgements of received messages through pulsar-client's C API, one GIL release per
//! batch.
//!
//! The binding's `Consumer.acknowledge` waits for the acknowledgement's result (a promise
//! and a future per message) and lets go of the GIL while it waits. Here the ids of a batch
//! are taken with the GIL (`message_id()` and pybind11's conduit, which hands out the C++
//! `pulsar::MessageId` each Python id wraps: the C API's pulsar_message_id_t), then given to
//! `pulsar_consumer_acknowledge_async_id` with the GIL let go once. pulsar-client groups
//! acknowledgements itself and sends them within its grouping time.

use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyList, PyTuple};
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

type ResultCallback = extern "C" fn(c_int, *mut c_void);
type AcknowledgeId = unsafe extern "C" fn(*mut c_void, *mut c_void, ResultCallback, *mut c_void);

struct AckApi {
    acknowledge_id: AcknowledgeId,
    /// The conduit's arguments: (pybind11's ABI id, a capsule of pulsar::MessageId's
    /// type_info, b"raw_pointer_ephemeral").
    conduit_args: Py<PyTuple>,
}

static ACK_API: OnceLock<AckApi> = OnceLock::new();

/// Set the address of pulsar_consumer_acknowledge_async_id and the conduit's ABI id and
/// type_info capsule for pulsar::MessageId. Only the first call counts.
#[pyfunction]
pub fn bind_acknowledge(
    py: Python<'_>,
    address: usize,
    abi: &Bound<'_, PyBytes>,
    type_info: &Bound<'_, PyCapsule>,
) -> PyResult<()> {
    if address == 0 {
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
    let _ = ACK_API.set(AckApi {
        acknowledge_id,
        conduit_args: args.unbind(),
    });
    Ok(())
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
    // The Python ids stay alive (held here) until the C API has copied them.
    let mut ids = Vec::with_capacity(messages.len());
    let mut pointers = Vec::with_capacity(messages.len());
    for message in messages.iter() {
        let id = message
            .getattr(intern!(py, "raw"))?
            .call_method0(intern!(py, "message_id"))?;
        let capsule = id.call_method1(intern!(py, "_pybind11_conduit_v1_"), args)?;
        let capsule = capsule.downcast::<PyCapsule>()?;
        let pointer = capsule.pointer() as usize;
        if pointer == 0 {
            return Err(PyRuntimeError::new_err(
                "pybind11's conduit handed out no message id",
            ));
        }
        pointers.push(pointer);
        ids.push(id);
    }
    let count = pointers.len();
    let acknowledge_id = api.acknowledge_id;
    py.allow_threads(move || {
        for pointer in pointers {
            // SAFETY: a live pulsar::MessageId (held in `ids`), which the C API's
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
    drop(ids);
    Ok(count)
}
