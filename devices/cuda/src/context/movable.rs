//! Movable allocations on a real GPU (docs/memory.md, "Address stability"): a VM's plain
//! allocation of at least [`MovableConfig::granularity`] bytes gets its own reserved virtual
//! range (`cuMemAddressReserve`) mapped (`cuMemMap`, `cuMemSetAccess`) to physical memory from
//! `cuMemCreate`, on the device or, for overflow, in host memory. A move creates the new
//! physical memory, maps it at a scratch range, copies the bytes on the VM's stream, then maps
//! the new memory at the allocation's own range in place of the old: the address the guest
//! holds never changes. Smaller allocations stay `cuMemAlloc` memory and cannot move (a whole
//! granule each would cost up to the granularity per byte charged).
//!
//! None of this has run on a GPU yet: it is written against cuda.h and the driver API
//! reference, and checked by the conformance suite when a GPU is present.

use std::sync::atomic::Ordering;

use tracing::{debug, warn};
use vgpu_broker::device::{DeviceError, Residence};
use vgpu_proto::cuda;

use super::{Generation, Range, RangeKind, lock, round_up};
use crate::driver::{Driver, Failed, MemPlace};
use crate::error::Op;

/// Largest granularity accepted: a driver answering more would make every movable allocation
/// absurdly large, so allocations then stay `cuMemAlloc` memory.
const MAX_GRANULARITY: u64 = 1 << 30;

/// How movable allocations are made on one GPU, found when the device is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MovableConfig {
    /// Unit of every movable allocation's range and physical memory: a multiple of the
    /// minimum granularity of device memory and of host memory, so that either can back it.
    /// Allocations of at least this many bytes are movable.
    pub(crate) granularity: u64,
    /// Where host-resident physical memory is created; `None` when this driver cannot create
    /// host memory with `cuMemCreate` (before CUDA 12.2): allocations then never leave the
    /// device.
    pub(crate) host: Option<MemPlace>,
}

/// Asks the driver whether and how device `dev` can make movable allocations.
/// `vmm_supported` is `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`, `host_numa`
/// `CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID` (-1 or 0 when unknown).
pub(crate) fn probe(
    d: &Driver,
    dev: i32,
    vmm_supported: i32,
    host_numa: i32,
) -> Option<MovableConfig> {
    if !d.has_vmm() || vmm_supported == 0 {
        return None;
    }
    let device = d.vmm_granularity(MemPlace::Device(dev)).ok()?;
    // `CU_MEM_LOCATION_TYPE_HOST` first (no NUMA node needed), then the device's closest host
    // NUMA node (0 on a machine without NUMA, as `cuMemCreate` asks).
    let host = [MemPlace::Host, MemPlace::HostNuma(host_numa.max(0))]
        .into_iter()
        .find_map(|p| d.vmm_granularity(p).ok().map(|g| (p, g)));
    let granularity = match host {
        Some((_, g)) => lcm(device, g)?,
        None => device,
    };
    (granularity <= MAX_GRANULARITY).then_some(MovableConfig {
        granularity,
        host: host.map(|(p, _)| p),
    })
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn lcm(a: u64, b: u64) -> Option<u64> {
    if a == 0 || b == 0 {
        return None;
    }
    (a / gcd(a, b)).checked_mul(b)
}

/// One movable allocation: its range `[va, va + span)` is mapped to `handle`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Movable {
    /// Bytes of the reserved range and of its physical memory (the size rounded up to the
    /// granularity).
    pub(crate) span: u64,
    /// The `cuMemCreate` handle mapped at the range.
    pub(crate) handle: u64,
    /// Where the physical memory is.
    pub(crate) residence: Residence,
}

/// Unmaps, releases and unreserves a movable allocation (VMM calls need no current context).
pub(super) fn release(d: &Driver, va: u64, m: &Movable) {
    if let Err(f) = d.vmm_unmap(va, m.span) {
        warn!(
            call = f.call,
            code = f.code,
            "unmapping a movable allocation failed"
        );
    }
    let _ = d.vmm_release(m.handle);
    let _ = d.vmm_free(va, m.span);
}

/// Physical memory created at `place` and mapped, with this GPU's access, in a range of its
/// own; undone (in reverse) when dropped unless kept.
struct Mapping<'a> {
    d: &'a Driver,
    va: u64,
    span: u64,
    handle: u64,
    mapped: bool,
    reserved: bool,
    keep_handle: bool,
}

impl Drop for Mapping<'_> {
    fn drop(&mut self) {
        if self.mapped {
            let _ = self.d.vmm_unmap(self.va, self.span);
        }
        if self.reserved {
            let _ = self.d.vmm_free(self.va, self.span);
        }
        if !self.keep_handle {
            let _ = self.d.vmm_release(self.handle);
        }
    }
}

impl Generation {
    fn config(&self) -> Option<MovableConfig> {
        self.shared.movable
    }

    /// Where physical memory for `to` is created.
    fn place(&self, to: Residence) -> Result<MemPlace, DeviceError> {
        let cfg = self.config().ok_or_else(no_vmm)?;
        match to {
            Residence::Device => Ok(MemPlace::Device(self.shared.dev)),
            Residence::Host => cfg.host.ok_or_else(|| {
                DeviceError::NotSupported(format!(
                    "this driver (version {}) does not take a host location for cuMemCreate \
                     (CU_MEM_LOCATION_TYPE_HOST or _HOST_NUMA, which NVIDIA drivers take from \
                     CUDA 12.2), so allocations cannot overflow to host memory",
                    self.driver().version()
                ))
            }),
        }
    }

    /// Whether an allocation of `size` bytes is made movable.
    pub(crate) fn movable_size(&self, size: u64) -> bool {
        self.config().is_some_and(|c| size >= c.granularity)
    }

    /// `cuMemCreate` at `place`, with the driver's refusal of a host location (an older driver)
    /// turned into a clear error.
    fn create(&self, span: u64, place: MemPlace) -> Result<u64, DeviceError> {
        self.driver().vmm_create_at(span, place).map_err(|f| {
            let host = !matches!(place, MemPlace::Device(_));
            if host
                && matches!(
                    f.code,
                    cuda::CUDA_ERROR_INVALID_VALUE | cuda::CUDA_ERROR_NOT_SUPPORTED
                )
            {
                DeviceError::NotSupported(format!(
                    "cuMemCreate refused host memory ({place:?}) with CUresult {}: this driver \
                     cannot back GPU addresses with host memory, so allocations cannot \
                     overflow to it",
                    f.code
                ))
            } else {
                self.fail(f, Op::Other)
            }
        })
    }

    /// Creates `span` bytes of physical memory at `place` and maps it read-write for this GPU
    /// in a fresh range. The current context must be this generation's.
    fn map_new(&self, span: u64, place: MemPlace) -> Result<Mapping<'_>, DeviceError> {
        let cfg = self.config().ok_or_else(no_vmm)?;
        let d = self.driver();
        let handle = self.create(span, place)?;
        let mut m = Mapping {
            d,
            va: 0,
            span,
            handle,
            mapped: false,
            reserved: false,
            keep_handle: false,
        };
        m.va = d
            .vmm_reserve(span, cfg.granularity)
            .map_err(|f| self.fail(f, Op::Other))?;
        m.reserved = true;
        d.vmm_map(m.va, span, handle, self.shared.dev)
            .map_err(|f| self.fail(f, Op::Other))?;
        m.mapped = true;
        Ok(m)
    }

    /// A movable allocation of `size` bytes at `to`, zeroed (physical memory may hold what
    /// another VM freed).
    pub(crate) fn alloc_movable(&self, size: u64, to: Residence) -> Result<u64, DeviceError> {
        let cfg = self.config().ok_or_else(no_vmm)?;
        let place = self.place(to)?;
        let span = round_up(size.max(1), cfg.granularity);
        let mut m = {
            let _c = self.enter()?;
            let m = self.map_new(span, place)?;
            let len = usize::try_from(span).unwrap_or(usize::MAX);
            self.driver()
                .memset_async(m.va, 0, 1, len, self.stream)
                .map_err(|f| self.fail(f, Op::Other))?;
            m
        };
        // The VM's work runs on several streams: the fill completes first.
        self.finish_on(self.stream)?;
        m.mapped = false;
        m.reserved = false;
        m.keep_handle = true;
        let va = m.va;
        let charged = if to == Residence::Device { span } else { 0 };
        lock(&self.vmm).movable.insert(
            va,
            Movable {
                span,
                handle: m.handle,
                residence: to,
            },
        );
        lock(&self.ranges).insert(
            va,
            Range {
                size,
                charged,
                kind: RangeKind::Movable,
            },
        );
        match to {
            Residence::Device => self.shared.used.fetch_add(span, Ordering::Relaxed),
            Residence::Host => self.shared.host_used.fetch_add(span, Ordering::Relaxed),
        };
        debug!(
            ptr = format_args!("{va:#x}"),
            size,
            span,
            ?to,
            "movable allocation (cuMemCreate + cuMemMap)"
        );
        Ok(va)
    }

    /// Forgets the movable allocation at `va` (its range already removed from `ranges`) and
    /// gives its memory back to the driver.
    pub(crate) fn free_movable(&self, va: u64) {
        let m = {
            let mut v = lock(&self.vmm);
            // A broken context keeps it: the generation's drop releases (and uncounts) it
            // after destroying the context.
            if self.broken().is_some() {
                return;
            }
            match v.movable.remove(&va) {
                Some(m) => m,
                None => return,
            }
        };
        if m.residence == Residence::Host {
            self.shared.host_used.fetch_sub(m.span, Ordering::Relaxed);
        }
        release(self.driver(), va, &m);
    }

    /// Where the movable allocation at `va` is; `None` for any other address.
    pub(crate) fn movable_residence(&self, va: u64) -> Option<Residence> {
        lock(&self.vmm).movable.get(&va).map(|m| m.residence)
    }

    /// Moves the physical memory of the movable allocation at `va` to `to`, keeping its address
    /// and bytes. Waits for the VM's running copies and kernels (the gate), and runs no other
    /// work of the VM meanwhile.
    pub(crate) fn move_movable(&self, va: u64, to: Residence) -> Result<(), DeviceError> {
        let Some(_excl) = self.move_gate() else {
            return Err(DeviceError::NotSupported(format!(
                "the VM's kernels and copies did not pause within {:?} (a real GPU cannot stop \
                 a running kernel): the allocation was not moved",
                super::MOVE_GATE_WAIT
            )));
        };
        let m = *lock(&self.vmm)
            .movable
            .get(&va)
            .ok_or(DeviceError::InvalidAddress { addr: va, len: 0 })?;
        if m.residence == to {
            return Ok(());
        }
        let place = self.place(to)?;
        let d = self.driver();
        {
            let _c = self.enter()?;
            // New memory at a scratch range, filled from the allocation on the VM's stream.
            let mut new = self.map_new(m.span, place)?;
            let len = usize::try_from(m.span).unwrap_or(usize::MAX);
            d.memcpy_dtod_async(new.va, va, len, self.stream)
                .map_err(|f| self.fail(f, Op::Other))?;
            self.finish_on(self.stream)?;
            // Swap the backing under the allocation's own range: nothing of the VM runs (the
            // gate), so nothing sees the range unmapped.
            d.vmm_unmap(va, m.span)
                .map_err(|f| self.fail(f, Op::Other))?;
            if let Err(f) = d.vmm_map(va, m.span, new.handle, self.shared.dev) {
                let e = self.fail(f, Op::Other);
                // Put the old memory back; the new one goes with `new`.
                if let Err(f2) = d.vmm_map(va, m.span, m.handle, self.shared.dev) {
                    return Err(self.break_with(remap_lost(va, f2)));
                }
                return Err(e);
            }
            // The scratch range goes; the new memory stays, mapped at `va`.
            new.keep_handle = true;
            let new_handle = new.handle;
            drop(new);
            if let Err(f) = d.vmm_release(m.handle) {
                warn!(
                    call = f.call,
                    code = f.code,
                    "releasing moved-out memory failed"
                );
            }
            lock(&self.vmm).movable.insert(
                va,
                Movable {
                    span: m.span,
                    handle: new_handle,
                    residence: to,
                },
            );
        }
        let charged = if to == Residence::Device { m.span } else { 0 };
        if let Some(r) = lock(&self.ranges).get_mut(&va) {
            r.charged = charged;
        }
        match to {
            Residence::Device => {
                self.shared.used.fetch_add(m.span, Ordering::Relaxed);
                self.shared.host_used.fetch_sub(m.span, Ordering::Relaxed);
            }
            Residence::Host => {
                self.shared.used.fetch_sub(m.span, Ordering::Relaxed);
                self.shared.host_used.fetch_add(m.span, Ordering::Relaxed);
            }
        }
        debug!(
            ptr = format_args!("{va:#x}"),
            bytes = m.span,
            ?to,
            "movable allocation moved"
        );
        Ok(())
    }
}

fn no_vmm() -> DeviceError {
    DeviceError::NotSupported(
        "this GPU or driver has no virtual memory management (cuMemCreate, cuMemMap): \
         allocations are cuMemAlloc memory and cannot move"
            .into(),
    )
}

fn remap_lost(va: u64, f: Failed) -> DeviceError {
    DeviceError::Fault {
        code: cuda::CUDA_ERROR_ILLEGAL_ADDRESS,
        message: format!(
            "moving the allocation at {va:#x} failed and its memory could not be mapped back \
             ({} failed with CUresult {}): the VM's GPU context is abandoned",
            f.call, f.code
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_span_unit_fits_both_granularities() {
        assert_eq!(lcm(2 << 20, 2 << 20), Some(2 << 20));
        assert_eq!(lcm(2 << 20, 4 << 10), Some(2 << 20));
        assert_eq!(lcm(6, 4), Some(12));
        assert_eq!(lcm(0, 4), None);
        assert_eq!(lcm(u64::MAX, u64::MAX - 1), None);
    }
}
