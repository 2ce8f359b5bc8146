//! Virtual memory management requests of a VM ([`CudaContext`]): `cuMemCreate` physical memory,
//! address reservations and mappings, made in the VM's live context generation.

use std::sync::atomic::Ordering;

use vgpu_broker::device::DeviceError;

use super::CudaContext;
use crate::context::vmm::{Phys, unknown};
use crate::context::{Range, RangeKind, lock};
use crate::error::Op;

impl CudaContext {
    pub(super) fn vmm_phys_create(&self, size: u64) -> Result<u64, DeviceError> {
        let g = self.inner.generation()?;
        // Physical memory is useless unmapped: refusing it keeps every guest mapping away from
        // a device where other VMs' kernels might reach it.
        if let Some(why) = g.shared.vmm_isolation.refusal() {
            return Err(DeviceError::NotSupported(why));
        }
        let _c = g.enter()?;
        let handle = g
            .driver()
            .vmm_create(size, g.shared.dev)
            .map_err(|f| g.fail(f, Op::Other))?;
        g.shared.used.fetch_add(size, Ordering::Relaxed);
        let mut v = lock(&g.vmm);
        v.next_id += 1;
        let id = v.next_id;
        v.phys.insert(
            id,
            Phys {
                handle,
                size,
                zeroed: false,
            },
        );
        Ok(id)
    }

    pub(super) fn vmm_phys_release(&self, id: u64) -> Result<(), DeviceError> {
        let g = self.inner.existing().ok_or(unknown(id, 0))?;
        let p = lock(&g.vmm).phys.remove(&id).ok_or(unknown(id, 0))?;
        g.shared.used.fetch_sub(p.size, Ordering::Relaxed);
        let _c = g.enter()?;
        g.driver()
            .vmm_release(p.handle)
            .map_err(|f| g.fail(f, Op::Other))
    }

    pub(super) fn vmm_reserve(&self, size: u64, align: u64) -> Result<u64, DeviceError> {
        let g = self.inner.generation()?;
        let _c = g.enter()?;
        let va = g
            .driver()
            .vmm_reserve(size, align)
            .map_err(|f| g.fail(f, Op::Other))?;
        lock(&g.vmm).reserved.insert(va, size);
        Ok(va)
    }

    pub(super) fn vmm_free(&self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let g = self.inner.existing().ok_or(unknown(addr, size))?;
        if lock(&g.vmm).reserved.remove(&addr).is_none() {
            return Err(unknown(addr, size));
        }
        let _c = g.enter()?;
        g.driver()
            .vmm_free(addr, size)
            .map_err(|f| g.fail(f, Op::Other))
    }

    pub(super) fn vmm_map(&self, va: u64, size: u64, id: u64) -> Result<(), DeviceError> {
        let g = self.inner.generation()?;
        let p = *lock(&g.vmm).phys.get(&id).ok_or(unknown(id, 0))?;
        if p.size != size {
            return Err(DeviceError::NotSupported(
                "a mapping covers one whole physical allocation".into(),
            ));
        }
        let _c = g.enter()?;
        let d = g.driver();
        d.vmm_map(va, size, p.handle, g.shared.dev)
            .map_err(|f| g.fail(f, Op::Other))?;
        if !p.zeroed {
            let len = usize::try_from(size).unwrap_or(usize::MAX);
            if let Err(f) = d.memset_async(va, 0, 1, len, g.stream) {
                let _ = d.vmm_unmap(va, size);
                return Err(g.fail(f, Op::Other));
            }
            // The VM's work runs on several streams: the fill completes first.
            if let Err(e) = g.finish_on(g.stream) {
                let _ = d.vmm_unmap(va, size);
                return Err(e);
            }
            if let Some(p) = lock(&g.vmm).phys.get_mut(&id) {
                p.zeroed = true;
            }
        }
        lock(&g.vmm).mapped.insert(va, size);
        lock(&g.ranges).insert(
            va,
            Range {
                size,
                charged: 0,
                kind: RangeKind::Mapped,
            },
        );
        Ok(())
    }

    pub(super) fn vmm_unmap(&self, va: u64, size: u64) -> Result<(), DeviceError> {
        let g = self.inner.existing().ok_or(unknown(va, size))?;
        if lock(&g.vmm).mapped.remove(&va).is_none() {
            return Err(unknown(va, size));
        }
        lock(&g.ranges).remove(&va);
        // The broker waited for the VM's work that may use the memory.
        let _c = g.enter()?;
        g.driver()
            .vmm_unmap(va, size)
            .map_err(|f| g.fail(f, Op::Other))
    }
}
