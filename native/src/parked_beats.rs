//! The heartbeats of parked connections, kept in one table: the compiled form of
//! `starlight_py/gateway/connection/parked_beats.py`, whose docstring says what it does and
//! whose Python table this one is held to (tests/unit/test_parked_beats.py).
//!
//! The Python table keeps a heap of when each row is due; this one goes through every row
//! at each pass (a few nanoseconds a row), with the same arithmetic, so that both find the
//! same rows due and say the same next time.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::io;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

extern "C" {
    fn read(fd: c_int, buf: *mut c_void, count: usize) -> isize;
    fn write(fd: c_int, buf: *const c_void, count: usize) -> isize;
}

const MORE: u8 = 1;
const STUCK: u8 = 2;
const MISSED: u8 = 3;
const READY: u8 = 4;

struct Row {
    fd: c_int,
    heartbeat: f64,
    last_sent: f64,
    last_received: f64,
    due: f64,
}

/// `parked_beats.step_of`.
fn step_of(heartbeat: f64) -> f64 {
    f64::min(1.0, heartbeat / 20.0)
}

/// `parked_beats.next_step`.
fn next_step(heartbeat: f64, now: f64) -> f64 {
    let step = step_of(heartbeat);
    ((now + step) / step).ceil() * step
}

/// `parked_beats.due_of`.
fn due_of(heartbeat: f64, last_sent: f64, last_received: f64, now: f64) -> f64 {
    let step = step_of(heartbeat);
    let due = f64::min(
        last_sent + heartbeat / 2.0 - step,
        last_received + 2.0 * heartbeat,
    );
    if due <= now {
        return next_step(heartbeat, now);
    }
    (due / step).ceil() * step
}

enum Read {
    /// Nothing waits, or only heartbeats did.
    Nothing,
    /// What followed the heartbeats (empty: the socket ended or broke).
    More(usize, usize),
}

#[pyclass(module = "starlight_py.amqp._native")]
pub struct ParkedBeats {
    frame: Vec<u8>,
    rows: Vec<Row>,
    index: HashMap<c_int, usize>,
    buffer: Vec<u8>,
    /// Heartbeats read, since the start.
    #[pyo3(get)]
    heard: u64,
}

impl ParkedBeats {
    /// Read what waits in the socket of `fd` once; the heartbeats leading it count as
    /// heard (at `now`).
    fn read_row(&mut self, at: usize, now: f64) -> Read {
        let fd = self.rows[at].fd;
        let got = loop {
            // SAFETY: `buffer` is ours, `len` bytes long.
            let got = unsafe {
                read(
                    fd,
                    self.buffer.as_mut_ptr() as *mut c_void,
                    self.buffer.len(),
                )
            };
            if got >= 0 {
                break got as usize;
            }
            match io::Error::last_os_error().kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Read::Nothing,
                _ => return Read::More(0, 0), // broken: the reader sees it as an end
            }
        };
        if got == 0 {
            return Read::More(0, 0);
        }
        let size = self.frame.len();
        let mut beats = 0;
        while (beats + 1) * size <= got
            && self.buffer[beats * size..(beats + 1) * size] == self.frame[..]
        {
            beats += 1;
        }
        if beats > 0 {
            self.rows[at].last_received = now;
            self.heard += beats as u64;
        }
        if beats * size == got {
            Read::Nothing
        } else {
            Read::More(beats * size, got)
        }
    }

    /// `_beat` of the Python table: what row `at` needs at `now`, written to `events`.
    fn beat(
        &mut self,
        py: Python<'_>,
        at: usize,
        now: f64,
        events: &Bound<'_, PyList>,
    ) -> PyResult<bool> {
        let (fd, heartbeat) = (self.rows[at].fd, self.rows[at].heartbeat);
        if let Read::More(start, end) = self.read_row(at, now) {
            push(py, events, fd, MORE, &self.buffer[start..end])?;
            return Ok(true);
        }
        if now - self.rows[at].last_received > 2.0 * heartbeat {
            push(py, events, fd, MISSED, &[])?;
            return Ok(true);
        }
        if now >= self.rows[at].last_sent + heartbeat / 2.0 - step_of(heartbeat) {
            let sent = loop {
                // SAFETY: `frame` is ours, `len` bytes long.
                let sent =
                    unsafe { write(fd, self.frame.as_ptr() as *const c_void, self.frame.len()) };
                if sent >= 0 {
                    break sent as usize;
                }
                if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                    break 0; // full or broken: the connection's writer finds out which
                }
            };
            self.rows[at].last_sent = now;
            if sent < self.frame.len() {
                push(py, events, fd, STUCK, &self.frame[sent..])?;
                return Ok(true);
            }
        }
        Ok(false)
    }
}

fn push(
    py: Python<'_>,
    events: &Bound<'_, PyList>,
    fd: c_int,
    kind: u8,
    data: &[u8],
) -> PyResult<()> {
    let event = PyTuple::new(
        py,
        [
            fd.into_pyobject(py)?.into_any(),
            kind.into_pyobject(py)?.into_any(),
            PyBytes::new(py, data).into_any(),
        ],
    )?;
    events.append(event)
}

#[pymethods]
impl ParkedBeats {
    #[new]
    fn new(frame: &[u8], read_size: usize) -> Self {
        ParkedBeats {
            frame: frame.to_vec(),
            rows: Vec::new(),
            index: HashMap::new(),
            buffer: vec![0; read_size.max(frame.len()).max(1)],
            heard: 0,
        }
    }

    fn __len__(&self) -> usize {
        self.rows.len()
    }

    fn add(
        &mut self,
        fd: c_int,
        heartbeat: f64,
        last_sent: f64,
        last_received: f64,
        now: f64,
    ) -> f64 {
        let due = due_of(heartbeat, last_sent, last_received, now);
        let row = Row {
            fd,
            heartbeat,
            last_sent,
            last_received,
            due,
        };
        match self.index.get(&fd) {
            Some(&at) => self.rows[at] = row,
            None => {
                self.index.insert(fd, self.rows.len());
                self.rows.push(row);
            }
        }
        due
    }

    fn remove(&mut self, fd: c_int) -> Option<(f64, f64)> {
        let at = self.index.remove(&fd)?;
        let row = self.rows.swap_remove(at);
        if at < self.rows.len() {
            self.index.insert(self.rows[at].fd, at);
        }
        Some((row.last_sent, row.last_received))
    }

    fn drain<'py>(
        &mut self,
        py: Python<'py>,
        ready: &Bound<'py, PyList>,
        now: f64,
    ) -> PyResult<Bound<'py, PyList>> {
        let events = PyList::empty(py);
        for item in ready.iter() {
            let fd: c_int = item.get_item(0)?.extract()?;
            let Some(&at) = self.index.get(&fd) else {
                push(py, &events, fd, READY, &[])?;
                continue;
            };
            if let Read::More(start, end) = self.read_row(at, now) {
                push(py, &events, fd, MORE, &self.buffer[start..end])?;
            }
        }
        Ok(events)
    }

    fn tick<'py>(&mut self, py: Python<'py>, now: f64) -> PyResult<(Bound<'py, PyList>, f64)> {
        let events = PyList::empty(py);
        let mut following = f64::INFINITY;
        for at in 0..self.rows.len() {
            if self.rows[at].due <= now {
                let heartbeat = self.rows[at].heartbeat;
                self.rows[at].due = if self.beat(py, at, now, &events)? {
                    next_step(heartbeat, now) // the connection takes its row back (soon)
                } else {
                    let row = &self.rows[at];
                    due_of(heartbeat, row.last_sent, row.last_received, now)
                };
            }
            following = f64::min(following, self.rows[at].due);
        }
        Ok((events, following))
    }
}
