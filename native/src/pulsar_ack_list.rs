//! Acknowledgements of listened messages as one list per call (src/acknowledge_list.cpp):
//! with pulsar-client's acknowledgement grouping turned off, each call is one CommandAck to
//! the broker, and consumers keep no grouping timer.
//!
//! The ids are taken with the C API (`pulsar_message_get_message_id`, one copy per message,
//! freed after the call); the address of `pulsar::Consumer::acknowledgeAsync` for a vector
//! of ids comes from Python (`bind_acknowledge_list`), which finds it by its mangled name.

use crate::pulsar_listen::{api, message_pointers};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use std::ffi::c_void;
use std::sync::OnceLock;

extern "C" {
    fn starlight_acknowledge_list(
        function: *mut c_void,
        consumer: *mut c_void,
        ids: *const *const c_void,
        count: usize,
    ) -> usize;
}

/// The address of `pulsar::Consumer::acknowledgeAsync(const std::vector<MessageId>&,
/// const std::function<void(Result)>&)`.
static ACKNOWLEDGE_LIST: OnceLock<usize> = OnceLock::new();

/// Set the address of pulsar-client's list acknowledgement. Only the first call counts.
#[pyfunction]
pub fn bind_acknowledge_list(address: usize) -> PyResult<()> {
    if address == 0 {
        return Err(PyRuntimeError::new_err("no list acknowledgement function"));
    }
    let _ = ACKNOWLEDGE_LIST.set(address);
    Ok(())
}

/// Acknowledge `messages` (ListenedMessages the consumer at `consumer`, the C API's
/// pulsar_consumer_t, received; it must outlive the call) in one call to pulsar-client,
/// letting go of the GIL once. Returns how many; acknowledges none when one is not a
/// ListenedMessage (TypeError).
#[pyfunction]
pub fn acknowledge_listened_list(
    py: Python<'_>,
    consumer: usize,
    messages: &Bound<'_, PyList>,
) -> PyResult<usize> {
    let api = api()?;
    let function = *ACKNOWLEDGE_LIST.get().ok_or_else(|| {
        PyRuntimeError::new_err("list acknowledgements are not bound (call bind_acknowledge_list)")
    })?;
    if consumer == 0 {
        return Err(PyRuntimeError::new_err("no consumer"));
    }
    let pointers = message_pointers(messages)?;
    if pointers.is_empty() {
        return Ok(0);
    }
    let get_message_id = api.get_message_id;
    let message_id_free = api.message_id_free;
    // The messages stay alive (held by `messages`) while their ids are copied out.
    let acknowledged = py.allow_threads(move || {
        let mut ids: Vec<*const c_void> = Vec::with_capacity(pointers.len());
        for pointer in &pointers {
            // SAFETY: a live message; the copy is freed below.
            let id = unsafe { get_message_id(*pointer as *mut c_void) };
            if !id.is_null() {
                ids.push(id as *const c_void);
            }
        }
        // SAFETY: live ids (pulsar_message_id_t holds a pulsar::MessageId as its only
        // member), a live consumer (pulsar_consumer_t holds a pulsar::Consumer likewise),
        // and `function` the member function the C++ side expects.
        let count = unsafe {
            starlight_acknowledge_list(
                function as *mut c_void,
                consumer as *mut c_void,
                ids.as_ptr(),
                ids.len(),
            )
        };
        for id in ids {
            // SAFETY: each id was copied out above and is freed once.
            unsafe { message_id_free(id as *mut c_void) };
        }
        count
    });
    Ok(acknowledged)
}
