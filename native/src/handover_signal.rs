//! The eventfd that tells the bridge's trio task (gateway/bridge.py) a queue got work: written
//! once per batch of hand-overs, by the thread that pushed the batch's first entry.

use std::ffi::{c_int, c_void};

extern "C" {
    fn write(fd: c_int, buf: *const c_void, count: usize) -> isize;
}

/// Kept with the queue it signals for, under the same lock.
pub struct Signal {
    /// The eventfd the trio task waits on, or -1: none attached.
    fd: c_int,
    /// The eventfd was written since the queue was last taken.
    signalled: bool,
}

impl Signal {
    pub const fn new() -> Self {
        Signal {
            fd: -1,
            signalled: false,
        }
    }

    pub fn attached(&self) -> bool {
        self.fd >= 0
    }

    /// False, and nothing changes, when an eventfd is attached already.
    pub fn attach(&mut self, fd: c_int) -> bool {
        if self.fd >= 0 {
            return false;
        }
        self.fd = fd;
        self.signalled = false;
        true
    }

    /// No eventfd is written any more; it may be closed after this.
    pub fn detach(&mut self) {
        self.fd = -1;
        self.signalled = false;
    }

    /// After a push: write the eventfd, unless it was written since the last take.
    pub fn notify(&mut self) {
        if self.fd >= 0 && !self.signalled {
            self.signalled = true;
            let one: u64 = 1;
            // SAFETY: a valid eventfd (attached, not closed before it is detached) and 8
            // bytes from a u64. It cannot fail short of 2^64 - 1 unread writes.
            unsafe { write(self.fd, (&one as *const u64).cast(), 8) };
        }
    }

    /// The queue was taken whole: the next push writes the eventfd again.
    pub fn taken(&mut self) {
        self.signalled = false;
    }
}
