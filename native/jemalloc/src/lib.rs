//! jemalloc behind the C allocator's names, for `LD_PRELOAD`.
//!
//! glibc lets a preloaded library replace `malloc`: every allocation of the process, the
//! interpreter's, pulsar-client's and glibc's own, then comes here. glibc's malloc costs
//! the proxy several µs per message (docs/performance.md, "The allocator"): messages of
//! about 1 KiB are too large for its thread caches and are allocated and freed on one
//! thread and another. `starlight_py/allocator.py` re-executes the proxy with this library
//! preloaded.
//!
//! Every entry point glibc documents as replaceable is defined here, so no block allocated
//! by one allocator is ever freed by the other; so are C++'s plain and sized operator new
//! and delete, as in jemalloc's own C++ build.

use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::ptr;

use tikv_jemalloc_sys as je;

const PAGE: usize = 4096;

/// # Safety
/// The C `malloc` contract.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    je::malloc(size)
}

/// # Safety
/// The C `calloc` contract.
#[no_mangle]
pub unsafe extern "C" fn calloc(count: usize, size: usize) -> *mut c_void {
    je::calloc(count, size)
}

/// # Safety
/// The C `realloc` contract: `block` is null or came from this allocator.
#[no_mangle]
pub unsafe extern "C" fn realloc(block: *mut c_void, size: usize) -> *mut c_void {
    je::realloc(block, size)
}

/// # Safety
/// The C `free` contract: `block` is null or came from this allocator.
#[no_mangle]
pub unsafe extern "C" fn free(block: *mut c_void) {
    je::free(block)
}

/// # Safety
/// The POSIX `posix_memalign` contract.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    alignment: usize,
    size: usize,
) -> c_int {
    je::posix_memalign(out, alignment, size)
}

/// # Safety
/// The C11 `aligned_alloc` contract.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(alignment: usize, size: usize) -> *mut c_void {
    je::aligned_alloc(alignment, size)
}

/// # Safety
/// glibc's `memalign`: like `aligned_alloc` without its size rule.
#[no_mangle]
pub unsafe extern "C" fn memalign(alignment: usize, size: usize) -> *mut c_void {
    aligned(alignment, size)
}

/// # Safety
/// glibc's `valloc`: aligned to the page.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned(PAGE, size)
}

/// # Safety
/// glibc's `pvalloc`: aligned to the page, the size rounded up to pages.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    match size.checked_add(PAGE - 1) {
        Some(padded) => aligned(PAGE, padded.max(PAGE) & !(PAGE - 1)),
        None => ptr::null_mut(),
    }
}

/// # Safety
/// glibc's `malloc_usable_size`: `block` is null or came from this allocator.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(block: *mut c_void) -> usize {
    if block.is_null() {
        0
    } else {
        je::malloc_usable_size(block)
    }
}

// C++'s operator new and delete (pulsar-client's allocations), as jemalloc's own C++ build
// defines them: the sized delete frees without looking the size up. Only the plain forms
// are here; the others (nothrow, aligned) reach malloc, aligned_alloc and free above
// through libstdc++.

/// # Safety
/// C++'s `operator new(size_t)`.
#[export_name = "_Znwm"]
pub unsafe extern "C" fn operator_new(size: usize) -> *mut c_void {
    new_or_next(size, c"_Znwm")
}

/// # Safety
/// C++'s `operator new[](size_t)`.
#[export_name = "_Znam"]
pub unsafe extern "C" fn operator_new_array(size: usize) -> *mut c_void {
    new_or_next(size, c"_Znam")
}

/// # Safety
/// C++'s `operator delete(void*)`.
#[export_name = "_ZdlPv"]
pub unsafe extern "C" fn operator_delete(block: *mut c_void) {
    je::free(block)
}

/// # Safety
/// C++'s `operator delete[](void*)`.
#[export_name = "_ZdaPv"]
pub unsafe extern "C" fn operator_delete_array(block: *mut c_void) {
    je::free(block)
}

/// # Safety
/// C++'s sized `operator delete(void*, size_t)`.
#[export_name = "_ZdlPvm"]
pub unsafe extern "C" fn operator_delete_sized(block: *mut c_void, size: usize) {
    sized_free(block, size)
}

/// # Safety
/// C++'s sized `operator delete[](void*, size_t)`.
#[export_name = "_ZdaPvm"]
pub unsafe extern "C" fn operator_delete_array_sized(block: *mut c_void, size: usize) {
    sized_free(block, size)
}

unsafe fn sized_free(block: *mut c_void, size: usize) {
    if !block.is_null() {
        je::sdallocx(block, size, 0);
    }
}

/// jemalloc's block, or when it has none, what libstdc++'s own operator does about it: call
/// the new-handler, throw std::bad_alloc. (Python loads C++ extensions with RTLD_LOCAL, so
/// libstdc++ is found by name, not through RTLD_NEXT.)
unsafe fn new_or_next(size: usize, name: &CStr) -> *mut c_void {
    let block = je::malloc(size.max(1));
    if !block.is_null() {
        return block;
    }
    let library = libc::dlopen(
        c"libstdc++.so.6".as_ptr(),
        libc::RTLD_LAZY | libc::RTLD_NOLOAD,
    );
    let next = if library.is_null() {
        ptr::null_mut()
    } else {
        libc::dlsym(library, name.as_ptr())
    };
    if next.is_null() {
        std::process::abort();
    }
    let next: unsafe extern "C" fn(usize) -> *mut c_void = std::mem::transmute(next);
    next(size)
}

unsafe fn aligned(alignment: usize, size: usize) -> *mut c_void {
    let mut block = ptr::null_mut();
    // posix_memalign wants a power of two no smaller than a pointer; memalign takes less.
    let alignment = alignment
        .max(std::mem::size_of::<*mut c_void>())
        .next_power_of_two();
    if je::posix_memalign(&mut block, alignment, size) == 0 {
        block
    } else {
        ptr::null_mut()
    }
}
