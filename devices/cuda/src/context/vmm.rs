//! Virtual memory management on a real GPU: `cuMemCreate` physical memory, address
//! reservations and mappings of a VM's context, released with it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use tracing::warn;
use vgpu_broker::device::DeviceError;

use super::{Generation, lock};
use crate::driver::Driver;

/// One physical allocation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Phys {
    pub(crate) handle: u64,
    pub(crate) size: u64,
    /// Zeroed once, at its first mapping (it may hold what another VM freed).
    pub(crate) zeroed: bool,
}

/// A context's physical allocations (by id), reservations and mappings.
#[derive(Debug, Default)]
pub(crate) struct Vmm {
    pub(crate) next_id: u64,
    pub(crate) phys: BTreeMap<u64, Phys>,
    pub(crate) reserved: BTreeMap<u64, u64>,
    pub(crate) mapped: BTreeMap<u64, u64>,
    /// Movable allocations (`alloc`, `alloc_host`) by address ([`super::movable`]).
    pub(crate) movable: BTreeMap<u64, super::movable::Movable>,
}

pub(crate) fn unknown(addr: u64, len: u64) -> DeviceError {
    DeviceError::InvalidAddress { addr, len }
}

impl Generation {
    /// Unmaps, unreserves and releases everything (the context goes away).
    pub(super) fn release_vmm(&self) {
        let v = self.take_vmm();
        release(self.driver(), v);
    }

    /// Takes the context's VMM state out, uncounting its physical memory and mappings.
    pub(super) fn take_vmm(&self) -> Vmm {
        let v = std::mem::take(&mut *lock(&self.vmm));
        let mut ranges = lock(&self.ranges);
        for va in v.mapped.keys() {
            ranges.remove(va);
        }
        let phys: u64 = v.phys.values().map(|p| p.size).sum();
        self.shared.used.fetch_sub(phys, Ordering::Relaxed);
        // Movable allocations: their device bytes are the `charged` of their ranges, which the
        // generation's drop (the only caller) already uncounted; their host bytes here.
        for (va, m) in &v.movable {
            ranges.remove(va);
            if m.residence == vgpu_broker::device::Residence::Host {
                self.shared.host_used.fetch_sub(m.span, Ordering::Relaxed);
            }
        }
        v
    }
}

/// Unmaps, unreserves and releases what `v` holds (VMM calls need no current context).
pub(super) fn release(d: &Driver, v: Vmm) {
    for (va, size) in v.mapped {
        if let Err(f) = d.vmm_unmap(va, size) {
            warn!(call = f.call, code = f.code, "unmapping VM memory failed");
        }
    }
    for (va, size) in v.reserved {
        let _ = d.vmm_free(va, size);
    }
    for p in v.phys.values() {
        let _ = d.vmm_release(p.handle);
    }
    for (va, m) in v.movable {
        super::movable::release(d, va, &m);
    }
}
