//! A VM's memory use broken down by kind of allocation, for `cuMemGetInfo`'s
//! callers who want to know where the slice went: the admin API, `vgpuctl vm
//! show`, Prometheus and vgpu-smi.
//!
//! The slice ([`crate::memory::MemorySlice`]) is what limits a VM; these
//! counters only split what it charged. Plain device memory (`cuMemAlloc*`,
//! module globals) is what the slice charged minus every other kind.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// A kind of charged memory other than plain device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageKind {
    /// Blocks a stream-ordered memory pool holds (in use or free, not yet released).
    PoolReserved,
    /// Of those, blocks handed out by `cuMemAllocAsync` and not yet freed.
    PoolUsed,
    /// `cuMemAllocManaged`.
    Managed,
    /// `cuMemHostAlloc`/`cuMemHostRegister` with `DEVICEMAP`: host memory kernels reach.
    MappedHost,
    /// `cuMemCreate` physical memory, mapped or not.
    VmmPhysical,
}

/// Counters of one VM, in bytes charged.
#[derive(Debug, Default)]
pub struct MemUsage {
    pool_reserved: AtomicU64,
    pool_used: AtomicU64,
    managed: AtomicU64,
    mapped_host: AtomicU64,
    vmm_physical: AtomicU64,
    va_reserved: AtomicU64,
}

/// A snapshot of [`MemUsage`], with plain memory filled in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct UsageBreakdown {
    /// `cuMemAlloc*` and module globals.
    pub plain: u64,
    /// Reserved by memory pools (includes `pool_used`).
    pub pool_reserved: u64,
    /// In use out of pools.
    pub pool_used: u64,
    /// Managed memory.
    pub managed: u64,
    /// Mapped (zero-copy) host memory.
    pub mapped_host: u64,
    /// Virtual memory management physical allocations.
    pub vmm_physical: u64,
}

impl MemUsage {
    fn counter(&self, k: UsageKind) -> &AtomicU64 {
        match k {
            UsageKind::PoolReserved => &self.pool_reserved,
            UsageKind::PoolUsed => &self.pool_used,
            UsageKind::Managed => &self.managed,
            UsageKind::MappedHost => &self.mapped_host,
            UsageKind::VmmPhysical => &self.vmm_physical,
        }
    }

    /// Counts `bytes` more of kind `k`.
    pub fn add(&self, k: UsageKind, bytes: u64) {
        self.counter(k).fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts `bytes` less of kind `k` (never below zero).
    pub fn sub(&self, k: UsageKind, bytes: u64) {
        let c = self.counter(k);
        let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(bytes))
        });
    }

    /// Reserves `bytes` of device address space unless more than `limit` would be reserved.
    pub fn reserve_va(&self, bytes: u64, limit: u64) -> bool {
        self.va_reserved
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                v.checked_add(bytes).filter(|&n| n <= limit)
            })
            .is_ok()
    }

    /// Returns address space reserved by [`MemUsage::reserve_va`].
    pub fn release_va(&self, bytes: u64) {
        let _ = self
            .va_reserved
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(bytes))
            });
    }

    /// Device address space reserved (`cuMemAddressReserve`).
    pub fn va_reserved(&self) -> u64 {
        self.va_reserved.load(Ordering::Relaxed)
    }

    /// The breakdown, given the bytes the slice has charged in all.
    pub fn breakdown(&self, slice_used: u64) -> UsageBreakdown {
        let g = |k| self.counter(k).load(Ordering::Relaxed);
        let b = UsageBreakdown {
            plain: 0,
            pool_reserved: g(UsageKind::PoolReserved),
            pool_used: g(UsageKind::PoolUsed),
            managed: g(UsageKind::Managed),
            mapped_host: g(UsageKind::MappedHost),
            vmm_physical: g(UsageKind::VmmPhysical),
        };
        let others = b.pool_reserved + b.managed + b.mapped_host + b.vmm_physical;
        UsageBreakdown {
            plain: slice_used.saturating_sub(others),
            ..b
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_is_what_the_other_kinds_leave() {
        let u = MemUsage::default();
        u.add(UsageKind::Managed, 100);
        u.add(UsageKind::PoolReserved, 50);
        u.add(UsageKind::PoolUsed, 20);
        let b = u.breakdown(400);
        assert_eq!(b.plain, 250);
        assert_eq!(b.pool_used, 20);
        u.sub(UsageKind::Managed, 1000);
        assert_eq!(u.breakdown(50).managed, 0);
    }
}
