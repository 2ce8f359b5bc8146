//! The allocation APIs beyond `cuMemAlloc`: memory the guest mirrors at the same address
//! (managed and mapped host memory) and stream-ordered memory pools. Every byte is charged
//! to the VM's slice before it is allocated, and counted by kind in [`crate::usage`].
//!
//! Pools: a pool's reserved memory (blocks in use and free blocks it keeps) is what the
//! slice is charged, not only what is in use. A block freed by `cuMemFreeAsync` goes back
//! to its pool; the pool releases free blocks to the slice at synchronizing calls down to
//! its release threshold (0 by default, as in CUDA), at `cuMemPoolTrimTo`, and when an
//! allocation would not fit otherwise. The session runs all its work in submission order,
//! so a block reused by a later allocation on any stream is never still in use by earlier
//! work; a freed block goes back to the device only once the work before its free is done.

use std::collections::BTreeMap;
use std::sync::Arc;

use vgpu_proto::cuda::attr;
use vgpu_proto::msg::{self, Request};

use super::{Session, reply, round_up};
use crate::error::CuError;
use crate::handles::{HandleKind, HandleTable};
use crate::memory::{AllocKind, Allocation};
use crate::usage::UsageKind;

pub(super) mod ipc;
mod pool_ipc;
mod tokens;
mod vmm;
pub use vmm::{ACCESS_READ, ACCESS_READWRITE, va_limit};

/// Alignment and size granule of memory the guest mirrors (the guest's page size).
pub const MIRROR_PAGE: u64 = 4096;
/// `MemAllocMapped` kind: `cuMemAllocManaged`.
pub const MAPPED_KIND_MANAGED: u32 = 1;
/// `MemAllocMapped` kind: `cuMemHostAlloc` with `CU_MEMHOSTALLOC_DEVICEMAP`.
pub const MAPPED_KIND_HOST_ALLOC: u32 = 2;
/// `MemAllocMapped` kind: `cuMemHostRegister` with `CU_MEMHOSTREGISTER_DEVICEMAP`.
pub const MAPPED_KIND_HOST_REGISTER: u32 = 3;

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: the handle type pools are exported as.
pub const HANDLE_TYPE_POSIX_FD: u32 = 1;

/// `CUmemPool_attribute` numbers.
pub mod pool_attr {
    /// `CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES` (int).
    pub const REUSE_FOLLOW_EVENT_DEPENDENCIES: i32 = 1;
    /// `CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC` (int).
    pub const REUSE_ALLOW_OPPORTUNISTIC: i32 = 2;
    /// `CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES` (int).
    pub const REUSE_ALLOW_INTERNAL_DEPENDENCIES: i32 = 3;
    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` (cuuint64_t).
    pub const RELEASE_THRESHOLD: i32 = 4;
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` (cuuint64_t, read only).
    pub const RESERVED_MEM_CURRENT: i32 = 5;
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH` (cuuint64_t, reset by setting 0).
    pub const RESERVED_MEM_HIGH: i32 = 6;
    /// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` (cuuint64_t, read only).
    pub const USED_MEM_CURRENT: i32 = 7;
    /// `CU_MEMPOOL_ATTR_USED_MEM_HIGH` (cuuint64_t, reset by setting 0).
    pub const USED_MEM_HIGH: i32 = 8;
}

/// The PCI domain of a VM's GPU as the guest sees it (`cuDeviceGetPCIBusId` "FFFF:00:00.0"):
/// the GPU is no PCI function of the guest, so its location must not name one of the guest's
/// (before, 0000:00:00.0 named the guest's host bridge, and NCCL took the bridge's class for the
/// GPU's and failed), nor the host's GPU.
pub const GUEST_PCI_DOMAIN: i32 = 0xffff;

/// Device attributes as a guest of vgpu sees them: what the allocation APIs and stream memory
/// operations provide here,
/// whatever the device underneath does. Managed memory is mirrored by the guest library and
/// made coherent at launches and synchronizations, so concurrent managed access is 0.
pub fn guest_attributes(device: &[i32]) -> Vec<i32> {
    let mut a = device.to_vec();
    if a.len() < attr::COUNT {
        a.resize(attr::COUNT, 0);
    }
    for (k, v) in [
        (attr::CAN_MAP_HOST_MEMORY, 1),
        (attr::MANAGED_MEMORY, 1),
        (attr::CONCURRENT_MANAGED_ACCESS, 0),
        (attr::PAGEABLE_MEMORY_ACCESS, 0),
        // Mapped host memory is coherent at launches and synchronizations, not while a kernel
        // runs: no atomic operation reaches it natively.
        (attr::HOST_NATIVE_ATOMIC_SUPPORTED, 0),
        (100, 0), // PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES
        (101, 0), // DIRECT_MANAGED_MEM_ACCESS_FROM_HOST
        (91, 0),  // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: the device pointer differs
        (attr::HOST_REGISTER_SUPPORTED, 1),
        (attr::MEMORY_POOLS_SUPPORTED, 1),
        (119, HANDLE_TYPE_POSIX_FD as i32), // MEMPOOL_SUPPORTED_HANDLE_TYPES (within the VM)
        (attr::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1),
        (103, 1), // HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED (within the VM)
        (104, 0), // HANDLE_TYPE_WIN32_HANDLE_SUPPORTED
        (105, 0), // HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED
        // Stream memory operations run in vgpud (`mem_wait`) on any device; nothing writes
        // the VM's memory from outside, so there are no remote writes to flush.
        (attr::CAN_USE_STREAM_MEM_OPS_V1, 1),
        (attr::CAN_USE_64_BIT_STREAM_MEM_OPS_V1, 1),
        (attr::CAN_USE_STREAM_WAIT_VALUE_NOR_V1, 1),
        (attr::CAN_USE_64_BIT_STREAM_MEM_OPS, 1),
        (attr::CAN_USE_STREAM_WAIT_VALUE_NOR, 1),
        (attr::CAN_FLUSH_REMOTE_WRITES, 0),
        (attr::PCI_DOMAIN_ID, GUEST_PCI_DOMAIN),
        (attr::PCI_BUS_ID, 0),
        (attr::PCI_DEVICE_ID, 0),
    ] {
        a[k] = v;
    }
    for k in HOST_ONLY_FEATURES {
        a[k] = 0;
    }
    a
}

/// Features of the host's GPU a VM does not have, whatever the GPU reports: no third-party
/// device (a NIC's GPUDirect RDMA, a dma-buf importer, an NVLink fabric) reaches a VM's device
/// memory, multicast objects span devices and a VM has one, nothing in the guest exports memory,
/// semaphores or command lists to CUDA, and tensor maps, sparse arrays and the copy engines'
/// decompression are not offered (the shim refuses each, docs/compatibility.md).
pub const HOST_ONLY_FEATURES: [usize; 14] = [
    attr::MULTICAST_SUPPORTED,
    attr::GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
    attr::SPARSE_CUDA_ARRAY_SUPPORTED,
    attr::TIMELINE_SEMAPHORE_INTEROP_SUPPORTED,
    attr::GPU_DIRECT_RDMA_SUPPORTED,
    attr::GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS,
    attr::GPU_DIRECT_RDMA_WRITES_ORDERING,
    attr::DMA_BUF_SUPPORTED,
    attr::TENSOR_MAP_ACCESS_SUPPORTED,
    attr::HANDLE_TYPE_FABRIC_SUPPORTED,
    attr::D3D12_CIG_SUPPORTED,
    attr::MEM_DECOMPRESS_ALGORITHM_MASK,
    attr::MEM_DECOMPRESS_MAXIMUM_LENGTH,
    attr::VULKAN_CIG_SUPPORTED,
];

#[derive(Debug)]
struct Block {
    /// Bytes charged (the device allocation's size, rounded to the granularity).
    charged: u64,
    in_use: bool,
    /// The session's last submitted work when the block was freed: the block goes back to
    /// the device only once that work completed.
    freed_seq: u64,
    /// Exported with `cuMemPoolExportPointer` (until freed).
    shared: Option<pool_ipc::BlockShare>,
}

/// A stream-ordered memory pool.
#[derive(Debug)]
pub(super) struct PoolState {
    max_size: u64,
    blocks: BTreeMap<u64, Block>,
    reserved: u64,
    used: u64,
    reserved_high: u64,
    used_high: u64,
    release_threshold: u64,
    reuse: [u64; 3],
    /// `cuMemPoolDestroy` was called while blocks were in use: released when the last is freed.
    destroyed: bool,
    /// The `CUmemAllocationHandleType` bits the pool may be exported as (0: never).
    handle_types: u32,
    /// Exported with `cuMemPoolExportToShareableHandle`.
    share: Option<pool_ipc::PoolShare>,
    /// Imported from another process of the VM: allocates nothing, opens its blocks.
    imported: Option<Arc<pool_ipc::SharedPool>>,
}

impl PoolState {
    fn new(max_size: u64, handle_types: u32) -> Self {
        Self {
            handle_types,
            share: None,
            imported: None,
            max_size,
            blocks: BTreeMap::new(),
            reserved: 0,
            used: 0,
            reserved_high: 0,
            used_high: 0,
            release_threshold: 0,
            reuse: [1, 1, 1],
            destroyed: false,
        }
    }
}

/// The session's pools and virtual memory management state.
#[derive(Debug)]
pub(super) struct AllocExt {
    pools: HandleTable<PoolState>,
    default_pool: Option<u64>,
    current_pool: Option<u64>,
    vmm: vmm::VmmState,
    /// Bytes of physical memory the session holds (counted in its memory figure).
    vmm_held: u64,
    /// Memory shared with other processes of the VM (`cuIpc*MemHandle`).
    ipc: ipc::IpcState,
    /// Pools and pool blocks shared with other processes of the VM.
    pool_ipc: pool_ipc::PoolIpcState,
}

impl AllocExt {
    /// Counts the memory pools and allocation handles against `budget`.
    pub(super) fn set_budget(&mut self, budget: crate::limits::HandleBudget) {
        self.pools.set_budget(budget.clone());
        self.ipc.set_budget(budget.clone());
        self.pool_ipc.set_budget(budget.clone());
        self.vmm.set_budget(budget);
    }
}

impl Default for AllocExt {
    fn default() -> Self {
        Self {
            pools: HandleTable::new(HandleKind::MemPool),
            default_pool: None,
            current_pool: None,
            vmm: vmm::VmmState::default(),
            vmm_held: 0,
            ipc: ipc::IpcState::default(),
            pool_ipc: pool_ipc::PoolIpcState::default(),
        }
    }
}

impl Session {
    /// Requests of the allocation APIs beyond `cuMemAlloc`.
    pub(super) fn dispatch_alloc_ext(
        &mut self,
        req: &Request,
        out: &mut Vec<u8>,
    ) -> Result<(), CuError> {
        use Request as R;
        if let Some(r) = self.dispatch_vmm(req, out) {
            return r;
        }
        if let Some(r) = self.dispatch_ipc(req, out) {
            return r;
        }
        if let Some(r) = self.dispatch_pool_ipc(req, out) {
            return r;
        }
        match req {
            R::MemAllocMapped(m) => {
                let ptr = self.alloc_mapped(m)?;
                reply(out, msg::Ptr { ptr })
            }
            R::MemPoolCreate(m) => {
                self.ctx(m.ctx)?;
                let h = self
                    .ext
                    .pools
                    .insert(PoolState::new(m.max_size, m.handle_types))?;
                reply(out, msg::Handle { handle: h })
            }
            R::MemPoolDestroy(m) => {
                self.ctx(m.ctx)?;
                self.pool(m.pool)?;
                if Some(m.pool) == self.ext.default_pool {
                    return Err(CuError::invalid_value(
                        "a device's default memory pool cannot be destroyed",
                    ));
                }
                if self.ext.current_pool == Some(m.pool) {
                    self.ext.current_pool = None;
                }
                if self.pool(m.pool)?.imported.is_some() {
                    // Blocks opened through it stay open until freed.
                    self.ext.pools.remove(m.pool);
                    return reply(out, msg::Empty {});
                }
                // Its tokens end; blocks other processes opened stay theirs.
                self.pool_unshare(m.pool);
                // Work may still use its free blocks: they go back once it is done.
                self.engine.drain()?;
                self.release_free_blocks(m.pool, 0);
                let busy = self.pool(m.pool)?.used > 0;
                if busy {
                    if let Some(p) = self.ext.pools.get_mut(m.pool) {
                        p.destroyed = true;
                    }
                } else {
                    self.ext.pools.remove(m.pool);
                }
                reply(out, msg::Empty {})
            }
            R::DeviceGetMemPool(m) => {
                self.check_device(m.device)?;
                let h = if m.default != 0 {
                    self.default_pool()?
                } else {
                    self.current_pool()?
                };
                reply(out, msg::Handle { handle: h })
            }
            R::DeviceSetMemPool(m) => {
                self.check_device(m.device)?;
                self.allocating_pool(m.pool)?;
                self.ext.current_pool = Some(m.pool);
                reply(out, msg::Empty {})
            }
            R::MemPoolSetAttribute(m) => {
                self.pool_set_attribute(m.pool, m.attribute, m.value)?;
                reply(out, msg::Empty {})
            }
            R::MemPoolGetAttribute(m) => {
                let p = self.pool(m.pool)?;
                let bytes = match m.attribute {
                    a @ 1..=3 => p.reuse[(a - 1) as usize],
                    pool_attr::RELEASE_THRESHOLD => p.release_threshold,
                    pool_attr::RESERVED_MEM_CURRENT => p.reserved,
                    pool_attr::RESERVED_MEM_HIGH => p.reserved_high,
                    pool_attr::USED_MEM_CURRENT => p.used,
                    pool_attr::USED_MEM_HIGH => p.used_high,
                    a => {
                        return Err(CuError::invalid_value(format!(
                            "unknown memory pool attribute {a}"
                        )));
                    }
                };
                reply(out, msg::Bytes { bytes })
            }
            R::MemPoolTrimTo(m) => {
                self.pool(m.pool)?;
                self.release_free_blocks(m.pool, m.keep);
                reply(out, msg::Empty {})
            }
            R::MemAllocAsync(m) => {
                let lane = self.lane(m.ctx, m.stream)?;
                let pool = if m.pool == 0 {
                    self.current_pool()?
                } else {
                    self.allocating_pool(m.pool)?;
                    m.pool
                };
                let ptr = self.pool_alloc(pool, m.size)?;
                // A reused block may have been freed on another stream whose earlier work
                // still runs: this stream's later work waits for it.
                let freed = self
                    .ext
                    .pools
                    .get(pool)
                    .and_then(|p| p.blocks.get(&ptr))
                    .map_or(0, |b| b.freed_seq);
                self.engine.wait_for_prefix(&lane, freed);
                reply(out, msg::Ptr { ptr })
            }
            R::MemFreeAsync(m) => {
                self.stream_ctx(m.ctx, m.stream)?;
                self.free_async(m.ptr)?;
                reply(out, msg::Empty {})
            }
            other => Err(CuError::not_supported(format!(
                "request {} is not handled",
                other.name()
            ))),
        }
    }

    fn alloc_mapped(&mut self, m: &msg::MemAllocMapped) -> Result<u64, CuError> {
        self.ctx(m.ctx)?;
        let kind = match m.kind {
            MAPPED_KIND_MANAGED => AllocKind::Managed,
            MAPPED_KIND_HOST_ALLOC | MAPPED_KIND_HOST_REGISTER => AllocKind::MappedHost,
            k => return Err(CuError::invalid_value(format!("unknown mapped kind {k}"))),
        };
        if m.size == 0 {
            return Err(CuError::invalid_value("cannot allocate 0 bytes"));
        }
        let size = round_up(m.size, MIRROR_PAGE)
            .ok_or_else(|| CuError::out_of_memory("allocation size overflows"))?;
        let charged = round_up(size, self.device.alloc_granularity)
            .ok_or_else(|| CuError::out_of_memory("allocation size overflows"))?;
        self.tenant.slice.charge(charged)?;
        let ptr = match self.dev.alloc_aligned(size, MIRROR_PAGE) {
            Ok(p) => p,
            Err(e) => {
                self.tenant.slice.refund(charged);
                return Err(e.into());
            }
        };
        self.allocs.insert(
            ptr,
            Allocation {
                size,
                charged,
                ctx: m.ctx,
                kind,
            },
        );
        if let Some(k) = kind.usage() {
            self.tenant.usage.add(k, charged);
        }
        self.store_memory();
        Ok(ptr)
    }

    pub(super) fn store_memory(&self) {
        self.note_memory();
    }

    fn pool(&self, h: u64) -> Result<&PoolState, CuError> {
        match self.ext.pools.get(h) {
            Some(p) if !p.destroyed => Ok(p),
            _ => Err(CuError::invalid_value(format!(
                "{h:#x} is not a memory pool of this process"
            ))),
        }
    }

    /// A pool of this process that allocates (not an imported one).
    fn allocating_pool(&self, h: u64) -> Result<&PoolState, CuError> {
        let p = self.pool(h)?;
        if p.imported.is_some() {
            return Err(CuError::invalid_value(
                "an imported memory pool cannot allocate (only cuMemPoolImportPointer opens its blocks)",
            ));
        }
        Ok(p)
    }

    fn default_pool(&mut self) -> Result<u64, CuError> {
        if let Some(h) = self.ext.default_pool {
            return Ok(h);
        }
        let h = self.ext.pools.insert(PoolState::new(0, 0))?;
        self.ext.default_pool = Some(h);
        Ok(h)
    }

    fn current_pool(&mut self) -> Result<u64, CuError> {
        match self.ext.current_pool {
            Some(h) => Ok(h),
            None => self.default_pool(),
        }
    }

    fn pool_set_attribute(&mut self, h: u64, attribute: i32, value: u64) -> Result<(), CuError> {
        self.pool(h)?;
        let p = self.ext.pools.get_mut(h).expect("pool just checked");
        match attribute {
            a @ 1..=3 => {
                if value > 1 {
                    return Err(CuError::invalid_value("reuse policies are 0 or 1"));
                }
                p.reuse[(a - 1) as usize] = value;
            }
            pool_attr::RELEASE_THRESHOLD => p.release_threshold = value,
            pool_attr::RESERVED_MEM_HIGH | pool_attr::USED_MEM_HIGH if value != 0 => {
                return Err(CuError::invalid_value(
                    "a high-water mark can only be reset, by setting it to 0",
                ));
            }
            pool_attr::RESERVED_MEM_HIGH => p.reserved_high = p.reserved,
            pool_attr::USED_MEM_HIGH => p.used_high = p.used,
            pool_attr::RESERVED_MEM_CURRENT | pool_attr::USED_MEM_CURRENT => {
                return Err(CuError::invalid_value(
                    "the current reserved and used memory of a pool are read only",
                ));
            }
            a => {
                return Err(CuError::invalid_value(format!(
                    "unknown memory pool attribute {a}"
                )));
            }
        }
        Ok(())
    }

    fn pool_alloc(&mut self, pool: u64, size: u64) -> Result<u64, CuError> {
        if size == 0 {
            return Err(CuError::invalid_value("cannot allocate 0 bytes"));
        }
        let need = round_up(size, self.device.alloc_granularity)
            .ok_or_else(|| CuError::out_of_memory("allocation size overflows"))?;
        // Reuse the smallest free block that fits without wasting more than half of it.
        let p = self.pool(pool)?;
        let reuse = p
            .blocks
            .iter()
            .filter(|(_, b)| !b.in_use && b.charged >= need && b.charged / 2 <= need)
            .min_by_key(|(_, b)| b.charged)
            .map(|(&ptr, b)| (ptr, b.charged));
        let (ptr, charged) = match reuse {
            Some(r) => r,
            None => self.pool_grow(pool, need)?,
        };
        let p = self.ext.pools.get_mut(pool).expect("pool just checked");
        if let Some(b) = p.blocks.get_mut(&ptr) {
            b.in_use = true;
        }
        p.used += charged;
        p.used_high = p.used_high.max(p.used);
        self.tenant.usage.add(UsageKind::PoolUsed, charged);
        self.allocs.insert(
            ptr,
            Allocation {
                size,
                charged: 0,
                ctx: crate::engine::NO_CONTEXT,
                kind: AllocKind::PoolBlock(pool),
            },
        );
        self.store_memory();
        Ok(ptr)
    }

    /// A new block of `need` bytes for `pool`, charged to the slice; free blocks of every
    /// pool are released first when the slice has no room.
    fn pool_grow(&mut self, pool: u64, need: u64) -> Result<(u64, u64), CuError> {
        let p = self.pool(pool)?;
        if p.max_size != 0 && p.reserved.saturating_add(need) > p.max_size {
            return Err(CuError::out_of_memory(format!(
                "the pool's maximum size of {} bytes would be exceeded",
                p.max_size
            )));
        }
        if self.tenant.slice.charge(need).is_err() {
            for h in self.ext.pools.handles_where(|_| true) {
                self.release_free_blocks(h, 0);
            }
            self.tenant.slice.charge(need)?;
        }
        let ptr = match self.dev.alloc(need) {
            Ok(p) => p,
            Err(e) => {
                self.tenant.slice.refund(need);
                return Err(e.into());
            }
        };
        self.allocs.hold(need);
        self.tenant.usage.add(UsageKind::PoolReserved, need);
        let p = self.ext.pools.get_mut(pool).expect("pool just checked");
        p.blocks.insert(
            ptr,
            Block {
                charged: need,
                in_use: false,
                freed_seq: 0,
                shared: None,
            },
        );
        p.reserved += need;
        p.reserved_high = p.reserved_high.max(p.reserved);
        Ok((ptr, need))
    }

    /// `cuMemFreeAsync`: a pool block goes back to its pool; other allocations are freed once
    /// the work before them is done.
    fn free_async(&mut self, ptr: u64) -> Result<(), CuError> {
        if ptr == 0 {
            return Ok(());
        }
        match self.allocs.find(ptr) {
            Some((base, a)) if base == ptr => match a.kind {
                AllocKind::PoolBlock(pool) => {
                    self.pool_free(pool, ptr);
                    Ok(())
                }
                AllocKind::Device | AllocKind::Managed | AllocKind::MappedHost => {
                    self.engine.drain()?;
                    self.free_allocation(ptr);
                    Ok(())
                }
                AllocKind::ModuleGlobal(_) => Err(CuError::invalid_value(
                    "module globals are freed by unloading their module",
                )),
                AllocKind::VmmMapping => Err(CuError::invalid_value(
                    "mapped memory is released with cuMemUnmap and cuMemRelease",
                )),
                AllocKind::IpcImport => Err(CuError::invalid_value(
                    "memory opened with cuIpcOpenMemHandle is closed with cuIpcCloseMemHandle",
                )),
                AllocKind::PoolImport => self.pool_import_free(ptr),
            },
            _ => Err(CuError::invalid_value(format!(
                "{ptr:#x} is not the start of a live allocation of this process"
            ))),
        }
    }

    /// `cuMemFree` of a pool block: it is returned to its pool (the work before it is done);
    /// of a VMM mapping: refused. `None` for other pointers.
    pub(super) fn free_pool_block(&mut self, ptr: u64) -> Option<Result<(), CuError>> {
        match self.allocs.find(ptr) {
            Some((base, a)) if base == ptr => {
                if a.kind == AllocKind::VmmMapping {
                    return Some(Err(CuError::invalid_value(
                        "mapped memory is released with cuMemUnmap and cuMemRelease, not cuMemFree",
                    )));
                }
                if a.kind == AllocKind::PoolImport {
                    return Some(self.pool_import_free(ptr));
                }
                let AllocKind::PoolBlock(pool) = a.kind else {
                    return None;
                };
                if let Err(e) = self.engine.drain() {
                    return Some(Err(e));
                }
                self.pool_free(pool, ptr);
                self.pools_after_sync();
                Some(Ok(()))
            }
            _ => None,
        }
    }

    fn pool_free(&mut self, pool: u64, ptr: u64) {
        self.allocs.remove(ptr);
        let seq = self.engine.submitted();
        let share = self
            .ext
            .pools
            .get_mut(pool)
            .and_then(|p| p.blocks.get_mut(&ptr))
            .and_then(|b| b.shared.take());
        if let Some(share) = share
            && self.pool_block_unshare(share)
        {
            // Another process has it open: the block leaves the pool, still charged.
            self.pool_orphan_block(pool, ptr);
        }
        let Some(p) = self.ext.pools.get_mut(pool) else {
            return;
        };
        if let Some(b) = p.blocks.get_mut(&ptr) {
            b.in_use = false;
            b.freed_seq = seq;
            p.used = p.used.saturating_sub(b.charged);
            self.tenant.usage.sub(UsageKind::PoolUsed, b.charged);
        }
        // A destroyed pool goes once its work is done (if the client hung up, the session's
        // end releases it).
        if p.destroyed && p.used == 0 && self.engine.drain().is_ok() {
            self.release_free_blocks(pool, 0);
            self.ext.pools.remove(pool);
        }
        self.store_memory();
    }

    /// Takes the block at `ptr`, in use, out of `pool`: another process has it open, and the
    /// last to free it gives it back to the device (work of this process before the free is
    /// done first).
    fn pool_orphan_block(&mut self, pool: u64, ptr: u64) {
        if let Err(e) = self.engine.drain() {
            tracing::debug!(session = self.info.id, error = %e, "work before the free of a shared pool block failed");
        }
        let Some(p) = self.ext.pools.get_mut(pool) else {
            return;
        };
        let Some(b) = p.blocks.remove(&ptr) else {
            return;
        };
        p.reserved = p.reserved.saturating_sub(b.charged);
        if b.in_use {
            p.used = p.used.saturating_sub(b.charged);
            self.tenant.usage.sub(UsageKind::PoolUsed, b.charged);
        }
        // The slice charge and the reserved figure stay with the orphan until it is released.
        self.allocs.unhold(b.charged);
    }

    /// Gives free blocks of `pool` whose last use is done back to the device and the slice,
    /// until at most `keep` bytes stay reserved.
    fn release_free_blocks(&mut self, pool: u64, keep: u64) {
        let Some(p) = self.ext.pools.get(pool) else {
            return;
        };
        let mut reserved = p.reserved;
        let mut gone = Vec::new();
        for (&ptr, b) in &p.blocks {
            if reserved <= keep {
                break;
            }
            if !b.in_use && self.engine.is_complete(b.freed_seq) {
                gone.push((ptr, b.charged));
                reserved -= b.charged;
            }
        }
        for (ptr, charged) in gone {
            if let Err(e) = self.dev.free(ptr) {
                tracing::warn!(session = self.info.id, error = %e, "device refused to free pool block {ptr:#x}");
            }
            self.tenant.slice.refund(charged);
            self.tenant.usage.sub(UsageKind::PoolReserved, charged);
            self.allocs.unhold(charged);
            if let Some(p) = self.ext.pools.get_mut(pool) {
                p.blocks.remove(&ptr);
                p.reserved -= charged;
            }
        }
        self.store_memory();
    }

    /// At a synchronizing call: pools keep at most their release threshold of free memory.
    pub(super) fn pools_after_sync(&mut self) {
        for h in self.ext.pools.handles_where(|_| true) {
            let keep = self.ext.pools.get(h).map_or(0, |p| p.release_threshold);
            self.release_free_blocks(h, keep);
        }
    }

    /// Releases pools and virtual memory (the session ended; its work was discarded).
    pub(super) fn release_alloc_ext(&mut self) {
        self.release_ipc();
        self.release_pool_ipc();
        self.release_vmm();
        self.release_pools();
    }

    /// Frees every pool block, in use or not.
    fn release_pools(&mut self) {
        for h in self.ext.pools.handles_where(|_| true) {
            self.pool_unshare(h);
            let Some(p) = self.ext.pools.remove(h) else {
                continue;
            };
            for (ptr, mut b) in p.blocks {
                if b.in_use {
                    self.allocs.remove(ptr);
                    self.tenant.usage.sub(UsageKind::PoolUsed, b.charged);
                }
                if let Some(share) = b.shared.take()
                    && self.pool_block_unshare(share)
                {
                    // Another process has it open: the orphan holds the charge.
                    self.allocs.unhold(b.charged);
                    continue;
                }
                if let Err(e) = self.dev.free(ptr) {
                    tracing::warn!(session = self.info.id, error = %e, "device refused to free pool block {ptr:#x}");
                }
                self.tenant.slice.refund(b.charged);
                self.tenant.usage.sub(UsageKind::PoolReserved, b.charged);
                self.allocs.unhold(b.charged);
            }
        }
        self.ext.default_pool = None;
        self.ext.current_pool = None;
        self.store_memory();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host GPU that has every interop and RDMA feature (an H100 reports most of them) shows a
    /// VM none: the shim refuses them all, and a guest that read the host's values would take
    /// paths that then fail.
    #[test]
    fn the_host_gpus_interop_and_rdma_features_are_not_the_vms() {
        const HOST_ONLY: [usize; 13] = [
            110, 112, 114, 116, 117, 118, 124, 127, 128, 135, 136, 137, 138,
        ];
        let host = vec![1; attr::COUNT];
        let guest = guest_attributes(&host);
        for a in HOST_ONLY {
            assert_eq!(guest[a], 0, "attribute {a}");
        }
        // What the VM does have stays the host's.
        assert_eq!(guest[attr::COOPERATIVE_LAUNCH], 1);
        assert_eq!(guest[attr::MEMORY_POOLS_SUPPORTED], 1);
    }
}
