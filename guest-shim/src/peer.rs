//! Peer access and device lookup by PCI location. A VM sees one device, so
//! the answers are those of a single-GPU machine: no device is a peer of
//! another, peer access cannot be enabled, and the only PCI bus id that
//! names a device is the VM's device's own. Multicast objects (NVLink SHARP,
//! CUDA 12.1) span devices: a VM's device reports `MULTICAST_SUPPORTED` 0 and
//! the `cuMulticast*` functions answer `CUDA_ERROR_NOT_SUPPORTED`, as CUDA does
//! on a GPU without them. Libraries resolve them when they start (PyTorch's
//! allocator refuses to allocate if any is missing), so they must exist.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong};

use vgpu_proto::cuda;

use crate::driver as drv;
use crate::exports::{CUdevice, CUhandle, c_name, h};
use crate::ffi::{CUresult, ffi};
use crate::out;

fn check_device(dev: CUdevice) -> drv::CuRes<()> {
    if (0..drv::device_count()?).contains(&dev) {
        Ok(())
    } else {
        Err(cuda::CUDA_ERROR_INVALID_DEVICE)
    }
}

/// Parses `[domain:]bus:device[.function]` (hexadecimal), as
/// `cuDeviceGetByPCIBusId` accepts it.
fn parse_bus_id(s: &str) -> Option<(u32, u32, u32)> {
    let (s, _function) = s.split_once('.').unwrap_or((s, "0"));
    let parts: Vec<&str> = s.split(':').collect();
    let hex = |p: &str| u32::from_str_radix(p, 16).ok();
    match parts.as_slice() {
        [bus, dev] => Some((0, hex(bus)?, hex(dev)?)),
        [domain, bus, dev] => Some((hex(domain)?, hex(bus)?, hex(dev)?)),
        _ => None,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(
    dev: *mut CUdevice,
    bus_id: *const c_char,
) -> CUresult {
    ffi("cuDeviceGetByPCIBusId", || {
        // SAFETY: the caller's C string (CUDA contract).
        let wanted = parse_bus_id(unsafe { c_name(bus_id) }?.trim())
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        for d in 0..drv::device_count()? {
            let ours = drv::device_pci_bus_id(d)?;
            if parse_bus_id(&ours) == Some(wanted) {
                return out!(dev, d);
            }
        }
        Err(cuda::CUDA_ERROR_INVALID_DEVICE)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    ffi("cuDeviceCanAccessPeer", || {
        check_device(dev)?;
        check_device(peer)?;
        out!(can, 0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetP2PAttribute(
    value: *mut c_int,
    _attribute: c_int,
    src: CUdevice,
    dst: CUdevice,
) -> CUresult {
    ffi("cuDeviceGetP2PAttribute", || {
        check_device(src)?;
        check_device(dst)?;
        if value.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // A device is not its own peer, and there is no other device.
        Err(cuda::CUDA_ERROR_INVALID_DEVICE)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxEnablePeerAccess(peer: CUhandle, flags: c_uint) -> CUresult {
    ffi("cuCtxEnablePeerAccess", || {
        drv::ctx_get_current()?;
        if flags != 0 || h(peer) == 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        Err(cuda::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDisablePeerAccess(peer: CUhandle) -> CUresult {
    ffi("cuCtxDisablePeerAccess", || {
        drv::ctx_get_current()?;
        if h(peer) == 0 {
            return Err(cuda::CUDA_ERROR_INVALID_CONTEXT);
        }
        Err(cuda::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)
    })
}

// ---- atomic capabilities (CUDA 13) ------------------------------------------------------

/// `CU_ATOMIC_OPERATION_MAX`: operations are `0..` this.
const ATOMIC_OPERATIONS: c_int = 13;

/// Checks a capability query's arrays and reads its operations.
fn atomic_operations<'a>(
    capabilities: *mut c_uint,
    operations: *const c_int,
    count: c_uint,
) -> drv::CuRes<&'a mut [c_uint]> {
    if capabilities.is_null() || operations.is_null() || count == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let n = count as usize;
    // SAFETY: `operations` holds `count` operations (CUDA contract), checked non-NULL above.
    let ops = unsafe { std::slice::from_raw_parts(operations, n) };
    if ops.iter().any(|op| !(0..ATOMIC_OPERATIONS).contains(op)) {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `capabilities` has room for `count` answers (CUDA contract), checked non-NULL.
    Ok(unsafe { std::slice::from_raw_parts_mut(capabilities, n) })
}

/// CUDA 13's `cuDeviceGetHostAtomicCapabilities`: no atomic operation reaches host memory
/// natively (mapped host memory is made coherent at launches and synchronizations, not while a
/// kernel runs; `HOST_NATIVE_ATOMIC_SUPPORTED` is 0), so every capability mask is 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetHostAtomicCapabilities(
    capabilities: *mut c_uint,
    operations: *const c_int,
    count: c_uint,
    dev: CUdevice,
) -> CUresult {
    ffi("cuDeviceGetHostAtomicCapabilities", || {
        check_device(dev)?;
        atomic_operations(capabilities, operations, count)?.fill(0);
        Ok(())
    })
}

/// CUDA 13's `cuDeviceGetP2PAtomicCapabilities`: there is no link between two devices in a VM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetP2PAtomicCapabilities(
    capabilities: *mut c_uint,
    operations: *const c_int,
    count: c_uint,
    src: CUdevice,
    dst: CUdevice,
) -> CUresult {
    ffi("cuDeviceGetP2PAtomicCapabilities", || {
        check_device(src)?;
        check_device(dst)?;
        atomic_operations(capabilities, operations, count)?;
        // A device is not its own peer, and there is no other device.
        Err(cuda::CUDA_ERROR_INVALID_DEVICE)
    })
}

// ---- multicast objects ---------------------------------------------------------------

/// `CUmemGenericAllocationHandle`.
type MemHandle = c_ulonglong;

/// `CUmulticastObjectProp`.
#[repr(C)]
pub struct MulticastObjectProp {
    num_devices: c_uint,
    size: usize,
    handle_types: c_ulonglong,
    flags: c_ulonglong,
}

/// The answer of every multicast function once its arguments are checked: a VM's device has no
/// multicast support (`CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED` is 0).
fn no_multicast(what: &str) -> drv::CuRes<()> {
    drv::device_count()?;
    crate::debug!("{what}: multicast objects span devices; a VM's device has none");
    Err(cuda::CUDA_ERROR_NOT_SUPPORTED)
}

/// Checks a multicast object's properties as CUDA does before anything else.
fn check_prop(prop: *const MulticastObjectProp) -> drv::CuRes<()> {
    // SAFETY: the caller's properties when non-NULL (CUDA contract); `as_ref` handles NULL.
    let prop = unsafe { prop.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    if prop.num_devices == 0 || prop.size == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMulticastCreate(
    handle: *mut MemHandle,
    prop: *const MulticastObjectProp,
) -> CUresult {
    ffi("cuMulticastCreate", || {
        if handle.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        check_prop(prop)?;
        no_multicast("cuMulticastCreate")
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMulticastGetGranularity(
    granularity: *mut usize,
    prop: *const MulticastObjectProp,
    _option: c_int,
) -> CUresult {
    ffi("cuMulticastGetGranularity", || {
        if granularity.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        check_prop(prop)?;
        no_multicast("cuMulticastGetGranularity")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMulticastAddDevice(_handle: MemHandle, dev: CUdevice) -> CUresult {
    ffi("cuMulticastAddDevice", || {
        check_device(dev)?;
        no_multicast("cuMulticastAddDevice")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMulticastBindMem(
    _handle: MemHandle,
    _mc_offset: usize,
    _mem: MemHandle,
    _mem_offset: usize,
    _size: usize,
    _flags: c_ulonglong,
) -> CUresult {
    ffi("cuMulticastBindMem", || no_multicast("cuMulticastBindMem"))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMulticastBindAddr(
    _handle: MemHandle,
    _mc_offset: usize,
    _ptr: u64,
    _size: usize,
    _flags: c_ulonglong,
) -> CUresult {
    ffi("cuMulticastBindAddr", || {
        no_multicast("cuMulticastBindAddr")
    })
}

/// `cuMulticastBindMem_v2` (CUDA 13.1): with the device whose memory is bound.
#[unsafe(no_mangle)]
pub extern "C" fn cuMulticastBindMem_v2(
    _handle: MemHandle,
    dev: CUdevice,
    _mc_offset: usize,
    _mem: MemHandle,
    _mem_offset: usize,
    _size: usize,
    _flags: c_ulonglong,
) -> CUresult {
    ffi("cuMulticastBindMem_v2", || {
        check_device(dev)?;
        no_multicast("cuMulticastBindMem_v2")
    })
}

/// `cuMulticastBindAddr_v2` (CUDA 13.1): with the device whose memory is bound.
#[unsafe(no_mangle)]
pub extern "C" fn cuMulticastBindAddr_v2(
    _handle: MemHandle,
    dev: CUdevice,
    _mc_offset: usize,
    _ptr: u64,
    _size: usize,
    _flags: c_ulonglong,
) -> CUresult {
    ffi("cuMulticastBindAddr_v2", || {
        check_device(dev)?;
        no_multicast("cuMulticastBindAddr_v2")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMulticastUnbind(
    _handle: MemHandle,
    dev: CUdevice,
    _mc_offset: usize,
    _size: usize,
) -> CUresult {
    ffi("cuMulticastUnbind", || {
        check_device(dev)?;
        no_multicast("cuMulticastUnbind")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_parse_with_and_without_a_domain() {
        assert_eq!(parse_bus_id("00000000:65:00.0"), Some((0, 0x65, 0)));
        assert_eq!(parse_bus_id("0000:65:00.0"), Some((0, 0x65, 0)));
        assert_eq!(parse_bus_id("65:1f"), Some((0, 0x65, 0x1f)));
        assert_eq!(parse_bus_id("1:2:3:4"), None);
        assert_eq!(parse_bus_id("zz:00.0"), None);
    }
}
