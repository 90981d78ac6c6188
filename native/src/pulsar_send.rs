//! Untracked sends to a pulsar-client producer through its C API, one GIL release per batch.
//!
//! The binding's way (`MessageBuilder`, `content`, `properties`, `build`, `send_async`) costs
//! five pybind11 calls per message, and `send_async` lets go of the GIL each time: another
//! thread waiting for it then takes it, and the trio thread waits to get it back. Here a
//! message is built at once (`Sender.add`: C API calls that take no lock another thread holds)
//! and handed to the producer with the others of its batch in `Sender.send_pending`, which
//! lets go of the GIL once for all of them: the producer's lock may be held by a
//! pulsar-client thread that waits for the GIL (backend/producer_flush.py says when).
//!
//! The addresses of the C API's functions come from Python (`bind`), which finds them with
//! ctypes in the library pulsar-client loads; the producer's address comes from pybind11's
//! conduit, checked by Python before use (backend/producer_flush.py).

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

type SendCallback = extern "C" fn(c_int, *mut c_void, *mut c_void);

type Create = unsafe extern "C" fn() -> *mut c_void;
type SetContent = unsafe extern "C" fn(*mut c_void, *const c_void, usize);
type SetProperty = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char);
type Free = unsafe extern "C" fn(*mut c_void);
type SendAsync = unsafe extern "C" fn(*mut c_void, *mut c_void, SendCallback, *mut c_void);

/// The C API functions used here (pulsar/c/message.h, pulsar/c/producer.h, pulsar/c/message_id.h).
struct Api {
    message_create: Create,
    message_set_content: SetContent,
    message_set_property: SetProperty,
    message_free: Free,
    producer_send_async: SendAsync,
    message_id_free: Free,
}

static API: OnceLock<Api> = OnceLock::new();

/// Set the C API's function addresses, in this order: pulsar_message_create,
/// pulsar_message_set_content, pulsar_message_set_property, pulsar_message_free,
/// pulsar_producer_send_async, pulsar_message_id_free. Only the first call counts.
#[pyfunction]
pub fn bind(addresses: Vec<usize>) -> PyResult<()> {
    if addresses.len() != 6 || addresses.contains(&0) {
        return Err(PyRuntimeError::new_err(
            "bind needs the six C API function addresses",
        ));
    }
    // SAFETY: the caller passes the addresses of these exported functions, whose C
    // prototypes are the ones written in `Api`.
    let api = unsafe {
        Api {
            message_create: std::mem::transmute::<usize, Create>(addresses[0]),
            message_set_content: std::mem::transmute::<usize, SetContent>(addresses[1]),
            message_set_property: std::mem::transmute::<usize, SetProperty>(addresses[2]),
            message_free: std::mem::transmute::<usize, Free>(addresses[3]),
            producer_send_async: std::mem::transmute::<usize, SendAsync>(addresses[4]),
            message_id_free: std::mem::transmute::<usize, Free>(addresses[5]),
        }
    };
    let _ = API.set(api);
    Ok(())
}

fn api() -> PyResult<&'static Api> {
    API.get()
        .ok_or_else(|| PyRuntimeError::new_err("the C API is not bound (call bind first)"))
}

/// pulsar-client calls it on one of its threads with the send's outcome. On success it
/// passes a message id made for the callback, which the callback frees; nothing else is
/// done here: the flush that follows reports the outcome of the untracked sends.
extern "C" fn on_sent(_result: c_int, message_id: *mut c_void, _ctx: *mut c_void) {
    if !message_id.is_null() {
        if let Some(api) = API.get() {
            // SAFETY: the id was allocated by pulsar-client for this callback.
            unsafe { (api.message_id_free)(message_id) };
        }
    }
}

/// Whose turn it is to hand messages to the producer: `send_pending` takes a ticket with the
/// GIL, in the order the messages were added, and hands them over without it, in ticket
/// order. Two threads may call it (the trio thread, and a worker thread's blocking flush);
/// without turns, the later batch could overtake the earlier one on the topic.
struct Turns {
    serving: Mutex<u64>,
    changed: Condvar,
}

impl Turns {
    fn serving(&self) -> std::sync::MutexGuard<'_, u64> {
        // Nothing panics while holding it; a poisoned lock still holds a valid counter.
        self.serving.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The untracked sends of one producer, built and waiting to be handed over.
#[pyclass(module = "starlight_py.amqp._native")]
pub struct Sender {
    producer: usize,
    /// pulsar_message_t pointers, owned here until sent.
    pending: Vec<usize>,
    /// The ticket the next `send_pending` takes.
    next_ticket: u64,
    turns: Arc<Turns>,
    /// Scratch for the properties as NUL-terminated strings, and where each key and
    /// value starts in it.
    scratch: Vec<u8>,
    offsets: Vec<(usize, usize)>,
}

impl Sender {
    /// The properties as "key\0value\0..." in `scratch`, or false when one is not a str
    /// or holds a NUL (the C API takes C strings: Python sends those).
    fn encode_properties(&mut self, properties: &Bound<'_, PyDict>) -> bool {
        self.scratch.clear();
        self.offsets.clear();
        for (key, value) in properties.iter() {
            let (Ok(key), Ok(value)) = (key.downcast::<PyString>(), value.downcast::<PyString>())
            else {
                return false;
            };
            let (Ok(key), Ok(value)) = (key.to_str(), value.to_str()) else {
                return false;
            };
            if key.as_bytes().contains(&0) || value.as_bytes().contains(&0) {
                return false;
            }
            let key_at = self.scratch.len();
            self.scratch.extend_from_slice(key.as_bytes());
            self.scratch.push(0);
            self.offsets.push((key_at, self.scratch.len()));
            self.scratch.extend_from_slice(value.as_bytes());
            self.scratch.push(0);
        }
        true
    }
}

#[pymethods]
impl Sender {
    /// `producer`: the address of the pulsar::Producer (the C API's pulsar_producer_t),
    /// which must outlive the sender's sends.
    #[new]
    fn new(producer: usize) -> PyResult<Self> {
        api()?;
        if producer == 0 {
            return Err(PyRuntimeError::new_err("no producer"));
        }
        Ok(Sender {
            producer,
            pending: Vec::new(),
            next_ticket: 0,
            turns: Arc::new(Turns {
                serving: Mutex::new(0),
                changed: Condvar::new(),
            }),
            scratch: Vec::new(),
            offsets: Vec::new(),
        })
    }

    /// Build a message of `body` (bytes) and `properties` (str to str) and keep it for
    /// `send_pending`. False (nothing kept) when the C API cannot carry them: then the
    /// caller sends it its own way, after `send_pending`.
    fn add(&mut self, body: &Bound<'_, PyAny>, properties: &Bound<'_, PyDict>) -> PyResult<bool> {
        let Ok(body) = body.downcast::<PyBytes>() else {
            return Ok(false);
        };
        if !self.encode_properties(properties) {
            return Ok(false);
        }
        let api = api()?;
        let data = body.as_bytes();
        // SAFETY: C API calls on a message made here; the strings are NUL-terminated
        // slices of `scratch`, which the C API copies.
        unsafe {
            let message = (api.message_create)();
            (api.message_set_content)(message, data.as_ptr() as *const c_void, data.len());
            let base = self.scratch.as_ptr() as *const c_char;
            for &(key_at, value_at) in &self.offsets {
                (api.message_set_property)(message, base.add(key_at), base.add(value_at));
            }
            self.pending.push(message as usize);
        }
        Ok(true)
    }

    /// Hand every kept message to the producer, in the order they were added, with the GIL
    /// let go once; returns how many. It returns once everything added before the call was
    /// handed over, by this call or by another thread's, so that what the caller sends next
    /// (through the binding) comes after it.
    fn send_pending(slf: &Bound<'_, Self>) -> PyResult<usize> {
        let api = api()?;
        let (producer, pending, ticket, turns) = {
            let mut me = slf.borrow_mut();
            if me.pending.is_empty() && *me.turns.serving() == me.next_ticket {
                return Ok(0); // nothing kept, nothing being handed over
            }
            let ticket = me.next_ticket;
            me.next_ticket += 1;
            (
                me.producer,
                std::mem::take(&mut me.pending),
                ticket,
                Arc::clone(&me.turns),
            )
        };
        let count = pending.len();
        slf.py().allow_threads(move || {
            let mut serving = turns.serving();
            while *serving != ticket {
                serving = turns
                    .changed
                    .wait(serving)
                    .unwrap_or_else(|e| e.into_inner());
            }
            drop(serving);
            for message in pending {
                // SAFETY: the producer outlives its sender; each message was made by
                // pulsar_message_create and is sent and freed once (sendAsync keeps its
                // own reference to the built message).
                unsafe {
                    (api.producer_send_async)(
                        producer as *mut c_void,
                        message as *mut c_void,
                        on_sent,
                        std::ptr::null_mut(),
                    );
                    (api.message_free)(message as *mut c_void);
                }
            }
            *turns.serving() += 1;
            turns.changed.notify_all();
        });
        Ok(count)
    }

    /// How many messages wait for `send_pending`.
    #[getter]
    fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Free the kept messages without sending them.
    fn discard(&mut self) -> PyResult<usize> {
        let count = self.pending.len();
        if count > 0 {
            let api = api()?;
            for message in self.pending.drain(..) {
                // SAFETY: made by pulsar_message_create, never sent.
                unsafe { (api.message_free)(message as *mut c_void) };
            }
        }
        Ok(count)
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        if let Some(api) = API.get() {
            for message in self.pending.drain(..) {
                // SAFETY: made by pulsar_message_create, never sent.
                unsafe { (api.message_free)(message as *mut c_void) };
            }
        }
    }
}
