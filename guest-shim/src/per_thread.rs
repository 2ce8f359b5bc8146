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

use crate::alloc_exports as al;
use crate::copies as cp;
use crate::driver as drv;
use crate::exports::{self as ex, CUdeviceptr, CUhandle, CUhostFn, CUstreamCallback};
use crate::ffi::CUresult;
use crate::interop as io;
use crate::stream_capture as sc;

macro_rules! per_thread {
    ($( $(#[$m:meta])* $name:ident => $($base:ident)::+ ( $($a:ident : $t:ty),* ); )*) => {$(
        $(#[$m])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            // SAFETY: the caller upholds the base entry point's contract,
            // which this one shares.
            #[allow(unused_unsafe)]
            drv::with_per_thread_default(|| unsafe { $($base)::+($($a),*) })
        }
    )*

    /// Each base entry point with its per-thread variant.
    pub fn variants() -> Vec<(usize, usize)> {
        vec![$( ($($base)::+ as *const () as usize, $name as *const () as usize) ),*]
    }

    /// The names of the per-thread entry points.
    pub const NAMES: &[&str] = &[$( stringify!($name) ),*];
    };
}

per_thread! {
    cuLaunchKernel_ptsz => ex::cuLaunchKernel(
        f: CUhandle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: CUhandle, params: *mut *mut c_void, extra: *mut *mut c_void
    );
    cuLaunchCooperativeKernel_ptsz => ex::cuLaunchCooperativeKernel(
        f: CUhandle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: CUhandle, params: *mut *mut c_void
    );
    cuMemcpyHtoDAsync_v2_ptsz => ex::cuMemcpyHtoDAsync_v2(
        dst: CUdeviceptr, src: *const c_void, n: usize, stream: CUhandle
    );
    cuMemcpyDtoHAsync_v2_ptsz => ex::cuMemcpyDtoHAsync_v2(
        dst: *mut c_void, src: CUdeviceptr, n: usize, stream: CUhandle
    );
    cuMemcpyDtoDAsync_v2_ptsz => ex::cuMemcpyDtoDAsync_v2(
        dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUhandle
    );
    cuMemcpyAsync_ptsz => ex::cuMemcpyAsync(
        dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUhandle
    );
    cuMemcpyBatchAsync_ptsz => ex::cuMemcpyBatchAsync(
        dsts: *const CUdeviceptr, srcs: *const CUdeviceptr, sizes: *const usize, count: usize,
        attrs: *const ex::MemcpyAttributes, attr_idxs: *const usize, num_attrs: usize,
        fail_idx: *mut usize, stream: CUhandle
    );
    cuMemcpyBatchAsync_v2_ptsz => ex::cuMemcpyBatchAsync_v2(
        dsts: *const CUdeviceptr, srcs: *const CUdeviceptr, sizes: *const usize, count: usize,
        attrs: *const ex::MemcpyAttributes, attr_idxs: *const usize, num_attrs: usize,
        stream: CUhandle
    );
    cuStreamWriteValue32_ptsz => ex::cuStreamWriteValue32(
        stream: CUhandle, addr: CUdeviceptr, value: u32, flags: c_uint
    );
    cuStreamWriteValue32_v2_ptsz => ex::cuStreamWriteValue32_v2(
        stream: CUhandle, addr: CUdeviceptr, value: u32, flags: c_uint
    );
    cuStreamWriteValue64_ptsz => ex::cuStreamWriteValue64(
        stream: CUhandle, addr: CUdeviceptr, value: u64, flags: c_uint
    );
    cuStreamWriteValue64_v2_ptsz => ex::cuStreamWriteValue64_v2(
        stream: CUhandle, addr: CUdeviceptr, value: u64, flags: c_uint
    );
    cuStreamWaitValue32_ptsz => ex::cuStreamWaitValue32(
        stream: CUhandle, addr: CUdeviceptr, value: u32, flags: c_uint
    );
    cuStreamWaitValue32_v2_ptsz => ex::cuStreamWaitValue32_v2(
        stream: CUhandle, addr: CUdeviceptr, value: u32, flags: c_uint
    );
    cuStreamWaitValue64_ptsz => ex::cuStreamWaitValue64(
        stream: CUhandle, addr: CUdeviceptr, value: u64, flags: c_uint
    );
    cuStreamWaitValue64_v2_ptsz => ex::cuStreamWaitValue64_v2(
        stream: CUhandle, addr: CUdeviceptr, value: u64, flags: c_uint
    );
    cuStreamBatchMemOp_ptsz => ex::cuStreamBatchMemOp(
        stream: CUhandle, count: c_uint, params: *const crate::mem_ops::RawParams, flags: c_uint
    );
    cuStreamBatchMemOp_v2_ptsz => ex::cuStreamBatchMemOp_v2(
        stream: CUhandle, count: c_uint, params: *const crate::mem_ops::RawParams, flags: c_uint
    );
    cuMemsetD8Async_ptsz => ex::cuMemsetD8Async(dst: CUdeviceptr, v: u8, n: usize, stream: CUhandle);
    cuMemsetD16Async_ptsz => ex::cuMemsetD16Async(dst: CUdeviceptr, v: u16, n: usize, stream: CUhandle);
    cuMemsetD32Async_ptsz => ex::cuMemsetD32Async(
        dst: CUdeviceptr, v: c_uint, n: usize, stream: CUhandle
    );
    cuStreamSynchronize_ptsz => ex::cuStreamSynchronize(stream: CUhandle);
    cuStreamQuery_ptsz => ex::cuStreamQuery(stream: CUhandle);
    cuStreamWaitEvent_ptsz => ex::cuStreamWaitEvent(stream: CUhandle, event: CUhandle, flags: c_uint);
    cuEventRecord_ptsz => ex::cuEventRecord(event: CUhandle, stream: CUhandle);
    cuEventRecordWithFlags_ptsz => ex::cuEventRecordWithFlags(
        event: CUhandle, stream: CUhandle, flags: c_uint
    );
    cuStreamGetId_ptsz => ex::cuStreamGetId(stream: CUhandle, id: *mut u64);
    cuStreamGetDevice_ptsz => ex::cuStreamGetDevice(stream: CUhandle, device: *mut ex::CUdevice);
    cuStreamGetAttribute_ptsz => ex::cuStreamGetAttribute(
        stream: CUhandle, attr: c_int, value: *mut c_void
    );
    cuStreamSetAttribute_ptsz => ex::cuStreamSetAttribute(
        stream: CUhandle, attr: c_int, value: *const c_void
    );
    cuStreamCopyAttributes_ptsz => ex::cuStreamCopyAttributes(dst: CUhandle, src: CUhandle);
    cuLaunchHostFunc_ptsz => ex::cuLaunchHostFunc(stream: CUhandle, f: CUhostFn, data: *mut c_void);
    cuLaunchHostFunc_v2_ptsz => ex::cuLaunchHostFunc_v2(
        stream: CUhandle, f: CUhostFn, data: *mut c_void, sync_mode: c_uint
    );
    cuGraphicsMapResources_ptsz => io::cuGraphicsMapResources(
        count: c_uint, resources: *mut CUhandle, stream: CUhandle
    );
    cuGraphicsUnmapResources_ptsz => io::cuGraphicsUnmapResources(
        count: c_uint, resources: *mut CUhandle, stream: CUhandle
    );
    cuSignalExternalSemaphoresAsync_ptsz => io::cuSignalExternalSemaphoresAsync(
        semaphores: *const CUhandle, params: *const c_void, count: c_uint, stream: CUhandle
    );
    cuWaitExternalSemaphoresAsync_ptsz => io::cuWaitExternalSemaphoresAsync(
        semaphores: *const CUhandle, params: *const c_void, count: c_uint, stream: CUhandle
    );
    cuGLMapBufferObjectAsync_v2_ptsz => io::cuGLMapBufferObjectAsync_v2(
        ptr: *mut CUdeviceptr, size: *mut usize, buffer: c_uint, stream: CUhandle
    );
    cuGLMapBufferObject_v2_ptds => io::cuGLMapBufferObject_v2(
        ptr: *mut CUdeviceptr, size: *mut usize, buffer: c_uint
    );
    cuStreamAddCallback_ptsz => ex::cuStreamAddCallback(
        stream: CUhandle, callback: CUstreamCallback, data: *mut c_void, flags: c_uint
    );
    cuMemcpyHtoD_v2_ptds => ex::cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize);
    cuMemcpyDtoH_v2_ptds => ex::cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize);
    cuMemcpyDtoD_v2_ptds => ex::cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize);
    cuMemcpy_ptds => ex::cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize);
    cuMemsetD8_v2_ptds => ex::cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize);
    cuMemsetD16_v2_ptds => ex::cuMemsetD16_v2(dst: CUdeviceptr, v: u16, n: usize);
    cuMemsetD32_v2_ptds => ex::cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize);
    // Graphs, launches, stream-ordered memory, 2-D/3-D and array copies, peers, streams.
    cuGraphLaunch_ptsz => crate::graph::api::cuGraphLaunch(e: CUhandle, stream: CUhandle);
    cuGraphUpload_ptsz => crate::graph::api::cuGraphUpload(e: CUhandle, stream: CUhandle);
    cuGraphInstantiateWithParams_ptsz => crate::graph::api::cuGraphInstantiateWithParams(
        out: *mut CUhandle, graph: CUhandle, prm: *mut crate::graph::api::InstantiateParams
    );
    cuLaunchKernelEx_ptsz => ex::cuLaunchKernelEx(
        config: *const ex::CUlaunchConfig, f: CUhandle, params: *mut *mut c_void,
        extra: *mut *mut c_void
    );
    cuMemAllocAsync_ptsz => al::cuMemAllocAsync(
        dptr: *mut CUdeviceptr, bytesize: usize, stream: CUhandle
    );
    cuMemAllocFromPoolAsync_ptsz => al::cuMemAllocFromPoolAsync(
        dptr: *mut CUdeviceptr, bytesize: usize, pool: CUhandle, stream: CUhandle
    );
    cuMemFreeAsync_ptsz => al::cuMemFreeAsync(dptr: CUdeviceptr, stream: CUhandle);
    cuMemMapArrayAsync_ptsz => al::cuMemMapArrayAsync(
        map_info_list: *mut c_void, count: c_uint, stream: CUhandle
    );
    cuMemPrefetchAsync_ptsz => al::cuMemPrefetchAsync(
        dptr: CUdeviceptr, count: usize, dst_device: ex::CUdevice, stream: CUhandle
    );
    cuMemPrefetchAsync_v2_ptsz => al::cuMemPrefetchAsync_v2(
        dptr: CUdeviceptr, count: usize, location: al::CUmemLocation, flags: c_uint,
        stream: CUhandle
    );
    cuStreamAttachMemAsync_ptsz => al::cuStreamAttachMemAsync(
        stream: CUhandle, dptr: CUdeviceptr, length: usize, flags: c_uint
    );
    cuMemcpy2DAsync_v2_ptsz => cp::cuMemcpy2DAsync_v2(p: *const cp::Memcpy2D, stream: CUhandle);
    cuMemcpy2D_v2_ptds => cp::cuMemcpy2D_v2(p: *const cp::Memcpy2D);
    cuMemcpy2DUnaligned_v2_ptds => cp::cuMemcpy2DUnaligned_v2(p: *const cp::Memcpy2D);
    cuMemcpy3DAsync_v2_ptsz => cp::cuMemcpy3DAsync_v2(p: *const cp::Memcpy3D, stream: CUhandle);
    cuMemcpy3D_v2_ptds => cp::cuMemcpy3D_v2(p: *const cp::Memcpy3D);
    cuMemcpy3DPeerAsync_ptsz => cp::cuMemcpy3DPeerAsync(p: *const cp::Memcpy3D, stream: CUhandle);
    cuMemcpy3DPeer_ptds => cp::cuMemcpy3DPeer(p: *const cp::Memcpy3D);
    cuMemcpy3DBatchAsync_ptsz => cp::cuMemcpy3DBatchAsync(
        n: usize, ops: *const cp::Memcpy3DBatchOp, fail_idx: *mut usize, flags: u64,
        stream: CUhandle
    );
    cuMemcpy3DBatchAsync_v2_ptsz => cp::cuMemcpy3DBatchAsync_v2(
        n: usize, ops: *const cp::Memcpy3DBatchOp, flags: u64, stream: CUhandle
    );
    cuMemcpy3DWithAttributesAsync_ptsz => cp::cuMemcpy3DWithAttributesAsync(
        op: *const cp::Memcpy3DBatchOp, flags: u64, stream: CUhandle
    );
    cuMemcpyWithAttributesAsync_ptsz => ex::cuMemcpyWithAttributesAsync(
        dst: CUdeviceptr, src: CUdeviceptr, size: usize, attr: *const ex::MemcpyAttributes,
        stream: CUhandle
    );
    cuMemPrefetchBatchAsync_ptsz => al::cuMemPrefetchBatchAsync(
        ptrs: *const CUdeviceptr, sizes: *const usize, count: usize,
        locs: *const al::CUmemLocation, loc_idxs: *const usize, num_locs: usize, flags: u64,
        stream: CUhandle
    );
    cuMemDiscardBatchAsync_ptsz => al::cuMemDiscardBatchAsync(
        ptrs: *const CUdeviceptr, sizes: *const usize, count: usize, flags: u64, stream: CUhandle
    );
    cuMemDiscardAndPrefetchBatchAsync_ptsz => al::cuMemDiscardAndPrefetchBatchAsync(
        ptrs: *const CUdeviceptr, sizes: *const usize, count: usize,
        locs: *const al::CUmemLocation, loc_idxs: *const usize, num_locs: usize, flags: u64,
        stream: CUhandle
    );
    cuMemcpyPeerAsync_ptsz => cp::cuMemcpyPeerAsync(
        dst: CUdeviceptr, dst_ctx: CUhandle, src: CUdeviceptr, src_ctx: CUhandle, n: usize,
        stream: CUhandle
    );
    cuMemcpyPeer_ptds => cp::cuMemcpyPeer(
        dst: CUdeviceptr, dst_ctx: CUhandle, src: CUdeviceptr, src_ctx: CUhandle, n: usize
    );
    cuMemsetD2D8Async_ptsz => cp::cuMemsetD2D8Async(
        dst: CUdeviceptr, pitch: usize, v: u8, w: usize, ht: usize, stream: CUhandle
    );
    cuMemsetD2D16Async_ptsz => cp::cuMemsetD2D16Async(
        dst: CUdeviceptr, pitch: usize, v: u16, w: usize, ht: usize, stream: CUhandle
    );
    cuMemsetD2D32Async_ptsz => cp::cuMemsetD2D32Async(
        dst: CUdeviceptr, pitch: usize, v: u32, w: usize, ht: usize, stream: CUhandle
    );
    cuMemsetD2D8_v2_ptds => cp::cuMemsetD2D8_v2(
        dst: CUdeviceptr, pitch: usize, v: u8, w: usize, ht: usize
    );
    cuMemsetD2D16_v2_ptds => cp::cuMemsetD2D16_v2(
        dst: CUdeviceptr, pitch: usize, v: u16, w: usize, ht: usize
    );
    cuMemsetD2D32_v2_ptds => cp::cuMemsetD2D32_v2(
        dst: CUdeviceptr, pitch: usize, v: u32, w: usize, ht: usize
    );
    cuMemcpyAtoA_v2_ptds => crate::arrays::cuMemcpyAtoA_v2(
        dst: CUhandle, dst_offset: usize, src: CUhandle, src_offset: usize, len: usize
    );
    cuMemcpyAtoD_v2_ptds => crate::arrays::cuMemcpyAtoD_v2(
        dst: CUdeviceptr, src: CUhandle, offset: usize, len: usize
    );
    cuMemcpyAtoH_v2_ptds => crate::arrays::cuMemcpyAtoH_v2(
        dst: *mut c_void, src: CUhandle, offset: usize, len: usize
    );
    cuMemcpyAtoHAsync_v2_ptsz => crate::arrays::cuMemcpyAtoHAsync_v2(
        dst: *mut c_void, src: CUhandle, offset: usize, len: usize, stream: CUhandle
    );
    cuMemcpyDtoA_v2_ptds => crate::arrays::cuMemcpyDtoA_v2(
        dst: CUhandle, offset: usize, src: CUdeviceptr, len: usize
    );
    cuMemcpyHtoA_v2_ptds => crate::arrays::cuMemcpyHtoA_v2(
        dst: CUhandle, offset: usize, src: *const c_void, len: usize
    );
    cuMemcpyHtoAAsync_v2_ptsz => crate::arrays::cuMemcpyHtoAAsync_v2(
        dst: CUhandle, offset: usize, src: *const c_void, len: usize, stream: CUhandle
    );
    cuStreamGetCtx_ptsz => crate::compat::cuStreamGetCtx(stream: CUhandle, pctx: *mut CUhandle);
    cuStreamGetCtx_v2_ptsz => crate::compat::cuStreamGetCtx_v2(
        stream: CUhandle, pctx: *mut CUhandle, pgreen: *mut CUhandle
    );
    cuStreamGetFlags_ptsz => ex::cuStreamGetFlags(stream: CUhandle, flags: *mut c_uint);
    cuStreamGetDevResource_ptsz => crate::green_ctx::cuStreamGetDevResource(
        stream: CUhandle, res: *mut c_void, ty: c_int
    );
    cuStreamGetPriority_ptsz => ex::cuStreamGetPriority(stream: CUhandle, priority: *mut c_int);
    // Stream capture.
    cuStreamBeginCapture_ptsz => sc::cuStreamBeginCapture(stream: CUhandle);
    cuStreamBeginCapture_v2_ptsz => sc::cuStreamBeginCapture_v2(stream: CUhandle, mode: c_int);
    cuStreamBeginCaptureToGraph_ptsz => sc::cuStreamBeginCaptureToGraph(
        stream: CUhandle,
        graph: CUhandle,
        deps: *const CUhandle,
        edge_data: *const u8,
        num_deps: usize,
        mode: c_int
    );
    cuStreamEndCapture_ptsz => sc::cuStreamEndCapture(stream: CUhandle, graph: *mut CUhandle);
    cuStreamIsCapturing_ptsz => sc::cuStreamIsCapturing(stream: CUhandle, st: *mut c_int);
    cuStreamGetCaptureInfo_ptsz => sc::cuStreamGetCaptureInfo(
        stream: CUhandle,
        st: *mut c_int,
        id: *mut u64
    );
    cuStreamGetCaptureInfo_v2_ptsz => sc::cuStreamGetCaptureInfo_v2(
        stream: CUhandle,
        st: *mut c_int,
        id: *mut u64,
        graph: *mut CUhandle,
        deps: *mut *const CUhandle,
        num_deps: *mut usize
    );
    cuStreamGetCaptureInfo_v3_ptsz => sc::cuStreamGetCaptureInfo_v3(
        stream: CUhandle,
        st: *mut c_int,
        id: *mut u64,
        graph: *mut CUhandle,
        deps: *mut *const CUhandle,
        edges: *mut *const u8,
        num_deps: *mut usize
    );
    cuStreamUpdateCaptureDependencies_ptsz => sc::cuStreamUpdateCaptureDependencies(
        stream: CUhandle,
        deps: *const CUhandle,
        num_deps: usize,
        flags: u32
    );
    cuStreamUpdateCaptureDependencies_v2_ptsz => sc::cuStreamUpdateCaptureDependencies_v2(
        stream: CUhandle,
        deps: *const CUhandle,
        edge_data: *const u8,
        num_deps: usize,
        flags: u32
    );
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
