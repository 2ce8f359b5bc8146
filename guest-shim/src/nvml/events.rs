//! NVML's device events (`nvmlEventSetCreate`, `nvmlDeviceRegisterEvents`,
//! `nvmlDeviceGetSupportedEventTypes`, `nvmlEventSetWait`, `nvmlEventSetFree`), as health checks
//! and monitoring agents use them (Kubernetes' device plugins, DCGM-style exporters).
//!
//! A VM's GPU reports none of them: ECC errors, performance-state and clock changes, the power
//! source and MIG reconfiguration belong to the host's GPU, and a kernel fault is vgpud's to
//! contain (it fails its own context, as the context's next call says), not an Xid of the
//! device. So the supported mask is empty, registering any type is `NVML_ERROR_NOT_SUPPORTED`
//! (nvml.h: the set stays usable, with none of the types registered), and a wait finds no
//! event within its timeout (`NVML_ERROR_TIMEOUT`), as with NVIDIA's library on a device without
//! those events. Sets are real: their handles are checked, and a freed or forged one is
//! `NVML_ERROR_INVALID_ARGUMENT`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::{NvmlRes, ensure_init, ret};

/// Every event type nvml.h defines (`nvmlEventTypeAll`).
pub const EVENT_TYPES_ALL: u64 = 0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x80 | 0x100;
/// The event types the VM's GPU reports: none.
pub const EVENT_TYPES_SUPPORTED: u64 = 0;
/// Longest one `nvmlEventSetWait` sleeps: a caller's timeout past it is cut (it may return
/// early, as NVIDIA's may on an interrupt).
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// Live event sets, by handle.
static SETS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
/// The next set's handle (never 0, never reused).
static NEXT: AtomicUsize = AtomicUsize::new(1);

fn sets() -> MutexGuard<'static, Option<HashSet<usize>>> {
    SETS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `nvmlEventSetCreate`: a new, empty set's handle.
pub fn create() -> NvmlRes<usize> {
    ensure_init()?;
    let handle = NEXT.fetch_add(1, Ordering::Relaxed);
    sets().get_or_insert_with(HashSet::new).insert(handle);
    Ok(handle)
}

/// A set `create` made and `free` did not end (`NVML_ERROR_INVALID_ARGUMENT` otherwise).
pub(super) fn check(set: usize) -> NvmlRes<()> {
    ensure_init()?;
    match sets().as_ref() {
        Some(s) if s.contains(&set) => Ok(()),
        _ => Err(ret::INVALID_ARGUMENT),
    }
}

/// `nvmlDeviceRegisterEvents` on the VM's GPU: types nvml.h does not define are
/// `NVML_ERROR_INVALID_ARGUMENT`, any it defines `NVML_ERROR_NOT_SUPPORTED` (none registered);
/// an empty mask registers nothing.
pub fn register(set: usize, types: u64) -> NvmlRes<()> {
    check(set)?;
    if types & !EVENT_TYPES_ALL != 0 {
        return Err(ret::INVALID_ARGUMENT);
    }
    if types & !EVENT_TYPES_SUPPORTED != 0 {
        return Err(ret::NOT_SUPPORTED);
    }
    Ok(())
}

/// `nvmlEventSetWait`: no event comes; sleeps `timeout_ms` (at most [`MAX_WAIT`]) and answers
/// `NVML_ERROR_TIMEOUT`.
pub fn wait(set: usize, timeout_ms: u32) -> NvmlRes<()> {
    check(set)?;
    std::thread::sleep(Duration::from_millis(u64::from(timeout_ms)).min(MAX_WAIT));
    Err(ret::TIMEOUT)
}

/// `nvmlEventSetFree`.
pub fn free(set: usize) -> NvmlRes<()> {
    check(set)?;
    if let Some(s) = sets().as_mut() {
        s.remove(&set);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nvml.h's `nvmlEventTypeAll` is 0x19f.
    #[test]
    fn the_masks_are_nvml_hs() {
        assert_eq!(EVENT_TYPES_ALL, 0x19f);
        assert_eq!(EVENT_TYPES_SUPPORTED & !EVENT_TYPES_ALL, 0);
    }
}
