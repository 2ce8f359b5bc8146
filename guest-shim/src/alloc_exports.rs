//! The C ABI of the allocation APIs in [`crate::alloc_api`]: managed memory, mapped host
//! memory, pointer and range attributes, stream-ordered memory pools, and the virtual memory
//! management calls.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_int, c_uint, c_void};

use vgpu_proto::cuda;

use crate::alloc_api::{self as api, PointerInfo, ptr_attr};
use crate::driver as drv;
use crate::exports::{CUdevice, CUdeviceptr, CUhandle};
use crate::ffi::{CUresult, ffi};
use crate::out;

fn h(p: CUhandle) -> u64 {
    p as u64
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemLocation {
    /// `CUmemLocationType`: 1 device, 2 host, 3 host NUMA node, 4 current host NUMA node.
    pub type_: c_int,
    /// Device ordinal or NUMA node.
    pub id: c_int,
}

/// The device number (`CU_DEVICE_CPU` for the host) of a `CUmemLocation`.
fn location_device(l: CUmemLocation) -> Result<i32, CUresult> {
    match l.type_ {
        1 => Ok(l.id),
        2..=4 => Ok(api::DEVICE_CPU),
        _ => Err(cuda::CUDA_ERROR_INVALID_VALUE),
    }
}

// ---- mapped host memory ---------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut c_uint, p: *mut c_void) -> CUresult {
    ffi("cuMemHostGetFlags", || {
        out!(flags, api::host_get_flags(p as usize)?)
    })
}

// ---- managed memory ---------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    ffi("cuMemAllocManaged", || {
        if dptr.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(dptr, api::alloc_managed(bytesize, flags)?)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamAttachMemAsync(
    stream: CUhandle,
    dptr: CUdeviceptr,
    length: usize,
    flags: c_uint,
) -> CUresult {
    ffi("cuStreamAttachMemAsync", || {
        api::stream_attach(h(stream), dptr, length, flags)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPrefetchAsync(
    dptr: CUdeviceptr,
    count: usize,
    dst_device: CUdevice,
    stream: CUhandle,
) -> CUresult {
    ffi("cuMemPrefetchAsync", || {
        api::prefetch(dptr, count, dst_device, h(stream))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPrefetchAsync_v2(
    dptr: CUdeviceptr,
    count: usize,
    location: CUmemLocation,
    flags: c_uint,
    stream: CUhandle,
) -> CUresult {
    ffi("cuMemPrefetchAsync_v2", || {
        if flags != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        api::prefetch(dptr, count, location_device(location)?, h(stream))
    })
}

/// Checks a CUDA 13 batch of managed ranges (`cuMemPrefetchBatchAsync` and the discards): the
/// arrays, and the prefetch locations' indices (the first 0, each above the one before, all
/// below `count`).
///
/// Pointer contract (CUDA's): each non-NULL array holds the number of entries its count says.
fn check_managed_batch(
    ptrs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    locs: Option<(*const CUmemLocation, *const usize, usize)>,
    flags: u64,
) -> Result<(), CUresult> {
    if ptrs.is_null() || sizes.is_null() || count == 0 || flags != 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    if let Some((locs, idxs, n)) = locs {
        if locs.is_null() || idxs.is_null() || n == 0 || n > count {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `idxs` holds `n` indices (CUDA contract), checked non-NULL above.
        let idxs = unsafe { std::slice::from_raw_parts(idxs, n) };
        // SAFETY: `locs` holds `n` locations (CUDA contract), checked non-NULL above.
        let locs = unsafe { std::slice::from_raw_parts(locs, n) };
        let ordered = idxs.first() == Some(&0)
            && idxs.windows(2).all(|w| w[0] < w[1])
            && idxs.last().is_some_and(|&l| l < count);
        if !ordered {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        for l in locs {
            location_device(*l)?;
        }
    }
    Ok(())
}

/// Batched prefetches and discards of managed memory (CUDA 13) need
/// `CONCURRENT_MANAGED_ACCESS`, which a VM's device reports 0 (managed memory moves at launches
/// and synchronizations): as CUDA on such a device, they are refused once their arguments are
/// checked. `cuMemPrefetchAsync` works.
fn no_concurrent_managed_access(what: &str) -> Result<(), CUresult> {
    crate::debug!("{what}: needs CONCURRENT_MANAGED_ACCESS, which this device does not have");
    Err(cuda::CUDA_ERROR_NOT_SUPPORTED)
}

/// A CUDA 13 batch of managed ranges, checked and refused (see
/// [`no_concurrent_managed_access`]); `locs` for those that prefetch.
fn managed_batch(
    what: &'static str,
    ptrs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    locs: Option<(*const CUmemLocation, *const usize, usize)>,
    flags: u64,
) -> CUresult {
    ffi(what, || {
        drv::driver()?;
        check_managed_batch(ptrs, sizes, count, locs, flags)?;
        no_concurrent_managed_access(what)
    })
}

/// CUDA 13's `cuMemPrefetchBatchAsync` (see [`no_concurrent_managed_access`]).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuMemPrefetchBatchAsync(
    ptrs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    locs: *const CUmemLocation,
    loc_idxs: *const usize,
    num_locs: usize,
    flags: u64,
    _stream: CUhandle,
) -> CUresult {
    let locs = Some((locs, loc_idxs, num_locs));
    managed_batch("cuMemPrefetchBatchAsync", ptrs, sizes, count, locs, flags)
}

/// CUDA 13's `cuMemDiscardBatchAsync` (see [`no_concurrent_managed_access`]).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemDiscardBatchAsync(
    ptrs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    flags: u64,
    _stream: CUhandle,
) -> CUresult {
    managed_batch("cuMemDiscardBatchAsync", ptrs, sizes, count, None, flags)
}

/// CUDA 13's `cuMemDiscardAndPrefetchBatchAsync` (see [`no_concurrent_managed_access`]).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuMemDiscardAndPrefetchBatchAsync(
    ptrs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    locs: *const CUmemLocation,
    loc_idxs: *const usize,
    num_locs: usize,
    flags: u64,
    _stream: CUhandle,
) -> CUresult {
    let locs = Some((locs, loc_idxs, num_locs));
    managed_batch(
        "cuMemDiscardAndPrefetchBatchAsync",
        ptrs,
        sizes,
        count,
        locs,
        flags,
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAdvise(
    dptr: CUdeviceptr,
    count: usize,
    advice: c_int,
    device: CUdevice,
) -> CUresult {
    ffi("cuMemAdvise", || api::advise(dptr, count, advice, device))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAdvise_v2(
    dptr: CUdeviceptr,
    count: usize,
    advice: c_int,
    location: CUmemLocation,
) -> CUresult {
    ffi("cuMemAdvise_v2", || {
        api::advise(dptr, count, advice, location_device(location)?)
    })
}

/// Fills one `cuMemRangeGetAttribute` answer of `size` bytes at `data`.
fn range_attribute(
    data: *mut c_void,
    size: usize,
    attribute: c_int,
    dptr: CUdeviceptr,
    count: usize,
) -> Result<(), CUresult> {
    if data.is_null() || size < 4 || !size.is_multiple_of(4) {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let out = crate::out_bytes!(data, size);
    let mut ints = vec![0i32; size / 4];
    api::range_attribute(&mut ints, attribute, dptr, count)?;
    for (o, v) in out.chunks_mut(4).zip(ints) {
        o.copy_from_slice(&v.to_ne_bytes());
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRangeGetAttribute(
    data: *mut c_void,
    data_size: usize,
    attribute: c_int,
    dptr: CUdeviceptr,
    count: usize,
) -> CUresult {
    ffi("cuMemRangeGetAttribute", || {
        range_attribute(data, data_size, attribute, dptr, count)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRangeGetAttributes(
    data: *mut *mut c_void,
    data_sizes: *mut usize,
    attributes: *mut c_int,
    num_attributes: usize,
    dptr: CUdeviceptr,
    count: usize,
) -> CUresult {
    ffi("cuMemRangeGetAttributes", || {
        if data.is_null() || data_sizes.is_null() || attributes.is_null() || num_attributes == 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        if num_attributes > 64 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller passes three arrays of `num_attributes` entries (CUDA contract).
        let datas = unsafe { std::slice::from_raw_parts(data, num_attributes) };
        // SAFETY: as above.
        let sizes = unsafe { std::slice::from_raw_parts(data_sizes, num_attributes) };
        // SAFETY: as above.
        let attrs = unsafe { std::slice::from_raw_parts(attributes, num_attributes) };
        for i in 0..num_attributes {
            range_attribute(datas[i], sizes[i], attrs[i], dptr, count)?;
        }
        Ok(())
    })
}

// ---- pointer attributes -------------------------------------------------------------------------

/// `cuPointerGetAttribute(s)` for memory this module hands out, called by [`crate::pointer`]
/// before its own answer: managed and mapped host memory (all attributes), and the pool of a
/// `cuMemAllocAsync` block. `None`: not such memory (or another attribute); `data` NULL skips
/// the write. Values are written in the types [`crate::pointer`] uses (booleans are one byte,
/// except `IS_MANAGED`, an unsigned int).
pub fn pointer_attr_hook(
    attribute: c_int,
    ptr: CUdeviceptr,
    data: *mut c_void,
) -> Option<Result<(), CUresult>> {
    let write = |v: Result<u64, CUresult>, width: usize| -> Result<(), CUresult> {
        let v = v?;
        if data.is_null() {
            return Ok(());
        }
        match width {
            1 => out!(data.cast::<u8>(), v as u8),
            4 => out!(data.cast::<u32>(), v as u32),
            _ => out!(data.cast::<u64>(), v),
        }
    };
    if attribute == ptr_attr::MEMPOOL_HANDLE
        && let Some(pool) = api::pool_of(ptr)
    {
        return Some(write(pool, 8));
    }
    let i: PointerInfo = api::mirrored_info(ptr)?;
    Some(match attribute {
        ptr_attr::CONTEXT => write(Ok(i.ctx), 8),
        ptr_attr::MEMORY_TYPE => write(Ok(i.memory_type), 4),
        ptr_attr::DEVICE_POINTER => write(Ok(i.device_pointer), 8),
        ptr_attr::HOST_POINTER => write(Ok(i.host_pointer), 8),
        ptr_attr::SYNC_MEMOPS | ptr_attr::IS_LEGACY_CUDA_IPC_CAPABLE => write(Ok(0), 1),
        ptr_attr::IS_GPU_DIRECT_RDMA_CAPABLE | 21 => write(Ok(0), 1),
        ptr_attr::BUFFER_ID | ptr_attr::MEMORY_BLOCK_ID => write(Ok(i.buffer_id), 8),
        ptr_attr::IS_MANAGED => write(Ok(u64::from(i.managed)), 4),
        ptr_attr::DEVICE_ORDINAL => write(Ok(0), 4),
        ptr_attr::RANGE_START_ADDR | ptr_attr::MAPPING_BASE_ADDR => write(Ok(i.range.0), 8),
        ptr_attr::RANGE_SIZE | ptr_attr::MAPPING_SIZE => write(Ok(i.range.1), 8),
        ptr_attr::MAPPED => write(Ok(1), 1),
        ptr_attr::ALLOWED_HANDLE_TYPES | ptr_attr::MEMPOOL_HANDLE => write(Ok(0), 8),
        // CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
        ptr_attr::ACCESS_FLAGS => write(Ok(3), 4),
        _ => return None,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerSetAttribute(
    value: *const c_void,
    attribute: c_int,
    ptr: CUdeviceptr,
) -> CUresult {
    ffi("cuPointerSetAttribute", || {
        if crate::driver::allocation_of(ptr)?.is_none() && api::mirrored_info(ptr).is_none() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // Every memory operation here is synchronous with respect to the host already.
        if attribute == ptr_attr::SYNC_MEMOPS && !value.is_null() {
            Ok(())
        } else {
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        }
    })
}

// ---- stream-ordered allocator -----------------------------------------------------------------

/// `CUmemPoolProps` (CUDA 11.2 layout; later fields live in its reserved bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemPoolProps {
    /// `CUmemAllocationType`: 1 pinned.
    pub alloc_type: c_int,
    /// `CUmemAllocationHandleType` bits the pool may be exported as.
    pub handle_types: c_int,
    /// Where its memory lives.
    pub location: CUmemLocation,
    /// Windows security attributes.
    pub win32_security_attributes: *mut c_void,
    /// CUDA 12.2: maximum pool size (0: the system's).
    pub max_size: usize,
    /// CUDA 12.6: usage flags.
    pub usage: u16,
    /// Reserved.
    pub reserved: [u8; 54],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemAccessDesc {
    /// Location the access applies to.
    pub location: CUmemLocation,
    /// `CUmemAccess_flags`: 0 none, 1 read, 3 read-write.
    pub flags: c_int,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUhandle,
) -> CUresult {
    ffi("cuMemAllocAsync", || {
        if dptr.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(dptr, api::alloc_async(bytesize as u64, 0, h(stream))?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUhandle,
    stream: CUhandle,
) -> CUresult {
    ffi("cuMemAllocFromPoolAsync", || {
        if dptr.is_null() || pool.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(dptr, api::alloc_async(bytesize as u64, h(pool), h(stream))?)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUhandle) -> CUresult {
    ffi("cuMemFreeAsync", || api::free_async(dptr, h(stream)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUhandle,
    props: *const CUmemPoolProps,
) -> CUresult {
    ffi("cuMemPoolCreate", || {
        if pool.is_null() || props.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-NULL, and a `CUmemPoolProps` by the CUDA contract.
        let p = unsafe { props.read_unaligned() };
        if p.alloc_type != 1 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let h = api::pool_create(
            p.location.type_,
            p.location.id,
            p.handle_types as u32,
            p.max_size as u64,
        )?;
        out!(pool, h as CUhandle)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolDestroy(pool: CUhandle) -> CUresult {
    ffi("cuMemPoolDestroy", || api::pool_destroy(h(pool)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut CUhandle, dev: CUdevice) -> CUresult {
    ffi("cuDeviceGetDefaultMemPool", || {
        out!(pool, api::device_mem_pool(dev, true)? as CUhandle)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut CUhandle, dev: CUdevice) -> CUresult {
    ffi("cuDeviceGetMemPool", || {
        out!(pool, api::device_mem_pool(dev, false)? as CUhandle)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceSetMemPool(dev: CUdevice, pool: CUhandle) -> CUresult {
    ffi("cuDeviceSetMemPool", || {
        api::device_set_mem_pool(dev, h(pool))
    })
}

/// `CU_MEM_ALLOCATION_TYPE_PINNED`: memory of the location itself.
const ALLOCATION_TYPE_PINNED: c_int = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_TYPE_DEVICE: c_int = 1;

/// The device whose pool CUDA 13's per-location pool calls name. Pools of device memory are
/// the device's (`cuDeviceGetMemPool` and friends); host pools (`CU_MEM_LOCATION_TYPE_HOST*`)
/// and managed pools (`CU_MEM_ALLOCATION_TYPE_MANAGED`) do not exist in vgpu:
/// `CUDA_ERROR_NOT_SUPPORTED`.
fn pool_device(location: *const CUmemLocation, alloc_type: c_int) -> Result<CUdevice, CUresult> {
    // SAFETY: the caller's location when non-NULL (CUDA contract); `as_ref` handles NULL.
    let l = unsafe { location.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    location_device(*l)?;
    if !(1..=2).contains(&alloc_type) {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    if l.type_ != LOCATION_TYPE_DEVICE || alloc_type != ALLOCATION_TYPE_PINNED {
        crate::debug!(
            "memory pools of host or managed memory (location type {}, allocation type {alloc_type}) are not supported",
            l.type_
        );
        return Err(cuda::CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(l.id)
}

/// CUDA 13's pool of a location: its default pool, or its current one.
fn location_pool(
    what: &'static str,
    pool: *mut CUhandle,
    location: *const CUmemLocation,
    alloc_type: c_int,
    default: bool,
) -> CUresult {
    ffi(what, || {
        let dev = pool_device(location, alloc_type)?;
        out!(pool, api::device_mem_pool(dev, default)? as CUhandle)
    })
}

/// CUDA 13's `cuMemGetDefaultMemPool`: for a device's memory, its default pool.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetDefaultMemPool(
    pool: *mut CUhandle,
    location: *const CUmemLocation,
    alloc_type: c_int,
) -> CUresult {
    location_pool("cuMemGetDefaultMemPool", pool, location, alloc_type, true)
}

/// CUDA 13's `cuMemGetMemPool`: for a device's memory, its current pool.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetMemPool(
    pool: *mut CUhandle,
    location: *const CUmemLocation,
    alloc_type: c_int,
) -> CUresult {
    location_pool("cuMemGetMemPool", pool, location, alloc_type, false)
}

/// CUDA 13's `cuMemSetMemPool`: for a device's memory, sets its current pool.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetMemPool(
    location: *const CUmemLocation,
    alloc_type: c_int,
    pool: CUhandle,
) -> CUresult {
    ffi("cuMemSetMemPool", || {
        let dev = pool_device(location, alloc_type)?;
        api::device_set_mem_pool(dev, h(pool))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUhandle,
    attribute: c_int,
    value: *mut c_void,
) -> CUresult {
    ffi("cuMemPoolSetAttribute", || {
        if value.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let v = if api::pool_attribute_is_int(attribute) {
            // SAFETY: an `int` for these attributes (CUDA contract); non-NULL.
            let i = unsafe { value.cast::<c_int>().read_unaligned() };
            u64::try_from(i).map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?
        } else {
            // SAFETY: a `cuuint64_t` for the other attributes (CUDA contract); non-NULL.
            unsafe { value.cast::<u64>().read_unaligned() }
        };
        api::pool_set_attribute(h(pool), attribute, v)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUhandle,
    attribute: c_int,
    value: *mut c_void,
) -> CUresult {
    ffi("cuMemPoolGetAttribute", || {
        let v = api::pool_get_attribute(h(pool), attribute)?;
        if api::pool_attribute_is_int(attribute) {
            out!(value.cast::<c_int>(), v as c_int)
        } else {
            out!(value.cast::<u64>(), v)
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolTrimTo(pool: CUhandle, min_bytes_to_keep: usize) -> CUresult {
    ffi("cuMemPoolTrimTo", || {
        api::pool_trim(h(pool), min_bytes_to_keep as u64)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAccess(
    pool: CUhandle,
    map: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    ffi("cuMemPoolSetAccess", || {
        api::pool_check(h(pool))?;
        if count > 0 && map.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        if count > 64 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let descs = if count == 0 {
            &[][..]
        } else {
            // SAFETY: `map` holds `count` descriptors (CUDA contract), checked non-NULL above.
            unsafe { std::slice::from_raw_parts(map, count) }
        };
        for d in descs {
            // The pool's own device always keeps read-write access; there is no other device.
            if d.location.type_ != 1 || d.location.id != 0 || d.flags != 3 {
                return Err(cuda::CUDA_ERROR_INVALID_DEVICE);
            }
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAccess(
    flags: *mut c_int,
    pool: CUhandle,
    location: *const CUmemLocation,
) -> CUresult {
    ffi("cuMemPoolGetAccess", || {
        api::pool_check(h(pool))?;
        if location.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-NULL `CUmemLocation` (CUDA contract).
        let l = unsafe { location.read_unaligned() };
        let access = match (l.type_, l.id) {
            (1, 0) => 3,
            (1, _) => return Err(cuda::CUDA_ERROR_INVALID_DEVICE),
            _ => 0,
        };
        out!(flags, access)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolExportToShareableHandle(
    handle: *mut c_void,
    pool: CUhandle,
    handle_type: c_int,
    flags: u64,
) -> CUresult {
    ffi("cuMemPoolExportToShareableHandle", || {
        if handle.is_null() || flags != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = api::pool_export(h(pool), handle_type)?;
        out!(handle.cast::<c_int>(), api::export_fd(&bytes)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolImportFromShareableHandle(
    pool: *mut CUhandle,
    handle: *mut c_void,
    handle_type: c_int,
    flags: u64,
) -> CUresult {
    ffi("cuMemPoolImportFromShareableHandle", || {
        if pool.is_null() || flags != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        if handle_type != api::HANDLE_TYPE_POSIX_FD {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // A POSIX file descriptor travels in the pointer's value, as in CUDA.
        let bytes = api::import_fd(handle as usize as c_int)?;
        out!(pool, api::pool_import(&bytes)? as CUhandle)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolExportPointer(data: *mut c_void, ptr: CUdeviceptr) -> CUresult {
    ffi("cuMemPoolExportPointer", || {
        let d = api::pool_export_pointer(ptr)?;
        out!(data.cast::<[u8; api::POOL_PTR_EXPORT_SIZE]>(), d)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolImportPointer(
    ptr: *mut CUdeviceptr,
    pool: CUhandle,
    data: *mut c_void,
) -> CUresult {
    ffi("cuMemPoolImportPointer", || {
        if ptr.is_null() || data.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a `CUmemPoolPtrExportData` (64 bytes) by the CUDA contract; non-NULL.
        let d = unsafe {
            data.cast::<[u8; api::POOL_PTR_EXPORT_SIZE]>()
                .read_unaligned()
        };
        out!(ptr, api::pool_import_pointer(h(pool), &d)?)
    })
}

// ---- legacy interprocess memory --------------------------------------------------------------

/// `CUipcMemHandle` and `CUipcEventHandle`: opaque bytes, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUipcHandle {
    /// What the exporter wrote.
    pub reserved: [u8; api::IPC_HANDLE_SIZE],
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetMemHandle(
    handle: *mut CUipcHandle,
    dptr: CUdeviceptr,
) -> CUresult {
    ffi("cuIpcGetMemHandle", || {
        if handle.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let reserved = api::ipc_get_mem_handle(dptr)?;
        out!(handle, CUipcHandle { reserved })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    dptr: *mut CUdeviceptr,
    handle: CUipcHandle,
    flags: c_uint,
) -> CUresult {
    ffi("cuIpcOpenMemHandle", || {
        if dptr.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(dptr, api::ipc_open_mem_handle(&handle.reserved, flags)?)
    })
}

/// The CUDA 4.1 name of `cuIpcOpenMemHandle_v2` (the same ABI).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenMemHandle(
    dptr: *mut CUdeviceptr,
    handle: CUipcHandle,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's contract is `cuIpcOpenMemHandle_v2`'s.
    unsafe { cuIpcOpenMemHandle_v2(dptr, handle, flags) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult {
    ffi("cuIpcCloseMemHandle", || api::ipc_close_mem_handle(dptr))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetEventHandle(
    handle: *mut CUipcHandle,
    event: CUhandle,
) -> CUresult {
    ffi("cuIpcGetEventHandle", || {
        if handle.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let reserved = api::ipc_get_event_handle(event as u64)?;
        out!(handle, CUipcHandle { reserved })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenEventHandle(
    event: *mut CUhandle,
    handle: CUipcHandle,
) -> CUresult {
    ffi("cuIpcOpenEventHandle", || {
        if event.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(
            event,
            api::ipc_open_event_handle(&handle.reserved)? as CUhandle
        )
    })
}

// ---- virtual memory management ------------------------------------------------------------

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemAllocationProp {
    /// `CUmemAllocationType`: 1 pinned.
    pub type_: c_int,
    /// `CUmemAllocationHandleType` bits it may be exported as.
    pub requested_handle_types: c_int,
    /// Where it lives.
    pub location: CUmemLocation,
    /// Windows metadata.
    pub win32_handle_meta_data: *mut c_void,
    /// `allocFlags`: compression type, GPUDirect RDMA capable, usage, reserved.
    pub alloc_flags: [u8; 8],
}

fn read_prop(prop: *const CUmemAllocationProp) -> Result<CUmemAllocationProp, CUresult> {
    if prop.is_null() {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL, and a `CUmemAllocationProp` by the CUDA contract.
    let p = unsafe { prop.read_unaligned() };
    api::check_alloc_prop(
        p.type_,
        p.location.type_,
        p.location.id,
        p.requested_handle_types,
    )?;
    Ok(p)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: c_int,
) -> CUresult {
    ffi("cuMemGetAllocationGranularity", || {
        crate::driver::driver()?;
        read_prop(prop)?;
        if !matches!(option, 0 | 1) {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(granularity, api::VMM_GRANULARITY as usize)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    ffi("cuMemCreate", || {
        let p = read_prop(prop)?;
        if flags != 0 || handle.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(
            handle,
            api::mem_create(size as u64, p.requested_handle_types)?
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    ffi("cuMemRelease", || api::mem_release(handle))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    _addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    ffi("cuMemAddressReserve", || {
        if flags != 0 || ptr.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(ptr, api::address_reserve(size as u64, alignment as u64)?)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    ffi("cuMemAddressFree", || api::address_free(ptr, size as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> CUresult {
    ffi("cuMemMap", || {
        if flags != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        api::mem_map(ptr, size as u64, offset as u64, handle)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemMapArrayAsync(
    _map_info_list: *mut c_void,
    _count: c_uint,
    _stream: CUhandle,
) -> CUresult {
    crate::driver::unsupported("cuMemMapArrayAsync (sparse CUDA arrays)")
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    ffi("cuMemUnmap", || api::mem_unmap(ptr, size as u64))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    ffi("cuMemSetAccess", || {
        if desc.is_null() || count == 0 || count > 64 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `desc` holds `count` descriptors (CUDA contract), checked non-NULL above.
        let descs = unsafe { std::slice::from_raw_parts(desc, count) };
        for d in descs {
            if d.location.type_ != 1 {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
            if d.location.id != 0 {
                return Err(cuda::CUDA_ERROR_INVALID_DEVICE);
            }
            let flags = u32::try_from(d.flags).map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?;
            api::mem_set_access(ptr, size as u64, flags)?;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAccess(
    flags: *mut u64,
    location: *const CUmemLocation,
    ptr: CUdeviceptr,
) -> CUresult {
    ffi("cuMemGetAccess", || {
        if location.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-NULL `CUmemLocation` (CUDA contract).
        let l = unsafe { location.read_unaligned() };
        if l.type_ != 1 || l.id != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_DEVICE);
        }
        out!(flags, api::mem_get_access(ptr)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut CUmemAllocationProp,
    handle: u64,
) -> CUresult {
    ffi("cuMemGetAllocationPropertiesFromHandle", || {
        let (_, types) = api::mem_handle_props(handle)?;
        out!(
            prop,
            CUmemAllocationProp {
                type_: 1,
                requested_handle_types: types,
                location: CUmemLocation { type_: 1, id: 0 },
                win32_handle_meta_data: std::ptr::null_mut(),
                alloc_flags: [0; 8],
            }
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut u64,
    addr: *mut c_void,
) -> CUresult {
    ffi("cuMemRetainAllocationHandle", || {
        out!(handle, api::mem_retain(addr as u64)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: u64,
    handle_type: c_int,
    flags: u64,
) -> CUresult {
    ffi("cuMemExportToShareableHandle", || {
        if shareable.is_null() || flags != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let token = api::mem_export(handle, handle_type)?;
        if handle_type == api::HANDLE_TYPE_POSIX_FD {
            out!(shareable.cast::<c_int>(), api::export_fd(&token)?)
        } else {
            let mut fabric = [0u8; 64];
            fabric[..token.len()].copy_from_slice(&token);
            out!(shareable.cast::<[u8; 64]>(), fabric)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut u64,
    os_handle: *mut c_void,
    handle_type: c_int,
) -> CUresult {
    ffi("cuMemImportFromShareableHandle", || {
        let token = match handle_type {
            api::HANDLE_TYPE_POSIX_FD => api::import_fd(os_handle as usize as c_int)?,
            api::HANDLE_TYPE_FABRIC => {
                if os_handle.is_null() {
                    return Err(cuda::CUDA_ERROR_INVALID_VALUE);
                }
                // SAFETY: a `CUmemFabricHandle` (64 bytes) by the CUDA contract; non-NULL.
                unsafe { os_handle.cast::<[u8; 64]>().read_unaligned() }.to_vec()
            }
            _ => return Err(cuda::CUDA_ERROR_NOT_SUPPORTED),
        };
        out!(handle, api::mem_import(&token)?)
    })
}
