//! Entry points libraries resolve by name with `dlsym` rather than through
//! `cuGetProcAddress`: the pre-`_v2` names NVIDIA's driver still exports
//! (cuBLAS and cuFFT look up `cuCtxPushCurrent`, `cuCtxPopCurrent`,
//! `cuDevicePrimaryCtxRelease`, `cuDevicePrimaryCtxReset` and refuse to start
//! without them), whose ABI is that of the `_v2` forms, and small queries
//! those libraries need (`cuStreamGetCtx`, occupancy with flags).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_int, c_uint};

use vgpu_proto::cuda;

use crate::driver as drv;
use crate::exports::{self, CUdevice, CUhandle, h, p};
use crate::ffi::{CUresult, ffi};
use crate::out;

/// `CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE`: the only occupancy flag.
pub(crate) const OCCUPANCY_FLAGS_KNOWN: c_uint = 0x1;

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxPushCurrent(ctx: CUhandle) -> CUresult {
    exports::cuCtxPushCurrent_v2(ctx)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent(pctx: *mut CUhandle) -> CUresult {
    // SAFETY: same contract as cuCtxPopCurrent_v2.
    unsafe { exports::cuCtxPopCurrent_v2(pctx) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    exports::cuDevicePrimaryCtxRelease_v2(dev)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    exports::cuDevicePrimaryCtxReset_v2(dev)
}

/// `CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX`, the only target.
const FLUSH_TARGET_CURRENT_CTX: c_int = 0;
/// `CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER` and `_TO_ALL_DEVICES`.
const FLUSH_SCOPES: [c_int; 2] = [100, 200];

/// `cuProfilerStart`: profiling of the current context starts; no profiler reaches a VM's
/// device (CUPTI's table refuses, docs/runtime.md), so there is nothing to start, as in CUDA
/// without a profiler attached.
#[unsafe(no_mangle)]
pub extern "C" fn cuProfilerStart() -> CUresult {
    ffi("cuProfilerStart", || drv::ctx().map(drop))
}

/// `cuProfilerStop`: see `cuProfilerStart`.
#[unsafe(no_mangle)]
pub extern "C" fn cuProfilerStop() -> CUresult {
    ffi("cuProfilerStop", || drv::ctx().map(drop))
}

/// `cuFlushGPUDirectRDMAWrites`: no third-party device writes a VM's GPU memory, and the device
/// reports no flush options (`GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS` is 0), so once its arguments
/// are checked the call is `CUDA_ERROR_NOT_SUPPORTED`, as on a GPU without GPUDirect RDMA.
#[unsafe(no_mangle)]
pub extern "C" fn cuFlushGPUDirectRDMAWrites(target: c_int, scope: c_int) -> CUresult {
    ffi("cuFlushGPUDirectRDMAWrites", || {
        if target != FLUSH_TARGET_CURRENT_CTX || !FLUSH_SCOPES.contains(&scope) {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        drv::ctx()?;
        Err(drv::unsupported(
            "cuFlushGPUDirectRDMAWrites (no GPUDirect RDMA)",
        ))
    })
}

/// `cuStreamGetCtx`: a VM's streams live on its one device; the context is
/// the current one (the primary context when none is current).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCtx(stream: CUhandle, pctx: *mut CUhandle) -> CUresult {
    ffi("cuStreamGetCtx", || {
        out!(pctx, p(drv::stream_context(h(stream))?))
    })
}

/// `cuStreamGetCtx_v2` (CUDA 12.5): the stream's context and NULL, or, for a green context's
/// stream, the primary context and the green context. The per-thread default stream of a green
/// context is `CUDA_ERROR_INVALID_HANDLE`, as in CUDA.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCtx_v2(
    stream: CUhandle,
    pctx: *mut CUhandle,
    pgreen: *mut CUhandle,
) -> CUresult {
    ffi("cuStreamGetCtx_v2", || {
        if pctx.is_null() || pgreen.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let c = drv::stream_context(h(stream))?;
        match crate::green_ctx::green_of(c) {
            Some(_) if h(stream) == drv::STREAM_PER_THREAD => Err(cuda::CUDA_ERROR_INVALID_HANDLE),
            Some(g) => {
                out!(pgreen, p(g))?;
                out!(pctx, p(drv::primary_handle(0)?))
            }
            None => {
                out!(pgreen, std::ptr::null_mut())?;
                out!(pctx, p(c))
            }
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    n: *mut c_int,
    f: CUhandle,
    block: c_int,
    smem: usize,
    flags: c_uint,
) -> CUresult {
    ffi(
        "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
        || {
            if flags & !OCCUPANCY_FLAGS_KNOWN != 0 {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
            out!(n, drv::occupancy_blocks_per_sm(h(f), block, smem)?)
        },
    )
}
