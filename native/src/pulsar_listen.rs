//! Received messages handed over by pulsar-client's message listener, without the GIL.
//!
//! A consumer subscribed with `on_message` as its C API message listener (and a key of its
//! own as the listener's context) has each message put, on pulsar-client's listener thread,
//! into one queue shared by every such consumer; nothing there touches Python. In the proxy,
//! the listener also writes an eventfd when the queue gets a first message, and a trio task
//! takes everything there at once (`take_listened`, gateway/bridge.py). Elsewhere, one
//! reader thread waits for the queue (`next_batches`, GIL let go). Either turns what it
//! takes into `ListenedMessage`s, grouped by consumer: one hand-over for whatever arrived
//! meanwhile, on every consumer of the process.
//!
//! A `ListenedMessage` owns the C API's message (freed with it) and is acknowledged with it
//! (`acknowledge_listened`, one GIL release per batch). The addresses of the C API's
//! functions come from Python (`bind_listening`), which finds them with ctypes in the
//! library pulsar-client loads (backend/listened.py).

use crate::handover_signal::Signal;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple, PyType};
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

type ResultCallback = extern "C" fn(c_int, *mut c_void);
type GetData = unsafe extern "C" fn(*mut c_void) -> *const c_void;
type GetLength = unsafe extern "C" fn(*mut c_void) -> u32;
type ToPointer = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type MapSize = unsafe extern "C" fn(*mut c_void) -> c_int;
type MapEntry = unsafe extern "C" fn(*mut c_void, c_int) -> *const c_char;
type Free = unsafe extern "C" fn(*mut c_void);
type GetInt = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetTimestamp = unsafe extern "C" fn(*mut c_void) -> u64;
type IdText = unsafe extern "C" fn(*mut c_void) -> *mut c_char;
type AcknowledgeAsync = unsafe extern "C" fn(*mut c_void, *mut c_void, ResultCallback, *mut c_void);
type NegativeAcknowledge = unsafe extern "C" fn(*mut c_void, *mut c_void);
type CFree = unsafe extern "C" fn(*mut c_void);
type PauseListener = unsafe extern "C" fn(*mut c_void) -> c_int;

/// The C API functions used here (pulsar/c/message.h, string_map.h, message_id.h,
/// consumer.h), and MessageIdRecord (the position type the gateway reads).
pub(crate) struct Api {
    get_data: GetData,
    get_length: GetLength,
    get_properties: ToPointer,
    map_size: MapSize,
    map_key: MapEntry,
    map_value: MapEntry,
    map_free: Free,
    redelivery_count: GetInt,
    publish_timestamp: GetTimestamp,
    pub(crate) get_message_id: ToPointer,
    message_id_str: IdText,
    pub(crate) message_id_free: Free,
    message_free: Free,
    acknowledge_async: AcknowledgeAsync,
    negative_acknowledge: NegativeAcknowledge,
    pause_listener: PauseListener,
    c_free: CFree,
    record_type: Py<PyType>,
}

static API: OnceLock<Api> = OnceLock::new();

const BOUND_NAMES: usize = 17;

/// Set the C API's function addresses, in this order: pulsar_message_get_data,
/// pulsar_message_get_length, pulsar_message_get_properties, pulsar_string_map_size,
/// pulsar_string_map_get_key, pulsar_string_map_get_value, pulsar_string_map_free,
/// pulsar_message_get_redelivery_count, pulsar_message_get_publish_timestamp,
/// pulsar_message_get_message_id, pulsar_message_id_str, pulsar_message_id_free,
/// pulsar_message_free, pulsar_consumer_acknowledge_async,
/// pulsar_consumer_negative_acknowledge, pulsar_consumer_pause_message_listener, libc's
/// free; and the type positions are made of
/// (called with ledger, entry, batch index, partition). Only the first call counts.
#[pyfunction]
pub fn bind_listening(addresses: Vec<usize>, record_type: Bound<'_, PyType>) -> PyResult<()> {
    if addresses.len() != BOUND_NAMES || addresses.contains(&0) {
        return Err(PyRuntimeError::new_err(
            "bind_listening needs the seventeen function addresses",
        ));
    }
    // SAFETY: the caller passes the addresses of these exported functions, whose C
    // prototypes are the ones written in `Api`.
    let api = unsafe {
        Api {
            get_data: std::mem::transmute::<usize, GetData>(addresses[0]),
            get_length: std::mem::transmute::<usize, GetLength>(addresses[1]),
            get_properties: std::mem::transmute::<usize, ToPointer>(addresses[2]),
            map_size: std::mem::transmute::<usize, MapSize>(addresses[3]),
            map_key: std::mem::transmute::<usize, MapEntry>(addresses[4]),
            map_value: std::mem::transmute::<usize, MapEntry>(addresses[5]),
            map_free: std::mem::transmute::<usize, Free>(addresses[6]),
            redelivery_count: std::mem::transmute::<usize, GetInt>(addresses[7]),
            publish_timestamp: std::mem::transmute::<usize, GetTimestamp>(addresses[8]),
            get_message_id: std::mem::transmute::<usize, ToPointer>(addresses[9]),
            message_id_str: std::mem::transmute::<usize, IdText>(addresses[10]),
            message_id_free: std::mem::transmute::<usize, Free>(addresses[11]),
            message_free: std::mem::transmute::<usize, Free>(addresses[12]),
            acknowledge_async: std::mem::transmute::<usize, AcknowledgeAsync>(addresses[13]),
            negative_acknowledge: std::mem::transmute::<usize, NegativeAcknowledge>(addresses[14]),
            pause_listener: std::mem::transmute::<usize, PauseListener>(addresses[15]),
            c_free: std::mem::transmute::<usize, CFree>(addresses[16]),
            record_type: record_type.unbind(),
        }
    };
    let _ = API.set(api);
    Ok(())
}

pub(crate) fn api() -> PyResult<&'static Api> {
    API.get().ok_or_else(|| {
        PyRuntimeError::new_err("listening is not bound (call bind_listening first)")
    })
}

/// Messages handed over by pulsar-client and not taken yet: (the consumer's key, the C
/// API's message), in the order they came.
struct Pending {
    messages: Vec<(u64, usize)>,
    /// A reader waits on `ARRIVED` until this many messages are there (0: nobody waits).
    wanted: usize,
    /// Set by `wake_reader`: the waiting reader returns empty-handed.
    woken: bool,
    /// Tells the bridge's trio task (`attach_listen_signal`) that messages came.
    signal: Signal,
    /// Consumers the listener may hand over only so many messages of before it pauses
    /// them (`budget_listened`), by key; a consumer not here has no limit.
    budgets: BTreeMap<u64, Budget>,
}

/// What the listener may still hand over of one consumer.
struct Budget {
    left: u32,
    /// The listener paused the consumer when `left` reached 0.
    paused: bool,
}

static PENDING: Mutex<Pending> = Mutex::new(Pending {
    messages: Vec::new(),
    wanted: 0,
    woken: false,
    signal: Signal::new(),
    budgets: BTreeMap::new(),
});

fn pending() -> std::sync::MutexGuard<'static, Pending> {
    // Nothing panics while holding it; a poisoned lock still holds a valid queue.
    PENDING.lock().unwrap_or_else(|e| e.into_inner())
}
static ARRIVED: Condvar = Condvar::new();

/// The message listener given to pulsar-client (pulsar_message_listener): runs on its
/// listener thread, once per message, with the consumer's key as `ctx`.
extern "C" fn on_message(consumer: *mut c_void, message: *mut c_void, ctx: *mut c_void) {
    let mut pending = pending();
    pending.messages.push((ctx as u64, message as usize));
    if let Some(budget) = pending.budgets.get_mut(&(ctx as u64)) {
        budget.left = budget.left.saturating_sub(1);
        if budget.left == 0 && !budget.paused {
            if let Some(api) = API.get() {
                // SAFETY: the C API's consumer this listener call is for; pausing only
                // stops its next listener calls (the message just handed over stays).
                unsafe { (api.pause_listener)(consumer) };
                budget.paused = true;
            }
        }
    }
    pending.signal.notify();
    if pending.wanted != 0 && pending.messages.len() >= pending.wanted {
        pending.wanted = 0;
        ARRIVED.notify_one();
    }
}

/// From now on the listener hands over at most `most` messages of the consumer `key`
/// before it pauses the consumer (0: no limit, and the key is forgotten). True when the
/// listener had paused it: the caller resumes it (pulsar-client's `resume_message_listener`)
/// unless it wants it paused. The proxy gives each consumer its receiver queue's worth again
/// each time it takes what was handed over, so that a busy trio thread does not leave the
/// listener taking message after message from the broker for a consumer that has no room
/// for them (the broker would have given them to the queue's other consumers).
#[pyfunction]
pub fn budget_listened(key: u64, most: u32) -> bool {
    let mut pending = pending();
    if most == 0 {
        return pending.budgets.remove(&key).is_some_and(|b| b.paused);
    }
    let budget = pending.budgets.entry(key).or_insert(Budget {
        left: most,
        paused: false,
    });
    budget.left = most;
    std::mem::replace(&mut budget.paused, false)
}

/// From now on, `fd` (an eventfd) is written when a message comes to an empty queue, for a
/// trio task that takes them (`take_listened`). False, and nothing changes, when an
/// eventfd is attached already.
#[pyfunction]
pub fn attach_listen_signal(fd: c_int) -> bool {
    pending().signal.attach(fd)
}

/// No eventfd is written any more; it may be closed after this.
#[pyfunction]
pub fn detach_listen_signal() {
    pending().signal.detach();
}

/// The address of the message listener to give pulsar_consumer_configuration_set_message_listener.
#[pyfunction]
pub fn listener_address() -> usize {
    on_message as extern "C" fn(*mut c_void, *mut c_void, *mut c_void) as usize
}

/// Wake a reader waiting in `next_batches` (it returns what is there, maybe nothing).
#[pyfunction]
pub fn wake_reader() {
    let mut pending = pending();
    pending.woken = true;
    ARRIVED.notify_all();
}

/// Wait until `wanted` messages are there (or `timeout`, or `wake_reader`).
fn wait_for<'a>(
    mut pending: std::sync::MutexGuard<'a, Pending>,
    wanted: usize,
    timeout: Duration,
) -> std::sync::MutexGuard<'a, Pending> {
    if pending.messages.len() >= wanted || pending.woken {
        return pending;
    }
    pending.wanted = wanted;
    let (mut guard, _) = match ARRIVED
        .wait_timeout_while(pending, timeout, |p| p.messages.len() < wanted && !p.woken)
    {
        Ok(result) => result,
        Err(poisoned) => poisoned.into_inner(),
    };
    guard.wanted = 0;
    guard
}

/// The messages there are. Idle (`gather_us` 0), as a blocking receive: waits up to
/// `timeout_ms` for the first and takes it at once, so a message arriving alone is not
/// held back. Busy (the last take found some), as a batch receive: waits up to `gather_us`
/// for `most` of them, and takes what there is then; if that is nothing, it goes on
/// waiting as when idle instead of returning empty-handed (at a few hundred messages a
/// second every message ended a gather that found nothing: a return to Python and the
/// GIL taken for an empty list, per message).
fn take_pending(timeout_ms: u64, gather_us: u64, most: usize) -> Vec<(u64, usize)> {
    let pending = pending();
    let pending = if gather_us > 0 {
        let gathered = wait_for(pending, most.max(1), Duration::from_micros(gather_us));
        if gathered.messages.is_empty() && !gathered.woken {
            wait_for(gathered, 1, Duration::from_millis(timeout_ms))
        } else {
            gathered
        }
    } else {
        wait_for(pending, 1, Duration::from_millis(timeout_ms))
    };
    take_all(pending)
}

fn take_all(mut pending: std::sync::MutexGuard<'_, Pending>) -> Vec<(u64, usize)> {
    pending.woken = false;
    pending.signal.taken();
    // The next take is likely as large: one allocation now spares the listener's pushes
    // growing the vector again from nothing, under the lock.
    let room = pending.messages.len().min(MOST_KEPT_ROOM);
    std::mem::replace(&mut pending.messages, Vec::with_capacity(room))
}

/// The most room kept for the next take (entries), so one burst does not pin memory.
const MOST_KEPT_ROOM: usize = 4096;

/// A message received by a listening consumer: what the gateway reads of a received message
/// (starlight_py.backend.pulsar_client.ReceivedMessage), taken from the C API's message,
/// which it owns.
#[pyclass(frozen, module = "starlight_py.amqp._native")]
pub struct ListenedMessage {
    #[pyo3(get)]
    body: Py<PyBytes>,
    #[pyo3(get)]
    properties: Py<PyDict>,
    #[pyo3(get)]
    redelivery_count: i32,
    /// The ConsumerHandle that received it.
    #[pyo3(get)]
    handle: PyObject,
    message: usize,
    position: OnceLock<PyObject>,
}

impl Drop for ListenedMessage {
    fn drop(&mut self) {
        if let Some(api) = API.get() {
            // SAFETY: the message pulsar-client made for the listener, owned here.
            unsafe { (api.message_free)(self.message as *mut c_void) };
        }
    }
}

/// A C string as a Python str (invalid UTF-8 replaced).
fn text<'py>(py: Python<'py>, pointer: *const c_char) -> Bound<'py, PyString> {
    if pointer.is_null() {
        return PyString::new(py, "");
    }
    // SAFETY: a NUL-terminated string of a live string map.
    let bytes = unsafe { CStr::from_ptr(pointer) }.to_bytes();
    match std::str::from_utf8(bytes) {
        Ok(s) => PyString::new(py, s),
        Err(_) => PyString::new(py, &String::from_utf8_lossy(bytes)),
    }
}

fn properties_of<'py>(
    py: Python<'py>,
    api: &Api,
    message: *mut c_void,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    // SAFETY: a live message; the map is made for this call and freed here.
    unsafe {
        let map = (api.get_properties)(message);
        if map.is_null() {
            return Ok(dict);
        }
        let size = (api.map_size)(map);
        let mut result = Ok(());
        for index in 0..size {
            let key = text(py, (api.map_key)(map, index));
            let value = text(py, (api.map_value)(map, index));
            if let Err(e) = dict.set_item(key, value) {
                result = Err(e);
                break;
            }
        }
        (api.map_free)(map);
        result?;
    }
    Ok(dict)
}

impl ListenedMessage {
    fn new(py: Python<'_>, api: &Api, message: usize, handle: PyObject) -> PyResult<Self> {
        let pointer = message as *mut c_void;
        // SAFETY: a live message pulsar-client made for the listener.
        let (data, length, redelivery_count) = unsafe {
            (
                (api.get_data)(pointer),
                (api.get_length)(pointer),
                (api.redelivery_count)(pointer),
            )
        };
        let body = if data.is_null() || length == 0 {
            PyBytes::new(py, b"")
        } else {
            // SAFETY: `length` bytes at `data`, held by the message.
            PyBytes::new(py, unsafe {
                std::slice::from_raw_parts(data as *const u8, length as usize)
            })
        };
        let properties = properties_of(py, api, pointer)?;
        Ok(ListenedMessage {
            body: body.unbind(),
            properties: properties.unbind(),
            redelivery_count,
            handle,
            message,
            position: OnceLock::new(),
        })
    }
}

/// "(ledger,entry,partition,batch index)" as pulsar-client prints an id; a chunked
/// message's id prints its first and last chunks, "(..);(..)", and stands at its first.
fn parse_id(text: &str) -> Option<[i64; 4]> {
    let first = text.split(';').next()?;
    let inner = first.trim().strip_prefix('(')?.strip_suffix(')')?;
    let mut fields = [0i64; 4];
    let mut count = 0;
    for part in inner.split(',') {
        if count == 4 {
            return None;
        }
        fields[count] = part.trim().parse().ok()?;
        count += 1;
    }
    (count == 4).then_some(fields)
}

#[pymethods]
impl ListenedMessage {
    /// Itself: the gateway passes `message.raw` to the consumer that received it.
    #[getter]
    fn raw(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Where it is in its topic: MessageIdRecord(ledger, entry, batch index, partition).
    #[getter]
    fn position(&self, py: Python<'_>) -> PyResult<PyObject> {
        if let Some(position) = self.position.get() {
            return Ok(position.clone_ref(py));
        }
        let api = api()?;
        let fields = self.id_fields(api)?;
        let record = api
            .record_type
            .bind(py)
            .call1((fields[0], fields[1], fields[3], fields[2]))?
            .unbind();
        let _ = self.position.set(record.clone_ref(py));
        Ok(record)
    }

    /// The broker's publish timestamp (epoch ms).
    #[getter]
    fn publish_time_ms(&self) -> PyResult<u64> {
        let api = api()?;
        // SAFETY: the message this object owns.
        Ok(unsafe { (api.publish_timestamp)(self.message as *mut c_void) })
    }

    /// The local name of the topic it came from.
    #[getter]
    fn topic_local(&self, py: Python<'_>) -> PyResult<PyObject> {
        Ok(self
            .handle
            .bind(py)
            .getattr("topic")?
            .getattr("local")?
            .unbind())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let topic = self.topic_local(py)?;
        let position = self.position(py)?;
        Ok(format!(
            "ListenedMessage({}, {})",
            topic.bind(py).str()?,
            position.bind(py).repr()?
        ))
    }
}

impl ListenedMessage {
    /// (ledger, entry, partition, batch index), as pulsar-client prints the id.
    fn id_fields(&self, api: &Api) -> PyResult<[i64; 4]> {
        // SAFETY: the message this object owns; the id and its text are made for this call
        // and freed here.
        let printed = unsafe {
            let id = (api.get_message_id)(self.message as *mut c_void);
            if id.is_null() {
                return Err(PyRuntimeError::new_err("a message without an id"));
            }
            let text = (api.message_id_str)(id);
            (api.message_id_free)(id);
            if text.is_null() {
                return Err(PyRuntimeError::new_err(
                    "pulsar-client printed no message id",
                ));
            }
            let owned = CStr::from_ptr(text).to_string_lossy().into_owned();
            (api.c_free)(text as *mut c_void);
            owned
        };
        parse_id(&printed)
            .ok_or_else(|| PyRuntimeError::new_err(format!("an id printed as {printed:?}")))
    }
}

/// Wait for messages of listening consumers (GIL let go; `take_pending` says how long)
/// and take all there are: a list of (handle, [ListenedMessage, ...]), one entry per consumer in the order
/// its first message came, each consumer's messages in order. `handles` maps a consumer's
/// key to its handle; messages of a key not in it (a consumer closed meanwhile) are freed
/// (the broker redelivers them). Empty on timeout or after `wake_reader`.
#[pyfunction]
pub fn next_batches<'py>(
    py: Python<'py>,
    handles: &Bound<'py, PyDict>,
    timeout_ms: u64,
    gather_us: u64,
    most: usize,
) -> PyResult<Bound<'py, PyList>> {
    let api = api()?;
    let taken = py.allow_threads(|| take_pending(timeout_ms, gather_us, most));
    batches_of(py, api, handles, taken)
}

/// `next_batches` without waiting, and without letting go of the GIL (the listener thread
/// holds the queue's lock only to push): what is there now, maybe nothing. For the trio
/// task that waits on the eventfd (read it first: a message that comes after this call
/// writes it again).
#[pyfunction]
pub fn take_listened<'py>(
    py: Python<'py>,
    handles: &Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyList>> {
    let api = api()?;
    let taken = take_all(pending());
    batches_of(py, api, handles, taken)
}

/// The taken messages as ListenedMessages, grouped by consumer (`next_batches` says how).
fn batches_of<'py>(
    py: Python<'py>,
    api: &Api,
    handles: &Bound<'py, PyDict>,
    taken: Vec<(u64, usize)>,
) -> PyResult<Bound<'py, PyList>> {
    let result = PyList::empty(py);
    // (key, index in `result`), for the few consumers of one take.
    let mut seen: Vec<(u64, usize)> = Vec::new();
    let mut taken = taken.into_iter();
    let mut failure = None;
    for (key, message) in taken.by_ref() {
        let handle = match handles.get_item(key) {
            Ok(Some(handle)) => handle,
            Ok(None) => {
                // SAFETY: a message pulsar-client made for the listener, owned here.
                unsafe { (api.message_free)(message as *mut c_void) };
                continue;
            }
            Err(e) => {
                // SAFETY: as above.
                unsafe { (api.message_free)(message as *mut c_void) };
                failure = Some(e);
                break;
            }
        };
        let listened = match ListenedMessage::new(py, api, message, handle.clone().unbind()) {
            Ok(listened) => listened,
            Err(e) => {
                // SAFETY: as above (not owned by a ListenedMessage yet).
                unsafe { (api.message_free)(message as *mut c_void) };
                failure = Some(e);
                break;
            }
        };
        let object = Bound::new(py, listened)?;
        match seen.iter().find(|(k, _)| *k == key) {
            Some(&(_, index)) => {
                let entry = result.get_item(index)?;
                let batch = entry.downcast::<PyTuple>()?.get_item(1)?;
                batch.downcast::<PyList>()?.append(object)?;
            }
            None => {
                seen.push((key, result.len()));
                let batch = PyList::new(py, [object])?;
                result.append(PyTuple::new(py, [handle, batch.into_any()])?)?;
            }
        }
    }
    if let Some(e) = failure {
        for (_, message) in taken {
            // SAFETY: messages of this take not handed to Python.
            unsafe { (api.message_free)(message as *mut c_void) };
        }
        return Err(e);
    }
    Ok(result)
}

/// pulsar-client calls it with an acknowledgement's outcome: nothing to do (a consumer
/// closed meanwhile: the broker redelivers, at-least-once holds).
extern "C" fn on_acknowledged(_result: c_int, _ctx: *mut c_void) {}

pub(crate) fn message_pointers(messages: &Bound<'_, PyList>) -> PyResult<Vec<usize>> {
    let mut pointers = Vec::with_capacity(messages.len());
    for message in messages.iter() {
        let listened = message.downcast::<ListenedMessage>()?;
        pointers.push(listened.get().message);
    }
    Ok(pointers)
}

/// Acknowledge `messages` (ListenedMessages the consumer at `consumer`, the C API's
/// pulsar_consumer_t, received; it must outlive the call), letting go of the GIL once.
/// Returns how many; acknowledges none when one is not a ListenedMessage (TypeError).
#[pyfunction]
pub fn acknowledge_listened(
    py: Python<'_>,
    consumer: usize,
    messages: &Bound<'_, PyList>,
) -> PyResult<usize> {
    let api = api()?;
    if consumer == 0 {
        return Err(PyRuntimeError::new_err("no consumer"));
    }
    let pointers = message_pointers(messages)?;
    let count = pointers.len();
    let acknowledge = api.acknowledge_async;
    // The messages stay alive (held by `messages`) until pulsar-client has taken their ids.
    py.allow_threads(move || {
        for pointer in pointers {
            // SAFETY: live messages and a live consumer.
            unsafe {
                acknowledge(
                    consumer as *mut c_void,
                    pointer as *mut c_void,
                    on_acknowledged,
                    std::ptr::null_mut(),
                )
            };
        }
    });
    Ok(count)
}

/// Negatively acknowledge `message` (a ListenedMessage the consumer at `consumer` received).
#[pyfunction]
pub fn negative_acknowledge_listened(
    py: Python<'_>,
    consumer: usize,
    message: &Bound<'_, ListenedMessage>,
) -> PyResult<()> {
    let api = api()?;
    if consumer == 0 {
        return Err(PyRuntimeError::new_err("no consumer"));
    }
    let pointer = message.get().message;
    let negative_acknowledge = api.negative_acknowledge;
    // SAFETY: a live message (held by `message`) and a live consumer.
    py.allow_threads(move || unsafe {
        negative_acknowledge(consumer as *mut c_void, pointer as *mut c_void)
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_id;

    #[test]
    fn ids_are_read_as_pulsar_client_prints_them() {
        assert_eq!(parse_id("(12,345,-1,7)"), Some([12, 345, -1, 7]));
        assert_eq!(parse_id("(1,2,3)"), None);
        assert_eq!(parse_id("(1,2,3,4,5)"), None);
        assert_eq!(parse_id("1,2,3,4"), None);
        assert_eq!(parse_id("(a,2,3,4)"), None);
        assert_eq!(parse_id("(3,1,-1,-1);(3,2,-1,-1)"), Some([3, 1, -1, -1]));
    }
}
