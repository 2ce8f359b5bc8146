//! Device-side `printf` and `assert` output, written where CUDA writes it.
//!
//! vgpud keeps the text kernels print and releases it at synchronizing calls; a reply flagged
//! `FLAG_OUTPUT` tells the shim to fetch it ([`crate::client::Client`] does, with
//! `TakeOutput`). `printf` text goes to the process's stdout and failed-`assert` messages to
//! its stderr, through C's `stdout`/`stderr` streams so that it lands in order with what the
//! program itself printed before the synchronizing call, then flushed.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `CU_LIMIT_PRINTF_FIFO_SIZE` as last set (CUDA's default is 1 MiB).
static PRINTF_FIFO_SIZE: AtomicUsize = AtomicUsize::new(1 << 20);

/// The printf FIFO size `cuCtxGetLimit` reports.
pub fn printf_fifo_size() -> usize {
    PRINTF_FIFO_SIZE.load(Ordering::Relaxed)
}

/// Records the printf FIFO size vgpud accepted.
pub fn set_printf_fifo_size(bytes: usize) {
    PRINTF_FIFO_SIZE.store(bytes, Ordering::Relaxed);
}

unsafe extern "C" {
    /// C's standard output stream (glibc and musl export it by this name).
    static mut stdout: *mut libc::FILE;
    /// C's standard error stream.
    static mut stderr: *mut libc::FILE;
}

/// Writes `text` to C's stdout (`err` false) or stderr and flushes the stream.
pub fn write(text: &[u8], err: bool) {
    if text.is_empty() {
        return;
    }
    let f = if err {
        // SAFETY: reads libc's stream pointer (a copy, no reference taken); libc initialises it
        // before any constructor of this library runs.
        unsafe { stderr }
    } else {
        // SAFETY: as above, for stdout.
        unsafe { stdout }
    };
    if f.is_null() {
        return;
    }
    // SAFETY: `f` is a live stdio stream; the pointer and length describe `text`.
    unsafe { libc::fwrite(text.as_ptr().cast::<c_void>(), 1, text.len(), f) };
    // SAFETY: `f` is a live stdio stream.
    unsafe { libc::fflush(f) };
}
