//! Stream attributes (`cuStreamGetAttribute`, `cuStreamSetAttribute`, `cuStreamCopyAttributes`),
//! which the CUDA runtime's `cudaStream{Get,Set}Attribute` and `cudaStreamCopyAttributes` call.
//! The shim keeps them per stream:
//!
//! - the access policy window (L2 persistence hints): kept and reported back, not applied; a
//!   window larger than the device's `MAX_ACCESS_POLICY_WINDOW_SIZE` is refused as CUDA refuses
//!   it, and the simulated GPU reports 0, so there only an empty one (no bytes) can be set;
//! - the synchronization policy: kept and reported back (how a host thread waits for the
//!   stream; the shim's waits are its transport's);
//! - the priority: the stream's, fixed at its creation here (setting it:
//!   `CUDA_ERROR_NOT_SUPPORTED`).
//!
//! Memory synchronization domains (Hopper and later) are not offered:
//! `CUDA_ERROR_NOT_SUPPORTED`. Any other attribute is not a stream's:
//! `CUDA_ERROR_INVALID_VALUE`.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard, OnceLock};

use vgpu_proto::cuda;

use crate::driver as drv;
use crate::exports::{CUhandle, h};
use crate::ffi::{CUresult, ffi};

/// `CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW`.
const ACCESS_POLICY_WINDOW: c_int = 1;
/// `CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY`.
const SYNCHRONIZATION_POLICY: c_int = 4;
/// `CU_LAUNCH_ATTRIBUTE_PRIORITY`.
const PRIORITY: c_int = 8;
/// `CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP`.
const MEM_SYNC_DOMAIN_MAP: c_int = 9;
/// `CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN`.
const MEM_SYNC_DOMAIN: c_int = 10;

/// `CU_SYNC_POLICY_AUTO`, every stream's until set.
const SYNC_POLICY_AUTO: u32 = 1;
/// `CU_SYNC_POLICY_BLOCKING_SYNC`, the last policy.
const SYNC_POLICY_LAST: u32 = 4;
/// `CU_ACCESS_PROPERTY_PERSISTING`, the last access property.
const ACCESS_PROPERTY_LAST: u32 = 2;

/// `CUaccessPolicyWindow`, the first member of `CUlaunchAttributeValue`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct AccessPolicyWindow {
    base_ptr: u64,
    num_bytes: usize,
    hit_ratio: f32,
    hit_prop: u32,
    miss_prop: u32,
}

/// What a stream has set.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Attrs {
    window: AccessPolicyWindow,
    sync_policy: u32,
}

impl Default for Attrs {
    fn default() -> Self {
        Self {
            window: AccessPolicyWindow::default(),
            sync_policy: SYNC_POLICY_AUTO,
        }
    }
}

/// Attributes by stream ID ([`drv::stream_id`]); streams that never set one are absent.
fn table() -> MutexGuard<'static, HashMap<u64, Attrs>> {
    static TABLE: OnceLock<Mutex<HashMap<u64, Attrs>>> = OnceLock::new();
    TABLE
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Forgets a destroyed stream's attributes (by its ID: a created or per-thread stream's handle,
/// or a destroyed context's legacy stream's ID).
pub fn forget(stream: u64) {
    table().remove(&stream);
}

/// The ID of the stream a call names and the attribute value it passes, which must not be NULL.
fn stream_with_value<T>(stream: CUhandle, value: *const T) -> drv::CuRes<u64> {
    if value.is_null() {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    drv::stream_id(h(stream))
}

fn attrs_of(id: u64) -> Attrs {
    table().get(&id).copied().unwrap_or_default()
}

fn check_window(w: &AccessPolicyWindow) -> drv::CuRes<()> {
    let max = drv::device_attribute(
        cuda::attr::MAX_ACCESS_POLICY_WINDOW_SIZE as c_int,
        drv::ctx_get_device()?,
    )?;
    let fits = u64::try_from(w.num_bytes).is_ok_and(|n| n <= u64::try_from(max).unwrap_or(0));
    if !fits
        || !(0.0..=1.0).contains(&w.hit_ratio)
        || w.hit_prop > ACCESS_PROPERTY_LAST
        || w.miss_prop > ACCESS_PROPERTY_LAST
    {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// `cuStreamGetAttribute`: writes the attribute into the caller's `CUlaunchAttributeValue`
/// (only the member the attribute uses).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetAttribute(
    stream: CUhandle,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    ffi("cuStreamGetAttribute", || {
        let a = attrs_of(stream_with_value(stream, value)?);
        match attr {
            ACCESS_POLICY_WINDOW => {
                // SAFETY: `value` points to a CUlaunchAttributeValue (CUDA contract), whose
                // first member is a CUaccessPolicyWindow.
                unsafe { value.cast::<AccessPolicyWindow>().write_unaligned(a.window) };
            }
            SYNCHRONIZATION_POLICY => {
                // SAFETY: as above; the member is a 32-bit enum.
                unsafe { value.cast::<u32>().write_unaligned(a.sync_policy) };
            }
            PRIORITY => {
                let priority = drv::stream_params(h(stream))?.1;
                // SAFETY: as above; the member is an int.
                unsafe { value.cast::<c_int>().write_unaligned(priority) };
            }
            MEM_SYNC_DOMAIN_MAP | MEM_SYNC_DOMAIN => return Err(cuda::CUDA_ERROR_NOT_SUPPORTED),
            _ => return Err(cuda::CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    })
}

/// `cuStreamSetAttribute`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSetAttribute(
    stream: CUhandle,
    attr: c_int,
    value: *const c_void,
) -> CUresult {
    ffi("cuStreamSetAttribute", || {
        let id = stream_with_value(stream, value)?;
        let mut a = attrs_of(id);
        match attr {
            ACCESS_POLICY_WINDOW => {
                // SAFETY: `value` points to a CUlaunchAttributeValue (CUDA contract).
                let w = unsafe { value.cast::<AccessPolicyWindow>().read_unaligned() };
                check_window(&w)?;
                a.window = w;
            }
            SYNCHRONIZATION_POLICY => {
                // SAFETY: as above; the member is a 32-bit enum.
                let p = unsafe { value.cast::<u32>().read_unaligned() };
                if !(SYNC_POLICY_AUTO..=SYNC_POLICY_LAST).contains(&p) {
                    return Err(cuda::CUDA_ERROR_INVALID_VALUE);
                }
                a.sync_policy = p;
            }
            PRIORITY | MEM_SYNC_DOMAIN_MAP | MEM_SYNC_DOMAIN => {
                return Err(cuda::CUDA_ERROR_NOT_SUPPORTED);
            }
            _ => return Err(cuda::CUDA_ERROR_INVALID_VALUE),
        }
        table().insert(id, a);
        Ok(())
    })
}

/// `cuStreamCopyAttributes`: the attributes the shim keeps (not the priority, fixed at creation).
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamCopyAttributes(dst: CUhandle, src: CUhandle) -> CUresult {
    ffi("cuStreamCopyAttributes", || {
        let from = drv::stream_id(h(src))?;
        let to = drv::stream_id(h(dst))?;
        let a = attrs_of(from);
        table().insert(to, a);
        Ok(())
    })
}

/// `cuCtxResetPersistingL2Cache`: access policy windows are kept, not applied (above), so no
/// cache line is persisting and there is nothing to reset; a context must be current, as in
/// CUDA.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxResetPersistingL2Cache() -> CUresult {
    ffi("cuCtxResetPersistingL2Cache", || {
        drv::current_ctx()
            .map(drop)
            .ok_or(cuda::CUDA_ERROR_INVALID_CONTEXT)
    })
}
