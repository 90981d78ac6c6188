//! What the gateway takes of each received message (body, properties, redelivery count),
//! read from the C++ `pulsar::Message` in one call per batch.
//!
//! Through the binding that is three pybind11 calls per message on the reader thread
//! (`data()`, `properties()`, `redelivery_count()`), each with pybind11's dispatch. Here
//! pybind11's conduit hands out the `pulsar::Message` each `_pulsar.Message` wraps, and its
//! own accessors are called: `getData`, `getLength`, `getRedeliveryCount`, and
//! `getProperties`, whose `std::map<std::string, std::string>` is walked in key order
//! (libstdc++'s red-black tree, the layout of the library pulsar-client 3.13 ships with).
//! `backend/message_fields.py` checks at start, on a message built with properties, that
//! this reads what the binding reads; anything else reads through the binding.

use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyDict, PyList, PyString, PyTuple};
use std::ffi::c_void;
use std::sync::OnceLock;

type GetData = unsafe extern "C" fn(*const c_void) -> *const u8;
type GetLength = unsafe extern "C" fn(*const c_void) -> usize;
type GetRedeliveryCount = unsafe extern "C" fn(*const c_void) -> i32;
type GetProperties = unsafe extern "C" fn(*const c_void) -> *const StdMap;

struct ReadApi {
    get_data: GetData,
    get_length: GetLength,
    get_redelivery_count: GetRedeliveryCount,
    get_properties: GetProperties,
    /// The conduit's arguments for pulsar::Message (as in pulsar_ack).
    conduit_args: Py<PyTuple>,
}

static READ_API: OnceLock<ReadApi> = OnceLock::new();

/// libstdc++'s `_Rb_tree_node_base`.
#[repr(C)]
struct NodeBase {
    color: i32,
    parent: *const NodeBase,
    left: *const NodeBase,
    right: *const NodeBase,
}

/// libstdc++'s `std::map` (`_Rb_tree_impl`): the empty `std::less` (one byte, padded),
/// the header node (its `left` is the first node, itself the end), the node count.
#[repr(C)]
struct StdMap {
    _compare: usize,
    header: NodeBase,
    count: usize,
}

/// libstdc++'s `std::string` (the C++11 ABI): data pointer, length, then the inline
/// buffer or the capacity.
#[repr(C)]
struct StdString {
    data: *const u8,
    len: usize,
    _rest: [u8; 16],
}

/// A tree node: its base, then the `std::pair<const std::string, std::string>`.
#[repr(C)]
struct MapNode {
    base: NodeBase,
    key: StdString,
    value: StdString,
}

/// The node after `node` in key order (libstdc++'s `_Rb_tree_increment`).
///
/// SAFETY: `node` is a node of a valid tree, not its header.
unsafe fn next_node(mut node: *const NodeBase) -> *const NodeBase {
    if !(*node).right.is_null() {
        node = (*node).right;
        while !(*node).left.is_null() {
            node = (*node).left;
        }
        return node;
    }
    let mut parent = (*node).parent;
    while node == (*parent).right {
        node = parent;
        parent = (*parent).parent;
    }
    if (*node).right != parent {
        node = parent;
    }
    node
}

/// SAFETY: `s` is a live std::string.
unsafe fn text<'py>(py: Python<'py>, s: &StdString) -> PyResult<Bound<'py, PyString>> {
    let bytes = if s.len == 0 {
        &[][..]
    } else {
        std::slice::from_raw_parts(s.data, s.len)
    };
    let utf8 = std::str::from_utf8(bytes)
        .map_err(|_| PyRuntimeError::new_err("a property that is not UTF-8"))?;
    Ok(PyString::new(py, utf8))
}

/// Set the addresses of pulsar::Message's getData, getLength, getRedeliveryCount and
/// getProperties, and the conduit's ABI id and type_info capsule for pulsar::Message.
/// Only the first call counts.
#[pyfunction]
pub fn bind_read(
    py: Python<'_>,
    addresses: [usize; 4],
    abi: &Bound<'_, PyBytes>,
    type_info: &Bound<'_, PyCapsule>,
) -> PyResult<()> {
    if addresses.contains(&0) {
        return Err(PyRuntimeError::new_err(
            "a pulsar::Message accessor is missing",
        ));
    }
    let args = PyTuple::new(
        py,
        [
            abi.clone().into_any(),
            type_info.clone().into_any(),
            PyBytes::new(py, b"raw_pointer_ephemeral").into_any(),
        ],
    )?;
    // SAFETY: the caller passes the addresses of these const member functions of
    // pulsar::Message, in this order; their ABI (`this` first) is the types above.
    let api = unsafe {
        ReadApi {
            get_data: std::mem::transmute::<usize, GetData>(addresses[0]),
            get_length: std::mem::transmute::<usize, GetLength>(addresses[1]),
            get_redelivery_count: std::mem::transmute::<usize, GetRedeliveryCount>(addresses[2]),
            get_properties: std::mem::transmute::<usize, GetProperties>(addresses[3]),
            conduit_args: args.unbind(),
        }
    };
    let _ = READ_API.set(api);
    Ok(())
}

/// A received message's body, properties and redelivery count.
type Fields<'py> = (Bound<'py, PyBytes>, Bound<'py, PyDict>, i32);

/// (body, properties, redelivery count) of each `_pulsar.Message` of `raws`, in order.
#[pyfunction]
pub fn message_fields<'py>(
    py: Python<'py>,
    raws: &Bound<'py, PyList>,
) -> PyResult<Vec<Fields<'py>>> {
    let api = READ_API.get().ok_or_else(|| {
        PyRuntimeError::new_err("message reading is not bound (call bind_read first)")
    })?;
    let args = api.conduit_args.bind(py);
    let mut fields = Vec::with_capacity(raws.len());
    for raw in raws.iter() {
        let capsule = raw.call_method1(intern!(py, "_pybind11_conduit_v1_"), args)?;
        let message = capsule.downcast::<PyCapsule>()?.pointer() as *const c_void;
        if message.is_null() {
            return Err(PyRuntimeError::new_err(
                "pybind11's conduit handed out no message",
            ));
        }
        // SAFETY: a live pulsar::Message (held by `raw`, which `raws` holds); what its
        // accessors return lives as long as it.
        unsafe {
            let length = (api.get_length)(message);
            let body = if length == 0 {
                PyBytes::new(py, b"")
            } else {
                PyBytes::new(
                    py,
                    std::slice::from_raw_parts((api.get_data)(message), length),
                )
            };
            let properties = PyDict::new(py);
            let map = (api.get_properties)(message);
            let header = &(*map).header as *const NodeBase;
            let mut node = (*map).header.left;
            let mut left = (*map).count;
            while node != header && left > 0 {
                let entry = &*(node as *const MapNode);
                properties.set_item(text(py, &entry.key)?, text(py, &entry.value)?)?;
                node = next_node(node);
                left -= 1;
            }
            if node != header || left != 0 {
                return Err(PyRuntimeError::new_err(
                    "a message's properties are not the map expected",
                ));
            }
            fields.push((body, properties, (api.get_redelivery_count)(message)));
        }
    }
    Ok(fields)
}
