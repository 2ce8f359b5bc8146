//! The simulated GPU: device memory with CUDA semantics and a PTX
//! interpreter (crate `vgpu-ptx`), behind the broker's [`Device`] trait.
//!
//! It is the embedded default device, so that VMs, slices and scheduling run
//! and are tested on any machine. Each tenant gets a [`SimContext`] that sees
//! only its own allocations: a kernel that touches anything else faults with
//! `CUDA_ERROR_ILLEGAL_ADDRESS`, in its own context only.

pub mod alloc;
pub mod module;
mod texture;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use vgpu_broker::device::{
    Device, DeviceContext, DeviceError, DeviceHeap, DeviceInfo, DeviceModule, ExecutionUnits,
    LaunchDims, LaunchProgress, Residence, RunControl, pieces_len,
};
use vgpu_broker::texture::{TexSampling, TexelLayout};
use vgpu_proto::cuda::{self, attr};
use vgpu_ptx::{Buffer, GlobalMemory, LaunchControl};

use crate::alloc::{ALLOC_ALIGN, AddressSpace, BASE_ALIGN, aligned};

/// Name the simulated GPU reports.
pub const DEVICE_NAME: &str = "vgpu Simulated GPU";
/// Compute capability it reports (PTX for sm_52 … sm_90 loads).
pub const COMPUTE_CAPABILITY: (i32, i32) = (8, 0);

/// Times a migration polls for its safe point (asking running launches to yield each time)
/// before it queues for it.
const MIGRATION_POLLS: usize = 50;
/// Pause between two polls.
const MIGRATION_POLL: std::time::Duration = std::time::Duration::from_micros(200);

/// Settings of a simulated device.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Name in the config (mixed into the UUID).
    pub name: String,
    /// Device memory in bytes.
    pub memory: u64,
    /// Worker threads for kernels.
    pub workers: usize,
    /// Kernels running longer fail with `CUDA_ERROR_LAUNCH_TIMEOUT`.
    pub watchdog: Option<std::time::Duration>,
}

/// A simulated GPU.
pub struct SimDevice {
    info: DeviceInfo,
    memory: Arc<SimMemory>,
    /// Execution slots (one per worker), shared by every launch running at
    /// once: kernels of different streams share the workers.
    slots: Arc<vgpu_ptx::WorkerSlots>,
    /// Held by the cooperative launch running (one at a time on the device): its blocks run at
    /// once outside the slots, so two of them must not add up.
    cooperative: Arc<Mutex<()>>,
    config: SimConfig,
}

/// Device-wide memory state: the address space, the capacity in use, and the host memory
/// that overflowed allocations use (not counted against the capacity).
#[derive(Debug, Default)]
struct SimMemory {
    space: Mutex<AddressSpace>,
    used: AtomicU64,
    host_used: AtomicU64,
    total: u64,
}

impl std::fmt::Debug for SimDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDevice")
            .field("config", &self.config)
            .finish()
    }
}

fn uuid_for(name: &str) -> [u8; 16] {
    // FNV-1a over the name, spread over 16 bytes, with RFC 4122 version 8 bits.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut out = [0u8; 16];
    for (i, b) in name.bytes().chain(*b"vgpu-sim").enumerate() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
        out[i % 16] ^= (h >> 24) as u8;
    }
    for (i, o) in out.iter_mut().enumerate() {
        h = h.wrapping_mul(0x0100_0000_01b3) ^ i as u64;
        *o ^= (h >> 32) as u8;
    }
    out[6] = (out[6] & 0x0f) | 0x80;
    out[8] = (out[8] & 0x3f) | 0x80;
    out
}

/// The zeroed bytes of an allocation of `size` bytes, which kernels reach up to `rounded`.
fn allocation_buffer(size: u64, rounded: u64) -> Result<Buffer, DeviceError> {
    let (Ok(len), Ok(reach)) = (usize::try_from(size), usize::try_from(rounded)) else {
        return Err(DeviceError::OutOfMemory);
    };
    Buffer::new_zeroed_reaching(len, reach).map_err(|_| DeviceError::OutOfMemory)
}

fn attributes(workers: usize) -> Vec<i32> {
    let mut a = vec![0; attr::VGPU_ANY_PTX + 1];
    a[attr::VGPU_ANY_PTX] = 1;
    let sms = i32::try_from(workers.max(1)).unwrap_or(i32::MAX);
    for (k, v) in [
        (attr::MAX_THREADS_PER_BLOCK, 1024),
        (attr::MAX_BLOCK_DIM_X, 1024),
        (attr::MAX_BLOCK_DIM_Y, 1024),
        (attr::MAX_BLOCK_DIM_Z, 64),
        (attr::MAX_GRID_DIM_X, i32::MAX),
        (attr::MAX_GRID_DIM_Y, 65535),
        (attr::MAX_GRID_DIM_Z, 65535),
        (attr::MAX_SHARED_MEMORY_PER_BLOCK, 48 << 10),
        (attr::TOTAL_CONSTANT_MEMORY, 64 << 10),
        (attr::WARP_SIZE, 32),
        (attr::MAX_PITCH, i32::MAX),
        (attr::MAX_REGISTERS_PER_BLOCK, 65536),
        (attr::CLOCK_RATE, 1_410_000),
        (attr::TEXTURE_ALIGNMENT, BASE_ALIGN as i32),
        (attr::GPU_OVERLAP, 1),
        (attr::MULTIPROCESSOR_COUNT, sms),
        (attr::SURFACE_ALIGNMENT, 512),
        (attr::CONCURRENT_KERNELS, 1),
        (attr::COOPERATIVE_LAUNCH, 1),
        (attr::COOPERATIVE_MULTI_DEVICE_LAUNCH, 1),
        (attr::MEMORY_CLOCK_RATE, 1_215_000),
        (attr::GLOBAL_MEMORY_BUS_WIDTH, 5120),
        (attr::L2_CACHE_SIZE, 40 << 20),
        (attr::MAX_THREADS_PER_MULTIPROCESSOR, 2048),
        (attr::ASYNC_ENGINE_COUNT, 1),
        (attr::UNIFIED_ADDRESSING, 1),
        (attr::TEXTURE_PITCH_ALIGNMENT, 32),
        (attr::MAXIMUM_TEXTURE1D_WIDTH, 131072),
        (attr::MAXIMUM_TEXTURE2D_WIDTH, 131072),
        (attr::MAXIMUM_TEXTURE2D_HEIGHT, 65536),
        (attr::MAXIMUM_TEXTURE3D_WIDTH, 16384),
        (attr::MAXIMUM_TEXTURE3D_HEIGHT, 16384),
        (attr::MAXIMUM_TEXTURE3D_DEPTH, 16384),
        (attr::MAXIMUM_TEXTURE2D_LAYERED_WIDTH, 32768),
        (attr::MAXIMUM_TEXTURE2D_LAYERED_HEIGHT, 32768),
        (attr::MAXIMUM_TEXTURE2D_LAYERED_LAYERS, 2048),
        (attr::MAXIMUM_TEXTURE1D_LAYERED_WIDTH, 32768),
        (attr::MAXIMUM_TEXTURE1D_LAYERED_LAYERS, 2048),
        (attr::MAXIMUM_TEXTURE2D_GATHER_WIDTH, 32768),
        (attr::MAXIMUM_TEXTURE2D_GATHER_HEIGHT, 32768),
        (attr::MAXIMUM_SURFACE1D_WIDTH, 32768),
        (attr::MAXIMUM_SURFACE2D_WIDTH, 131072),
        (attr::MAXIMUM_SURFACE2D_HEIGHT, 65536),
        (attr::MAXIMUM_SURFACE3D_WIDTH, 16384),
        (attr::MAXIMUM_SURFACE3D_HEIGHT, 16384),
        (attr::MAXIMUM_SURFACE3D_DEPTH, 16384),
        (attr::MAXIMUM_SURFACE1D_LAYERED_WIDTH, 32768),
        (attr::MAXIMUM_SURFACE1D_LAYERED_LAYERS, 2048),
        (attr::MAXIMUM_SURFACE2D_LAYERED_WIDTH, 32768),
        (attr::MAXIMUM_SURFACE2D_LAYERED_HEIGHT, 32768),
        (attr::MAXIMUM_SURFACE2D_LAYERED_LAYERS, 2048),
        (attr::MAXIMUM_TEXTURE1D_LINEAR_WIDTH, 268435456),
        (attr::MAXIMUM_TEXTURE2D_LINEAR_WIDTH, 131072),
        (attr::MAXIMUM_TEXTURE2D_LINEAR_HEIGHT, 65000),
        (attr::MAXIMUM_TEXTURE2D_LINEAR_PITCH, 2097120),
        (attr::MAXIMUM_TEXTURECUBEMAP_WIDTH, 32768),
        (attr::MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH, 32768),
        (attr::MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS, 2046),
        (attr::MAXIMUM_SURFACECUBEMAP_WIDTH, 32768),
        (attr::MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH, 32768),
        (attr::MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS, 2046),
        (attr::MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH, 32768),
        (attr::MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT, 32768),
        (attr::MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH, 32768),
        (attr::COMPUTE_CAPABILITY_MAJOR, COMPUTE_CAPABILITY.0),
        (attr::COMPUTE_CAPABILITY_MINOR, COMPUTE_CAPABILITY.1),
        (attr::STREAM_PRIORITIES_SUPPORTED, 1),
        (attr::GLOBAL_L1_CACHE_SUPPORTED, 1),
        (attr::LOCAL_L1_CACHE_SUPPORTED, 1),
        (attr::MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 164 << 10),
        (attr::MAX_REGISTERS_PER_MULTIPROCESSOR, 65536),
        (attr::SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO, 2),
        (attr::COMPUTE_PREEMPTION_SUPPORTED, 1),
        (attr::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 163 << 10),
        (attr::MAX_BLOCKS_PER_MULTIPROCESSOR, 32),
        (attr::RESERVED_SHARED_MEMORY_PER_BLOCK, 1024),
        (attr::HOST_NUMA_ID, -1),
        // No large tensor-map allocation class: the selection is a no-op.
        (attr::TENSOR_MAP_LARGE_TENSOR_MIN_SIZE, i32::MAX),
    ] {
        a[k] = v;
    }
    a
}

impl SimDevice {
    /// A simulated GPU.
    pub fn new(config: SimConfig) -> Self {
        let info = DeviceInfo {
            name: DEVICE_NAME.to_string(),
            kind: "sim",
            uuid: uuid_for(&config.name),
            total_memory: config.memory,
            alloc_granularity: ALLOC_ALIGN,
            attributes: attributes(config.workers),
            watchdog: config.watchdog,
        };
        Self {
            info,
            memory: Arc::new(SimMemory {
                total: config.memory,
                ..SimMemory::default()
            }),
            slots: Arc::new(vgpu_ptx::WorkerSlots::new(config.workers)),
            cooperative: Arc::new(Mutex::new(())),
            config,
        }
    }
}

impl Device for SimDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn open(&self, _tenant: &str) -> Result<Arc<dyn DeviceContext>, DeviceError> {
        Ok(Arc::new(SimContext {
            inner: Arc::new(ContextMemory {
                memory: Arc::clone(&self.memory),
                allocs: RwLock::new(BTreeMap::new()),
                vmm: Mutex::new(Vmm::default()),
                host: Mutex::new(BTreeSet::new()),
                gate: RwLock::new(()),
                launches: Mutex::new(Vec::new()),
                objects: RwLock::new(texture::Objects::default()),
            }),
            workers: self.config.workers.max(1),
            slots: Arc::clone(&self.slots),
            cooperative: Arc::clone(&self.cooperative),
        }))
    }

    fn memory_used(&self) -> u64 {
        self.memory.used.load(Ordering::Relaxed)
    }

    fn execution_units(&self) -> Option<ExecutionUnits> {
        let u = self.slots.usage();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Some(ExecutionUnits {
            total: count(self.slots.total()),
            busy: count(u.held),
            waiting: count(u.waiting),
        })
    }
}

impl SimDevice {
    /// Bytes of host memory that overflowed allocations of all contexts use.
    pub fn host_memory_used(&self) -> u64 {
        self.memory.host_used.load(Ordering::Relaxed)
    }
}

/// One tenant's view of the simulated GPU: only its own allocations exist.
pub struct SimContext {
    inner: Arc<ContextMemory>,
    workers: usize,
    /// The device's execution slots, shared by the launches running at once.
    slots: Arc<vgpu_ptx::WorkerSlots>,
    /// The device's cooperative-launch lock.
    cooperative: Arc<Mutex<()>>,
}

/// A tenant's allocations; shared with its loaded modules, whose globals
/// live here too.
pub(crate) struct ContextMemory {
    memory: Arc<SimMemory>,
    allocs: RwLock<BTreeMap<u64, Arc<Buffer>>>,
    vmm: Mutex<Vmm>,
    /// Bases of the allocations whose backing is host memory (overflow).
    host: Mutex<BTreeSet<u64>>,
    /// Held shared by every kernel run and copy, exclusively by a migration: the safe point
    /// at which an allocation's backing may change under its address.
    gate: RwLock<()>,
    /// The launches running now, asked to yield when a migration waits for the gate.
    launches: Mutex<Vec<Arc<LaunchControl>>>,
    /// Texture and surface objects.
    objects: RwLock<texture::Objects>,
}

/// Virtual memory management state of a context: physical allocations by id, address
/// reservations, and which entries of `allocs` are mappings (not allocations of their own).
#[derive(Default)]
struct Vmm {
    next_id: u64,
    phys: BTreeMap<u64, Arc<Buffer>>,
    reserved: BTreeMap<u64, u64>,
    mapped: BTreeMap<u64, u64>,
}

impl std::fmt::Debug for SimContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimContext")
            .field(
                "allocations",
                &self.inner.allocs.read().map(|a| a.len()).unwrap_or(0),
            )
            .finish()
    }
}

impl GlobalMemory for ContextMemory {
    fn lookup(&self, addr: u64) -> Option<(u64, Arc<Buffer>)> {
        let a = self.allocs.read().unwrap_or_else(|p| p.into_inner());
        let (&base, buf) = a.range(..=addr).next_back()?;
        (addr - base < buf.reach() as u64).then(|| (base, Arc::clone(buf)))
    }

    fn texture(&self, handle: u64) -> Option<vgpu_ptx::texture::TextureView> {
        self.objects().texture(handle)
    }

    fn texture_level(&self, handle: u64, level: u32) -> Option<vgpu_ptx::texture::Layout> {
        self.objects().texture_level(handle, level)
    }

    fn surface(&self, handle: u64) -> Option<vgpu_ptx::texture::SurfaceView> {
        self.objects().surface(handle)
    }
}

impl ContextMemory {
    fn objects(&self) -> RwLockReadGuard<'_, texture::Objects> {
        self.objects.read().unwrap_or_else(|p| p.into_inner())
    }

    fn objects_mut(&self) -> std::sync::RwLockWriteGuard<'_, texture::Objects> {
        self.objects.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// One allocation's part of a range: the buffer, the offset in it, the bytes.
type Piece = (Arc<Buffer>, usize, usize);

/// Most allocations one copy may span (adjacent `cuMemMap` mappings of 2 MiB and more).
const MAX_PIECES: usize = 1 << 16;

impl ContextMemory {
    /// The allocations holding `[addr, addr+len)`, in order: one, or adjacent ones without a
    /// gap (virtual memory management maps several physical allocations side by side; the
    /// broker decides which ranges a guest may name).
    fn pieces(&self, addr: u64, len: u64) -> Result<Vec<Piece>, DeviceError> {
        let bad = DeviceError::InvalidAddress { addr, len };
        let end = addr.checked_add(len).ok_or(bad.clone())?;
        let mut out = Vec::new();
        let mut at = addr;
        while at < end || out.is_empty() {
            let (base, buf) = self.lookup(at).ok_or(bad.clone())?;
            let off = at - base;
            // Host copies stay within the allocation's size; only kernels reach its slack.
            if off >= buf.len() as u64 {
                return Err(bad);
            }
            let n = (buf.len() as u64 - off).min(end - at);
            out.push((buf, off as usize, n as usize));
            at += n;
            if out.len() > MAX_PIECES || (n == 0 && at < end) {
                return Err(bad);
            }
        }
        Ok(out)
    }

    /// The allocation holding `[addr, addr+len)` and the offset of `addr` in it.
    fn range(&self, addr: u64, len: u64) -> Result<(Arc<Buffer>, usize), DeviceError> {
        let bad = DeviceError::InvalidAddress { addr, len };
        let (base, buf) = self.lookup(addr).ok_or(bad.clone())?;
        let off = addr - base;
        match off.checked_add(len) {
            Some(end) if end <= buf.len() as u64 => Ok((buf, off as usize)),
            _ => Err(bad),
        }
    }

    pub(crate) fn alloc(&self, size: u64) -> Result<(u64, Arc<Buffer>), DeviceError> {
        self.alloc_aligned(size, BASE_ALIGN)
    }

    /// Like `alloc`, at a multiple of `align` (a power of two).
    pub(crate) fn alloc_aligned(
        &self,
        size: u64,
        align: u64,
    ) -> Result<(u64, Arc<Buffer>), DeviceError> {
        if !align.is_power_of_two() || align > 1 << 30 {
            return Err(DeviceError::NotSupported(format!(
                "allocation alignment {align} is not a power of two up to 1 GiB"
            )));
        }
        let rounded = aligned(size.max(1)).ok_or(DeviceError::OutOfMemory)?;
        // Reserve capacity first; give it back on any failure below.
        let prev = self.memory.used.fetch_add(rounded, Ordering::Relaxed);
        if prev
            .checked_add(rounded)
            .is_none_or(|n| n > self.memory.total)
        {
            self.memory.used.fetch_sub(rounded, Ordering::Relaxed);
            return Err(DeviceError::OutOfMemory);
        }
        // Kernels reach the allocation's bytes to its rounded size: one overrunning it by less
        // than CUDA's alignment stays in memory of its own (zeroed), as on a GPU, where such an
        // access lands in the allocation's page and does not fault. Host copies stay within
        // `size`.
        let buf = match allocation_buffer(size, rounded) {
            Ok(b) => Arc::new(b),
            Err(e) => {
                self.memory.used.fetch_sub(rounded, Ordering::Relaxed);
                return Err(e);
            }
        };
        let base = self
            .memory
            .space
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reserve_aligned(rounded, align);
        let Some(base) = base else {
            self.memory.used.fetch_sub(rounded, Ordering::Relaxed);
            return Err(DeviceError::OutOfMemory);
        };
        self.allocs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(base, Arc::clone(&buf));
        Ok((base, buf))
    }

    /// Registers (`on`) or forgets a running launch's control.
    pub(crate) fn running(&self, c: &Arc<LaunchControl>, on: bool) {
        let mut l = self.launches.lock().unwrap_or_else(|p| p.into_inner());
        if on {
            l.push(Arc::clone(c));
        } else {
            l.retain(|x| !Arc::ptr_eq(x, c));
        }
    }

    /// Exclusive hold of the gate: no kernel or copy of this context runs meanwhile. Running
    /// launches are asked to yield (they resume from their next block once the gate is free).
    fn exclusive(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        let yield_all = || {
            for c in self
                .launches
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
            {
                c.request_yield();
            }
        };
        for _ in 0..MIGRATION_POLLS {
            yield_all();
            match self.gate.try_write() {
                Ok(g) => return g,
                Err(std::sync::TryLockError::Poisoned(p)) => return p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => std::thread::sleep(MIGRATION_POLL),
            }
        }
        yield_all();
        self.gate.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Shared hold of the gate: no migration runs meanwhile.
    fn shared(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Allocates `size` bytes of host memory at a device address (overflow); not counted
    /// against the device's capacity.
    fn alloc_host(&self, size: u64) -> Result<u64, DeviceError> {
        let rounded = aligned(size.max(1)).ok_or(DeviceError::OutOfMemory)?;
        let buf = allocation_buffer(size, rounded)?;
        let base = self
            .memory
            .space
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reserve(rounded)
            .ok_or(DeviceError::OutOfMemory)?;
        self.memory.host_used.fetch_add(rounded, Ordering::Relaxed);
        self.host
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(base);
        self.allocs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(base, Arc::new(buf));
        Ok(base)
    }

    /// Moves the backing of the allocation at `ptr` to `to` under the same address, at a
    /// safe point: running kernels of this context are asked to yield, and copies finish.
    fn migrate(&self, ptr: u64, to: Residence) -> Result<(), DeviceError> {
        let _excl = self.exclusive();
        let old = self
            .allocs
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ptr)
            .cloned()
            .ok_or(DeviceError::InvalidAddress { addr: ptr, len: 0 })?;
        let on_host = self
            .host
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&ptr);
        if on_host == (to == Residence::Host) {
            return Ok(());
        }
        let rounded = aligned((old.len() as u64).max(1)).unwrap_or(ALLOC_ALIGN);
        if to == Residence::Device {
            let prev = self.memory.used.fetch_add(rounded, Ordering::Relaxed);
            if prev
                .checked_add(rounded)
                .is_none_or(|n| n > self.memory.total)
            {
                self.memory.used.fetch_sub(rounded, Ordering::Relaxed);
                return Err(DeviceError::OutOfMemory);
            }
        }
        // Device and host memory are both the host's RAM: the pages of a large backing move to
        // the new one without a copy (the old one, which nothing uses at the safe point, is left
        // empty). Small backings, and hosts whose kernel cannot move pages, are copied.
        let new = match old.take_backing() {
            Some(b) => Arc::new(b),
            None => {
                let new = match Buffer::new_zeroed_reaching(old.len(), old.reach()) {
                    Ok(b) => Arc::new(b),
                    Err(_) => {
                        if to == Residence::Device {
                            self.memory.used.fetch_sub(rounded, Ordering::Relaxed);
                        }
                        return Err(DeviceError::OutOfMemory);
                    }
                };
                new.copy_from(0, &old, 0, old.len())
                    .map_err(|_| DeviceError::InvalidAddress {
                        addr: ptr,
                        len: old.len() as u64,
                    })?;
                new
            }
        };
        self.allocs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ptr, new);
        let mut host = self.host.lock().unwrap_or_else(|p| p.into_inner());
        if to == Residence::Host {
            host.insert(ptr);
            self.memory.used.fetch_sub(rounded, Ordering::Relaxed);
            self.memory.host_used.fetch_add(rounded, Ordering::Relaxed);
        } else {
            host.remove(&ptr);
            self.memory.host_used.fetch_sub(rounded, Ordering::Relaxed);
        }
        Ok(())
    }

    pub(crate) fn free(&self, ptr: u64) -> Result<(), DeviceError> {
        let buf = self
            .allocs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ptr)
            .ok_or(DeviceError::InvalidAddress { addr: ptr, len: 0 })?;
        self.release(ptr, &buf);
        Ok(())
    }

    fn release(&self, base: u64, buf: &Buffer) {
        let size = aligned((buf.len() as u64).max(1)).unwrap_or(ALLOC_ALIGN);
        self.memory
            .space
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .release(base, size);
        let on_host = self
            .host
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&base);
        if on_host {
            self.memory.host_used.fetch_sub(size, Ordering::Relaxed);
        } else {
            self.memory.used.fetch_sub(size, Ordering::Relaxed);
        }
    }
}

impl ContextMemory {
    fn vmm(&self) -> std::sync::MutexGuard<'_, Vmm> {
        self.vmm.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn phys_create(&self, size: u64) -> Result<u64, DeviceError> {
        let prev = self.memory.used.fetch_add(size, Ordering::Relaxed);
        if prev.checked_add(size).is_none_or(|n| n > self.memory.total) {
            self.memory.used.fetch_sub(size, Ordering::Relaxed);
            return Err(DeviceError::OutOfMemory);
        }
        let buf = usize::try_from(size)
            .map_err(|_| DeviceError::OutOfMemory)
            .and_then(|l| Buffer::new_zeroed(l).map_err(|_| DeviceError::OutOfMemory));
        let buf = match buf {
            Ok(b) => Arc::new(b),
            Err(e) => {
                self.memory.used.fetch_sub(size, Ordering::Relaxed);
                return Err(e);
            }
        };
        let mut v = self.vmm();
        v.next_id += 1;
        let id = v.next_id;
        v.phys.insert(id, buf);
        Ok(id)
    }

    fn phys_release(&self, id: u64) -> Result<(), DeviceError> {
        let buf = self
            .vmm()
            .phys
            .remove(&id)
            .ok_or(DeviceError::InvalidAddress { addr: id, len: 0 })?;
        self.memory
            .used
            .fetch_sub(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn va_reserve(&self, size: u64, align: u64) -> Result<u64, DeviceError> {
        let size = aligned(size).ok_or(DeviceError::OutOfMemory)?;
        let addr = self
            .memory
            .space
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reserve_aligned(size, align.max(ALLOC_ALIGN))
            .ok_or(DeviceError::OutOfMemory)?;
        self.vmm().reserved.insert(addr, size);
        Ok(addr)
    }

    fn va_free(&self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let mut v = self.vmm();
        match v.reserved.get(&addr) {
            Some(&s) if s == aligned(size).unwrap_or(0) => {}
            _ => return Err(DeviceError::InvalidAddress { addr, len: size }),
        }
        v.reserved.remove(&addr);
        self.memory
            .space
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .release(addr, aligned(size).unwrap_or(size));
        Ok(())
    }

    fn map(&self, va: u64, size: u64, id: u64) -> Result<(), DeviceError> {
        let mut v = self.vmm();
        let buf = v
            .phys
            .get(&id)
            .cloned()
            .ok_or(DeviceError::InvalidAddress { addr: id, len: 0 })?;
        if buf.len() as u64 != size {
            return Err(DeviceError::NotSupported(
                "a mapping covers one whole physical allocation".into(),
            ));
        }
        let inside = v
            .reserved
            .range(..=va)
            .next_back()
            .is_some_and(|(&b, &l)| va.checked_add(size).is_some_and(|e| e <= b + l));
        let overlaps = v
            .mapped
            .range(..va.saturating_add(size))
            .next_back()
            .is_some_and(|(&b, &l)| b + l > va);
        if !inside || overlaps {
            return Err(DeviceError::InvalidAddress {
                addr: va,
                len: size,
            });
        }
        v.mapped.insert(va, size);
        self.allocs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(va, buf);
        Ok(())
    }

    fn unmap(&self, va: u64, size: u64) -> Result<(), DeviceError> {
        let mut v = self.vmm();
        if v.mapped.get(&va) != Some(&size) {
            return Err(DeviceError::InvalidAddress {
                addr: va,
                len: size,
            });
        }
        v.mapped.remove(&va);
        self.allocs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&va);
        Ok(())
    }
}

impl Drop for ContextMemory {
    fn drop(&mut self) {
        let mut allocs = std::mem::take(self.allocs.get_mut().unwrap_or_else(|p| p.into_inner()));
        let vmm = std::mem::take(self.vmm.get_mut().unwrap_or_else(|p| p.into_inner()));
        for va in vmm.mapped.keys() {
            allocs.remove(va);
        }
        for (base, buf) in allocs {
            self.release(base, &buf);
        }
        let mut space = self.memory.space.lock().unwrap_or_else(|p| p.into_inner());
        for (addr, size) in vmm.reserved {
            space.release(addr, size);
        }
        drop(space);
        for buf in vmm.phys.values() {
            self.memory
                .used
                .fetch_sub(buf.len() as u64, Ordering::Relaxed);
        }
    }
}

impl DeviceContext for SimContext {
    fn alloc(&self, size: u64) -> Result<u64, DeviceError> {
        self.inner.alloc(size).map(|(base, _)| base)
    }

    fn free(&self, ptr: u64) -> Result<(), DeviceError> {
        let _g = self.inner.shared();
        self.inner.free(ptr)
    }

    fn alloc_host(&self, size: u64) -> Result<u64, DeviceError> {
        self.inner.alloc_host(size)
    }

    fn migrate(&self, ptr: u64, to: Residence) -> Result<(), DeviceError> {
        self.inner.migrate(ptr, to)
    }

    fn alloc_aligned(&self, size: u64, align: u64) -> Result<u64, DeviceError> {
        self.inner.alloc_aligned(size, align).map(|(base, _)| base)
    }

    fn phys_create(&self, size: u64) -> Result<u64, DeviceError> {
        self.inner.phys_create(size)
    }

    fn phys_release(&self, id: u64) -> Result<(), DeviceError> {
        self.inner.phys_release(id)
    }

    fn va_reserve(&self, size: u64, align: u64) -> Result<u64, DeviceError> {
        self.inner.va_reserve(size, align)
    }

    fn va_free(&self, addr: u64, size: u64) -> Result<(), DeviceError> {
        self.inner.va_free(addr, size)
    }

    fn map(&self, va: u64, size: u64, id: u64) -> Result<(), DeviceError> {
        self.inner.map(va, size, id)
    }

    fn unmap(&self, va: u64, size: u64) -> Result<(), DeviceError> {
        self.inner.unmap(va, size)
    }

    fn write(&self, dst: u64, data: &[u8]) -> Result<(), DeviceError> {
        let _g = self.inner.shared();
        let len = data.len() as u64;
        let bad = || DeviceError::InvalidAddress { addr: dst, len };
        let mut at = 0;
        for (buf, off, n) in self.inner.pieces(dst, len)? {
            buf.write(off, &data[at..at + n]).map_err(|_| bad())?;
            at += n;
        }
        Ok(())
    }

    fn read(&self, src: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        let _g = self.inner.shared();
        let len = out.len() as u64;
        let bad = || DeviceError::InvalidAddress { addr: src, len };
        let mut at = 0;
        for (buf, off, n) in self.inner.pieces(src, len)? {
            buf.read(off, &mut out[at..at + n]).map_err(|_| bad())?;
            at += n;
        }
        Ok(())
    }

    fn write_gathered(&self, dst: u64, pieces: &[&[u8]]) -> Result<(), DeviceError> {
        let len = pieces_len(dst, pieces.iter().map(|p| p.len()))?;
        {
            let _g = self.inner.shared();
            if let Ok((buf, off)) = self.inner.range(dst, len) {
                return buf
                    .write_gathered(off, pieces)
                    .map_err(|_| DeviceError::InvalidAddress { addr: dst, len });
            }
        }
        // Across adjacent mappings: one staging copy.
        self.write(dst, &pieces.concat())
    }

    fn read_scattered(&self, src: u64, pieces: &mut [&mut [u8]]) -> Result<(), DeviceError> {
        let len = pieces_len(src, pieces.iter().map(|p| p.len()))?;
        {
            let _g = self.inner.shared();
            if let Ok((buf, off)) = self.inner.range(src, len) {
                return buf
                    .read_scattered(off, pieces)
                    .map_err(|_| DeviceError::InvalidAddress { addr: src, len });
            }
        }
        // Across adjacent mappings: one staging copy.
        let mut all = vec![0u8; len as usize];
        self.read(src, &mut all)?;
        let mut at = 0;
        for p in pieces.iter_mut() {
            p.copy_from_slice(&all[at..at + p.len()]);
            at += p.len();
        }
        Ok(())
    }

    fn copy(&self, dst: u64, src: u64, len: u64) -> Result<(), DeviceError> {
        {
            let _g = self.inner.shared();
            if let (Ok((s, soff)), Ok((d, doff))) =
                (self.inner.range(src, len), self.inner.range(dst, len))
            {
                return d
                    .copy_from(doff, &s, soff, len as usize)
                    .map_err(|_| DeviceError::InvalidAddress { addr: dst, len });
            }
        }
        // Across adjacent mappings: through host memory, in bounded chunks.
        const CHUNK: u64 = 4 << 20;
        let mut buf = Vec::new();
        let mut done = 0;
        while done < len {
            let n = CHUNK.min(len - done);
            buf.resize(n as usize, 0);
            self.read(src + done, &mut buf)?;
            self.write(dst + done, &buf)?;
            done += n;
        }
        Ok(())
    }

    fn memset(&self, dst: u64, value: u32, elem_size: u32, count: u64) -> Result<(), DeviceError> {
        let _g = self.inner.shared();
        let bytes = vgpu_broker::device::memset_len(dst, elem_size, count)?;
        let bad = || DeviceError::InvalidAddress {
            addr: dst,
            len: bytes,
        };
        let pattern = &value.to_le_bytes()[..elem_size as usize];
        if let Ok((buf, off)) = self.inner.range(dst, bytes) {
            // Inside one allocation, as almost every fill is: no list of pieces.
            return buf.fill(off, pattern, count as usize).map_err(|_| bad());
        }
        for (buf, off, n) in self.inner.pieces(dst, bytes)? {
            // Mappings are granular (2 MiB), so pieces hold whole elements.
            if n % elem_size as usize != 0 {
                return Err(bad());
            }
            buf.fill(off, pattern, n / elem_size as usize)
                .map_err(|_| bad())?;
        }
        Ok(())
    }

    fn load_module(
        &self,
        image: &[u8],
        budget: u64,
        control: &RunControl,
    ) -> Result<Arc<dyn DeviceModule>, DeviceError> {
        Ok(Arc::new(module::SimModule::load(
            &self.inner,
            image,
            budget,
            control,
        )?))
    }

    fn launch(
        &self,
        module: &dyn DeviceModule,
        kernel: usize,
        dims: &LaunchDims,
        params: &[u8],
        start_block: u64,
        control: &RunControl,
    ) -> Result<LaunchProgress, DeviceError> {
        let m = module
            .as_any()
            .downcast_ref::<module::SimModule>()
            .ok_or_else(|| DeviceError::NotSupported("module of another device".into()))?;
        let _g = self.inner.shared();
        // Cooperative launches run one at a time on the device, whichever VM they come from.
        let _one = if dims.cooperative {
            Some(cooperative_turn(&self.cooperative, control)?)
        } else {
            None
        };
        // A green context's kernel runs on at most its multiprocessors: that many workers.
        let workers = dims
            .units
            .map_or(self.workers, |u| self.workers.min(u as usize).max(1));
        m.launch(
            &self.inner,
            kernel,
            dims,
            params,
            start_block,
            workers,
            &self.slots,
            control,
        )
    }

    fn texture_create(
        &self,
        layout: &TexelLayout,
        sampling: &TexSampling,
    ) -> Result<u64, DeviceError> {
        self.inner.objects_mut().create_texture(layout, sampling)
    }

    fn texture_destroy(&self, handle: u64) -> Result<(), DeviceError> {
        self.inner.objects_mut().destroy_texture(handle)
    }

    fn surface_create(&self, layout: &TexelLayout) -> Result<u64, DeviceError> {
        self.inner.objects_mut().create_surface(layout)
    }

    fn surface_destroy(&self, handle: u64) -> Result<(), DeviceError> {
        self.inner.objects_mut().destroy_surface(handle)
    }

    fn sets_graph_conditionals(&self) -> bool {
        true
    }

    fn heap_create(&self, size: u64) -> Result<Arc<dyn DeviceHeap>, DeviceError> {
        Ok(Arc::new(module::SimHeap::new(&self.inner, size)?))
    }
}

/// How often a cooperative launch waiting for its turn looks at its cancellation and deadline.
const COOPERATIVE_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// Waits for the device's cooperative-launch lock the way a launch waits for the device: a
/// cancelled launch (its client went away) stops waiting, and the watchdog's deadline counts.
fn cooperative_turn<'a>(
    lock: &'a Mutex<()>,
    control: &RunControl,
) -> Result<std::sync::MutexGuard<'a, ()>, DeviceError> {
    loop {
        match lock.try_lock() {
            Ok(g) => return Ok(g),
            Err(std::sync::TryLockError::Poisoned(p)) => return Ok(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
        if control.cancelled() {
            return Err(DeviceError::Fault {
                code: cuda::CUDA_ERROR_LAUNCH_FAILED,
                message: "cancelled while waiting for another cooperative launch".into(),
            });
        }
        if control
            .deadline()
            .is_some_and(|d| std::time::Instant::now() >= d)
        {
            return Err(DeviceError::Fault {
                code: cuda::CUDA_ERROR_LAUNCH_TIMEOUT,
                message: "the watchdog expired while waiting for another cooperative launch".into(),
            });
        }
        std::thread::sleep(COOPERATIVE_POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancelled_launch_stops_waiting_for_its_cooperative_turn() {
        let lock = Mutex::new(());
        let held = lock.lock().unwrap();
        let control = RunControl::default();
        control.cancel();
        let e = cooperative_turn(&lock, &control).unwrap_err();
        assert!(
            matches!(e, DeviceError::Fault { code, .. } if code == cuda::CUDA_ERROR_LAUNCH_FAILED)
        );
        drop(held);
        assert!(cooperative_turn(&lock, &RunControl::default()).is_ok());
    }

    fn dev(memory: u64) -> SimDevice {
        SimDevice::new(SimConfig {
            name: "gpu0".into(),
            memory,
            workers: 2,
            watchdog: None,
        })
    }

    /// Each block writes `%smid` and `%nsmid` at `out[2 * %ctaid.x]`.
    const SMIDS: &str = ".version 7.0\n.target sm_52\n.address_size 64\n\
        .visible .entry smids(.param .u64 out)\n{\n .reg .u32 %r<4>;\n .reg .u64 %rd<4>;\n\
         ld.param.u64 %rd1, [out];\n mov.u32 %r1, %ctaid.x;\n mov.u32 %r2, %smid;\n\
         mov.u32 %r3, %nsmid;\n mul.wide.u32 %rd2, %r1, 8;\n add.u64 %rd3, %rd1, %rd2;\n\
         st.global.v2.u32 [%rd3], {%r2, %r3};\n ret;\n}\n";

    #[test]
    fn a_green_contexts_kernel_runs_on_its_units_only() {
        let d = SimDevice::new(SimConfig {
            name: "gpu0".into(),
            memory: 1 << 20,
            workers: 8,
            watchdog: None,
        });
        let c = d.open("a").unwrap();
        let m = c
            .load_module(SMIDS.as_bytes(), 1 << 20, &RunControl::default())
            .unwrap();
        const BLOCKS: u32 = 256;
        let out = c.alloc(u64::from(BLOCKS) * 8).unwrap();
        for (units, want) in [(Some(3), 3), (Some(1), 1), (Some(64), 8), (None, 8)] {
            let dims = LaunchDims {
                units,
                ..launch_dims(BLOCKS, 32)
            };
            c.memset(out, u32::MAX, 4, u64::from(BLOCKS) * 2).unwrap();
            let r = c
                .launch(&*m, 0, &dims, &out.to_le_bytes(), 0, &RunControl::default())
                .unwrap();
            assert_eq!(r, LaunchProgress::Completed);
            let mut b = vec![0u8; BLOCKS as usize * 8];
            c.read(out, &mut b).unwrap();
            for blk in b.chunks(8) {
                let smid = u32::from_le_bytes(blk[..4].try_into().unwrap());
                let nsmid = u32::from_le_bytes(blk[4..].try_into().unwrap());
                assert_eq!(nsmid, want, "%nsmid with {units:?} units");
                assert!(smid < want, "block on unit {smid} with {units:?} units");
            }
        }
    }

    #[test]
    fn memory_round_trips_and_fills() {
        let d = dev(1 << 20);
        let c = d.open("a").unwrap();
        let p = c.alloc(1000).unwrap();
        c.write(p + 10, b"hello").unwrap();
        c.memset(p + 100, 0xdead_beef, 4, 3).unwrap();
        c.copy(p + 500, p + 10, 5).unwrap();
        let mut out = vec![0u8; 1000];
        c.read(p, &mut out).unwrap();
        assert_eq!(&out[10..15], b"hello");
        assert_eq!(&out[500..505], b"hello");
        assert_eq!(&out[100..104], &0xdead_beefu32.to_le_bytes());
        assert_eq!(&out[108..112], &0xdead_beefu32.to_le_bytes());
        assert_eq!(out[112], 0);
        assert!(out[..10].iter().all(|&b| b == 0), "fresh memory is zeroed");
    }

    #[test]
    fn tenants_see_only_their_own_allocations() {
        let d = dev(1 << 20);
        let a = d.open("a").unwrap();
        let b = d.open("b").unwrap();
        let p = a.alloc(64).unwrap();
        assert!(matches!(
            b.write(p, b"x"),
            Err(DeviceError::InvalidAddress { .. })
        ));
        assert!(b.free(p).is_err());
        assert!(a.write(p + 60, b"12345").is_err(), "past the end");
        a.write(p + 59, b"12345").unwrap();
    }

    #[test]
    fn capacity_is_enforced_and_released() {
        let d = dev(4096);
        let c = d.open("a").unwrap();
        let p = c.alloc(4000).unwrap();
        assert_eq!(d.memory_used(), 4096);
        assert_eq!(c.alloc(1), Err(DeviceError::OutOfMemory));
        c.free(p).unwrap();
        assert_eq!(d.memory_used(), 0);
        let _q = c.alloc(4096).unwrap();
        drop(c);
        assert_eq!(d.memory_used(), 0, "a dropped context frees its memory");
    }

    #[test]
    fn migration_keeps_the_address_and_the_data_and_moves_the_capacity() {
        let d = dev(8192);
        let c = d.open("a").unwrap();
        let p = c.alloc(4096).unwrap();
        c.write(p + 100, b"stays put").unwrap();
        c.migrate(p, Residence::Host).unwrap();
        assert_eq!((d.memory_used(), d.host_memory_used()), (0, 4096));
        // The device's capacity is free for others while the data lives on the host.
        let q = c.alloc(8192).unwrap();
        let mut out = [0u8; 9];
        c.read(p + 100, &mut out).unwrap();
        assert_eq!(&out, b"stays put");
        c.write(p, b"x").unwrap();
        assert_eq!(
            c.migrate(p, Residence::Device),
            Err(DeviceError::OutOfMemory)
        );
        c.free(q).unwrap();
        c.migrate(p, Residence::Device).unwrap();
        assert_eq!((d.memory_used(), d.host_memory_used()), (4096, 0));
        c.read(p + 100, &mut out).unwrap();
        assert_eq!(&out, b"stays put");
        let h = c.alloc_host(1000).unwrap();
        assert_eq!(d.host_memory_used(), 1024);
        c.free(h).unwrap();
        c.migrate(p, Residence::Host).unwrap();
        drop(c);
        assert_eq!(
            (d.memory_used(), d.host_memory_used()),
            (0, 0),
            "a dropped context frees host memory too"
        );
    }

    #[test]
    fn scattered_free_memory_is_one_allocation_away() {
        const MIB: u64 = 1 << 20;
        let d = dev(64 * MIB);
        let c = d.open("a").unwrap();
        let p: Vec<u64> = (0..16).map(|_| c.alloc(4 * MIB).unwrap()).collect();
        for q in p.iter().step_by(2) {
            c.free(*q).unwrap();
        }
        // Free memory lies in eight 4 MiB holes; the largest allocation that fits is still
        // the free total.
        let big = c.alloc(32 * MIB).unwrap();
        assert_eq!(d.memory_used(), 64 * MIB);
        c.free(big).unwrap();
    }

    #[test]
    fn a_huge_request_fails_cleanly() {
        let d = dev(u64::MAX / 2);
        let c = d.open("a").unwrap();
        assert_eq!(c.alloc(u64::MAX - 10), Err(DeviceError::OutOfMemory));
        assert_eq!(d.memory_used(), 0);
    }

    /// A launch of `grid` blocks of `block` threads (1-D), without shared memory.
    fn launch_dims(grid: u32, block: u32) -> LaunchDims {
        LaunchDims {
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_bytes: 0,
            cooperative: false,
            units: None,
        }
    }

    /// A cubin for sm_`arch` (ELF ABI 7) with kernel `saxpy(int, float*, float*)`
    /// and a `__device__` variable.
    fn cubin(arch: u32) -> Vec<u8> {
        use vgpu_fatbin::cubin::{SHT_NOBITS, STO_CUDA_ENTRY, STT_FUNC, STT_OBJECT};
        let mut b = vgpu_fatbin::testutils::ElfBuilder::new();
        let text = b.section(".text.saxpy", 1, vec![0; 32]);
        b.section(
            ".nv.info.saxpy",
            0x7000_0000,
            vgpu_fatbin::testutils::ElfBuilder::nv_info(&[(0, 0, 4), (1, 8, 8), (2, 16, 8)]),
        );
        let glob = b.section(".nv.global", SHT_NOBITS, vec![]);
        b.symbol("saxpy", STT_FUNC, 1, STO_CUDA_ENTRY, text, 32);
        b.symbol("counter", STT_OBJECT, 1, 0, glob, 4);
        let mut img = b.build();
        img[8] = 7;
        img[48..52].copy_from_slice(&(arch | (arch << 16) | 0x500).to_le_bytes());
        img
    }

    /// A fat binary whose only PTX is for a newer GPU (CuPy's CUB and Thrust: cubins, and PTX
    /// for compute 10.0) runs that PTX instead of declaring the cubin's kernels, unless the PTX
    /// does not load.
    #[test]
    fn a_fat_binary_with_only_newer_ptx_runs_it() {
        use vgpu_fatbin::{KIND_ELF, KIND_PTX, NewEntry, write};
        const PTX_100: &[u8] = b".version 8.8\n.target sm_100\n.address_size 64\n\
            .visible .entry saxpy(.param .u32 n, .param .u64 x, .param .u64 y)\n{\n\
            .reg .b64 %rd<2>;\n.reg .b32 %r<3>;\nld.param.u64 %rd1, [y];\n\
            mov.u32 %r1, 0xfff00001;\nmov.u32 %r2, 0x00030002;\n\
            max.s16x2 %r1, %r1, %r2;\nst.global.u32 [%rd1], %r1;\nret;\n}\n\0";
        let entry = |kind, arch, payload| NewEntry {
            kind,
            arch,
            flags: 0,
            payload,
            uncompressed_len: 0,
        };
        let cubin = cubin(80);
        let image = write(&[entry(KIND_ELF, 80, &cubin), entry(KIND_PTX, 100, PTX_100)]);
        let d = dev(1 << 20);
        let c = d.open("a").unwrap();
        let m = c
            .load_module(&image, 1 << 20, &RunControl::default())
            .unwrap();
        assert_eq!(m.kernels()[0].name, "saxpy");
        assert!(m.kernels()[0].runnable, "the PTX's kernel, not the cubin's");
        let out = c.alloc(4).unwrap();
        let mut params = Vec::new();
        params.extend_from_slice(&[0u8; 8]);
        params.extend_from_slice(&0u64.to_le_bytes());
        params.extend_from_slice(&out.to_le_bytes());
        let dims = launch_dims(1, 1);
        c.launch(&*m, 0, &dims, &params, 0, &RunControl::default())
            .unwrap();
        let mut got = [0u8; 4];
        c.read(out, &mut got).unwrap();
        assert_eq!(u32::from_le_bytes(got), 0x0003_0002);

        // Newer PTX with an instruction the interpreter lacks: the cubin declares the kernels,
        // as before the simulated GPU ran newer PTX, and a launch is refused.
        const UNKNOWN_100: &[u8] = b".version 8.8\n.target sm_100\n.address_size 64\n\
            .visible .entry saxpy(.param .u32 n, .param .u64 x, .param .u64 y)\n{\n\
            tcgen05.fence::before_thread_sync;\nret;\n}\n\0";
        let image = write(&[
            entry(KIND_ELF, 80, &cubin),
            entry(KIND_PTX, 100, UNKNOWN_100),
        ]);
        let m = c
            .load_module(&image, 1 << 20, &RunControl::default())
            .unwrap();
        assert_eq!(m.kernels()[0].name, "saxpy");
        assert!(!m.kernels()[0].runnable, "the cubin's kernel");
        let e = c
            .launch(&*m, 0, &dims, &params, 0, &RunControl::default())
            .unwrap_err();
        assert_eq!(
            e.cu_result(),
            vgpu_proto::cuda::CUDA_ERROR_NO_BINARY_FOR_GPU
        );
        // Without a cubin, the load fails and says why.
        let image = write(&[entry(KIND_PTX, 100, UNKNOWN_100)]);
        let Err(e) = c.load_module(&image, 1 << 20, &RunControl::default()) else {
            panic!("PTX with an unknown instruction loaded");
        };
        assert!(e.to_string().contains("tcgen05"), "{e}");
    }

    #[test]
    fn cubins_load_their_kernels_but_cannot_launch_them() {
        let d = dev(1 << 20);
        let c = d.open("a").unwrap();
        let m = c
            .load_module(&cubin(80), 1 << 20, &RunControl::default())
            .unwrap();
        assert_eq!(m.kernels().len(), 1);
        assert_eq!(m.kernels()[0].name, "saxpy");
        assert_eq!(m.kernels()[0].param_offsets, [0, 8, 16]);
        assert_eq!(m.globals()[0].name, "counter");
        let dims = launch_dims(1, 32);
        let e = c
            .launch(&*m, 0, &dims, &[0; 24], 0, &RunControl::default())
            .unwrap_err();
        assert_eq!(
            e.cu_result(),
            vgpu_proto::cuda::CUDA_ERROR_NO_BINARY_FOR_GPU,
            "{e}"
        );
        assert!(e.to_string().contains("saxpy"), "{e}");
        // SASS for another architecture is refused at load, as a device of
        // compute capability 8.0 refuses it.
        let Err(e) = c.load_module(&cubin(90), 1 << 20, &RunControl::default()) else {
            panic!("an sm_90 cubin loaded on compute capability 8.0");
        };
        assert_eq!(
            e.cu_result(),
            vgpu_proto::cuda::CUDA_ERROR_NO_BINARY_FOR_GPU,
            "{e}"
        );
    }

    /// A kernel whose 1024 threads hold 64 KiB of local memory each (64 MiB a block).
    const LOCAL_HEAVY: &str = ".version 7.0\n.target sm_52\n.address_size 64\n\
        .visible .entry heavy()\n{\n .local .align 8 .b8 depot[65536];\n ret;\n}\n";

    #[derive(Debug)]
    struct Budget(std::sync::Mutex<(u64, u64)>);

    impl vgpu_broker::device::HostStateBudget for Budget {
        fn take(&self, bytes: u64) -> bool {
            let mut g = self.0.lock().unwrap();
            if g.0 + bytes > g.1 {
                return false;
            }
            g.0 += bytes;
            true
        }
        fn give_back(&self, bytes: u64) {
            self.0.lock().unwrap().0 -= bytes;
        }
    }

    #[test]
    fn launches_take_their_interpreter_state_from_the_controls_budget() {
        let d = dev(1 << 20);
        let c = d.open("a").unwrap();
        let m = c
            .load_module(LOCAL_HEAVY.as_bytes(), 1 << 20, &RunControl::default())
            .unwrap();
        let dims = launch_dims(2, 1024);
        let small = Arc::new(Budget(Mutex::new((0, 32 << 20))));
        let control = RunControl::default();
        control.set_state_budget(Some(Arc::clone(&small) as _));
        let e = c.launch(&*m, 0, &dims, &[], 0, &control).unwrap_err();
        assert_eq!(
            e.cu_result(),
            vgpu_proto::cuda::CUDA_ERROR_OUT_OF_MEMORY,
            "{e}"
        );
        assert!(
            matches!(e, DeviceError::InvalidLaunch { .. }),
            "not sticky: {e:?}"
        );
        let big = Arc::new(Budget(Mutex::new((0, 128 << 20))));
        control.set_state_budget(Some(Arc::clone(&big) as _));
        assert_eq!(
            c.launch(&*m, 0, &dims, &[], 0, &control).unwrap(),
            LaunchProgress::Completed
        );
        assert_eq!(small.0.lock().unwrap().0, 0);
        assert_eq!(
            big.0.lock().unwrap().0,
            0,
            "given back when the launch ended"
        );
    }

    /// A kernel that sets conditional handle `h` to `v` (`cudaGraphSetConditional(h, v)`, as
    /// NVRTC compiles it).
    const SET_CONDITIONAL: &str = ".version 8.3\n.target sm_80\n.address_size 64\n\
        .extern .func cudaGraphSetConditional\n(\n .param .b64 cudaGraphSetConditional_param_0,\n \
        .param .b32 cudaGraphSetConditional_param_1\n)\n;\n\
        .visible .entry set_value(.param .u64 h, .param .u32 v)\n{\n .reg .b32 %r<2>;\n \
        .reg .b64 %rd<2>;\n ld.param.u64 %rd1, [h];\n ld.param.u32 %r1, [v];\n \
        { // callseq 0, 0\n .param .b64 param0;\n st.param.b64 [param0+0], %rd1;\n \
        .param .b32 param1;\n st.param.b32 [param1+0], %r1;\n \
        call.uni\n cudaGraphSetConditional,\n (\n param0,\n param1\n );\n } // callseq 0\n \
        ret;\n}\n";

    #[test]
    fn kernels_set_the_conditional_handles_of_their_graph_launch() {
        const HANDLE: u64 = 0x7f00_0000_0000_0001;
        const OTHER: u64 = 0x7f00_0000_0000_0002;
        const UNKNOWN: u64 = 0xdead_beef_0000_0003;
        const OTHER_START: u32 = 5;
        const VALUE: u32 = 42;
        let d = dev(1 << 20);
        let c = d.open("a").unwrap();
        assert!(c.sets_graph_conditionals());
        let m = c
            .load_module(SET_CONDITIONAL.as_bytes(), 1 << 20, &RunControl::default())
            .unwrap();
        let dims = launch_dims(1, 1);
        let params = |handle: u64| {
            let mut p = handle.to_le_bytes().to_vec();
            p.extend_from_slice(&VALUE.to_le_bytes());
            p
        };
        let conditionals = Arc::new(vgpu_broker::device::GraphConditionals::new([
            (HANDLE, 0),
            (OTHER, OTHER_START),
        ]));
        let control = RunControl::default();
        control.set_conditionals(Some(Arc::clone(&conditionals)));
        assert_eq!(
            c.launch(&*m, 0, &dims, &params(HANDLE), 0, &control)
                .unwrap(),
            LaunchProgress::Completed
        );
        assert_eq!(conditionals.get(HANDLE), Some(VALUE));
        assert_eq!(conditionals.get(OTHER), Some(OTHER_START));

        // A handle of no graph launch, and a kernel outside one: the launch faults.
        let e = c
            .launch(&*m, 0, &dims, &params(UNKNOWN), 0, &control)
            .unwrap_err();
        assert!(
            matches!(e, DeviceError::Fault { code, .. } if code == cuda::CUDA_ERROR_ILLEGAL_INSTRUCTION),
            "{e:?}"
        );
        assert!(e.to_string().contains("0xdeadbeef00000003"), "{e}");
        assert_eq!(conditionals.get(HANDLE), Some(VALUE));
        let e = c
            .launch(&*m, 0, &dims, &params(HANDLE), 0, &RunControl::default())
            .unwrap_err();
        assert_eq!(e.cu_result(), cuda::CUDA_ERROR_ILLEGAL_INSTRUCTION, "{e}");
        assert!(
            e.to_string()
                .contains("outside any graph launch with conditional nodes"),
            "{e}"
        );
    }

    #[test]
    fn module_loads_stop_past_their_deadline_or_when_cancelled() {
        let d = dev(1 << 20);
        let c = d.open("a").unwrap();
        let mut ptx = String::from(".version 7.0\n.target sm_52\n.address_size 64\n");
        for i in 0..500 {
            ptx.push_str(&format!(".visible .entry k{i}()\n{{\n ret;\n}}\n"));
        }
        let past = RunControl::with_deadline(Some(std::time::Instant::now()));
        let Err(e) = c.load_module(ptx.as_bytes(), 1 << 20, &past) else {
            panic!("a load past its deadline finished");
        };
        assert!(matches!(e, DeviceError::LoadStopped(_)), "{e:?}");
        assert_eq!(e.cu_result(), vgpu_proto::cuda::CUDA_ERROR_INVALID_PTX);
        let gone = RunControl::default();
        gone.watch_hangup(Some(Arc::new(|| true)));
        let Err(e) = c.load_module(ptx.as_bytes(), 1 << 20, &gone) else {
            panic!("a load whose client has gone finished");
        };
        assert!(e.to_string().contains("cancelled"), "{e}");
        assert!(gone.cancelled());
        let m = c
            .load_module(ptx.as_bytes(), 1 << 20, &RunControl::default())
            .unwrap();
        assert_eq!(m.kernels().len(), 500);
    }

    #[test]
    fn the_uuid_is_stable_and_per_device() {
        assert_eq!(uuid_for("gpu0"), uuid_for("gpu0"));
        assert_ne!(uuid_for("gpu0"), uuid_for("gpu1"));
    }
}
