//! CUDA 12.5's asynchronous notifications (`cuDeviceRegisterAsyncNotification`,
//! `cuDeviceUnregisterAsyncNotification`): callbacks told when the process is over its device
//! memory budget (`CU_ASYNC_NOTIFICATION_TYPE_OVER_BUDGET`), so that it can give memory back.
//!
//! On vgpu a VM's slice is what it may allocate; whether the device has room for all of it is
//! the host's memory policy (docs/memory.md: reservations, overcommit and overflow). When the
//! device is full, allocations of a VM with `overflow = "host"` live in host memory (and a VM
//! that borrowed another's reservation is moved there when the owner claims it): the VM then
//! holds more than the device gives it, by the bytes it has in host memory, and its kernels run
//! slower on those. That is the over-budget condition this reports, with those bytes: a VM's
//! processes share its slice, so each is told the VM's figure.
//!
//! While callbacks are registered a watcher thread asks vgpud every [`WATCH_INTERVAL`] (the
//! tenant information vgpu-smi reads, `memory_placement.host_overflow`) and calls every
//! callback once each time the VM goes over (from none in host memory to some); callbacks run on
//! that thread, never under the shim's locks.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use vgpu_proto::cuda;

use crate::driver::{self, CuRes};

/// `CU_ASYNC_NOTIFICATION_TYPE_OVER_BUDGET`.
pub const OVER_BUDGET: u32 = 1;
/// How often the watcher asks vgpud while callbacks are registered.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// `CUasyncNotificationInfo`: the type and, for an over-budget notification, the bytes over.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AsyncNotificationInfo {
    pub kind: u32,
    pub bytes_over_budget: u64,
}

const _: () = assert!(std::mem::size_of::<AsyncNotificationInfo>() == 16);

/// `CUasyncCallback`.
pub type AsyncCallback =
    unsafe extern "C" fn(info: *mut AsyncNotificationInfo, user: *mut c_void, handle: *mut c_void);

#[derive(Clone, Copy)]
struct Registered {
    callback: AsyncCallback,
    /// The caller's pointer, handed back as it was (never dereferenced here).
    user: usize,
}

#[derive(Default)]
struct Registry {
    callbacks: BTreeMap<usize, Registered>,
    next: usize,
    watching: bool,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn registry() -> MutexGuard<'static, Option<Registry>> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `cuDeviceRegisterAsyncNotification` on device `dev`: the new registration's handle.
pub fn register(dev: i32, callback: AsyncCallback, user: *mut c_void) -> CuRes<usize> {
    driver::driver()?;
    driver::check_device(dev)?;
    let mut guard = registry();
    let reg = guard.get_or_insert_with(Registry::default);
    reg.next += 1;
    let handle = reg.next;
    reg.callbacks.insert(
        handle,
        Registered {
            callback,
            user: user as usize,
        },
    );
    if !reg.watching {
        std::thread::Builder::new()
            .name("vgpu-notify".into())
            .spawn(watch)
            .map_err(|_| cuda::CUDA_ERROR_OUT_OF_MEMORY)?;
        reg.watching = true;
    }
    Ok(handle)
}

/// `cuDeviceUnregisterAsyncNotification`: an unknown handle is `CUDA_ERROR_INVALID_VALUE`.
pub fn unregister(dev: i32, handle: usize) -> CuRes<()> {
    driver::driver()?;
    driver::check_device(dev)?;
    match registry().as_mut().map(|r| r.callbacks.remove(&handle)) {
        Some(Some(_)) => Ok(()),
        _ => Err(cuda::CUDA_ERROR_INVALID_VALUE),
    }
}

/// The VM's bytes in host memory, from vgpud's tenant information (0 when it has no placement
/// figures).
fn over_budget() -> CuRes<u64> {
    let json = driver::tenant_info()?;
    let v: serde_json::Value = serde_json::from_str(&json).map_err(|_| cuda::CUDA_ERROR_UNKNOWN)?;
    Ok(v["memory_placement"]["host_overflow"].as_u64().unwrap_or(0))
}

/// Whether a VM that had `before` bytes over and has `now` has just gone over.
pub fn went_over(before: u64, now: u64) -> bool {
    before == 0 && now > 0
}

/// The watcher: runs while callbacks are registered, then ends (a later registration starts it
/// again).
fn watch() {
    let mut before = 0;
    loop {
        std::thread::sleep(WATCH_INTERVAL);
        let callbacks: Vec<(usize, Registered)> = {
            let mut guard = registry();
            let Some(reg) = guard.as_mut() else { return };
            if reg.callbacks.is_empty() {
                reg.watching = false;
                return;
            }
            reg.callbacks.iter().map(|(&h, &r)| (h, r)).collect()
        };
        let Ok(now) = over_budget() else { continue };
        if went_over(before, now) {
            for (handle, r) in callbacks {
                let mut info = AsyncNotificationInfo {
                    kind: OVER_BUDGET,
                    bytes_over_budget: now,
                };
                // SAFETY: the application's callback, with the arguments CUDA passes: the
                // notification (alive for the call), its own pointer and the registration.
                unsafe { (r.callback)(&mut info, r.user as *mut c_void, handle as *mut c_void) };
            }
        }
        before = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vm_goes_over_once_per_excursion() {
        assert!(went_over(0, 1));
        assert!(!went_over(8, 16), "still over: no new notification");
        assert!(!went_over(8, 0));
        assert!(!went_over(0, 0));
    }
}
