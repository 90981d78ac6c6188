//! Flush outcomes handed to trio without the GIL.
//!
//! pulsar-client calls a flush's callback on its I/O thread. Through ctypes, that callback
//! takes the GIL, and first makes a Python thread state for the thread (and frees it
//! after): a few system calls and allocations per flush, and, while the GIL is busy, none
//! of the client's I/O moves. Here the callback (`on_flushed`) only queues the outcome and,
//! when the queue was empty, writes to an eventfd that a trio task waits on
//! (gateway/bridge.py). That task takes the queue whole (`take_flushed`) and runs
//! the flushes' Python callbacks on the trio thread.
//!
//! When no task waits (none attached its eventfd: tests of a producer alone, or after the
//! proxy stopped), the callback calls Python's fallback with the GIL, as ctypes did.

use crate::handover_signal::Signal;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard, OnceLock};

type ResultCallback = extern "C" fn(c_int, *mut c_void);
type FlushAsync = unsafe extern "C" fn(*mut c_void, ResultCallback, *mut c_void);

struct Outcomes {
    /// (key, pulsar result) of each flush done since the last take.
    queue: Vec<(u64, c_int)>,
    signal: Signal,
}

static OUTCOMES: Mutex<Outcomes> = Mutex::new(Outcomes {
    queue: Vec::new(),
    signal: Signal::new(),
});

/// pulsar_producer_flush_async.
static FLUSH: OnceLock<FlushAsync> = OnceLock::new();
/// Python's `fallback(key, result)`, called with the GIL when no eventfd is attached.
static FALLBACK: OnceLock<Py<PyAny>> = OnceLock::new();

fn outcomes() -> MutexGuard<'static, Outcomes> {
    // Nothing panics while holding it; a poisoned lock still holds a valid queue.
    OUTCOMES.lock().unwrap_or_else(|e| e.into_inner())
}

/// The flush's callback, on a pulsar-client thread (or on the flushing thread, at once).
/// `ctx` is the flush's key; 0: nobody waits for its outcome.
extern "C" fn on_flushed(result: c_int, ctx: *mut c_void) {
    let key = ctx as u64;
    if key == 0 {
        return;
    }
    {
        let mut outcomes = outcomes();
        if outcomes.signal.attached() {
            outcomes.queue.push((key, result));
            outcomes.signal.notify();
            return;
        }
    }
    // SAFETY: reads the interpreter's state; no GIL needed. Past the end of the process's
    // interpreter, nobody is left to tell.
    if unsafe { pyo3::ffi::Py_IsInitialized() } == 0 {
        return;
    }
    // A panic must not unwind into pulsar-client's C++ frames.
    let _ = std::panic::catch_unwind(|| {
        Python::with_gil(|py| {
            if let Some(fallback) = FALLBACK.get() {
                if let Err(e) = fallback.call1(py, (key, result)) {
                    e.write_unraisable(py, None);
                }
            }
        })
    });
}

/// Set pulsar_producer_flush_async's address and Python's fallback for outcomes that come
/// while no eventfd is attached. Only the first call counts.
#[pyfunction]
pub fn bind_flush(address: usize, fallback: PyObject) -> PyResult<()> {
    if address == 0 {
        return Err(PyRuntimeError::new_err(
            "bind_flush needs the function's address",
        ));
    }
    // SAFETY: the caller passes the address of pulsar_producer_flush_async, whose C
    // prototype is FlushAsync.
    let flush = unsafe { std::mem::transmute::<usize, FlushAsync>(address) };
    let _ = FLUSH.set(flush);
    let _ = FALLBACK.set(fallback);
    Ok(())
}

/// Ask the (checked) C++ producer at `producer` to send what it batched; the outcome comes
/// back with `key` (0: nobody waits for it). The GIL is let go of for the call: the
/// producer's lock may be held by a pulsar-client thread that waits for it.
#[pyfunction]
pub fn flush(py: Python<'_>, producer: usize, key: u64) -> PyResult<()> {
    let flush = *FLUSH
        .get()
        .ok_or_else(|| PyRuntimeError::new_err("flush is not bound (call bind_flush first)"))?;
    py.allow_threads(|| {
        // SAFETY: a producer pulsar-client made, kept alive by its owner; the key is only
        // carried back to on_flushed.
        unsafe { flush(producer as *mut c_void, on_flushed, key as *mut c_void) }
    });
    Ok(())
}

/// From now on, outcomes are queued and `fd` (an eventfd) is written when the queue gets
/// its first one. False, and nothing changes, when an eventfd is attached already.
#[pyfunction]
pub fn attach_flush_signal(fd: c_int) -> bool {
    outcomes().signal.attach(fd)
}

/// Outcomes go to Python's fallback again; returns those still queued. After this the
/// eventfd may be closed.
#[pyfunction]
pub fn detach_flush_signal() -> Vec<(u64, c_int)> {
    let mut outcomes = outcomes();
    outcomes.signal.detach();
    std::mem::take(&mut outcomes.queue)
}

/// Every outcome queued since the last take, in the order they came. Read the eventfd
/// first: an outcome queued after this call writes it again.
#[pyfunction]
pub fn take_flushed() -> Vec<(u64, c_int)> {
    let mut outcomes = outcomes();
    outcomes.signal.taken();
    std::mem::take(&mut outcomes.queue)
}
