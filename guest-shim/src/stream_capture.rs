//! Stream capture queries. vgpu does not capture streams into graphs yet
//! (`cuStreamBeginCapture` is not provided), so no stream is ever capturing:
//! the queries answer `CU_STREAM_CAPTURE_STATUS_NONE`, which is what the CUDA
//! runtime and libraries built on it (CuPy asks before every copy) need to
//! go on.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::cell::Cell;
use std::ffi::c_int;

use vgpu_proto::cuda;

use crate::driver as drv;
use crate::exports::{CUhandle, h};
use crate::ffi::{CUresult, ffi};
use crate::out;

/// `CU_STREAM_CAPTURE_STATUS_NONE`.
pub const CAPTURE_STATUS_NONE: c_int = 0;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`: the largest capture mode value.
const CAPTURE_MODE_MAX: c_int = 2;

thread_local! {
    /// This thread's `CUstreamCaptureMode` (`CU_STREAM_CAPTURE_MODE_GLOBAL` = 0 at start).
    static CAPTURE_MODE: Cell<c_int> = const { Cell::new(0) };
}

/// The status of a stream that exists: never capturing.
fn status(stream: CUhandle) -> drv::CuRes<c_int> {
    drv::stream_params(h(stream))?;
    Ok(CAPTURE_STATUS_NONE)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: CUhandle, st: *mut c_int) -> CUresult {
    ffi("cuStreamIsCapturing", || out!(st, status(stream)?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo(
    stream: CUhandle,
    st: *mut c_int,
    _id: *mut u64,
) -> CUresult {
    // The id is only set while capturing.
    ffi("cuStreamGetCaptureInfo", || out!(st, status(stream)?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    stream: CUhandle,
    st: *mut c_int,
    _id: *mut u64,
    _graph: *mut CUhandle,
    _deps: *mut *const CUhandle,
    _num_deps: *mut usize,
) -> CUresult {
    // The other outputs are only set while capturing.
    ffi("cuStreamGetCaptureInfo_v2", || out!(st, status(stream)?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3(
    stream: CUhandle,
    st: *mut c_int,
    _id: *mut u64,
    _graph: *mut CUhandle,
    _deps: *mut *const CUhandle,
    _edges: *mut *const u8,
    _num_deps: *mut usize,
) -> CUresult {
    ffi("cuStreamGetCaptureInfo_v3", || out!(st, status(stream)?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) -> CUresult {
    ffi("cuThreadExchangeStreamCaptureMode", || {
        if mode.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-NULL in/out pointer to a CUstreamCaptureMode (CUDA contract).
        let new = unsafe { mode.read_unaligned() };
        if !(0..=CAPTURE_MODE_MAX).contains(&new) {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(mode, CAPTURE_MODE.with(|m| m.replace(new)))
    })
}
