//! Helpers for the C ABI layer: result conversion, panic containment, and
//! checked writes through the caller's out-pointers.

use std::os::raw::c_char;
use std::panic::{AssertUnwindSafe, catch_unwind};

use vgpu_proto::cuda::{self, CuResult};

use crate::driver::CuRes;

/// `CUresult` as the C ABI returns it.
pub type CUresult = CuResult;

/// Runs driver function `name`, turning its result into a `CUresult`; a
/// panic (a bug) becomes `CUDA_ERROR_UNKNOWN` instead of unwinding into C.
/// With `VGPU_LOG=debug` every call is traced with its result.
pub fn ffi(name: &str, f: impl FnOnce() -> CuRes<()>) -> CUresult {
    crate::sync_wait::note_thread();
    let r = guarded(
        name,
        (
            cuda::CUDA_SUCCESS,
            cuda::CUDA_ERROR_UNKNOWN,
            "CUDA_ERROR_UNKNOWN",
        ),
        f,
    );
    crate::debug!("{name} -> {}", cuda::result_name(r).unwrap_or("?"));
    crate::logs::returned(name, r);
    r
}

/// Runs entry point `name` of a C API whose results are codes: `(success, unknown, the unknown
/// code's name)`; a panic (a bug) becomes the unknown code instead of unwinding into C.
pub fn guarded<C: Copy>(
    name: &str,
    (success, unknown, unknown_name): (C, C, &str),
    f: impl FnOnce() -> Result<(), C>,
) -> C {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => success,
        Ok(Err(code)) => code,
        Err(_) => {
            crate::warn!("internal error in {name}; returning {unknown_name}");
            unknown
        }
    }
}

/// Writes `v` through an out-pointer; NULL is `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `p` must be NULL or valid for a write of `T` (the CUDA API contract for
/// out-parameters).
pub unsafe fn write_out<T>(p: *mut T, v: T) -> CuRes<()> {
    if p.is_null() {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL, and valid for writes per this function's contract.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Copies `s` into a caller buffer of `len` bytes, NUL-terminated and truncated to fit.
///
/// # Safety
/// `p` must be NULL or valid for writes of `len` bytes.
pub unsafe fn write_cstr(p: *mut c_char, len: i32, s: &str) -> CuRes<()> {
    let Ok(len) = usize::try_from(len) else {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    };
    if p.is_null() || len == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let n = s.len().min(len - 1);
    // SAFETY: `p` is valid for `len` bytes (this function's contract) and `n < len`.
    let dst = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), n + 1) };
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
    dst[n] = 0;
    Ok(())
}

/// Writes through an out-pointer argument of a CUDA entry point.
#[macro_export]
macro_rules! out {
    ($p:expr, $v:expr) => {{
        let (ptr, value) = ($p, $v);
        // SAFETY: `ptr` is an out-pointer argument of a CUDA entry point; the CUDA API contract
        // makes it NULL (refused by write_out) or valid for a write of its type.
        unsafe { $crate::ffi::write_out(ptr, value) }
    }};
}

/// Borrows `n` bytes of caller memory for reading.
#[macro_export]
macro_rules! in_bytes {
    ($p:expr, $n:expr) => {{
        let n: usize = $n;
        let p: *const u8 = ($p).cast();
        if n == 0 {
            &[][..]
        } else if p.is_null() {
            return Err(vgpu_proto::cuda::CUDA_ERROR_INVALID_VALUE);
        } else {
            // SAFETY: the CUDA contract of this entry point makes the source buffer valid for reads
            // of the byte count passed with it for the duration of the call.
            unsafe { std::slice::from_raw_parts(p, n) }
        }
    }};
}

/// Borrows `n` bytes of caller memory for writing.
#[macro_export]
macro_rules! out_bytes {
    ($p:expr, $n:expr) => {{
        let n: usize = $n;
        let p: *mut u8 = ($p).cast();
        if n == 0 {
            &mut [][..]
        } else if p.is_null() {
            return Err(vgpu_proto::cuda::CUDA_ERROR_INVALID_VALUE);
        } else {
            // SAFETY: the CUDA contract of this entry point makes the destination buffer valid for
            // writes of the byte count passed with it for the duration of the call.
            unsafe { std::slice::from_raw_parts_mut(p, n) }
        }
    }};
}
