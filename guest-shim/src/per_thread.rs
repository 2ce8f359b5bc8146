//! The per-thread default stream entry points (`_ptsz` for calls that take a
//! stream, `_ptds` for synchronous calls), which programs built with
//! `--default-stream per-thread` (or `CUDA_API_PER_THREAD_DEFAULT_STREAM`)
//! call, and which `cuGetProcAddress` hands out for
//! `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`. Each runs its base entry
//! point with stream 0 meaning the calling thread's per-thread default
//! stream: a blocking stream of its own per thread and context
//! ([`crate::driver::wire_stream`]), which synchronizes with the legacy
//! default stream but not with other threads' default streams.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_int, c_uint, c_void};

use crate::driver as drv;
use crate::exports::{self as ex, CUdeviceptr, CUhandle, CUhostFn, CUstreamCallback};
use crate::ffi::CUresult;

macro_rules! per_thread {
    ($( $(#[$m:meta])* $name:ident => $base:ident ( $($a:ident : $t:ty),* ); )*) => {$(
        $(#[$m])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            // SAFETY: the caller upholds the base entry point's contract,
            // which this one shares.
            #[allow(unused_unsafe)]
            drv::with_per_thread_default(|| unsafe { ex::$base($($a),*) })
        }
    )*

    /// Each base entry point with its per-thread variant.
    pub fn variants() -> Vec<(usize, usize)> {
        vec![$( (ex::$base as *const () as usize, $name as *const () as usize) ),*]
    }

    /// The names of the per-thread entry points.
    pub const NAMES: &[&str] = &[$( stringify!($name) ),*];
    };
}

per_thread! {
    cuLaunchKernel_ptsz => cuLaunchKernel(
        f: CUhandle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: CUhandle, params: *mut *mut c_void, extra: *mut *mut c_void
    );
    cuLaunchCooperativeKernel_ptsz => cuLaunchCooperativeKernel(
        f: CUhandle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: CUhandle, params: *mut *mut c_void
    );
    cuMemcpyHtoDAsync_v2_ptsz => cuMemcpyHtoDAsync_v2(
        dst: CUdeviceptr, src: *const c_void, n: usize, stream: CUhandle
    );
    cuMemcpyDtoHAsync_v2_ptsz => cuMemcpyDtoHAsync_v2(
        dst: *mut c_void, src: CUdeviceptr, n: usize, stream: CUhandle
    );
    cuMemcpyDtoDAsync_v2_ptsz => cuMemcpyDtoDAsync_v2(
        dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUhandle
    );
    cuMemcpyAsync_ptsz => cuMemcpyAsync(
        dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUhandle
    );
    cuMemcpyBatchAsync_ptsz => cuMemcpyBatchAsync(
        dsts: *const CUdeviceptr, srcs: *const CUdeviceptr, sizes: *const usize, count: usize,
        attrs: *const ex::MemcpyAttributes, attr_idxs: *const usize, num_attrs: usize,
        fail_idx: *mut usize, stream: CUhandle
    );
    cuMemcpyBatchAsync_v2_ptsz => cuMemcpyBatchAsync_v2(
        dsts: *const CUdeviceptr, srcs: *const CUdeviceptr, sizes: *const usize, count: usize,
        attrs: *const ex::MemcpyAttributes, attr_idxs: *const usize, num_attrs: usize,
        stream: CUhandle
    );
    cuStreamWriteValue32_ptsz => cuStreamWriteValue32(
        stream: CUhandle, addr: CUdeviceptr, value: u32, flags: c_uint
    );
    cuStreamWriteValue32_v2_ptsz => cuStreamWriteValue32_v2(
        stream: CUhandle, addr: CUdeviceptr, value: u32, flags: c_uint
    );
    cuStreamWriteValue64_ptsz => cuStreamWriteValue64(
        stream: CUhandle, addr: CUdeviceptr, value: u64, flags: c_uint
    );
    cuStreamWriteValue64_v2_ptsz => cuStreamWriteValue64_v2(
        stream: CUhandle, addr: CUdeviceptr, value: u64, flags: c_uint
    );
    cuStreamWaitValue32_ptsz => cuStreamWaitValue32(
        stream: CUhandle, addr: CUdeviceptr, value: u32, flags: c_uint
    );
    cuStreamWaitValue32_v2_ptsz => cuStreamWaitValue32_v2(
        stream: CUhandle, addr: CUdeviceptr, value: u32, flags: c_uint
    );
    cuStreamWaitValue64_ptsz => cuStreamWaitValue64(
        stream: CUhandle, addr: CUdeviceptr, value: u64, flags: c_uint
    );
    cuStreamWaitValue64_v2_ptsz => cuStreamWaitValue64_v2(
        stream: CUhandle, addr: CUdeviceptr, value: u64, flags: c_uint
    );
    cuStreamBatchMemOp_ptsz => cuStreamBatchMemOp(
        stream: CUhandle, count: c_uint, params: *const crate::mem_ops::RawParams, flags: c_uint
    );
    cuStreamBatchMemOp_v2_ptsz => cuStreamBatchMemOp_v2(
        stream: CUhandle, count: c_uint, params: *const crate::mem_ops::RawParams, flags: c_uint
    );
    cuMemsetD8Async_ptsz => cuMemsetD8Async(dst: CUdeviceptr, v: u8, n: usize, stream: CUhandle);
    cuMemsetD16Async_ptsz => cuMemsetD16Async(dst: CUdeviceptr, v: u16, n: usize, stream: CUhandle);
    cuMemsetD32Async_ptsz => cuMemsetD32Async(
        dst: CUdeviceptr, v: c_uint, n: usize, stream: CUhandle
    );
    cuStreamSynchronize_ptsz => cuStreamSynchronize(stream: CUhandle);
    cuStreamQuery_ptsz => cuStreamQuery(stream: CUhandle);
    cuStreamWaitEvent_ptsz => cuStreamWaitEvent(stream: CUhandle, event: CUhandle, flags: c_uint);
    cuEventRecord_ptsz => cuEventRecord(event: CUhandle, stream: CUhandle);
    cuEventRecordWithFlags_ptsz => cuEventRecordWithFlags(
        event: CUhandle, stream: CUhandle, flags: c_uint
    );
    cuStreamGetId_ptsz => cuStreamGetId(stream: CUhandle, id: *mut u64);
    cuStreamGetDevice_ptsz => cuStreamGetDevice(stream: CUhandle, device: *mut ex::CUdevice);
    cuStreamGetAttribute_ptsz => cuStreamGetAttribute(
        stream: CUhandle, attr: c_int, value: *mut c_void
    );
    cuStreamSetAttribute_ptsz => cuStreamSetAttribute(
        stream: CUhandle, attr: c_int, value: *const c_void
    );
    cuStreamCopyAttributes_ptsz => cuStreamCopyAttributes(dst: CUhandle, src: CUhandle);
    cuLaunchHostFunc_ptsz => cuLaunchHostFunc(stream: CUhandle, f: CUhostFn, data: *mut c_void);
    cuStreamAddCallback_ptsz => cuStreamAddCallback(
        stream: CUhandle, callback: CUstreamCallback, data: *mut c_void, flags: c_uint
    );
    cuMemcpyHtoD_v2_ptds => cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize);
    cuMemcpyDtoH_v2_ptds => cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize);
    cuMemcpyDtoD_v2_ptds => cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize);
    cuMemcpy_ptds => cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize);
    cuMemsetD8_v2_ptds => cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize);
    cuMemsetD16_v2_ptds => cuMemsetD16_v2(dst: CUdeviceptr, v: u16, n: usize);
    cuMemsetD32_v2_ptds => cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize);
}

/// The per-thread variant of the entry point at `base`, if it has one.
pub fn variant_of(base: usize) -> Option<usize> {
    use std::sync::OnceLock;
    static TABLE: OnceLock<Vec<(usize, usize)>> = OnceLock::new();
    TABLE
        .get_or_init(variants)
        .iter()
        .find(|(b, _)| *b == base)
        .map(|(_, v)| *v)
}
