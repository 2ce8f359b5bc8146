//! The exported C ABI of `libcuda.so.1`: a thin layer that converts C
//! arguments and calls the safe functions in [`crate::driver`].
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::borrow::Cow;
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use vgpu_proto::cuda;

use crate::driver::{self as drv, Space};
use crate::ffi::{CUresult, ffi, write_cstr};
use crate::{in_bytes, out, out_bytes};

/// The stream memory operations take a stream: re-exported for the per-thread variants.
pub use crate::mem_ops::{
    cuStreamBatchMemOp, cuStreamBatchMemOp_v2, cuStreamWaitValue32, cuStreamWaitValue32_v2,
    cuStreamWaitValue64, cuStreamWaitValue64_v2, cuStreamWriteValue32, cuStreamWriteValue32_v2,
    cuStreamWriteValue64, cuStreamWriteValue64_v2,
};
/// Stream attributes live in their own module; re-exported for the per-thread variants.
pub use crate::stream_attrs::{
    cuCtxResetPersistingL2Cache, cuStreamCopyAttributes, cuStreamGetAttribute, cuStreamSetAttribute,
};

/// `CUdevice`.
pub type CUdevice = c_int;
/// `CUdeviceptr`.
pub type CUdeviceptr = u64;
/// An opaque handle (`CUcontext`, `CUstream`, `CUevent`, `CUmodule`, `CUfunction`, …).
pub type CUhandle = *mut c_void;

pub(crate) fn h(p: CUhandle) -> u64 {
    p as u64
}

pub(crate) fn p(v: u64) -> CUhandle {
    v as CUhandle
}

/// `CU_CTX_SCHED_*` and friends that `cuCtxCreate` accepts.
const CTX_FLAGS_KNOWN: c_uint = 0x1f;

// ---- initialisation, version, errors ---------------------------------------

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    ffi("cuInit", || drv::init(flags))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    ffi("cuDriverGetVersion", || {
        out!(version, drv::driver_version())
    })
}

fn error_strings() -> &'static [(u32, CString, CString)] {
    static T: OnceLock<Vec<(u32, CString, CString)>> = OnceLock::new();
    T.get_or_init(|| {
        cuda::RESULTS
            .iter()
            .map(|(c, n, m)| {
                (
                    *c,
                    CString::new(*n).unwrap_or_default(),
                    CString::new(*m).unwrap_or_default(),
                )
            })
            .collect()
    })
}

fn error_lookup(code: CUresult, s: *mut *const c_char, name: bool) -> CUresult {
    ffi(
        if name {
            "cuGetErrorName"
        } else {
            "cuGetErrorString"
        },
        || {
            let e = error_strings().iter().find(|e| e.0 == code);
            let ptr = e.map_or(std::ptr::null(), |e| {
                if name { e.1.as_ptr() } else { e.2.as_ptr() }
            });
            out!(s, ptr)?;
            if e.is_some() {
                Ok(())
            } else {
                Err(cuda::CUDA_ERROR_INVALID_VALUE)
            }
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, s: *mut *const c_char) -> CUresult {
    error_lookup(error, s, true)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, s: *mut *const c_char) -> CUresult {
    error_lookup(error, s, false)
}

// ---- error log (cuLogs*, crate::logs) ------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsRegisterCallback(
    callback: Option<crate::logs::Callback>,
    user_data: *mut c_void,
    handle_out: *mut *mut c_void,
) -> CUresult {
    ffi("cuLogsRegisterCallback", || {
        let f = callback.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        let id = crate::logs::register(f, user_data as usize);
        if handle_out.is_null() {
            return Ok(());
        }
        out!(handle_out, id as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsUnregisterCallback(handle: *mut c_void) -> CUresult {
    ffi("cuLogsUnregisterCallback", || {
        if crate::logs::unregister(handle as u64) {
            Ok(())
        } else {
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsCurrent(iterator_out: *mut c_uint, flags: c_uint) -> CUresult {
    ffi("cuLogsCurrent", || {
        if flags != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(iterator_out, crate::logs::current())
    })
}

/// The messages from the caller's optional iterator (advanced past them), fitting in `room`.
///
/// # Safety
/// `iterator` must be NULL or valid for reads and writes of a `CUlogIterator`.
unsafe fn dump_logs(iterator: *mut c_uint, room: usize) -> drv::CuRes<Option<String>> {
    let from = if iterator.is_null() {
        None
    } else {
        // SAFETY: non-NULL, and valid for reads (this function's contract).
        Some(unsafe { iterator.read_unaligned() })
    };
    let Some(d) = crate::logs::dump(from, room) else {
        return Ok(None);
    };
    if !iterator.is_null() {
        out!(iterator, d.next)?;
    }
    Ok(Some(d.text))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsDumpToMemory(
    iterator: *mut c_uint,
    buffer: *mut c_char,
    size: *mut usize,
    flags: c_uint,
) -> CUresult {
    ffi("cuLogsDumpToMemory", || {
        if flags != 0 || buffer.is_null() || size.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `size` is non-NULL and the caller's in/out size (CUDA contract).
        let room = unsafe { size.read_unaligned() };
        // SAFETY: `iterator` is NULL or the caller's iterator (CUDA contract).
        let text = unsafe { dump_logs(iterator, room) }?;
        let Some(text) = text else {
            out!(size, 0)?;
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        };
        let dst = out_bytes!(buffer, text.len() + 1);
        dst[..text.len()].copy_from_slice(text.as_bytes());
        dst[text.len()] = 0;
        out!(size, text.len())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsDumpToFile(
    iterator: *mut c_uint,
    path: *const c_char,
    flags: c_uint,
) -> CUresult {
    ffi("cuLogsDumpToFile", || {
        if flags != 0 || path.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `path` is the caller's NUL-terminated path (CUDA contract).
        let path = unsafe { CStr::from_ptr(path) };
        let path = std::path::Path::new(
            <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes()),
        );
        // SAFETY: `iterator` is NULL or the caller's iterator (CUDA contract).
        let text = unsafe { dump_logs(iterator, usize::MAX) }?.unwrap_or_default();
        std::fs::write(path, text).map_err(|e| {
            crate::debug!("cuLogsDumpToFile: {}: {e}", path.display());
            cuda::CUDA_ERROR_INVALID_VALUE
        })
    })
}

// ---- devices -----------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    ffi("cuDeviceGetCount", || out!(count, drv::device_count()?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    ffi("cuDeviceGet", || out!(device, drv::device_get(ordinal)?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    ffi("cuDeviceGetName", || {
        let n = drv::device_name(dev)?;
        // SAFETY: `name` is the caller's buffer of `len` bytes (CUDA contract); NULL and len <= 0 are refused.
        unsafe { write_cstr(name, len, &n) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    ffi("cuDeviceGetUuid", || out!(uuid, drv::device_uuid(dev)?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    ffi("cuDeviceGetUuid_v2", || out!(uuid, drv::device_uuid(dev)?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    ffi("cuDeviceTotalMem_v2", || {
        out!(bytes, drv::device_total_mem(dev)? as usize)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    dev: CUdevice,
) -> CUresult {
    ffi("cuDeviceGetAttribute", || {
        out!(pi, drv::device_attribute(attrib, dev)?)
    })
}

/// `CUdevprop`'s fields: the values of device attributes `MAX_THREADS_PER_BLOCK` to
/// `TEXTURE_ALIGNMENT`, in order, each an `int`.
const DEVPROP_FIELDS: usize = cuda::attr::TEXTURE_ALIGNMENT - cuda::attr::MAX_THREADS_PER_BLOCK + 1;

/// `cuDeviceGetProperties` (deprecated since CUDA 5.0, still declared): the legacy property
/// block, filled from the device's attributes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetProperties(prop: *mut c_int, dev: CUdevice) -> CUresult {
    ffi("cuDeviceGetProperties", || {
        if prop.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let mut fields = [0; DEVPROP_FIELDS];
        for (i, field) in fields.iter_mut().enumerate() {
            let attr = cuda::attr::MAX_THREADS_PER_BLOCK + i;
            *field = drv::device_attribute(attr as c_int, dev)?;
        }
        // SAFETY: `prop` points to a CUdevprop, fourteen ints (CUDA contract), checked non-NULL.
        unsafe { std::ptr::copy_nonoverlapping(fields.as_ptr(), prop, fields.len()) };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceComputeCapability(
    major: *mut c_int,
    minor: *mut c_int,
    dev: CUdevice,
) -> CUresult {
    ffi("cuDeviceComputeCapability", || {
        out!(
            major,
            drv::device_attribute(cuda::attr::COMPUTE_CAPABILITY_MAJOR as c_int, dev)?
        )?;
        out!(
            minor,
            drv::device_attribute(cuda::attr::COMPUTE_CAPABILITY_MINOR as c_int, dev)?
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    bus_id: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    ffi("cuDeviceGetPCIBusId", || {
        let s = drv::device_pci_bus_id(dev)?;
        // SAFETY: `bus_id` is the caller's buffer of `len` bytes (CUDA contract); NULL and len <= 0 are refused.
        unsafe { write_cstr(bus_id, len, &s) }
    })
}

// ---- contexts ------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUhandle,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    ffi("cuCtxCreate_v2", || {
        if pctx.is_null() || flags & !CTX_FLAGS_KNOWN != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(pctx, p(drv::ctx_create(flags, dev)?))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUhandle,
    params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    if num_params == 0 && params.is_null() {
        // SAFETY: same contract as cuCtxCreate_v2 for `pctx`.
        return unsafe { cuCtxCreate_v2(pctx, flags, dev) };
    }
    ffi("cuCtxCreate_v3", || {
        if pctx.is_null() || flags & !CTX_FLAGS_KNOWN != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(
            pctx,
            p(crate::exec_affinity::create(
                params, num_params, flags, dev
            )?)
        )
    })
}

/// `CUctxCreateParams`.
#[repr(C)]
pub struct CtxCreateParams {
    exec_affinity: *mut c_void,
    num_exec_affinity: c_int,
    cig: *mut c_void,
}

/// `cuCtxCreate_v4` (CUDA 13's `cuCtxCreate`): execution affinity
/// (`CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY`) and CUDA in graphics (CIG) parameters are not
/// supported; without them it is `cuCtxCreate_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUhandle,
    params: *const CtxCreateParams,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: NULL or a CUctxCreateParams (CUDA contract).
    if let Some(p) = unsafe { params.as_ref() } {
        if !p.cig.is_null() {
            return drv::unsupported("cuCtxCreate_v4 with CUDA in graphics (CIG) parameters");
        }
        if p.num_exec_affinity != 0 || !p.exec_affinity.is_null() {
            // SAFETY: the affinity array is the caller's (CUDA contract), read as _v3 reads it.
            return unsafe {
                cuCtxCreate_v3(pctx, p.exec_affinity, p.num_exec_affinity, flags, dev)
            };
        }
    }
    // SAFETY: same contract as cuCtxCreate_v2 for `pctx`.
    unsafe { cuCtxCreate_v2(pctx, flags, dev) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(ctx: CUhandle) -> CUresult {
    ffi("cuCtxDestroy_v2", || {
        if crate::green_ctx::is_green(h(ctx)) {
            // A green context's goes with it (cuGreenCtxDestroy).
            return Err(cuda::CUDA_ERROR_INVALID_CONTEXT);
        }
        drv::ctx_destroy(h(ctx))
    })
}

/// `cuCtxAttach` (deprecated): the current context, with one more use; `flags` must be 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxAttach(pctx: *mut CUhandle, flags: c_uint) -> CUresult {
    ffi("cuCtxAttach", || {
        if pctx.is_null() || flags != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(pctx, p(drv::ctx_attach()?))
    })
}

/// `cuCtxDetach` (deprecated): one use less of the current context, destroyed with its last.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDetach(ctx: CUhandle) -> CUresult {
    ffi("cuCtxDetach", || drv::ctx_detach(h(ctx)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUhandle) -> CUresult {
    ffi("cuCtxGetCurrent", || out!(pctx, p(drv::ctx_get_current()?)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: CUhandle) -> CUresult {
    ffi("cuCtxSetCurrent", || drv::ctx_set_current(h(ctx)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: CUhandle) -> CUresult {
    ffi("cuCtxPushCurrent_v2", || drv::ctx_push(h(ctx)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUhandle) -> CUresult {
    ffi("cuCtxPopCurrent_v2", || {
        let c = drv::ctx_pop()?;
        if pctx.is_null() {
            Ok(())
        } else {
            out!(pctx, p(c))
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    ffi("cuCtxGetDevice", || out!(device, drv::ctx_get_device()?))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    ffi("cuCtxSynchronize", drv::ctx_synchronize)
}

/// `cuCtxSynchronize_v2` (CUDA 13's `cuCtxSynchronize`): a given context, or
/// the current one for NULL.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize_v2(ctx: CUhandle) -> CUresult {
    ffi("cuCtxSynchronize_v2", || match h(ctx) {
        0 => drv::ctx_synchronize(),
        c => drv::ctx_synchronize_of(c),
    })
}

/// `cuDeviceRegisterAsyncNotification` (CUDA 12.5): over-budget notifications
/// ([`crate::async_notify`]).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceRegisterAsyncNotification(
    dev: c_int,
    callback: Option<crate::async_notify::AsyncCallback>,
    user: *mut c_void,
    handle: *mut *mut c_void,
) -> CUresult {
    ffi("cuDeviceRegisterAsyncNotification", || {
        let callback = callback.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        if handle.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let h = crate::async_notify::register(dev, callback, user)?;
        out!(handle, h as *mut c_void)
    })
}

/// `cuDeviceUnregisterAsyncNotification` (CUDA 12.5).
#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceUnregisterAsyncNotification(dev: c_int, handle: *mut c_void) -> CUresult {
    ffi("cuDeviceUnregisterAsyncNotification", || {
        crate::async_notify::unregister(dev, handle as usize)
    })
}

/// `cuCtxRecordEvent` (CUDA 12.5).
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxRecordEvent(ctx: CUhandle, event: CUhandle) -> CUresult {
    ffi("cuCtxRecordEvent", || {
        drv::ctx_record_event(h(ctx), h(event))
    })
}

/// `cuCtxWaitEvent` (CUDA 12.5).
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxWaitEvent(ctx: CUhandle, event: CUhandle) -> CUresult {
    ffi("cuCtxWaitEvent", || drv::ctx_wait_event(h(ctx), h(event)))
}

/// `cuCtxGetDevice_v2` (CUDA 13's `cuCtxGetDevice`): the device of a given
/// context, or of the current one for NULL. A VM sees one device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice_v2(device: *mut CUdevice, ctx: CUhandle) -> CUresult {
    ffi("cuCtxGetDevice_v2", || match h(ctx) {
        0 => out!(device, drv::ctx_get_device()?),
        c => {
            // The host checks the context (a synchronization of an idle
            // context costs one round trip).
            drv::ctx_synchronize_of(c)?;
            out!(device, 0)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetApiVersion(_ctx: CUhandle, version: *mut c_uint) -> CUresult {
    ffi("cuCtxGetApiVersion", || {
        drv::driver()?;
        out!(version, 3020)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    ffi("cuCtxGetFlags", || out!(flags, drv::ctx_flags()?))
}

/// `cuCtxSetFlags` (CUDA 12.1).
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetFlags(flags: c_uint) -> CUresult {
    ffi("cuCtxSetFlags", || drv::ctx_set_flags(flags))
}

/// `CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE`: the bank size of every device since Maxwell,
/// which ignore the setting.
const SHARED_MEM_FOUR_BYTE_BANKS: c_int = 1;
/// `CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE`, the largest configuration value.
const SHARED_MEM_CONFIG_LAST: c_int = 2;

fn check_shared_mem_config(config: c_int) -> drv::CuRes<()> {
    if (0..=SHARED_MEM_CONFIG_LAST).contains(&config) {
        Ok(())
    } else {
        Err(cuda::CUDA_ERROR_INVALID_VALUE)
    }
}

/// `cuCtxGetSharedMemConfig` (deprecated in CUDA 12.4): four-byte banks, as on every device
/// since Maxwell.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetSharedMemConfig(config: *mut c_int) -> CUresult {
    ffi("cuCtxGetSharedMemConfig", || {
        drv::ctx_get_device()?;
        out!(config, SHARED_MEM_FOUR_BYTE_BANKS)
    })
}

/// `cuCtxSetSharedMemConfig`: accepted and without effect, as on devices since Maxwell.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetSharedMemConfig(config: c_int) -> CUresult {
    ffi("cuCtxSetSharedMemConfig", || {
        check_shared_mem_config(config)?;
        drv::ctx_get_device().map(drop)
    })
}

/// `cuFuncSetSharedMemConfig`: accepted and without effect, as on devices since Maxwell.
#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetSharedMemConfig(f: CUhandle, config: c_int) -> CUresult {
    ffi("cuFuncSetSharedMemConfig", || {
        check_shared_mem_config(config)?;
        drv::func_layout(h(f)).map(drop)
    })
}

/// `cuCtxGetId` (CUDA 12.0): the context's handle, unique among the process's live contexts.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetId(ctx: CUhandle, id: *mut u64) -> CUresult {
    ffi("cuCtxGetId", || out!(id, drv::ctx_id(h(ctx))?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    ffi("cuCtxGetStreamPriorityRange", || {
        drv::driver()?;
        if !least.is_null() {
            out!(least, 0)?;
        }
        if !greatest.is_null() {
            out!(greatest, drv::GREATEST_PRIORITY)?;
        }
        Ok(())
    })
}

/// `CU_LIMIT_STACK_SIZE`.
const LIMIT_STACK_SIZE: c_int = cuda::limit::STACK_SIZE as c_int;
/// `CU_LIMIT_PRINTF_FIFO_SIZE`.
const LIMIT_PRINTF_FIFO_SIZE: c_int = cuda::limit::PRINTF_FIFO_SIZE as c_int;
/// `CU_LIMIT_MALLOC_HEAP_SIZE`.
const LIMIT_MALLOC_HEAP_SIZE: c_int = cuda::limit::MALLOC_HEAP_SIZE as c_int;
/// CUDA's device heap size until the program sets one.
const DEFAULT_MALLOC_HEAP_SIZE: usize = 8 << 20;
/// The device heap size vgpud accepted (`cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE)`).
static MALLOC_HEAP_SIZE: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(DEFAULT_MALLOC_HEAP_SIZE);
/// The device runtime's limits as the program set them (CUDA's defaults until then).
static SYNC_DEPTH: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(cuda::limit::DEFAULT_SYNC_DEPTH as usize);
static PENDING_LAUNCHES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(cuda::limit::DEFAULT_PENDING_LAUNCH_COUNT as usize);
/// `CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH`.
const LIMIT_DEV_RUNTIME_SYNC_DEPTH: c_int = cuda::limit::DEV_RUNTIME_SYNC_DEPTH as c_int;
/// `CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT`.
const LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: c_int =
    cuda::limit::DEV_RUNTIME_PENDING_LAUNCH_COUNT as c_int;
/// `CU_LIMIT_MAX_L2_FETCH_GRANULARITY`.
const LIMIT_MAX_L2_FETCH_GRANULARITY: c_int = 5;
/// `CU_LIMIT_PERSISTING_L2_CACHE_SIZE`.
const LIMIT_PERSISTING_L2_CACHE_SIZE: c_int = 6;
/// `CU_LIMIT_SHMEM_SIZE` (CIG contexts).
const LIMIT_SHMEM_SIZE: c_int = 7;
/// `CU_LIMIT_CIG_ENABLED`.
const LIMIT_CIG_ENABLED: c_int = 8;
/// `CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED`.
const LIMIT_CIG_SHMEM_FALLBACK_ENABLED: c_int = 9;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetLimit(value: *mut usize, limit: c_int) -> CUresult {
    ffi("cuCtxGetLimit", || {
        drv::ctx_get_device()?;
        let v = match limit {
            LIMIT_STACK_SIZE => 1024,
            LIMIT_PRINTF_FIFO_SIZE => crate::devout::printf_fifo_size(),
            LIMIT_MALLOC_HEAP_SIZE => MALLOC_HEAP_SIZE.load(std::sync::atomic::Ordering::Relaxed),
            // Device-runtime (dynamic parallelism) limits: CUDA's defaults.
            LIMIT_DEV_RUNTIME_SYNC_DEPTH => SYNC_DEPTH.load(std::sync::atomic::Ordering::Relaxed),
            LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT => {
                PENDING_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
            }
            // L2 tuning: the default fetch granularity, no persisting L2.
            LIMIT_MAX_L2_FETCH_GRANULARITY => 64,
            LIMIT_PERSISTING_L2_CACHE_SIZE => 0,
            // Not a CUDA-in-graphics context: no CIG shared memory budget.
            LIMIT_SHMEM_SIZE | LIMIT_CIG_ENABLED | LIMIT_CIG_SHMEM_FALLBACK_ENABLED => 0,
            _ => {
                crate::debug!("cuCtxGetLimit({limit}): a limit vgpu does not know");
                return Err(cuda::CUDA_ERROR_UNSUPPORTED_LIMIT);
            }
        };
        out!(value, v)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult {
    ffi("cuCtxSetLimit", || {
        drv::ctx_get_device()?;
        match limit {
            LIMIT_PRINTF_FIFO_SIZE => {
                drv::ctx_set_limit(limit as u32, value as u64)?;
                crate::devout::set_printf_fifo_size(value);
                Ok(())
            }
            LIMIT_MALLOC_HEAP_SIZE => {
                match drv::ctx_set_limit(limit as u32, value as u64) {
                    // An older vgpud, which has no device heap, refuses the limit.
                    Ok(()) | Err(cuda::CUDA_ERROR_UNSUPPORTED_LIMIT) => {}
                    Err(e) => return Err(e),
                }
                MALLOC_HEAP_SIZE.store(value, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT => {
                match drv::ctx_set_limit(limit as u32, value as u64) {
                    // An older vgpud keeps CUDA's default.
                    Ok(()) | Err(cuda::CUDA_ERROR_UNSUPPORTED_LIMIT) => {}
                    Err(e) => return Err(e),
                }
                PENDING_LAUNCHES.store(value, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            // How deep grids may wait for their children with device-side
            // cudaDeviceSynchronize (CUDA 11's dynamic parallelism).
            LIMIT_DEV_RUNTIME_SYNC_DEPTH => {
                match drv::ctx_set_limit(limit as u32, value as u64) {
                    // An older vgpud keeps CUDA's default.
                    Ok(()) | Err(cuda::CUDA_ERROR_UNSUPPORTED_LIMIT) => {}
                    Err(e) => return Err(e),
                }
                SYNC_DEPTH.store(value, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            LIMIT_STACK_SIZE => Ok(()),
            _ => Err(cuda::CUDA_ERROR_UNSUPPORTED_LIMIT),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCacheConfig(config: *mut c_int) -> CUresult {
    ffi("cuCtxGetCacheConfig", || {
        drv::ctx_get_device()?;
        out!(config, 0)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCacheConfig(_config: c_int) -> CUresult {
    ffi("cuCtxSetCacheConfig", || drv::ctx_get_device().map(drop))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUhandle, dev: CUdevice) -> CUresult {
    ffi("cuDevicePrimaryCtxRetain", || {
        if pctx.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(pctx, p(drv::primary_retain(dev)?))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    ffi("cuDevicePrimaryCtxRelease_v2", || drv::primary_release(dev))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    ffi("cuDevicePrimaryCtxReset_v2", || drv::primary_reset(dev))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    ffi("cuDevicePrimaryCtxGetState", || {
        let (f, a) = drv::primary_state(dev)?;
        out!(flags, f)?;
        out!(active, c_int::from(a))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    ffi("cuDevicePrimaryCtxSetFlags_v2", || {
        drv::primary_set_flags(dev, flags)
    })
}

// ---- memory ----------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    ffi("cuMemAlloc_v2", || {
        if dptr.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(dptr, drv::mem_alloc(bytesize as u64)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem_size: c_uint,
) -> CUresult {
    ffi("cuMemAllocPitch_v2", || {
        if dptr.is_null() || pitch.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let (d, pt) = drv::mem_alloc_pitch(width as u64, height as u64, elem_size)?;
        out!(dptr, d)?;
        out!(pitch, pt as usize)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    ffi("cuMemFree_v2", || drv::mem_free(dptr))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    ffi("cuMemGetInfo_v2", || {
        let (f, t) = drv::mem_get_info()?;
        out!(free, f as usize)?;
        out!(total, t as usize)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CUdeviceptr,
    size: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    ffi("cuMemGetAddressRange_v2", || {
        let (b, s) = drv::mem_get_address_range(dptr)?;
        if !base.is_null() {
            out!(base, b)?;
        }
        if !size.is_null() {
            out!(size, s as usize)?;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    ffi("cuMemcpyHtoD_v2", || {
        drv::memcpy_htod(dst, in_bytes!(src, n), 0, true)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    stream: CUhandle,
) -> CUresult {
    ffi("cuMemcpyHtoDAsync_v2", || {
        drv::memcpy_htod(dst, in_bytes!(src, n), h(stream), false)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    ffi("cuMemcpyDtoH_v2", || {
        drv::memcpy_dtoh(out_bytes!(dst, n), src, 0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    stream: CUhandle,
) -> CUresult {
    ffi("cuMemcpyDtoHAsync_v2", || {
        drv::memcpy_dtoh(out_bytes!(dst, n), src, h(stream))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    ffi("cuMemcpyDtoD_v2", || {
        drv::memcpy_dtod(dst, src, n as u64, 0, true)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: CUhandle,
) -> CUresult {
    ffi("cuMemcpyDtoDAsync_v2", || {
        drv::memcpy_dtod(dst, src, n as u64, h(stream), false)
    })
}

fn memcpy_uva(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: u64,
    sync: bool,
) -> drv::CuRes<()> {
    match (drv::space_of(dst)?, drv::space_of(src)?) {
        (Space::Device, Space::Device) => drv::memcpy_dtod(dst, src, n as u64, stream, sync),
        (Space::Device, Space::Host) => {
            drv::memcpy_htod(dst, in_bytes!(src as *const u8, n), stream, sync)
        }
        (Space::Host, Space::Device) => {
            drv::memcpy_dtoh(out_bytes!(dst as *mut u8, n), src, stream)
        }
        (Space::Host, Space::Host) => {
            if n > 0 {
                let s = in_bytes!(src as *const u8, n).as_ptr();
                let d = out_bytes!(dst as *mut u8, n).as_mut_ptr();
                // SAFETY: both ranges are valid for `n` bytes (CUDA contract); copy allows overlap.
                unsafe { std::ptr::copy(s, d, n) };
            }
            Ok(())
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    ffi("cuMemcpy", || memcpy_uva(dst, src, n, 0, true))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: CUhandle,
) -> CUresult {
    ffi("cuMemcpyAsync", || {
        memcpy_uva(dst, src, n, h(stream), false)
    })
}

/// `CUmemcpyAttributes`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemcpyAttributes {
    src_access_order: u32,
    src_loc_hint: [u32; 2],
    dst_loc_hint: [u32; 2],
    flags: u32,
}

const _: () = assert!(std::mem::size_of::<MemcpyAttributes>() == 24);

/// `CU_MEMCPY_SRC_ACCESS_ORDER_STREAM` .. `_ANY`: the source access orders CUDA defines.
const SRC_ACCESS_ORDERS: std::ops::RangeInclusive<u32> = 1..=3;
/// `CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE`, the one copy flag (a hint).
const MEMCPY_FLAGS: u32 = 0x1;
/// What `failIdx` says when an error is not about one copy.
const NO_COPY: usize = usize::MAX;

/// The arrays of a `cuMemcpyBatchAsync` call, as the caller passed them.
#[derive(Debug, Clone, Copy)]
struct BatchArgs {
    dsts: *const CUdeviceptr,
    srcs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    attrs: *const MemcpyAttributes,
    attr_idxs: *const usize,
    num_attrs: usize,
}

/// `n` entries at `p`, or `None` for NULL.
///
/// # Safety
/// `p` is NULL or points to `n` readable entries that outlive the borrow.
unsafe fn entries<'a, T>(p: *const T, n: usize) -> Option<&'a [T]> {
    // SAFETY: non-NULL and valid for `n` entries (this function's contract).
    (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p, n) })
}

/// `cuMemcpyBatchAsync`: the copies in order on `stream` (CUDA lets them run in any order; a
/// batch whose copies depend on each other is undefined). Each copy is a `cuMemcpyAsync`, which
/// takes a pageable host source's bytes before returning, so every source access order CUDA
/// defines is honoured. The attributes are checked as CUDA checks them (one per run of copies
/// starting at index 0, increasing, a valid source access order each); the location hints apply
/// only to memory this device does not have (concurrently accessed managed or pageable memory).
/// Returns the index of the copy an error is about (`usize::MAX` when none).
///
/// # Safety
/// The arrays hold `count` (`dsts`, `srcs`, `sizes`) and `num_attrs` entries (CUDA contract).
unsafe fn memcpy_batch(b: BatchArgs, stream: u64) -> (drv::CuRes<()>, usize) {
    let inval = (Err(cuda::CUDA_ERROR_INVALID_VALUE), NO_COPY);
    if drv::is_legacy_stream(stream) || b.count == 0 || b.num_attrs == 0 || b.num_attrs > b.count {
        return inval;
    }
    // SAFETY: the arrays' lengths are the caller's counts (this function's contract).
    let dsts = unsafe { entries(b.dsts, b.count) };
    // SAFETY: as above.
    let srcs = unsafe { entries(b.srcs, b.count) };
    // SAFETY: as above.
    let sizes = unsafe { entries(b.sizes, b.count) };
    // SAFETY: as above.
    let attrs = unsafe { entries(b.attrs, b.num_attrs) };
    // SAFETY: as above.
    let idxs = unsafe { entries(b.attr_idxs, b.num_attrs) };
    let (Some(dsts), Some(srcs), Some(sizes), Some(attrs), Some(idxs)) =
        (dsts, srcs, sizes, attrs, idxs)
    else {
        return inval;
    };
    if idxs[0] != 0 || idxs.windows(2).any(|w| w[1] <= w[0]) || idxs[b.num_attrs - 1] >= b.count {
        return inval;
    }
    for (a, &first) in attrs.iter().zip(idxs) {
        if !SRC_ACCESS_ORDERS.contains(&a.src_access_order) || a.flags & !MEMCPY_FLAGS != 0 {
            return (Err(cuda::CUDA_ERROR_INVALID_VALUE), first);
        }
    }
    for i in 0..b.count {
        if let Err(e) = memcpy_uva(dsts[i], srcs[i], sizes[i], stream, false) {
            return (Err(e), i);
        }
    }
    (Ok(()), NO_COPY)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyBatchAsync(
    dsts: *const CUdeviceptr,
    srcs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    attrs: *const MemcpyAttributes,
    attr_idxs: *const usize,
    num_attrs: usize,
    fail_idx: *mut usize,
    stream: CUhandle,
) -> CUresult {
    ffi("cuMemcpyBatchAsync", || {
        // SAFETY: the caller's arrays (CUDA contract, the same as memcpy_batch's).
        let (r, at) = unsafe {
            memcpy_batch(
                BatchArgs {
                    dsts,
                    srcs,
                    sizes,
                    count,
                    attrs,
                    attr_idxs,
                    num_attrs,
                },
                h(stream),
            )
        };
        if r.is_err() && !fail_idx.is_null() {
            out!(fail_idx, at)?;
        }
        r
    })
}

/// `cuMemcpyBatchAsync_v2` (CUDA 13): the same without the failing copy's index.
/// CUDA 13.2's `cuMemcpyWithAttributesAsync`: one copy with its attributes, as a batch of one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyWithAttributesAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    size: usize,
    attr: *const MemcpyAttributes,
    stream: CUhandle,
) -> CUresult {
    let first = 0usize;
    // SAFETY: one-element arrays on this stack frame, and the caller's attributes (CUDA
    // contract: valid when not NULL, which the batch checks).
    unsafe { cuMemcpyBatchAsync_v2(&dst, &src, &size, 1, attr, &first, 1, stream) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyBatchAsync_v2(
    dsts: *const CUdeviceptr,
    srcs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    attrs: *const MemcpyAttributes,
    attr_idxs: *const usize,
    num_attrs: usize,
    stream: CUhandle,
) -> CUresult {
    // SAFETY: the same contract as cuMemcpyBatchAsync's, with no failing index asked for.
    unsafe {
        cuMemcpyBatchAsync(
            dsts,
            srcs,
            sizes,
            count,
            attrs,
            attr_idxs,
            num_attrs,
            std::ptr::null_mut(),
            stream,
        )
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize) -> CUresult {
    ffi("cuMemsetD8_v2", || {
        drv::memset(dst, u32::from(v), 1, n as u64, 0, true)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD16_v2(dst: CUdeviceptr, v: u16, n: usize) -> CUresult {
    ffi("cuMemsetD16_v2", || {
        drv::memset(dst, u32::from(v), 2, n as u64, 0, true)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize) -> CUresult {
    ffi("cuMemsetD32_v2", || {
        drv::memset(dst, v, 4, n as u64, 0, true)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8Async(dst: CUdeviceptr, v: u8, n: usize, stream: CUhandle) -> CUresult {
    ffi("cuMemsetD8Async", || {
        drv::memset(dst, u32::from(v), 1, n as u64, h(stream), false)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD16Async(
    dst: CUdeviceptr,
    v: u16,
    n: usize,
    stream: CUhandle,
) -> CUresult {
    ffi("cuMemsetD16Async", || {
        drv::memset(dst, u32::from(v), 2, n as u64, h(stream), false)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD32Async(
    dst: CUdeviceptr,
    v: c_uint,
    n: usize,
    stream: CUhandle,
) -> CUresult {
    ffi("cuMemsetD32Async", || {
        drv::memset(dst, v, 4, n as u64, h(stream), false)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> CUresult {
    ffi("cuMemAllocHost_v2", || {
        if pp.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(pp, drv::host_alloc(bytesize, 0)?.cast())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    ffi("cuMemHostAlloc", || {
        if pp.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(pp, drv::host_alloc(bytesize, flags)?.cast())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeHost(ptr: *mut c_void) -> CUresult {
    ffi("cuMemFreeHost", || drv::host_free(ptr as usize))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    ffi("cuMemHostRegister_v2", || {
        drv::host_register(p as usize, bytesize, flags)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister(p: *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    cuMemHostRegister_v2(p, bytesize, flags)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    ffi("cuMemHostUnregister", || drv::host_unregister(p as usize))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    d: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    ffi("cuMemHostGetDevicePointer_v2", || {
        out!(d, crate::alloc_api::host_device_pointer(p as usize, flags)?)
    })
}

// ---- streams and events ---------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut CUhandle, flags: c_uint) -> CUresult {
    ffi("cuStreamCreate", || {
        if ph.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(ph, p(drv::stream_create(flags, 0)?))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    ph: *mut CUhandle,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    ffi("cuStreamCreateWithPriority", || {
        if ph.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(ph, p(drv::stream_create(flags, priority)?))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy_v2(stream: CUhandle) -> CUresult {
    ffi("cuStreamDestroy_v2", || drv::stream_destroy(h(stream)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(stream: CUhandle) -> CUresult {
    ffi("cuStreamSynchronize", || drv::stream_synchronize(h(stream)))
}

/// `CUhostFn`.
pub type CUhostFn = Option<unsafe extern "C" fn(*mut c_void)>;
/// `CUstreamCallback`.
pub type CUstreamCallback = Option<unsafe extern "C" fn(CUhandle, CUresult, *mut c_void)>;

/// `cuLaunchHostFunc`: the function runs on a shim thread once the stream's
/// earlier work is done, and the stream's later work waits for it
/// ([`crate::host_func`]).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchHostFunc(
    stream: CUhandle,
    f: CUhostFn,
    data: *mut c_void,
) -> CUresult {
    ffi("cuLaunchHostFunc", || {
        let f = f.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        // On a capturing stream it becomes a host node of the graph.
        if let Some(r) = crate::stream_capture::capture_host(h(stream), f as usize, data as usize) {
            return r;
        }
        crate::host_func::launch_host_func(h(stream), crate::host_func::HostCall::Func { f, data })
    })
}

/// `CU_HOST_TASK_BLOCKING` and `CU_HOST_TASK_SPINWAIT`: how the thread that runs host functions
/// waits for the next (CUDA 13.1).
const HOST_TASK_SYNC_MODES: [c_uint; 2] = [0, 1];

/// `cuLaunchHostFunc_v2` (CUDA 13.1): with a hint how the thread running host functions waits
/// for the next. The shim's thread for them waits as it does for `cuLaunchHostFunc`'s, whichever
/// is asked (a hint, not a result).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchHostFunc_v2(
    stream: CUhandle,
    f: CUhostFn,
    data: *mut c_void,
    sync_mode: c_uint,
) -> CUresult {
    if !HOST_TASK_SYNC_MODES.contains(&sync_mode) {
        return ffi("cuLaunchHostFunc_v2", || {
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        });
    }
    // SAFETY: the same contract as cuLaunchHostFunc's.
    unsafe { cuLaunchHostFunc(stream, f, data) }
}

/// `cuStreamAddCallback`: like [`cuLaunchHostFunc`]; the callback also gets
/// the stream and its status.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamAddCallback(
    stream: CUhandle,
    callback: CUstreamCallback,
    data: *mut c_void,
    flags: c_uint,
) -> CUresult {
    ffi("cuStreamAddCallback", || {
        let f = callback.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        if flags != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // CUDA refuses stream callbacks during capture (and invalidates it).
        crate::stream_capture::check_stream_sync(h(stream))?;
        crate::host_func::launch_host_func(
            h(stream),
            crate::host_func::HostCall::Callback { f, stream, data },
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamQuery(stream: CUhandle) -> CUresult {
    ffi("cuStreamQuery", || drv::stream_query(h(stream)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitEvent(stream: CUhandle, event: CUhandle, flags: c_uint) -> CUresult {
    ffi("cuStreamWaitEvent", || {
        drv::stream_wait_event(h(stream), h(event), flags)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetPriority(stream: CUhandle, priority: *mut c_int) -> CUresult {
    ffi("cuStreamGetPriority", || {
        out!(priority, drv::stream_params(h(stream))?.1)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetFlags(stream: CUhandle, flags: *mut c_uint) -> CUresult {
    ffi("cuStreamGetFlags", || {
        out!(flags, drv::stream_params(h(stream))?.0)
    })
}

/// `cuStreamGetId` (CUDA 12.0): unique among the process's live streams ([`drv::stream_id`]).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetId(stream: CUhandle, id: *mut u64) -> CUresult {
    ffi("cuStreamGetId", || out!(id, drv::stream_id(h(stream))?))
}

/// `cuStreamGetDevice` (CUDA 12.8): a VM's streams all live on its one device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetDevice(stream: CUhandle, device: *mut CUdevice) -> CUresult {
    ffi("cuStreamGetDevice", || {
        drv::stream_params(h(stream))?;
        out!(device, drv::ctx_get_device()?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(ph: *mut CUhandle, flags: c_uint) -> CUresult {
    ffi("cuEventCreate", || {
        if ph.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(ph, p(drv::event_create(flags)?))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord(event: CUhandle, stream: CUhandle) -> CUresult {
    ffi("cuEventRecord", || drv::event_record(h(event), h(stream)))
}

/// `CU_EVENT_RECORD_DEFAULT`.
const EVENT_RECORD_DEFAULT: c_uint = 0x0;
/// `CU_EVENT_RECORD_EXTERNAL`: in a stream capture, an event record node.
const EVENT_RECORD_EXTERNAL: c_uint = 0x1;

/// `cuEventRecordWithFlags` (CUDA 11.1): a record; `CU_EVENT_RECORD_EXTERNAL` only changes what a
/// stream capture makes of it, and vgpu's captures have no external event nodes: refused there
/// (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, the capture invalidated), a plain record elsewhere.
#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecordWithFlags(
    event: CUhandle,
    stream: CUhandle,
    flags: c_uint,
) -> CUresult {
    ffi("cuEventRecordWithFlags", || match flags {
        EVENT_RECORD_DEFAULT => drv::event_record(h(event), h(stream)),
        EVENT_RECORD_EXTERNAL => {
            if crate::stream_capture::recording() {
                return Err(cuda::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            }
            crate::stream_capture::check_stream_sync(h(stream))?;
            drv::event_record(h(event), h(stream))
        }
        _ => Err(cuda::CUDA_ERROR_INVALID_VALUE),
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventQuery(event: CUhandle) -> CUresult {
    ffi("cuEventQuery", || drv::event_query(h(event)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventSynchronize(event: CUhandle) -> CUresult {
    ffi("cuEventSynchronize", || drv::event_synchronize(h(event)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: CUhandle,
    end: CUhandle,
) -> CUresult {
    ffi("cuEventElapsedTime", || {
        if ms.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(ms, drv::event_elapsed(h(start), h(end))?)
    })
}

/// `cuEventElapsedTime_v2` (CUDA 12.8): the same measurement (the runtime of CUDA 12.8 and
/// later asks for this ABI, identical to the first).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: CUhandle,
    end: CUhandle,
) -> CUresult {
    // SAFETY: the same contract as cuEventElapsedTime's.
    unsafe { cuEventElapsedTime(ms, start, end) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy_v2(event: CUhandle) -> CUresult {
    ffi("cuEventDestroy_v2", || drv::event_destroy(h(event)))
}

// ---- modules and launches ---------------------------------------------------------

/// ELF magic (cubin).
const ELF_MAGIC: [u8; 4] = *b"\x7fELF";
/// Fat binary magic, little-endian.
const FATBIN_MAGIC: u32 = vgpu_fatbin::MAGIC;
/// Magic of `__fatBinC_Wrapper_t`, the fat binary nvcc registers with the runtime.
const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43B1;
/// The wrapper version whose data pointer is one whole fat binary.
const FATBIN_WRAPPER_VERSION: u32 = 1;
/// The wrapper version that also lists prelinked fat binaries.
const FATBIN_WRAPPER_PRELINKED: u32 = 2;
/// `CU_JIT_ERROR_LOG_BUFFER`.
const JIT_ERROR_LOG_BUFFER: c_int = 5;
/// `CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES`.
const JIT_ERROR_LOG_BUFFER_SIZE_BYTES: c_int = 6;
/// `CU_LAUNCH_PARAM_END`.
const LAUNCH_PARAM_END: usize = 0x00;
/// `CU_LAUNCH_PARAM_BUFFER_POINTER`.
const LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
/// `CU_LAUNCH_PARAM_BUFFER_SIZE`.
const LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;
/// Most (key, value) pairs read from a launch's `extra` array.
const MAX_EXTRA_PAIRS: usize = 64;
/// `CU_LAUNCH_ATTRIBUTE_COOPERATIVE`.
const LAUNCH_ATTRIBUTE_COOPERATIVE: u32 = 2;
/// `CU_LAUNCH_ATTRIBUTE_PRIORITY`: the kernel's own priority (`int`).
const LAUNCH_ATTRIBUTE_PRIORITY: u32 = 8;
/// `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`.
const LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: u32 = 4;

/// The bytes of a module image: a cubin's size comes from its ELF header, a
/// fat binary's from its header, PTX text ends at its NUL.
///
/// # Safety
/// `image` must point to a valid image, as cuModuleLoadData requires.
unsafe fn image_bytes<'a>(image: *const c_void) -> drv::CuRes<Cow<'a, [u8]>> {
    if image.is_null() {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let p = image.cast::<u8>();
    // SAFETY: every image format has at least 16 readable bytes or a NUL within them; a PTX
    // string shorter than that is read only up to its NUL below.
    let head = |n: usize| unsafe { std::slice::from_raw_parts(p, n) };
    // SAFETY: reading the first byte of a valid image.
    let first = unsafe { *p };
    if first == (FATBIN_WRAPPER_MAGIC & 0xff) as u8
        && u32::from_le_bytes(head(4).try_into().unwrap_or([0; 4])) == FATBIN_WRAPPER_MAGIC
    {
        // SAFETY: the magic says this is a `__fatBinC_Wrapper_t` (CUDA contract).
        return unsafe { wrapped_fatbins(image) };
    }
    if first == ELF_MAGIC[0] && head(4) == ELF_MAGIC {
        let h = head(64);
        let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap_or([0; 8]));
        let u16_at = |o: usize| u64::from(u16::from_le_bytes([h[o], h[o + 1]]));
        let sections = u64_at(0x28) + u16_at(0x3a) * u16_at(0x3c);
        let programs = u64_at(0x20) + u16_at(0x36) * u16_at(0x38);
        let len = usize::try_from(sections.max(programs).max(64))
            .map_err(|_| cuda::CUDA_ERROR_INVALID_IMAGE)?;
        return Ok(Cow::Borrowed(head(len)));
    }
    if first == (FATBIN_MAGIC & 0xff) as u8
        && u32::from_le_bytes(head(4).try_into().unwrap_or([0; 4])) == FATBIN_MAGIC
    {
        let len = vgpu_fatbin::declared_len(head(vgpu_fatbin::HEADER_LEN))
            .ok()
            .and_then(|l| usize::try_from(l).ok())
            .ok_or(cuda::CUDA_ERROR_INVALID_IMAGE)?;
        return Ok(Cow::Borrowed(head(len)));
    }
    // SAFETY: PTX images are NUL-terminated strings.
    Ok(Cow::Borrowed(
        unsafe { CStr::from_ptr(image.cast::<c_char>()) }.to_bytes(),
    ))
}

/// Most prelinked fat binaries read from one wrapper.
const MAX_PRELINKED: usize = 256;

/// The fat binaries of a `__fatBinC_Wrapper_t { int magic; int version;
/// const void *data; const void **prelinked; }`: version 1 wraps one fat
/// binary; version 2 (nvcc's link stub) wraps `data` plus a NULL-terminated
/// array of the translation units' fat binaries. Empty ones are skipped;
/// several are sent as one concatenation, as nvcc lays them out in
/// `.nv_fatbin`.
///
/// # Safety
/// `wrapper` must point to a valid wrapper, as the CUDA runtime registers it.
unsafe fn wrapped_fatbins<'a>(wrapper: *const c_void) -> drv::CuRes<Cow<'a, [u8]>> {
    // SAFETY: a wrapper has four 8-byte-aligned fields (this function's contract).
    let w = unsafe { std::slice::from_raw_parts(wrapper.cast::<u64>(), 3) };
    let version = (w[0] >> 32) as u32;
    let mut headers = vec![w[1] as *const u32];
    if version == FATBIN_WRAPPER_PRELINKED {
        let list = w[2] as *const *const u32;
        for i in 0..MAX_PRELINKED {
            if list.is_null() {
                break;
            }
            // SAFETY: the prelinked array is NULL-terminated (CUDA contract); `i` stops there.
            let f = unsafe { list.wrapping_add(i).read() };
            if f.is_null() {
                break;
            }
            headers.push(f);
        }
    } else if version != FATBIN_WRAPPER_VERSION {
        return Err(cuda::CUDA_ERROR_INVALID_IMAGE);
    }
    let mut parts = Vec::new();
    for h in headers {
        // SAFETY: each pointer is a fat binary of the program (CUDA contract); its magic is checked
        // before anything else is read.
        if h.is_null() || unsafe { h.read_unaligned() } != FATBIN_MAGIC {
            continue;
        }
        // SAFETY: as above.
        let bytes = unsafe { image_bytes(h.cast()) }?;
        if bytes.len() > vgpu_fatbin::HEADER_LEN {
            parts.push(bytes);
        }
    }
    crate::debug!(
        "fat binary wrapper version {version}: {} non-empty fat binaries",
        parts.len()
    );
    match parts.len() {
        0 => Err(cuda::CUDA_ERROR_NO_BINARY_FOR_GPU),
        1 => Ok(parts.swap_remove(0)),
        _ => Ok(link_translation_units(&parts)
            .map(|ptx| Cow::Owned(ptx.into_bytes()))
            .unwrap_or_else(|| Cow::Owned(parts.concat()))),
    }
}

/// The fat binaries of several translation units as one module: the PTX of
/// those that carry PTX the device runs linked into one text, with from the
/// others (libcudadevrt's image, whose PTX is for a newer architecture) only
/// what that text calls ([`crate::linker::link_ptx_with`]), so that every
/// unit's kernels load (a module is one image) and relocatable device code
/// (`nvcc -rdc=true`) finds the functions of the other units. `None` when no
/// unit has such PTX, one has no PTX at all, or the texts do not link (the
/// fat binaries are then sent as they are).
fn link_translation_units(parts: &[Cow<'_, [u8]>]) -> Option<String> {
    let arch = drv::device_arch().ok()?;
    let (mut texts, mut libraries) = (Vec::new(), Vec::new());
    for p in parts {
        match vgpu_fatbin::ptx_for(p, arch) {
            Ok(ptx) => texts.push(String::from_utf8(ptx).ok()?),
            Err(_) => {
                let ptx = vgpu_fatbin::library_ptx(p, arch).ok()??;
                libraries.push(String::from_utf8(ptx).ok()?);
            }
        }
    }
    if texts.is_empty() {
        return None;
    }
    match crate::linker::link_ptx_with(&texts, &libraries) {
        Ok(linked) => Some(linked),
        Err(e) => {
            crate::debug!("the translation units' PTX does not link ({e}): sent as they are");
            None
        }
    }
}

/// Of a fat binary, the images the device runs (one cubin, one PTX); other
/// images are sent as they are. Libraries ship cubins for ten architectures
/// and more (CuPy's CUB: 48 MB), which the device never reads.
fn usable_images(bytes: Cow<'_, [u8]>) -> Result<Cow<'_, [u8]>, (CUresult, String)> {
    if !vgpu_fatbin::is_fatbin(&bytes) {
        return Ok(bytes);
    }
    let arch = drv::device_arch().map_err(|e| (e, String::new()))?;
    let range = drv::device_ptx_range().map_err(|e| (e, String::new()))?;
    match vgpu_fatbin::select(&bytes, arch, range) {
        Ok(kept) => {
            crate::debug!(
                "fat binary of {} bytes: {} bytes of images for compute capability {}.{}",
                bytes.len(),
                kept.len(),
                arch / 10,
                arch % 10
            );
            Ok(Cow::Owned(kept))
        }
        Err(e @ vgpu_fatbin::FatbinError::NoUsableImage { .. }) => {
            Err((cuda::CUDA_ERROR_NO_BINARY_FOR_GPU, e.to_string()))
        }
        // Malformed: the host reports what is wrong.
        Err(_) => Ok(bytes),
    }
}

/// Loads a module image in the current context: its handle, or the error
/// and the host's (or the fat binary reader's) message.
pub(crate) fn load_image(image: *const c_void) -> Result<u64, (CUresult, String)> {
    // SAFETY: `image` is the caller's module image (CUDA contract).
    let bytes = unsafe { image_bytes(image) }.map_err(|e| (e, String::new()))?;
    drv::module_load(&usable_images(bytes)?)
}

pub(crate) fn module_load(
    module: *mut CUhandle,
    image: *const c_void,
    log: Option<(*mut c_char, *mut *mut c_void)>,
) -> drv::CuRes<()> {
    if module.is_null() {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    match load_image(image) {
        Ok(h) => out!(module, p(h)),
        Err((code, message)) => {
            if code == cuda::CUDA_ERROR_NO_BINARY_FOR_GPU {
                crate::warn!("cannot load a module: {message}");
            }
            if let Some((buf, size_slot)) = log {
                // SAFETY: the option values hold the log buffer and its size (CUDA JIT option contract).
                let size = unsafe { *size_slot } as usize;
                if !buf.is_null() && size > 0 {
                    // SAFETY: `buf` has `size` bytes.
                    let _ = unsafe {
                        write_cstr(buf, i32::try_from(size).unwrap_or(i32::MAX), &message)
                    };
                    // SAFETY: the size slot is in/out: the driver stores the bytes written.
                    unsafe { *size_slot = (message.len().min(size - 1) + 1) as *mut c_void };
                }
            }
            Err(code)
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut CUhandle, image: *const c_void) -> CUresult {
    ffi("cuModuleLoadData", || module_load(module, image, None))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut CUhandle,
    image: *const c_void,
    num_options: c_uint,
    options: *mut c_int,
    values: *mut *mut c_void,
) -> CUresult {
    ffi("cuModuleLoadDataEx", || {
        let mut log = None;
        if num_options > 0 && !options.is_null() && !values.is_null() {
            let n = num_options.min(64) as usize;
            // SAFETY: `options` has `num_options` entries (CUDA contract).
            let opts = unsafe { std::slice::from_raw_parts(options, n) };
            // SAFETY: `values` has `num_options` entries (CUDA contract).
            let vals = unsafe { std::slice::from_raw_parts_mut(values, n) };
            let buf = opts.iter().position(|&o| o == JIT_ERROR_LOG_BUFFER);
            let size = opts
                .iter()
                .position(|&o| o == JIT_ERROR_LOG_BUFFER_SIZE_BYTES);
            if let (Some(b), Some(sz)) = (buf, size) {
                log = Some((vals[b].cast::<c_char>(), std::ptr::from_mut(&mut vals[sz])));
            }
        }
        // SAFETY: the caller's option arrays of `num_options` entries (CUDA contract).
        let jit = unsafe { crate::linker::JitOptions::read(num_options, options, values) };
        if let Some(n) = jit.max_registers
            // SAFETY: the caller's module image (CUDA contract).
            && let Cow::Borrowed(text) = unsafe { image_bytes(image) }?
            && !vgpu_fatbin::is_fatbin(text)
            && !text.starts_with(&ELF_MAGIC)
        {
            // PTX text: the register budget becomes `.maxnreg` on each kernel.
            let ptx = std::str::from_utf8(text).map_err(|_| cuda::CUDA_ERROR_INVALID_PTX)?;
            let limited = CString::new(crate::linker::with_max_registers(ptx, n))
                .map_err(|_| cuda::CUDA_ERROR_INVALID_PTX)?;
            return module_load(module, limited.as_ptr().cast(), log);
        }
        module_load(module, image, log)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleUnload(module: CUhandle) -> CUresult {
    ffi("cuModuleUnload", || drv::module_unload(h(module)))
}

/// Reads a C string argument.
///
/// # Safety
/// `s` must be NULL or a NUL-terminated string.
pub(crate) unsafe fn c_name<'a>(s: *const c_char) -> drv::CuRes<&'a str> {
    if s.is_null() {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: NUL-terminated per this function's contract.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut CUhandle,
    module: CUhandle,
    name: *const c_char,
) -> CUresult {
    ffi("cuModuleGetFunction", || {
        // SAFETY: `name` is the caller's C string (CUDA contract).
        let name = unsafe { c_name(name) }?;
        if f.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(f, p(drv::module_get_function(h(module), name)?))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    module: CUhandle,
    name: *const c_char,
) -> CUresult {
    ffi("cuModuleGetGlobal_v2", || {
        // SAFETY: `name` is the caller's C string (CUDA contract).
        let name = unsafe { c_name(name) }?;
        let (a, s) = drv::module_get_global(h(module), name)?;
        if !dptr.is_null() {
            out!(dptr, a)?;
        }
        if !bytes.is_null() {
            out!(bytes, s as usize)?;
        }
        Ok(())
    })
}

/// Packs a launch's parameters from `kernelParams` (one pointer per
/// parameter) or `extra` (a packed buffer).
///
/// # Safety
/// `params` and `extra` must follow the cuLaunchKernel contract for this function's parameters.
pub(crate) unsafe fn pack_params(
    f: u64,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> drv::CuRes<Vec<u8>> {
    let layout = drv::func_layout(f)?;
    let total = layout.param_bytes();
    let mut buf = vec![0u8; total];
    if !params.is_null() {
        // SAFETY: kernelParams has one entry per kernel parameter (CUDA contract).
        let entries = unsafe { std::slice::from_raw_parts(params, layout.offsets.len()) };
        for (&entry, (&off, &size)) in entries.iter().zip(layout.offsets.iter().zip(&layout.sizes))
        {
            let src = entry.cast::<u8>();
            if src.is_null() {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: entry i points to a value of the parameter's size.
            let v = unsafe { std::slice::from_raw_parts(src, size as usize) };
            buf[off as usize..(off + size) as usize].copy_from_slice(v);
        }
        return Ok(buf);
    }
    if !extra.is_null() {
        let (mut ptr, mut size) = (std::ptr::null::<u8>(), None);
        for i in 0..MAX_EXTRA_PAIRS {
            // SAFETY: `extra` is a key/value array terminated by CU_LAUNCH_PARAM_END (CUDA contract):
            // entry 2i is readable until the END key has been seen.
            let key = unsafe { extra.wrapping_add(i * 2).read() } as usize;
            if key == LAUNCH_PARAM_END {
                break;
            }
            // SAFETY: every key but END is followed by its value.
            let value = unsafe { extra.wrapping_add(i * 2 + 1).read() };
            match key {
                LAUNCH_PARAM_BUFFER_POINTER => ptr = value.cast::<u8>(),
                LAUNCH_PARAM_BUFFER_SIZE => {
                    let sp = value.cast::<usize>();
                    if sp.is_null() {
                        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
                    }
                    // SAFETY: non-NULL pointer to a size_t.
                    size = Some(unsafe { *sp });
                }
                _ => return Err(cuda::CUDA_ERROR_INVALID_VALUE),
            }
        }
        let Some(size) = size else {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        };
        if ptr.is_null() || size < total {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the buffer has `size >= total` bytes.
        buf.copy_from_slice(unsafe { std::slice::from_raw_parts(ptr, total) });
        return Ok(buf);
    }
    if total == 0 {
        Ok(buf)
    } else {
        Err(cuda::CUDA_ERROR_INVALID_VALUE)
    }
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUhandle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUhandle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    ffi("cuLaunchKernel", || {
        // SAFETY: params/extra follow the cuLaunchKernel contract.
        let packed = unsafe { pack_params(h(f), params, extra) }?;
        drv::launch(h(f), [gx, gy, gz], [bx, by, bz], shared, h(stream), &packed)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: CUhandle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUhandle,
    params: *mut *mut c_void,
) -> CUresult {
    ffi("cuLaunchCooperativeKernel", || {
        // SAFETY: `params` follows the cuLaunchCooperativeKernel contract (no `extra`).
        let packed = unsafe { pack_params(h(f), params, std::ptr::null_mut()) }?;
        drv::launch_cooperative(h(f), [gx, gy, gz], [bx, by, bz], shared, h(stream), &packed)
    })
}

/// `CUDA_LAUNCH_PARAMS`: one device's part of a multi-device cooperative launch.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LaunchParams {
    function: CUhandle,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    stream: CUhandle,
    params: *mut *mut c_void,
}

const _: () = assert!(std::mem::size_of::<LaunchParams>() == 56);

/// `CUDA_COOPERATIVE_LAUNCH_MULTI_DEVICE_NO_PRE_LAUNCH_SYNC` and `..._NO_POST_LAUNCH_SYNC`: the
/// flags a multi-device cooperative launch takes.
const MULTI_DEVICE_FLAGS: c_uint = 0x3;

/// `cuLaunchCooperativeKernelMultiDevice` (deprecated since CUDA 11.3): one launch per device
/// listed. A VM has one device, so the list has one entry, launched as
/// `cuLaunchCooperativeKernel` on its stream; the synchronization the flags leave out or ask for
/// is between devices, and the stream orders the launch with its own work either way.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernelMultiDevice(
    list: *mut LaunchParams,
    devices: c_uint,
    flags: c_uint,
) -> CUresult {
    ffi("cuLaunchCooperativeKernelMultiDevice", || {
        if devices != 1 || flags & !MULTI_DEVICE_FLAGS != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: NULL or the caller's array of `devices` (one) entries (CUDA contract).
        let p = *unsafe { list.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: `params` follows the cuLaunchCooperativeKernel contract (no `extra`).
        let packed = unsafe { pack_params(h(p.function), p.params, std::ptr::null_mut()) }?;
        drv::launch_cooperative(
            h(p.function),
            p.grid,
            p.block,
            p.shared,
            h(p.stream),
            &packed,
        )
    })
}

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Debug)]
pub struct CUlaunchConfig {
    /// Grid x.
    pub grid_x: c_uint,
    /// Grid y.
    pub grid_y: c_uint,
    /// Grid z.
    pub grid_z: c_uint,
    /// Block x.
    pub block_x: c_uint,
    /// Block y.
    pub block_y: c_uint,
    /// Block z.
    pub block_z: c_uint,
    /// Dynamic shared memory.
    pub shared_bytes: c_uint,
    /// Stream.
    pub stream: CUhandle,
    /// Attributes.
    pub attrs: *const CUlaunchAttribute,
    /// Number of attributes.
    pub num_attrs: c_uint,
}

/// `CUlaunchAttribute`: an id and a 64-byte value union.
#[repr(C)]
#[derive(Debug)]
pub struct CUlaunchAttribute {
    /// `CUlaunchAttributeID`.
    pub id: u32,
    /// Padding.
    pub pad: [u8; 4],
    /// Value union.
    pub value: [u32; 16],
}

/// The largest portable thread block cluster (CUDA: 8 blocks; more only for kernels that allow
/// non-portable sizes).
const PORTABLE_CLUSTER_BLOCKS: i32 = 8;
/// The largest non-portable cluster (compute capability 9.0).
const NON_PORTABLE_CLUSTER_BLOCKS: i32 = 16;
/// `CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`.
const FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: c_int = 14;

/// The cluster size (blocks) a launch configuration asks for with
/// `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION` (`None`: no such attribute).
///
/// # Safety
/// `c.attrs` has `c.num_attrs` entries when not NULL (CUDA contract).
unsafe fn cluster_blocks(c: &CUlaunchConfig) -> Option<u64> {
    if c.num_attrs == 0 || c.attrs.is_null() {
        return None;
    }
    // SAFETY: `attrs` has `num_attrs` entries (the caller's contract).
    let attrs = unsafe { std::slice::from_raw_parts(c.attrs, c.num_attrs.min(64) as usize) };
    attrs
        .iter()
        .rev()
        .find(|a| a.id == LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
        .map(|a| a.value[..3].iter().map(|&d| u64::from(d.max(1))).product())
}

/// Blocks of a launch configuration's size that fit one multiprocessor at once.
fn blocks_per_sm(f: u64, c: &CUlaunchConfig) -> drv::CuRes<i32> {
    let threads = u64::from(c.block_x) * u64::from(c.block_y) * u64::from(c.block_z);
    let threads = i32::try_from(threads).map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?;
    drv::occupancy_blocks_per_sm(f, threads, c.shared_bytes as usize)
}

/// `cuOccupancyMaxPotentialClusterSize` (CUDA 11.8): the largest cluster a kernel can be launched
/// in: 1 on a device without clusters (compute capability below 9.0, the simulated GPU's 8.0),
/// else the portable 8 blocks (16 for a kernel that allows non-portable sizes), or 0 when its
/// blocks do not fit a multiprocessor at all.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxPotentialClusterSize(
    size: *mut c_int,
    f: CUhandle,
    config: *const CUlaunchConfig,
) -> CUresult {
    ffi("cuOccupancyMaxPotentialClusterSize", || {
        // SAFETY: NULL or the caller's launch configuration (CUDA contract).
        let c = unsafe { config.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        let per_sm = blocks_per_sm(h(f), c)?;
        let major = drv::device_attribute(cuda::attr::COMPUTE_CAPABILITY_MAJOR as c_int, 0)?;
        let most = if per_sm == 0 {
            0
        } else if major < crate::green_ctx::CLUSTERS_MAJOR {
            1
        } else if drv::func_get_attribute(h(f), FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED)? != 0 {
            NON_PORTABLE_CLUSTER_BLOCKS
        } else {
            PORTABLE_CLUSTER_BLOCKS
        };
        out!(size, most)
    })
}

/// `cuOccupancyMaxActiveClusters` (CUDA 11.8): how many clusters of the configuration's size fit
/// the device at once: the blocks that fit all its multiprocessors, in whole clusters. A
/// configuration without a cluster size is `CUDA_ERROR_INVALID_CLUSTER_SIZE`, as is a cluster of
/// more than one block on a device without clusters.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveClusters(
    n: *mut c_int,
    f: CUhandle,
    config: *const CUlaunchConfig,
) -> CUresult {
    ffi("cuOccupancyMaxActiveClusters", || {
        // SAFETY: NULL or the caller's launch configuration (CUDA contract).
        let c = unsafe { config.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: `c` is the caller's configuration; its attributes follow the CUDA contract.
        let cluster = unsafe { cluster_blocks(c) }.ok_or(cuda::CUDA_ERROR_INVALID_CLUSTER_SIZE)?;
        let major = drv::device_attribute(cuda::attr::COMPUTE_CAPABILITY_MAJOR as c_int, 0)?;
        if cluster > 1 && major < crate::green_ctx::CLUSTERS_MAJOR {
            return Err(cuda::CUDA_ERROR_INVALID_CLUSTER_SIZE);
        }
        let per_sm = blocks_per_sm(h(f), c)?;
        let sms = drv::device_attribute(cuda::attr::MULTIPROCESSOR_COUNT as c_int, 0)?;
        let blocks = i64::from(per_sm) * i64::from(sms);
        out!(
            n,
            i32::try_from(blocks / cluster as i64).unwrap_or(i32::MAX)
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUhandle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    ffi("cuLaunchKernelEx", || {
        if config.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-NULL pointer to the caller's launch configuration.
        let c = unsafe { &*config };
        let mut cooperative = false;
        let mut priority = None;
        if c.num_attrs > 0 && !c.attrs.is_null() {
            // SAFETY: `attrs` has `num_attrs` entries (CUDA contract).
            let attrs =
                unsafe { std::slice::from_raw_parts(c.attrs, c.num_attrs.min(64) as usize) };
            for a in attrs {
                match a.id {
                    LAUNCH_ATTRIBUTE_COOPERATIVE => cooperative = a.value[0] != 0,
                    // `int priority`: the union's first word.
                    LAUNCH_ATTRIBUTE_PRIORITY => {
                        priority = Some(a.value[0] as i32);
                    }
                    LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION if a.value[..3].iter().any(|&d| d > 1) => {
                        return Err(drv::unsupported("thread block clusters"));
                    }
                    _ => {}
                }
            }
        }
        // SAFETY: params/extra follow the cuLaunchKernel contract.
        let packed = unsafe { pack_params(h(f), params, extra) }?;
        drv::launch_ex(
            h(f),
            [c.grid_x, c.grid_y, c.grid_z],
            [c.block_x, c.block_y, c.block_z],
            c.shared_bytes,
            h(c.stream),
            &packed,
            cooperative,
            priority,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetAttribute(pi: *mut c_int, attr: c_int, f: CUhandle) -> CUresult {
    ffi("cuFuncGetAttribute", || {
        out!(pi, drv::func_get_attribute(h(f), attr)?)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetAttribute(f: CUhandle, attr: c_int, value: c_int) -> CUresult {
    ffi("cuFuncSetAttribute", || {
        drv::func_set_attribute(h(f), attr, value)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetCacheConfig(f: CUhandle, _config: c_int) -> CUresult {
    ffi("cuFuncSetCacheConfig", || drv::func_layout(h(f)).map(drop))
}

/// `CU_FUNCTION_LOADING_STATE_LOADED`.
const FUNCTION_LOADED: c_int = 1;

/// `cuFuncIsLoaded` (CUDA 12.4): a function handle vgpu hands out is loaded.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncIsLoaded(state: *mut c_int, f: CUhandle) -> CUresult {
    ffi("cuFuncIsLoaded", || {
        drv::func_layout(h(f))?;
        out!(state, FUNCTION_LOADED)
    })
}

/// `cuFuncLoad` (CUDA 12.4): nothing to do for a function vgpu hands out.
#[unsafe(no_mangle)]
pub extern "C" fn cuFuncLoad(f: CUhandle) -> CUresult {
    ffi("cuFuncLoad", || drv::func_layout(h(f)).map(drop))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    n: *mut c_int,
    f: CUhandle,
    block: c_int,
    smem: usize,
) -> CUresult {
    ffi("cuOccupancyMaxActiveBlocksPerMultiprocessor", || {
        out!(n, drv::occupancy_blocks_per_sm(h(f), block, smem)?)
    })
}

/// `CUoccupancyB2DSize`: dynamic shared memory for a block size.
pub type B2DSize = Option<unsafe extern "C" fn(c_int) -> usize>;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSize(
    min_grid: *mut c_int,
    block: *mut c_int,
    f: CUhandle,
    smem_fn: B2DSize,
    smem: usize,
    limit: c_int,
) -> CUresult {
    ffi("cuOccupancyMaxPotentialBlockSize", || {
        let dyn_smem = |bs: c_int| match smem_fn {
            // SAFETY: the caller's callback, called as CUDA calls it.
            Some(cb) => unsafe { cb(bs) },
            None => smem,
        };
        let (g, b) = drv::occupancy_max_block_size(h(f), &dyn_smem, limit)?;
        out!(min_grid, g)?;
        out!(block, b)
    })
}

/// `cuOccupancyMaxPotentialBlockSizeWithFlags`: as without flags; the one flag
/// (`CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE`) changes nothing on a device whose L1 and shared
/// memory vgpu does not split.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSizeWithFlags(
    min_grid: *mut c_int,
    block: *mut c_int,
    f: CUhandle,
    smem_fn: B2DSize,
    smem: usize,
    limit: c_int,
    flags: c_uint,
) -> CUresult {
    if flags & !crate::compat::OCCUPANCY_FLAGS_KNOWN != 0 {
        return ffi("cuOccupancyMaxPotentialBlockSizeWithFlags", || {
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        });
    }
    // SAFETY: the same contract as cuOccupancyMaxPotentialBlockSize.
    unsafe { cuOccupancyMaxPotentialBlockSize(min_grid, block, f, smem_fn, smem, limit) }
}

/// `cuOccupancyAvailableDynamicSMemPerBlock` ([`drv::occupancy_available_dyn_smem`]).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    dyn_smem: *mut usize,
    f: CUhandle,
    blocks: c_int,
    block_size: c_int,
) -> CUresult {
    ffi("cuOccupancyAvailableDynamicSMemPerBlock", || {
        out!(
            dyn_smem,
            drv::occupancy_available_dyn_smem(h(f), blocks, block_size)?
        )
    })
}

/// `cuGetExportTable`: NVIDIA's private interface tables, which the CUDA
/// runtime fetches by UUID ([`crate::export_tables`]).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const c_void,
    id: *const [u8; 16],
) -> CUresult {
    ffi("cuGetExportTable", || {
        if table.is_null() || id.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `id` points to a 16-byte CUuuid (CUDA contract), checked non-NULL above.
        let id = unsafe { id.read_unaligned() };
        match crate::export_tables::lookup(&id) {
            Some((name, t)) => {
                crate::debug!(
                    "cuGetExportTable({}): {name}",
                    crate::export_tables::uuid_text(&id)
                );
                out!(table, t)
            }
            None => {
                crate::debug!(
                    "cuGetExportTable({}): a table vgpu does not provide",
                    crate::export_tables::uuid_text(&id)
                );
                out!(table, std::ptr::null())?;
                Err(cuda::CUDA_ERROR_NOT_FOUND)
            }
        }
    })
}

// ---- cuGetProcAddress -----------------------------------------------------------------

/// `CU_GET_PROC_ADDRESS_SUCCESS`.
const PROC_SUCCESS: c_int = 0;
/// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`.
const PROC_NOT_FOUND: c_int = 1;
/// `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`.
const PROC_VERSION_NOT_SUFFICIENT: c_int = 2;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    ffi("cuGetProcAddress_v2", || {
        if symbol.is_null() || pfn.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `symbol` is a NUL-terminated string (CUDA contract), checked non-NULL above.
        let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
        let found = crate::procaddr::lookup(name, cuda_version, flags);
        let (ptr, st, r) = match found {
            crate::procaddr::Lookup::Found(f) => (f, PROC_SUCCESS, Ok(())),
            crate::procaddr::Lookup::VersionTooLow => (
                std::ptr::null_mut(),
                PROC_VERSION_NOT_SUFFICIENT,
                Err(cuda::CUDA_ERROR_NOT_FOUND),
            ),
            crate::procaddr::Lookup::NotFound => (
                std::ptr::null_mut(),
                PROC_NOT_FOUND,
                Err(cuda::CUDA_ERROR_NOT_FOUND),
            ),
        };
        crate::debug!(
            "cuGetProcAddress({name}, {cuda_version}, {flags}) -> {}",
            if st == PROC_SUCCESS {
                "found"
            } else {
                "not found"
            }
        );
        out!(pfn, ptr)?;
        if !status.is_null() {
            out!(status, st)?;
        }
        r
    })
}

/// `cuGetProcAddress_v2_ptsz`: what a program built with the per-thread default stream calls;
/// it is answered the per-thread forms, as with `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2_ptsz(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    let flags = flags | crate::procaddr::PER_THREAD_DEFAULT_STREAM;
    // SAFETY: same contract as cuGetProcAddress_v2.
    unsafe { cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, status) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: same contract as cuGetProcAddress_v2; no status pointer.
    unsafe { cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, std::ptr::null_mut()) }
}
