//! Memory slices (one per tenant) and allocation tables (one per session).
//!
//! The slice is the hard limit: every allocating call charges it before the
//! device allocates, and a charge that does not fit is refused with
//! `CUDA_ERROR_OUT_OF_MEMORY` with nothing changed. The allocation table is how
//! the broker validates every device pointer a guest passes.

pub mod movable;
pub mod placement;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::CuError;
use vgpu_config::size::Human;

/// A tenant's memory slice: limit and bytes charged.
#[derive(Debug)]
pub struct MemorySlice {
    state: Mutex<SliceState>,
    /// Where charged bytes are admitted to device memory (reservations, overcommit).
    admission: OnceLock<Arc<dyn placement::Admission>>,
}

impl std::fmt::Debug for dyn placement::Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Admission")
    }
}

#[derive(Debug, Clone, Copy)]
struct SliceState {
    limit: u64,
    used: u64,
    /// Most ever charged at once.
    peak: u64,
    /// Most charged at once per hour (hour since the Unix epoch, bytes),
    /// for the last 24 hours.
    hourly: [(u64, u64); 24],
}

fn unix_hour() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 3600)
}

impl SliceState {
    fn note_use(&mut self) {
        self.peak = self.peak.max(self.used);
        let h = unix_hour();
        let b = &mut self.hourly[(h % 24) as usize];
        if b.0 != h {
            *b = (h, 0);
        }
        b.1 = b.1.max(self.used);
    }
}

impl MemorySlice {
    /// A slice of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self {
            state: Mutex::new(SliceState {
                limit,
                used: 0,
                peak: 0,
                hourly: [(0, 0); 24],
            }),
            admission: OnceLock::new(),
        }
    }

    /// Sends every later [`MemorySlice::charge`] and [`MemorySlice::refund`] through `a`
    /// (the VM's entry in its device's memory ledger). Set once.
    pub fn set_admission(&self, a: Arc<dyn placement::Admission>) {
        let _ = self.admission.set(a);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SliceState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Charges `bytes` of device memory; refuses when the slice would overflow, or when the
    /// device has no room for the VM (its reservations and the others').
    pub fn charge(&self, bytes: u64) -> Result<(), CuError> {
        self.charge_unplaced(bytes)?;
        if let Some(a) = self.admission.get()
            && let Err(e) = a.admit(bytes)
        {
            self.refund_unplaced(bytes);
            return Err(e);
        }
        Ok(())
    }

    /// Returns `bytes` charged by [`MemorySlice::charge`].
    pub fn refund(&self, bytes: u64) {
        self.refund_unplaced(bytes);
        if let Some(a) = self.admission.get() {
            a.release(bytes);
        }
    }

    /// Charges `bytes` to the slice only: the caller places them (a movable allocation,
    /// see [`placement::TenantMemory::place`]).
    pub fn charge_unplaced(&self, bytes: u64) -> Result<(), CuError> {
        let mut s = self.lock();
        match s.used.checked_add(bytes) {
            Some(n) if n <= s.limit => {
                s.used = n;
                s.note_use();
                Ok(())
            }
            _ => Err(CuError::out_of_memory(format!(
                "allocation of {} does not fit the memory slice: {} of {} in use",
                Human(bytes),
                Human(s.used),
                Human(s.limit)
            ))),
        }
    }

    /// Returns `bytes` of [`MemorySlice::charge_unplaced`] to the slice.
    pub fn refund_unplaced(&self, bytes: u64) {
        let mut s = self.lock();
        s.used = s.used.saturating_sub(bytes);
    }

    /// Changes the limit; refuses to go below what is in use.
    pub fn resize(&self, limit: u64) -> Result<(), CuError> {
        let mut s = self.lock();
        if limit < s.used {
            return Err(CuError::invalid_value(format!(
                "cannot shrink the slice to {}: {} is in use; free memory in the VM first",
                Human(limit),
                Human(s.used)
            )));
        }
        s.limit = limit;
        Ok(())
    }

    /// Bytes charged.
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// The limit.
    pub fn limit(&self) -> u64 {
        self.lock().limit
    }

    /// Most bytes ever charged at once.
    pub fn peak(&self) -> u64 {
        self.lock().peak
    }

    /// Most bytes charged at once over the last 24 hours (hour granularity).
    pub fn high_water_24h(&self) -> u64 {
        let s = self.lock();
        let h = unix_hour();
        s.hourly
            .iter()
            .filter(|b| b.0 + 24 > h)
            .map(|b| b.1)
            .max()
            .unwrap_or(0)
            .max(s.used)
    }

    /// (free, total) as `cuMemGetInfo` reports them.
    pub fn info(&self) -> (u64, u64) {
        let s = self.lock();
        (s.limit.saturating_sub(s.used), s.limit)
    }
}

/// What an allocation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocKind {
    /// `cuMemAlloc*`: freed by `cuMemFree`.
    Device,
    /// A module global: lives and dies with its module (handle).
    ModuleGlobal(u64),
    /// `cuMemAllocManaged`: freed by `cuMemFree`; the guest mirrors it at the same address.
    Managed,
    /// Mapped host memory (`cuMemHostAlloc`/`cuMemHostRegister` with `DEVICEMAP`).
    MappedHost,
    /// A block handed out by memory pool (handle) `cuMemAllocAsync`; the pool holds the charge.
    PoolBlock(u64),
    /// A `cuMemMap` mapping the device may access; its physical memory holds the charge.
    VmmMapping,
    /// Another process's `cuMemAlloc` memory opened by `cuIpcOpenMemHandle`: closed by
    /// `cuIpcCloseMemHandle`; the exporter's allocation holds the charge.
    IpcImport,
    /// A block of another process's pool opened by `cuMemPoolImportPointer`: closed by
    /// `cuMemFree`/`cuMemFreeAsync`; the exporter's pool (or the orphaned block) holds the charge.
    PoolImport,
}

impl AllocKind {
    /// The usage counter the allocation's charge goes to (`None`: plain memory).
    pub fn usage(self) -> Option<crate::usage::UsageKind> {
        use crate::usage::UsageKind;
        match self {
            AllocKind::Device
            | AllocKind::ModuleGlobal(_)
            | AllocKind::PoolBlock(_)
            | AllocKind::VmmMapping
            | AllocKind::IpcImport
            | AllocKind::PoolImport => None,
            AllocKind::Managed => Some(UsageKind::Managed),
            AllocKind::MappedHost => Some(UsageKind::MappedHost),
        }
    }
}

/// One live allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// Size the guest asked for (the valid range).
    pub size: u64,
    /// Bytes charged to the slice.
    pub charged: u64,
    /// Context handle it was made in.
    pub ctx: u64,
    /// Kind.
    pub kind: AllocKind,
}

/// A session's live allocations, by base address.
#[derive(Debug, Default)]
pub struct Allocations {
    map: BTreeMap<u64, Allocation>,
    charged: u64,
    held: u64,
}

impl Allocations {
    /// Records an allocation.
    pub fn insert(&mut self, base: u64, a: Allocation) {
        self.charged += a.charged;
        self.map.insert(base, a);
    }

    /// Removes the allocation starting exactly at `base`.
    pub fn remove(&mut self, base: u64) -> Option<Allocation> {
        let a = self.map.remove(&base)?;
        self.charged -= a.charged;
        Some(a)
    }

    /// The allocation containing `ptr`, as (base, allocation).
    pub fn find(&self, ptr: u64) -> Option<(u64, &Allocation)> {
        let (&base, a) = self.map.range(..=ptr).next_back()?;
        (ptr - base < a.size).then_some((base, a))
    }

    /// Validates that `[ptr, ptr+len)` lies inside one live allocation, or inside adjacent
    /// `cuMemMap` mappings (virtual memory management makes one range of several physical
    /// allocations, and CUDA copies and launches across them).
    pub fn check(&self, ptr: u64, len: u64, what: &str) -> Result<(), CuError> {
        let inside = ptr
            .checked_add(len)
            .is_some_and(|end| self.covered(ptr, end));
        if inside {
            Ok(())
        } else {
            Err(CuError::invalid_value(format!(
                "{what} range {ptr:#x}+{len} is not inside one of this process's live allocations"
            )))
        }
    }

    /// Whether `[ptr, end)` lies in one allocation or in a chain of mappings without gaps.
    fn covered(&self, ptr: u64, end: u64) -> bool {
        let Some((base, a)) = self.find(ptr) else {
            return false;
        };
        let mut reach = base + a.size;
        if end <= reach {
            return true;
        }
        if a.kind != AllocKind::VmmMapping {
            return false;
        }
        // Each step moves to the mapping that starts where the last one ended.
        for (&next, b) in self.map.range(reach..) {
            if next != reach || b.kind != AllocKind::VmmMapping {
                return false;
            }
            reach = next + b.size;
            if end <= reach {
                return true;
            }
        }
        false
    }

    /// Bytes charged for these allocations, and for memory held without a live allocation
    /// (see [`Allocations::hold`]).
    pub fn charged(&self) -> u64 {
        self.charged + self.held
    }

    /// Counts `bytes` the session holds outside any live allocation (a pool's free blocks).
    pub fn hold(&mut self, bytes: u64) {
        self.held += bytes;
    }

    /// Stops counting `bytes` of [`Allocations::hold`].
    pub fn unhold(&mut self, bytes: u64) {
        self.held = self.held.saturating_sub(bytes);
    }

    /// Number of live allocations.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Gives the allocations of context `from` to context `to` (a green context's memory to
    /// the primary context when the green context is destroyed).
    pub fn move_context(&mut self, from: u64, to: u64) {
        for a in self.map.values_mut().filter(|a| a.ctx == from) {
            a.ctx = to;
        }
    }

    /// Base addresses of allocations for which `f` holds.
    pub fn bases_where(&self, mut f: impl FnMut(&Allocation) -> bool) -> Vec<u64> {
        self.map
            .iter()
            .filter(|(_, a)| f(a))
            .map(|(b, _)| *b)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(size: u64) -> Allocation {
        Allocation {
            size,
            charged: size,
            ctx: 1,
            kind: AllocKind::Device,
        }
    }

    #[test]
    fn slice_refuses_past_the_limit_and_changes_nothing() {
        let s = MemorySlice::new(1000);
        s.charge(600).unwrap();
        let e = s.charge(401).unwrap_err();
        assert_eq!(e.code, 2);
        assert_eq!(s.used(), 600);
        s.charge(400).unwrap();
        assert_eq!(s.info(), (0, 1000));
        s.refund(1000);
        assert_eq!(s.info(), (1000, 1000));
        assert!(s.charge(u64::MAX).is_err());
    }

    #[test]
    fn slice_keeps_its_peak_and_24_hour_high_water_mark() {
        let s = MemorySlice::new(1000);
        s.charge(700).unwrap();
        s.refund(500);
        s.charge(100).unwrap();
        assert_eq!((s.used(), s.peak(), s.high_water_24h()), (300, 700, 700));
    }

    #[test]
    fn slice_shrinks_only_above_use() {
        let s = MemorySlice::new(1000);
        s.charge(500).unwrap();
        let e = s.resize(499).unwrap_err();
        assert!(e.message.contains("in use"), "{e}");
        assert_eq!(s.limit(), 1000);
        s.resize(500).unwrap();
        assert_eq!(s.info(), (0, 500));
        s.resize(4000).unwrap();
        assert_eq!(s.info(), (3500, 4000));
    }

    #[test]
    fn ranges_must_lie_inside_one_allocation() {
        let mut t = Allocations::default();
        t.insert(0x1000, dev(0x100));
        t.insert(0x1100, dev(0x100));
        assert!(t.check(0x1000, 0x100, "x").is_ok());
        assert!(t.check(0x10ff, 1, "x").is_ok());
        assert!(t.check(0x1100, 0x100, "x").is_ok());
        // Spanning two adjacent allocations is refused.
        assert!(t.check(0x10ff, 2, "x").is_err());
        // Before, after, overflowing.
        assert!(t.check(0xfff, 1, "x").is_err());
        assert!(t.check(0x1200, 1, "x").is_err());
        assert!(t.check(0x1000, u64::MAX, "x").is_err());
        let e = t.check(0x5000, 4, "copy destination").unwrap_err();
        assert_eq!(e.code, 1);
        assert!(e.message.contains("copy destination range 0x5000+4"));
    }

    #[test]
    fn ranges_may_span_adjacent_mappings_only() {
        let mapping = |size| Allocation {
            kind: AllocKind::VmmMapping,
            ..dev(size)
        };
        let mut t = Allocations::default();
        t.insert(0x10000, mapping(0x1000));
        t.insert(0x11000, mapping(0x1000));
        t.insert(0x12000, mapping(0x1000));
        t.insert(0x14000, mapping(0x1000)); // after a gap
        t.insert(0x15000, dev(0x1000)); // adjacent, but not a mapping
        assert!(t.check(0x10ff0, 0x20, "x").is_ok(), "two mappings");
        assert!(t.check(0x10000, 0x3000, "x").is_ok(), "three, whole");
        assert!(t.check(0x12ff0, 0x20, "x").is_err(), "into the gap");
        assert!(t.check(0x14ff0, 0x20, "x").is_err(), "into plain memory");
        assert!(t.check(0x10000, u64::MAX, "x").is_err());
    }

    #[test]
    fn find_and_remove_track_charges() {
        let mut t = Allocations::default();
        t.insert(0x1000, dev(10));
        t.insert(0x2000, dev(20));
        assert_eq!(t.charged(), 30);
        assert_eq!(t.find(0x1009).map(|(b, _)| b), Some(0x1000));
        assert_eq!(t.find(0x100a), None);
        assert!(t.remove(0x1001).is_none());
        assert_eq!(t.remove(0x1000).unwrap().size, 10);
        assert_eq!(t.charged(), 20);
        assert_eq!(t.len(), 1);
    }
}
