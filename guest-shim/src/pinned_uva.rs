//! Page-locked host memory that kernels reach at its host address, as on a unified-addressing
//! device: CUDA lets a kernel use any `cuMemHostAlloc`/`cuMemAllocHost` buffer through the
//! pointer the host uses, `CU_MEMHOSTALLOC_DEVICEMAP` or not (cuda.core's
//! `LegacyPinnedMemoryResource`, programs that hand `cudaMallocHost` buffers to kernels).
//!
//! vgpud's GPU cannot read guest memory, so such a buffer needs device memory behind its
//! address, and an address vgpud's device address space has free (it is shared by all VMs): at
//! allocation the shim reserves a device address range ([`reserve`], `cuMemAddressReserve`'s
//! path, charged to nothing but the VM's address-space budget) and places the host buffer at
//! that address. Device memory comes only when a launch's parameters point into the buffer
//! ([`back_args`]): `cuMemCreate` and `cuMemMap` at the reserved address, charged to the slice
//! like any device memory, and from then on the buffer is a mirrored region
//! ([`crate::alloc_api`]): copied to the device before launches and back at synchronization,
//! page by changed page. Buffers kernels never see cost no device memory.
//!
//! When the reservation or the placement fails (the address-space budget, a taken address), the
//! buffer is an ordinary one: copies work, kernels cannot use it, as before this existed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use vgpu_proto::msg;

use crate::alloc_api::{self, VMM_GRANULARITY};
use crate::driver::{self as drv, CuRes};

/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const ACCESS_READWRITE: u32 = 3;
/// Bytes of a kernel parameter that can hold a pointer.
const POINTER: usize = 8;

/// A page-locked buffer placed at a reserved device address.
#[derive(Debug)]
struct Buffer {
    /// Bytes the program asked for.
    len: usize,
    /// Device address space reserved for it (whole granules).
    reserved: u64,
    /// The physical memory behind it once a kernel used it.
    backing: Option<u64>,
}

static BUFFERS: Mutex<BTreeMap<u64, Buffer>> = Mutex::new(BTreeMap::new());
/// Whether any buffer exists: launches skip the parameter scan otherwise.
static ANY: AtomicBool = AtomicBool::new(false);

fn buffers() -> MutexGuard<'static, BTreeMap<u64, Buffer>> {
    BUFFERS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn granules(len: usize) -> Option<u64> {
    u64::try_from(len.max(1))
        .ok()?
        .checked_next_multiple_of(VMM_GRANULARITY)
}

/// Reserves a device address range for a `len`-byte buffer; `None` when vgpud refuses (the
/// buffer is then an ordinary one).
pub fn reserve(ctx: u64, len: usize) -> Option<u64> {
    let size = granules(len)?;
    let d = drv::driver().ok()?;
    let r = d.call(
        &msg::MemAddressReserve {
            ctx,
            size,
            align: VMM_GRANULARITY,
        },
        &[],
    );
    match r {
        Ok(p) => Some(p.ptr),
        Err(code) => {
            crate::debug!("page-locked buffer of {len} bytes: no device address ({code})");
            None
        }
    }
}

/// Gives back a reservation whose buffer could not be placed.
pub fn unreserve(va: u64, len: usize) {
    if let (Ok(d), Some(size)) = (drv::driver(), granules(len)) {
        let _ = d.call(&msg::MemAddressFree { ptr: va, size }, &[]);
    }
}

/// Records a buffer placed at its reserved address `va`.
pub fn placed(va: u64, len: usize) {
    let Some(reserved) = granules(len) else {
        return;
    };
    buffers().insert(
        va,
        Buffer {
            len,
            reserved,
            backing: None,
        },
    );
    ANY.store(true, Ordering::Relaxed);
}

/// Before a launch with these packed parameters: every placed buffer a parameter points into
/// gets device memory (once) and becomes a mirrored region, so that the launch's copy-in
/// includes it. `CUDA_ERROR_OUT_OF_MEMORY` when the slice has no room for it.
pub fn back_args(ctx: u64, params: &[u8]) -> CuRes<()> {
    if !ANY.load(Ordering::Relaxed) {
        return Ok(());
    }
    let mut bufs = buffers();
    for chunk in params.chunks_exact(POINTER) {
        let mut word = [0u8; POINTER];
        word.copy_from_slice(chunk);
        let v = u64::from_le_bytes(word);
        let Some((&va, b)) = bufs.range_mut(..=v).next_back() else {
            continue;
        };
        if v - va >= b.len as u64 {
            continue;
        }
        if b.backing.is_none() {
            b.backing = Some(back(ctx, va, b.reserved)?);
        }
        if !alloc_api::has_region(va) {
            alloc_api::add_pinned_region(va, b.len, ctx);
        }
    }
    Ok(())
}

/// Device memory behind `[va, va + size)`: its handle.
fn back(ctx: u64, va: u64, size: u64) -> CuRes<u64> {
    let d = drv::driver()?;
    let h = d.call(&msg::MemCreate { ctx, size }, &[])?.handle;
    let mapped = d
        .call(
            &msg::MemMap {
                ptr: va,
                size,
                offset: 0,
                handle: h,
            },
            &[],
        )
        .and_then(|_| {
            d.call(
                &msg::MemSetAccess {
                    ptr: va,
                    size,
                    flags: ACCESS_READWRITE,
                },
                &[],
            )
        });
    if let Err(code) = mapped {
        let _ = d.call(&msg::MemUnmap { ptr: va, size }, &[]);
        let _ = d.call(&msg::MemRelease { handle: h }, &[]);
        return Err(code);
    }
    crate::debug!("page-locked buffer at {va:#x}: device memory for a kernel ({size} bytes)");
    Ok(h)
}

/// `cuMemFreeHost` of `va`: its device memory and address range go back (the caller unmaps the
/// host memory). False when `va` is not such a buffer.
pub fn free(va: u64) -> bool {
    let b = {
        let mut bufs = buffers();
        let Some(b) = bufs.remove(&va) else {
            return false;
        };
        if bufs.is_empty() {
            // Launches skip the parameter scan again.
            ANY.store(false, Ordering::Relaxed);
        }
        b
    };
    alloc_api::remove_pinned_region(va);
    if let Ok(d) = drv::driver() {
        if let Some(h) = b.backing {
            let _ = d.call(
                &msg::MemUnmap {
                    ptr: va,
                    size: b.reserved,
                },
                &[],
            );
            let _ = d.call(&msg::MemRelease { handle: h }, &[]);
        }
        let _ = d.call(
            &msg::MemAddressFree {
                ptr: va,
                size: b.reserved,
            },
            &[],
        );
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_whole_granules() {
        assert_eq!(granules(1), Some(VMM_GRANULARITY));
        assert_eq!(granules(0), Some(VMM_GRANULARITY));
        assert_eq!(granules(2 << 20), Some(2 << 20));
        assert_eq!(granules((2 << 20) + 1), Some(4 << 20));
        assert_eq!(granules(usize::MAX), None);
    }
}
