//! Allocation APIs beyond `cuMemAlloc`, in safe Rust: memory the guest process mirrors
//! (managed memory, mapped host memory) and stream-ordered memory pools. The C ABI is in
//! [`crate::alloc_exports`].
//!
//! # Mirrored memory
//!
//! Managed memory (`cuMemAllocManaged`) and mapped host memory (`cuMemHostAlloc` and
//! `cuMemHostRegister` with `DEVICEMAP`) are device allocations that the process also reaches
//! through host memory, its *mirror*. For managed memory and `cuMemHostAlloc` the mirror is
//! mapped at the device address itself, so one pointer is valid on the host and in kernels;
//! a registered range keeps its host address and gets a device address of its own
//! (`CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM` is 0).
//!
//! Coherence is CUDA's on devices without concurrent managed access: a region is owned by the
//! host or by the device. Before a launch, every region the launch may touch that the host
//! owns is copied to the device (on the launch's connection, ahead of it) and becomes the
//! device's; at a synchronizing call (context, stream or event synchronize, a successful
//! query, a synchronous device-to-host copy) every region the device owns is copied back and
//! becomes the host's. Copies and memsets that name mirrored memory work on the mirror, after
//! taking it back from the device if needed. Whole regions move: simple and correct, at the
//! cost of copying a region that neither side changed (docs/memory.md has figures).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, OnceLock};

use vgpu_proto::cuda;
use vgpu_proto::msg;
use vgpu_proto::pagehash;

use crate::driver::{self as drv, CuRes};

/// Guest page size: mirrors are mapped in whole pages.
pub const PAGE: usize = 4096;
/// `CU_MEM_ATTACH_GLOBAL`.
pub const ATTACH_GLOBAL: u32 = 0x1;
/// `CU_MEM_ATTACH_HOST`.
pub const ATTACH_HOST: u32 = 0x2;
/// `CU_MEM_ATTACH_SINGLE`.
pub const ATTACH_SINGLE: u32 = 0x4;
/// `CU_DEVICE_CPU`.
pub const DEVICE_CPU: i32 = -1;
/// `CU_DEVICE_INVALID`.
pub const DEVICE_INVALID: i32 = -2;
/// `CU_MEMHOSTALLOC_PORTABLE`.
pub const MEMHOSTALLOC_PORTABLE: u32 = 0x1;

/// What a mirrored region is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionKind {
    /// `cuMemAllocManaged`.
    Managed,
    /// `cuMemHostAlloc` with `DEVICEMAP`.
    HostAlloc,
    /// `cuMemHostRegister` with `DEVICEMAP`.
    Registered,
    /// `cuMemHostAlloc` without `DEVICEMAP`, given device memory when a kernel first used it
    /// ([`crate::pinned_uva`]); its host memory is the buffer's own.
    Pinned,
}

/// Which launches may touch a managed region (`cuStreamAttachMemAsync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attach {
    /// Every stream.
    Global,
    /// None: the host's only.
    Host,
    /// One stream.
    Stream(u64),
}

/// `cuMemAdvise` state of a managed region (kept per allocation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Advice {
    /// `CU_MEM_ADVISE_SET_READ_MOSTLY`.
    pub read_mostly: bool,
    /// Preferred location: a device, `CU_DEVICE_CPU`, or `CU_DEVICE_INVALID` (none).
    pub preferred: i32,
    /// Devices (or the CPU) that access it.
    pub accessed_by: Vec<i32>,
    /// Last prefetch target, `CU_DEVICE_INVALID` when never prefetched.
    pub last_prefetch: i32,
}

/// One mirrored region.
#[derive(Debug)]
pub struct Region {
    /// Kind.
    pub kind: RegionKind,
    /// Device address.
    pub dev: u64,
    /// Host address of the mirror.
    pub host: usize,
    /// Bytes the guest asked for.
    pub len: usize,
    /// Bytes of the device allocation and of an owned mirror mapping (whole pages).
    pub mapped: usize,
    /// Context it was allocated in.
    pub ctx: u64,
    /// `cuMemHostAlloc` / `cuMemHostRegister` / `cuMemAllocManaged` flags.
    pub flags: u32,
    /// Launch visibility.
    pub attach: Attach,
    /// Advice.
    pub advice: Advice,
    /// Whether the device holds the current data (a launch ran since the last pull).
    pub device_owned: bool,
    /// A unique id (`CU_POINTER_ATTRIBUTE_BUFFER_ID`).
    pub id: u64,
    /// The hash of each page (`vgpu_proto::pagehash`) as the host and the device both held it
    /// at the last move; empty when unknown. A move then carries only the pages that differ.
    pub hashes: Vec<u64>,
    /// The module of a `__managed__` variable (0: an allocation). Its mirror pages are
    /// shared with the module's other variables and counted in `State::module_pages`.
    pub module: u64,
}

impl Region {
    /// Whether the region owns its mirror mapping (`mapped` bytes at `host`).
    fn owns_mapping(&self) -> bool {
        !matches!(self.kind, RegionKind::Registered | RegionKind::Pinned) && self.module == 0
    }

    fn visible_to(&self, stream: u64) -> bool {
        match self.attach {
            Attach::Global => true,
            Attach::Host => false,
            Attach::Stream(s) => s == stream,
        }
    }
}

/// Counters of mirror traffic (for benchmarks and tests).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MirrorStats {
    /// Bytes pushed to the device before launches.
    pub pushed: u64,
    /// Bytes pulled back at synchronizations.
    pub pulled: u64,
}

#[derive(Debug, Default)]
struct State {
    /// By device address.
    regions: BTreeMap<u64, Region>,
    /// Host address → device address of `Registered` regions.
    registered: BTreeMap<usize, u64>,
    /// Flags of plain (unmapped) `cuMemHostAlloc` buffers, for `cuMemHostGetFlags`.
    host_flags: HashMap<usize, u32>,
    next_id: u64,
    stats: MirrorStats,
    /// Pools whose handles this process got: for `cuMemPoolSetAccess`.
    pools: HashMap<u64, ()>,
    /// `cuMemAllocAsync` blocks: pointer → pool, for `CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE`.
    pool_blocks: HashMap<u64, u64>,
    /// Mirror pages of `__managed__` module variables → how many variables use each.
    module_pages: BTreeMap<u64, u32>,
}

fn state() -> MutexGuard<'static, State> {
    static S: OnceLock<Mutex<State>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(State::default()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn ctx() -> CuRes<u64> {
    drv::driver()?;
    drv::current_ctx().ok_or(cuda::CUDA_ERROR_INVALID_CONTEXT)
}

fn round_pages(n: usize) -> Option<usize> {
    n.checked_add(PAGE - 1).map(|x| x / PAGE * PAGE)
}

/// The mirror's bytes.
///
/// # Safety
/// `r`'s mirror must be mapped (regions are removed before their mapping goes away).
unsafe fn mirror(r: &Region) -> &'static mut [u8] {
    // SAFETY: the region's host range is a live mapping of `len` bytes (this function's
    // contract): owned by the region, or the registered memory the guest promised to keep
    // until it unregisters it.
    unsafe { std::slice::from_raw_parts_mut(r.host as *mut u8, r.len) }
}

fn push(st: &mut State, dev: u64, stream: u64) -> CuRes<()> {
    let Some(r) = st.regions.get_mut(&dev) else {
        return Ok(());
    };
    if r.device_owned {
        return Ok(());
    }
    // SAFETY: the region is registered, so its mirror is mapped.
    let bytes = unsafe { mirror(r) };
    let now = pagehash::page_hashes(bytes);
    let mut pushed = 0u64;
    if r.hashes.len() == now.len() {
        // Only the runs of pages the host changed since the last move.
        let mut i = 0;
        while i < now.len() {
            if now[i] == r.hashes[i] {
                i += 1;
                continue;
            }
            let start = i;
            while i < now.len() && now[i] != r.hashes[i] {
                i += 1;
            }
            let from = start * pagehash::DELTA_PAGE;
            let to = (i * pagehash::DELTA_PAGE).min(bytes.len());
            drv::memcpy_htod_raw(r.dev + from as u64, &bytes[from..to], stream, false)?;
            pushed += (to - from) as u64;
        }
    } else {
        drv::memcpy_htod_raw(r.dev, bytes, stream, false)?;
        pushed = bytes.len() as u64;
    }
    r.hashes = now;
    r.device_owned = true;
    st.stats.pushed += pushed;
    Ok(())
}

fn pull(st: &mut State, dev: u64) -> CuRes<()> {
    let Some(r) = st.regions.get_mut(&dev) else {
        return Ok(());
    };
    if !r.device_owned {
        return Ok(());
    }
    // SAFETY: the region is registered, so its mirror is mapped.
    let bytes = unsafe { mirror(r) };
    // Marked first: a failed pull (an earlier kernel's error) leaves the host the owner, and
    // what the mirror holds unknown to the hashes.
    r.device_owned = false;
    let hashes = std::mem::take(&mut r.hashes);
    let pulled = if hashes.len() == pagehash::pages(bytes.len()) {
        let mut hashes = hashes;
        let n = drv::memcpy_dtoh_delta(bytes, r.dev, &mut hashes)?;
        r.hashes = hashes;
        n
    } else {
        drv::memcpy_dtoh_raw(bytes, r.dev, 0)?;
        r.hashes = pagehash::page_hashes(bytes);
        bytes.len() as u64
    };
    st.stats.pulled += pulled;
    Ok(())
}

/// The region containing device address `ptr` (as its key).
fn region_at(st: &State, ptr: u64) -> Option<u64> {
    let (&base, r) = st.regions.range(..=ptr).next_back()?;
    (ptr - base < r.mapped.max(r.len) as u64).then_some(base)
}

/// The region whose host mirror contains `addr`.
fn region_of_host(st: &State, addr: usize) -> Option<u64> {
    if let Some(dev) = region_at(st, addr as u64)
        && st.regions[&dev].owns_mapping()
    {
        return Some(dev);
    }
    let (&host, &dev) = st.registered.range(..=addr).next_back()?;
    let r = st.regions.get(&dev)?;
    (addr - host < r.len).then_some(dev)
}

// ---- hooks called by crate::driver ----------------------------------------------------

/// Whether `ptr` is a device address of managed or mapped memory (as kernels address it).
pub fn is_mirrored_device_ptr(ptr: u64) -> bool {
    region_at(&state(), ptr).is_some()
}

/// Before a launch on `stream`: the regions it may touch go to the device.
pub fn before_launch(stream: u64) -> CuRes<()> {
    let mut st = state();
    let keys: Vec<u64> = st
        .regions
        .values()
        .filter(|r| !r.device_owned && r.visible_to(stream))
        .map(|r| r.dev)
        .collect();
    for k in keys {
        push(&mut st, k, stream)?;
    }
    Ok(())
}

/// After a synchronizing call: every region the device owns comes back to the host.
pub fn after_sync() -> CuRes<()> {
    let mut st = state();
    let keys: Vec<u64> = st
        .regions
        .values()
        .filter(|r| r.device_owned)
        .map(|r| r.dev)
        .collect();
    for k in keys {
        pull(&mut st, k)?;
    }
    Ok(())
}

/// Mirror traffic so far.
pub fn mirror_stats() -> MirrorStats {
    state().stats
}

/// Host bytes for `[ptr, ptr + len)` when it lies in a mirrored region (by device or host
/// address), taken back from the device first. `Some(Err)` when it starts in one but does not
/// fit in it.
fn host_view(ptr: u64, len: usize) -> Option<CuRes<&'static mut [u8]>> {
    let mut st = state();
    let dev = region_at(&st, ptr).or_else(|| region_of_host(&st, ptr as usize))?;
    let r = &st.regions[&dev];
    let off = if r.kind == RegionKind::Registered && (ptr < r.dev || ptr - r.dev >= r.len as u64) {
        ptr as usize - r.host
    } else {
        (ptr - r.dev) as usize
    };
    if off.checked_add(len).is_none_or(|e| e > r.len) {
        return Some(Err(cuda::CUDA_ERROR_INVALID_VALUE));
    }
    if let Err(e) = pull(&mut st, dev) {
        return Some(Err(e));
    }
    let r = &st.regions[&dev];
    // SAFETY: the region is registered, so its mirror is mapped; `off + len <= r.len`.
    let m = unsafe { mirror(r) };
    Some(Ok(&mut m[off..off + len]))
}

/// `cuMemcpyHtoD*` into mirrored memory: a host copy. `None`: not mirrored.
pub fn htod_hook(dst: u64, src: &[u8]) -> Option<CuRes<()>> {
    let v = host_view(dst, src.len())?;
    Some(v.map(|d| d.copy_from_slice(src)))
}

/// `cuMemcpyDtoH*` from mirrored memory: a host copy. `None`: not mirrored.
pub fn dtoh_hook(dst: &mut [u8], src: u64) -> Option<CuRes<()>> {
    let v = host_view(src, dst.len())?;
    Some(v.map(|s| dst.copy_from_slice(s)))
}

/// `cuMemcpyDtoD*` with a mirrored side. `None`: neither side is mirrored.
pub fn dtod_hook(dst: u64, src: u64, len: u64, stream: u64, sync: bool) -> Option<CuRes<()>> {
    let n = usize::try_from(len).ok()?;
    let (d, s) = (host_view(dst, n), host_view(src, n));
    match (d, s) {
        (None, None) => None,
        (Some(d), Some(s)) => Some(d.and_then(|d| {
            let s = s?;
            // SAFETY: both are valid for `n` bytes; `copy` allows overlap.
            unsafe { std::ptr::copy(s.as_ptr(), d.as_mut_ptr(), n) };
            Ok(())
        })),
        (Some(d), None) => Some(d.and_then(|d| drv::memcpy_dtoh_raw(d, src, stream))),
        (None, Some(s)) => Some(s.and_then(|s| drv::memcpy_htod_raw(dst, s, stream, sync))),
    }
}

/// `cuMemsetD*` on mirrored memory: a host fill. `None`: not mirrored.
pub fn memset_hook(dst: u64, value: u32, elem_size: u32, count: u64) -> Option<CuRes<()>> {
    let bytes = count.checked_mul(u64::from(elem_size))?;
    let v = host_view(dst, usize::try_from(bytes).ok()?)?;
    Some(v.map(|d| {
        let pat = &value.to_le_bytes()[..elem_size as usize];
        for c in d.chunks_mut(elem_size as usize) {
            c.copy_from_slice(&pat[..c.len()]);
        }
    }))
}

/// How `cuMemcpy` treats a pointer in a mirrored region: `Some(true)` device (a registered
/// range's device address), `Some(false)` host (the mirror, taken back from the device).
pub fn space_hook(ptr: u64) -> Option<bool> {
    let mut st = state();
    let dev = region_at(&st, ptr).or_else(|| region_of_host(&st, ptr as usize))?;
    let r = &st.regions[&dev];
    if r.kind == RegionKind::Registered && ptr >= r.dev && ptr - r.dev < r.len as u64 {
        return Some(true);
    }
    let _ = pull(&mut st, dev);
    Some(false)
}

/// A context was destroyed (or the primary context reset): the host freed its managed
/// memory, so the mirrors go too.
pub fn context_gone(c: u64) {
    let mut st = state();
    let gone: Vec<u64> = st
        .regions
        .values()
        .filter(|r| r.ctx == c)
        .map(|r| r.dev)
        .collect();
    for dev in gone {
        if let Some(r) = st.regions.remove(&dev) {
            drop_region(&mut st, r);
        }
    }
}

fn drop_region(st: &mut State, r: Region) {
    if r.module != 0 {
        release_pages(st, r.dev, r.len);
    } else if r.owns_mapping() {
        // SAFETY: the mapping was created by `map_mirror` for exactly this range and nothing
        // else refers to it now that the region is gone.
        unsafe { libc::munmap(r.host as *mut libc::c_void, r.mapped) };
    } else {
        st.registered.remove(&r.host);
    }
}

// ---- allocation ---------------------------------------------------------------------------

/// Maps `len` bytes of zeroed memory at exactly `addr`, never replacing a mapping; false when
/// the address is taken.
pub(crate) fn map_mirror(addr: u64, len: usize) -> bool {
    // SAFETY: an anonymous private mapping; MAP_FIXED_NOREPLACE never replaces an existing
    // mapping, and a kernel that ignores the flag (before Linux 4.17) treats the address as a
    // hint, which the check below catches.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return false;
    }
    if p as u64 != addr {
        // SAFETY: `p` is the mapping just created, of `len` bytes.
        unsafe { libc::munmap(p, len) };
        return false;
    }
    true
}

/// Allocates device memory of `kind` (`MemAllocMapped` kind) and maps the mirror at the same
/// address. Device addresses that the guest already uses are skipped.
fn alloc_mirrored(size: usize, kind: u32) -> CuRes<(u64, usize, u64)> {
    if size == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let c = ctx()?;
    let d = drv::driver()?;
    let mapped = round_pages(size).ok_or(cuda::CUDA_ERROR_OUT_OF_MEMORY)?;
    let mut refused = Vec::new();
    let mut result = Err(cuda::CUDA_ERROR_OUT_OF_MEMORY);
    for _ in 0..8 {
        let ptr = d
            .call(
                &msg::MemAllocMapped {
                    ctx: c,
                    size: mapped as u64,
                    kind,
                },
                &[],
            )?
            .ptr;
        if map_mirror(ptr, mapped) {
            result = Ok((ptr, mapped, c));
            break;
        }
        crate::debug!("mirror address {ptr:#x} is taken in this process; trying another");
        refused.push(ptr);
    }
    for p in refused {
        let _ = d.call(&msg::MemFree { ctx: c, ptr: p }, &[]);
    }
    result
}

fn insert(st: &mut State, mut r: Region) {
    st.next_id += 1;
    r.id = st.next_id;
    if r.kind == RegionKind::Registered {
        st.registered.insert(r.host, r.dev);
    }
    st.regions.insert(r.dev, r);
}

/// `cuMemAllocManaged`.
pub fn alloc_managed(size: usize, flags: u32) -> CuRes<u64> {
    if flags != ATTACH_GLOBAL && flags != ATTACH_HOST {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let (ptr, mapped, c) = alloc_mirrored(size, 1)?;
    insert(
        &mut state(),
        Region {
            kind: RegionKind::Managed,
            dev: ptr,
            host: ptr as usize,
            len: size,
            mapped,
            ctx: c,
            flags,
            attach: if flags == ATTACH_HOST {
                Attach::Host
            } else {
                Attach::Global
            },
            advice: Advice {
                preferred: DEVICE_INVALID,
                last_prefetch: DEVICE_INVALID,
                ..Advice::default()
            },
            device_owned: false,
            id: 0,
            hashes: Vec::new(),
            module: 0,
        },
    );
    Ok(ptr)
}

/// A region of page-locked host memory at `host` with device address `dev` (the same address
/// but for a registered range), owned by the host until the next launch.
fn host_region(
    kind: RegionKind,
    (dev, host): (u64, usize),
    len: usize,
    mapped: usize,
    ctx: u64,
    flags: u32,
) -> Region {
    Region {
        kind,
        dev,
        host,
        len,
        mapped,
        ctx,
        flags,
        attach: Attach::Global,
        advice: Advice::default(),
        device_owned: false,
        id: 0,
        hashes: Vec::new(),
        module: 0,
    }
}

/// `cuMemHostAlloc` with `DEVICEMAP`: host memory kernels reach at the same address.
pub fn host_alloc_mapped(size: usize, flags: u32) -> CuRes<*mut u8> {
    let (ptr, mapped, c) = alloc_mirrored(size.max(1), 2)?;
    let at = (ptr, ptr as usize);
    let r = host_region(RegionKind::HostAlloc, at, size.max(1), mapped, c, flags);
    insert(&mut state(), r);
    Ok(ptr as *mut u8)
}

/// Whether a mirrored region starts at device address `dev`.
pub fn has_region(dev: u64) -> bool {
    state().regions.contains_key(&dev)
}

/// A page-locked buffer at `va` (host and device address alike) becomes a mirrored region of
/// context `ctx`, owned by the host until the next launch ([`crate::pinned_uva`]).
pub fn add_pinned_region(va: u64, len: usize, ctx: u64) {
    let Some(mapped) = round_pages(len.max(1)) else {
        return;
    };
    let r = host_region(
        RegionKind::Pinned,
        (va, va as usize),
        len.max(1),
        mapped,
        ctx,
        0,
    );
    insert(&mut state(), r);
}

/// The page-locked buffer at `va` is being freed: its region goes (the host memory stays the
/// buffer's, unmapped by its owner).
pub fn remove_pinned_region(va: u64) {
    let mut st = state();
    if let Some(r) = st.regions.remove(&va) {
        drop_region(&mut st, r);
    }
}

/// Records the flags of a plain `cuMemHostAlloc` buffer.
pub fn note_host_flags(p: usize, flags: u32) {
    state().host_flags.insert(p, flags);
}

/// Whether `p` is a buffer `cuMemHostAlloc` made with `CU_MEMHOSTALLOC_DEVICEMAP` (its free also
/// frees a device mirror).
pub fn is_mapped_host_alloc(p: usize) -> bool {
    state()
        .regions
        .get(&(p as u64))
        .is_some_and(|r| r.kind == RegionKind::HostAlloc)
}

/// Whether `addr` starts a range registered with `CU_MEMHOSTREGISTER_DEVICEMAP` (its
/// unregistration reads back and frees a device mirror).
pub fn is_mapped_registration(addr: usize) -> bool {
    state().registered.contains_key(&addr)
}

/// `cuMemFreeHost` of a mapped buffer. `None`: `p` is not one.
pub fn host_free_hook(p: usize) -> Option<CuRes<()>> {
    let mut st = state();
    st.host_flags.remove(&p);
    match st.regions.get(&(p as u64)) {
        Some(r) if r.kind == RegionKind::HostAlloc => {}
        _ => return None,
    }
    Some(free_region(&mut st, p as u64))
}

fn free_region(st: &mut State, dev: u64) -> CuRes<()> {
    let d = drv::driver()?;
    let r = st
        .regions
        .remove(&dev)
        .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    let res = d
        .call(
            &msg::MemFree {
                ctx: r.ctx,
                ptr: r.dev,
            },
            &[],
        )
        .map(drop);
    drop_region(st, r);
    res
}

/// `cuMemFree` of managed memory (or of a pool block). `None`: an ordinary allocation.
pub fn free_hook(ptr: u64) -> Option<CuRes<()>> {
    // A block imported several times stays this process's pool memory until its last free
    // (`pool_import_still_open`, then `forget_pool_block`).
    let imported = pool_imports().contains_key(&ptr);
    let mut st = state();
    if !imported {
        st.pool_blocks.remove(&ptr);
    }
    match st.regions.get(&ptr) {
        Some(r) if r.kind == RegionKind::Managed && r.module == 0 => {
            Some(free_region(&mut st, ptr))
        }
        Some(_) => Some(Err(cuda::CUDA_ERROR_INVALID_VALUE)),
        None => None,
    }
}

// ---- __managed__ module variables ---------------------------------------------------------

/// The guest pages `[addr, addr + len)` touches.
fn pages_of(addr: u64, len: usize) -> impl Iterator<Item = u64> {
    let first = addr / PAGE as u64 * PAGE as u64;
    let end = addr.saturating_add(len.max(1) as u64);
    (first..end).step_by(PAGE)
}

/// Drops a variable's references to its mirror pages, unmapping the pages no variable uses.
fn release_pages(st: &mut State, addr: u64, len: usize) {
    for page in pages_of(addr, len) {
        let Some(n) = st.module_pages.get_mut(&page) else {
            continue;
        };
        *n -= 1;
        if *n == 0 {
            st.module_pages.remove(&page);
            // SAFETY: the page was mapped by `map_mirror` for module variables only, and the
            // last variable on it is gone.
            unsafe { libc::munmap(page as *mut libc::c_void, PAGE) };
        }
    }
}

/// A `__managed__` variable of module `module` at device address `addr` (what
/// `cuModuleGetGlobal` answered): the process reaches it at the same address, as managed
/// memory, from now on. Its mirror pages are mapped (shared with the module's other managed
/// variables) and filled with the device's bytes; coherence is then that of
/// `cuMemAllocManaged`. Asking again is a no-op. Fails with `CUDA_ERROR_NOT_SUPPORTED` when
/// the process already uses the address for something else.
pub fn adopt_module_variable(module: u64, addr: u64, len: usize, ctx: u64) -> CuRes<()> {
    let mut st = state();
    if st.regions.get(&addr).is_some_and(|r| r.module == module) {
        return Ok(());
    }
    let mut taken = Vec::new();
    for page in pages_of(addr, len) {
        if let Some(n) = st.module_pages.get_mut(&page) {
            *n += 1;
            taken.push(page);
            continue;
        }
        if !map_mirror(page, PAGE) {
            crate::warn!(
                "the __managed__ variable at {addr:#x} cannot be mapped into this process (the address is in use): the host cannot reach it"
            );
            for p in taken {
                release_pages(&mut st, p, 1);
            }
            return Err(cuda::CUDA_ERROR_NOT_SUPPORTED);
        }
        st.module_pages.insert(page, 1);
        taken.push(page);
    }
    insert(
        &mut st,
        Region {
            kind: RegionKind::Managed,
            dev: addr,
            host: addr as usize,
            len,
            mapped: 0,
            ctx,
            flags: ATTACH_GLOBAL,
            attach: Attach::Global,
            advice: Advice {
                preferred: DEVICE_INVALID,
                last_prefetch: DEVICE_INVALID,
                ..Advice::default()
            },
            // The device holds the variable's bytes (its initializer, or what kernels wrote):
            // they come to the mirror now, since the host reads it directly.
            device_owned: true,
            id: 0,
            hashes: Vec::new(),
            module,
        },
    );
    pull(&mut st, addr)
}

/// A module was unloaded: its `__managed__` variables' mirrors go.
pub fn module_gone(module: u64) {
    let mut st = state();
    let gone: Vec<u64> = st
        .regions
        .values()
        .filter(|r| r.module == module)
        .map(|r| r.dev)
        .collect();
    for dev in gone {
        if let Some(r) = st.regions.remove(&dev) {
            drop_region(&mut st, r);
        }
    }
}

/// `cuMemHostRegister` with `DEVICEMAP`: a device allocation that mirrors the guest's range.
pub fn register_mapped(addr: usize, size: usize, flags: u32) -> CuRes<()> {
    let c = ctx()?;
    let d = drv::driver()?;
    let mapped = round_pages(size).ok_or(cuda::CUDA_ERROR_OUT_OF_MEMORY)?;
    let ptr = d
        .call(
            &msg::MemAllocMapped {
                ctx: c,
                size: mapped as u64,
                kind: 3,
            },
            &[],
        )?
        .ptr;
    let r = host_region(RegionKind::Registered, (ptr, addr), size, mapped, c, flags);
    insert(&mut state(), r);
    Ok(())
}

/// `cuMemHostUnregister` of a mapped registration. `None`: not one.
pub fn unregister_hook(addr: usize) -> Option<CuRes<()>> {
    let mut st = state();
    let dev = *st.registered.get(&addr)?;
    // The guest keeps the memory: it gets the kernels' last writes.
    let r = pull(&mut st, dev);
    Some(r.and_then(|()| free_region(&mut st, dev)))
}

/// `cuMemHostGetDevicePointer`: the device address of mapped host memory.
pub fn host_device_pointer(p: usize, flags: u32) -> CuRes<u64> {
    if flags != 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    drv::driver()?;
    let st = state();
    let dev = region_of_host(&st, p).ok_or_else(|| {
        crate::debug!(
            "cuMemHostGetDevicePointer: {p:#x} is not mapped host memory (allocate it with CU_MEMHOSTALLOC_DEVICEMAP or register it with CU_MEMHOSTREGISTER_DEVICEMAP)"
        );
        cuda::CUDA_ERROR_INVALID_VALUE
    })?;
    let r = &st.regions[&dev];
    // Managed memory has none, nor page-locked memory without DEVICEMAP (its kernels use the
    // host pointer), as with CUDA.
    if matches!(r.kind, RegionKind::Managed | RegionKind::Pinned) {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(r.dev + (p - r.host) as u64)
}

/// `cuMemHostGetFlags`.
pub fn host_get_flags(p: usize) -> CuRes<u32> {
    drv::driver()?;
    let st = state();
    if let Some(dev) = region_of_host(&st, p) {
        let r = &st.regions[&dev];
        if r.kind == RegionKind::HostAlloc {
            return Ok(r.flags);
        }
    }
    st.host_flags
        .get(&p)
        .copied()
        .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)
}

// ---- managed memory -------------------------------------------------------------------------

fn managed_region(st: &State, ptr: u64, len: u64) -> CuRes<u64> {
    let dev = region_at(st, ptr).ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    let r = &st.regions[&dev];
    if r.kind != RegionKind::Managed
        || (ptr - r.dev)
            .checked_add(len)
            .is_none_or(|e| e > r.len as u64)
    {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(dev)
}

/// `cuStreamAttachMemAsync`. The attachment changes at once; the region is first taken
/// back from the device, so no launch sees it half-way.
pub fn stream_attach(stream: u64, ptr: u64, len: usize, flags: u32) -> CuRes<()> {
    drv::driver()?;
    let mut st = state();
    let dev = managed_region(&st, ptr, 0)?;
    let r = &st.regions[&dev];
    if ptr != r.dev || (len != 0 && len != r.len) {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let attach = match flags {
        ATTACH_GLOBAL => Attach::Global,
        ATTACH_HOST => Attach::Host,
        ATTACH_SINGLE if stream != 0 && stream != 1 && stream != drv::STREAM_PER_THREAD => {
            Attach::Stream(stream)
        }
        _ => return Err(cuda::CUDA_ERROR_INVALID_VALUE),
    };
    pull(&mut st, dev)?;
    if let Some(r) = st.regions.get_mut(&dev) {
        r.attach = attach;
    }
    Ok(())
}

/// `cuMemPrefetchAsync`: to the device, the region is copied there now (ordered on
/// `stream`); to the CPU, it comes back at the next synchronization as always.
pub fn prefetch(ptr: u64, len: usize, device: i32, stream: u64) -> CuRes<()> {
    drv::driver()?;
    if device != 0 && device != DEVICE_CPU {
        return Err(cuda::CUDA_ERROR_INVALID_DEVICE);
    }
    let mut st = state();
    let dev = managed_region(&st, ptr, len as u64)?;
    if device == 0 {
        push(&mut st, dev, stream)?;
    }
    if let Some(r) = st.regions.get_mut(&dev) {
        r.advice.last_prefetch = device;
    }
    Ok(())
}

/// `CU_MEM_ADVISE_*`.
pub mod advise {
    /// `CU_MEM_ADVISE_SET_READ_MOSTLY`.
    pub const SET_READ_MOSTLY: i32 = 1;
    /// `CU_MEM_ADVISE_UNSET_READ_MOSTLY`.
    pub const UNSET_READ_MOSTLY: i32 = 2;
    /// `CU_MEM_ADVISE_SET_PREFERRED_LOCATION`.
    pub const SET_PREFERRED_LOCATION: i32 = 3;
    /// `CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION`.
    pub const UNSET_PREFERRED_LOCATION: i32 = 4;
    /// `CU_MEM_ADVISE_SET_ACCESSED_BY`.
    pub const SET_ACCESSED_BY: i32 = 5;
    /// `CU_MEM_ADVISE_UNSET_ACCESSED_BY`.
    pub const UNSET_ACCESSED_BY: i32 = 6;
}

/// `cuMemAdvise`: recorded (per allocation) for `cuMemRangeGetAttribute`; it changes no
/// placement, since the mirror scheme already decides where the data is.
pub fn advise(ptr: u64, len: usize, advice: i32, device: i32) -> CuRes<()> {
    drv::driver()?;
    let mut st = state();
    let dev = managed_region(&st, ptr, len as u64)?;
    let needs_device = matches!(
        advice,
        advise::SET_PREFERRED_LOCATION | advise::SET_ACCESSED_BY | advise::UNSET_ACCESSED_BY
    );
    if needs_device && device != 0 && device != DEVICE_CPU {
        return Err(cuda::CUDA_ERROR_INVALID_DEVICE);
    }
    let a = &mut st.regions.get_mut(&dev).expect("region just found").advice;
    match advice {
        advise::SET_READ_MOSTLY => a.read_mostly = true,
        advise::UNSET_READ_MOSTLY => a.read_mostly = false,
        advise::SET_PREFERRED_LOCATION => a.preferred = device,
        advise::UNSET_PREFERRED_LOCATION => a.preferred = DEVICE_INVALID,
        advise::SET_ACCESSED_BY => {
            if !a.accessed_by.contains(&device) {
                a.accessed_by.push(device);
            }
        }
        advise::UNSET_ACCESSED_BY => a.accessed_by.retain(|&d| d != device),
        _ => return Err(cuda::CUDA_ERROR_INVALID_VALUE),
    }
    Ok(())
}

/// `CU_MEM_RANGE_ATTRIBUTE_*`.
pub mod range_attr {
    /// `READ_MOSTLY` (int).
    pub const READ_MOSTLY: i32 = 1;
    /// `PREFERRED_LOCATION` (int).
    pub const PREFERRED_LOCATION: i32 = 2;
    /// `ACCESSED_BY` (int array).
    pub const ACCESSED_BY: i32 = 3;
    /// `LAST_PREFETCH_LOCATION` (int).
    pub const LAST_PREFETCH_LOCATION: i32 = 4;
    /// `PREFERRED_LOCATION_TYPE` (int, CUDA 12.2).
    pub const PREFERRED_LOCATION_TYPE: i32 = 5;
    /// `PREFERRED_LOCATION_ID` (int).
    pub const PREFERRED_LOCATION_ID: i32 = 6;
    /// `LAST_PREFETCH_LOCATION_TYPE` (int).
    pub const LAST_PREFETCH_LOCATION_TYPE: i32 = 7;
    /// `LAST_PREFETCH_LOCATION_ID` (int).
    pub const LAST_PREFETCH_LOCATION_ID: i32 = 8;
}

/// `CUmemLocationType` of a device number (`CU_DEVICE_CPU` is the host).
pub fn location_type(device: i32) -> i32 {
    match device {
        DEVICE_CPU => 2,
        DEVICE_INVALID => 0,
        _ => 1,
    }
}

/// `cuMemRangeGetAttribute`: fills `out` (`dataSize / 4` ints).
pub fn range_attribute(out: &mut [i32], attribute: i32, ptr: u64, len: usize) -> CuRes<()> {
    drv::driver()?;
    let st = state();
    let dev = managed_region(&st, ptr, len as u64)?;
    let a = &st.regions[&dev].advice;
    let one = |out: &mut [i32], v: i32| match out {
        [o] => {
            *o = v;
            Ok(())
        }
        _ => Err(cuda::CUDA_ERROR_INVALID_VALUE),
    };
    let id = |d: i32| if d == DEVICE_CPU { 0 } else { d };
    match attribute {
        range_attr::READ_MOSTLY => one(out, i32::from(a.read_mostly)),
        range_attr::PREFERRED_LOCATION => one(out, a.preferred),
        range_attr::LAST_PREFETCH_LOCATION => one(out, a.last_prefetch),
        range_attr::PREFERRED_LOCATION_TYPE => one(out, location_type(a.preferred)),
        range_attr::PREFERRED_LOCATION_ID => one(out, id(a.preferred)),
        range_attr::LAST_PREFETCH_LOCATION_TYPE => one(out, location_type(a.last_prefetch)),
        range_attr::LAST_PREFETCH_LOCATION_ID => one(out, id(a.last_prefetch)),
        range_attr::ACCESSED_BY => {
            if out.is_empty() {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
            out.fill(DEVICE_INVALID);
            for (o, d) in out.iter_mut().zip(&a.accessed_by) {
                *o = *d;
            }
            Ok(())
        }
        _ => Err(cuda::CUDA_ERROR_INVALID_VALUE),
    }
}

// ---- pointer attributes ---------------------------------------------------------------------

/// `CU_POINTER_ATTRIBUTE_*`.
pub mod ptr_attr {
    /// `CONTEXT` (CUcontext).
    pub const CONTEXT: i32 = 1;
    /// `MEMORY_TYPE` (unsigned int).
    pub const MEMORY_TYPE: i32 = 2;
    /// `DEVICE_POINTER` (CUdeviceptr).
    pub const DEVICE_POINTER: i32 = 3;
    /// `HOST_POINTER` (void *).
    pub const HOST_POINTER: i32 = 4;
    /// `P2P_TOKENS` (struct).
    pub const P2P_TOKENS: i32 = 5;
    /// `SYNC_MEMOPS` (bool as unsigned int).
    pub const SYNC_MEMOPS: i32 = 6;
    /// `BUFFER_ID` (unsigned long long).
    pub const BUFFER_ID: i32 = 7;
    /// `IS_MANAGED` (bool as unsigned int).
    pub const IS_MANAGED: i32 = 8;
    /// `DEVICE_ORDINAL` (int).
    pub const DEVICE_ORDINAL: i32 = 9;
    /// `IS_LEGACY_CUDA_IPC_CAPABLE` (bool).
    pub const IS_LEGACY_CUDA_IPC_CAPABLE: i32 = 10;
    /// `RANGE_START_ADDR` (CUdeviceptr).
    pub const RANGE_START_ADDR: i32 = 11;
    /// `RANGE_SIZE` (size_t).
    pub const RANGE_SIZE: i32 = 12;
    /// `MAPPED` (bool).
    pub const MAPPED: i32 = 13;
    /// `ALLOWED_HANDLE_TYPES` (CUmemAllocationHandleType as unsigned long long).
    pub const ALLOWED_HANDLE_TYPES: i32 = 14;
    /// `IS_GPU_DIRECT_RDMA_CAPABLE` (bool).
    pub const IS_GPU_DIRECT_RDMA_CAPABLE: i32 = 15;
    /// `ACCESS_FLAGS` (unsigned int).
    pub const ACCESS_FLAGS: i32 = 16;
    /// `MEMPOOL_HANDLE` (CUmemoryPool).
    pub const MEMPOOL_HANDLE: i32 = 17;
    /// `MAPPING_SIZE` (size_t).
    pub const MAPPING_SIZE: i32 = 18;
    /// `MAPPING_BASE_ADDR` (void *).
    pub const MAPPING_BASE_ADDR: i32 = 19;
    /// `MEMORY_BLOCK_ID` (unsigned long long).
    pub const MEMORY_BLOCK_ID: i32 = 20;
}

/// `CU_MEMORYTYPE_HOST`.
pub const MEMORYTYPE_HOST: u64 = 1;
/// `CU_MEMORYTYPE_DEVICE`.
pub const MEMORYTYPE_DEVICE: u64 = 2;

/// What a pointer is, for `cuPointerGetAttribute(s)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointerInfo {
    /// Context.
    pub ctx: u64,
    /// `CU_MEMORYTYPE_*`.
    pub memory_type: u64,
    /// Device address (0: none).
    pub device_pointer: u64,
    /// Host address (0: none).
    pub host_pointer: u64,
    /// Managed memory.
    pub managed: bool,
    /// Reachable by kernels and the host alike.
    pub mapped: bool,
    /// Start and size of the allocation.
    pub range: (u64, u64),
    /// Unique id.
    pub buffer_id: u64,
    /// The pool a `cuMemAllocAsync` block came from (0: none).
    pub pool: u64,
}

/// Describes `ptr` when it lies in managed or mapped host memory (by device or host address).
pub fn mirrored_info(ptr: u64) -> Option<PointerInfo> {
    let st = state();
    let dev = region_at(&st, ptr).or_else(|| region_of_host(&st, ptr as usize))?;
    let r = &st.regions[&dev];
    let managed = r.kind == RegionKind::Managed;
    let in_dev = ptr >= r.dev && ptr - r.dev < r.len as u64;
    let off = if in_dev {
        ptr - r.dev
    } else {
        (ptr as usize - r.host) as u64
    };
    Some(PointerInfo {
        ctx: r.ctx,
        memory_type: if managed {
            MEMORYTYPE_DEVICE
        } else {
            MEMORYTYPE_HOST
        },
        device_pointer: r.dev + off,
        host_pointer: r.host as u64 + off,
        managed,
        mapped: true,
        range: if in_dev {
            (r.dev, r.len as u64)
        } else {
            (r.host as u64, r.len as u64)
        },
        buffer_id: r.id,
        pool: 0,
    })
}

/// The pool a `cuMemAllocAsync` block starting at `ptr` came from.
pub fn pool_of(ptr: u64) -> Option<CuRes<u64>> {
    let block = state().pool_blocks.get(&ptr).copied()?;
    Some(match block {
        0 => device_mem_pool(0, false),
        p => Ok(p),
    })
}

// ---- memory pools ----------------------------------------------------------------------------

/// `cuMemPoolCreate` (one device, pinned device memory; exportable as a POSIX file descriptor
/// to other processes of the VM, or not at all).
pub fn pool_create(
    location_type: i32,
    location_id: i32,
    handle_types: u32,
    max_size: u64,
) -> CuRes<u64> {
    let c = ctx()?;
    if location_type != 1 || location_id != 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    if handle_types & !(HANDLE_TYPE_POSIX_FD as u32) != 0 {
        crate::debug!(
            "cuMemPoolCreate: pools are exported as POSIX file descriptors only, within the VM (handle types {handle_types:#x}); across VMs this is never allowed"
        );
        return Err(cuda::CUDA_ERROR_NOT_SUPPORTED);
    }
    let h = drv::driver()?
        .call(
            &msg::MemPoolCreate {
                ctx: c,
                max_size,
                handle_types,
            },
            &[],
        )?
        .handle;
    state().pools.insert(h, ());
    Ok(h)
}

/// `cuMemPoolDestroy`.
pub fn pool_destroy(pool: u64) -> CuRes<()> {
    let c = ctx()?;
    crate::sync_wait::before_settling(c)?;
    drv::driver()?.call(&msg::MemPoolDestroy { ctx: c, pool }, &[])?;
    state().pools.remove(&pool);
    Ok(())
}

/// `cuDeviceGetMemPool` / `cuDeviceGetDefaultMemPool`.
pub fn device_mem_pool(device: i32, default: bool) -> CuRes<u64> {
    let d = drv::driver()?;
    if device != 0 {
        return Err(cuda::CUDA_ERROR_INVALID_DEVICE);
    }
    let h = d
        .call(
            &msg::DeviceGetMemPool {
                device: 0,
                default: u32::from(default),
            },
            &[],
        )?
        .handle;
    state().pools.insert(h, ());
    Ok(h)
}

/// `cuDeviceSetMemPool`.
pub fn device_set_mem_pool(device: i32, pool: u64) -> CuRes<()> {
    let d = drv::driver()?;
    if device != 0 {
        return Err(cuda::CUDA_ERROR_INVALID_DEVICE);
    }
    d.call(&msg::DeviceSetMemPool { device: 0, pool }, &[])
        .map(drop)
}

/// `cuMemPoolSetAttribute` (the value widened to 64 bits).
pub fn pool_set_attribute(pool: u64, attribute: i32, value: u64) -> CuRes<()> {
    drv::driver()?
        .call(
            &msg::MemPoolSetAttribute {
                pool,
                attribute,
                value,
            },
            &[],
        )
        .map(drop)
}

/// `cuMemPoolGetAttribute` (the value widened to 64 bits).
pub fn pool_get_attribute(pool: u64, attribute: i32) -> CuRes<u64> {
    Ok(drv::driver()?
        .call(&msg::MemPoolGetAttribute { pool, attribute }, &[])?
        .bytes)
}

/// Whether a pool attribute is an `int` (the reuse policies) rather than a `cuuint64_t`.
pub fn pool_attribute_is_int(attribute: i32) -> bool {
    (1..=3).contains(&attribute)
}

/// `cuMemPoolTrimTo`.
pub fn pool_trim(pool: u64, keep: u64) -> CuRes<()> {
    drv::driver()?
        .call(&msg::MemPoolTrimTo { pool, keep }, &[])
        .map(drop)
}

/// Checks a pool handle (for `cuMemPoolSetAccess`/`GetAccess`, which need no round trip
/// otherwise: the one device always has read-write access to its pools).
pub fn pool_check(pool: u64) -> CuRes<()> {
    pool_get_attribute(pool, 4).map(drop)
}

/// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync` (`pool` 0: the current pool).
pub fn alloc_async(size: u64, pool: u64, stream: u64) -> CuRes<u64> {
    let c = ctx()?;
    if let Some(r) = crate::stream_capture::capture_mem_alloc(stream, size) {
        return r;
    }
    let stream = drv::wire_stream(stream)?;
    let ptr = drv::driver()?
        .call(
            &msg::MemAllocAsync {
                ctx: c,
                stream,
                pool,
                size,
            },
            &[],
        )?
        .ptr;
    state().pool_blocks.insert(ptr, pool);
    drv::note_device_range(ptr, size);
    Ok(ptr)
}

/// `cuMemFreeAsync`: no round trip; an error surfaces at the next synchronizing call.
pub fn free_async(ptr: u64, stream: u64) -> CuRes<()> {
    let c = ctx()?;
    if let Some(r) = crate::stream_capture::capture_mem_free(stream, ptr) {
        return r;
    }
    if crate::graph::api::is_graph_alloc(ptr) {
        return crate::graph::api::free_graph_alloc(ptr, Some(stream));
    }
    if state().regions.contains_key(&ptr) {
        // Managed memory: its mirror goes at once (CUDA frees it in stream order; the guest
        // may not touch it after this call either way).
        drv::stream_synchronize(stream)?;
        return free_hook(ptr).unwrap_or(Ok(()));
    }
    // Memory not from a pool is freed once all earlier work is done (vgpud waits for it as it
    // takes the request, holding back the process's later calls): that wait happens first.
    crate::sync_wait::before_settling_if(c, || !state().pool_blocks.contains_key(&ptr))?;
    if !pool_import_still_open(ptr) {
        forget_pool_block(ptr);
        drv::forget_device_range(ptr);
    }
    drv::driver()?.post(
        &msg::MemFreeAsync {
            ctx: c,
            stream: drv::wire_stream(stream)?,
            ptr,
        },
        &[],
    )
}

/// What the file descriptor of a pool export holds before its token.
const POOL_EXPORT_MAGIC: &[u8; 8] = b"VGPUPOL1";
/// What a `CUmemPoolPtrExportData` vgpu made holds before its token.
const POOL_PTR_MAGIC: &[u8; 8] = b"VGPUPTR1";
/// Bytes of a `CUmemPoolPtrExportData`.
pub const POOL_PTR_EXPORT_SIZE: usize = 64;

/// Blocks this process opened with `cuMemPoolImportPointer`: base → times opened.
fn pool_imports() -> MutexGuard<'static, HashMap<u64, u32>> {
    static S: OnceLock<Mutex<HashMap<u64, u32>>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The token words of `bytes` after an 8-byte tag, if the tag is `magic`.
fn tagged_token(bytes: &[u8], magic: &[u8; 8]) -> Option<(u64, u64)> {
    if bytes.len() < 24 || &bytes[..8] != magic {
        return None;
    }
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[i..i + 8]);
        u64::from_le_bytes(w)
    };
    Some((word(8), word(16)))
}

/// `cuMemPoolExportToShareableHandle`: the bytes the file descriptor holds (a tag and the
/// VM-local token vgpud made).
pub fn pool_export(pool: u64, handle_type: i32) -> CuRes<Vec<u8>> {
    let c = ctx()?;
    if handle_type != HANDLE_TYPE_POSIX_FD {
        crate::debug!(
            "cuMemPoolExportToShareableHandle: pools are exported as POSIX file descriptors only (handle type {handle_type})"
        );
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let t = drv::driver()?.call(
        &msg::MemPoolExport {
            ctx: c,
            pool,
            handle_type: handle_type as u32,
        },
        &[],
    )?;
    let mut bytes = POOL_EXPORT_MAGIC.to_vec();
    bytes.extend_from_slice(&t.hi.to_le_bytes());
    bytes.extend_from_slice(&t.lo.to_le_bytes());
    Ok(bytes)
}

/// `cuMemPoolImportFromShareableHandle` from the bytes of the file descriptor: a pool handle
/// that allocates nothing and opens the blocks exported from the pool.
pub fn pool_import(bytes: &[u8]) -> CuRes<u64> {
    let c = ctx()?;
    let Some((hi, lo)) = tagged_token(bytes, POOL_EXPORT_MAGIC) else {
        crate::debug!("cuMemPoolImportFromShareableHandle: not a pool handle vgpu exported");
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    };
    let h = drv::driver()?
        .call(&msg::MemPoolImport { ctx: c, hi, lo }, &[])?
        .handle;
    state().pools.insert(h, ());
    Ok(h)
}

/// `cuMemPoolExportPointer`: the export data naming the block `ptr` starts.
pub fn pool_export_pointer(ptr: u64) -> CuRes<[u8; POOL_PTR_EXPORT_SIZE]> {
    let c = ctx()?;
    let t = drv::driver()?.call(&msg::MemPoolExportPointer { ctx: c, ptr }, &[])?;
    let mut d = [0u8; POOL_PTR_EXPORT_SIZE];
    d[..8].copy_from_slice(POOL_PTR_MAGIC);
    d[8..16].copy_from_slice(&t.hi.to_le_bytes());
    d[16..24].copy_from_slice(&t.lo.to_le_bytes());
    Ok(d)
}

/// `cuMemPoolImportPointer`: the exporter's address of the block, opened in this process
/// through the imported `pool` (freed with `cuMemFree`/`cuMemFreeAsync`, once per opening).
pub fn pool_import_pointer(pool: u64, data: &[u8; POOL_PTR_EXPORT_SIZE]) -> CuRes<u64> {
    let c = ctx()?;
    let Some((hi, lo)) = tagged_token(data, POOL_PTR_MAGIC) else {
        crate::debug!("cuMemPoolImportPointer: not export data vgpu made");
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    };
    let r = drv::driver()?.call(
        &msg::MemPoolImportPointer {
            ctx: c,
            pool,
            hi,
            lo,
        },
        &[],
    )?;
    *pool_imports().entry(r.base).or_insert(0) += 1;
    state().pool_blocks.insert(r.base, pool);
    drv::note_device_range(r.base, r.size);
    Ok(r.base)
}

/// Forgets the pool of the block at `ptr` (its last free in this process).
pub fn forget_pool_block(ptr: u64) {
    state().pool_blocks.remove(&ptr);
}

/// A free of `ptr` was sent: `true` when it ended one of several openings of an imported
/// block, so that the block is still this process's memory.
pub fn pool_import_still_open(ptr: u64) -> bool {
    let mut o = pool_imports();
    match o.get_mut(&ptr) {
        Some(n) if *n > 1 => {
            *n -= 1;
            true
        }
        Some(_) => {
            o.remove(&ptr);
            false
        }
        None => false,
    }
}

// ---- legacy interprocess memory (cuIpc*) ----------------------------------------------------

/// `CU_IPC_HANDLE_SIZE`: bytes of a `CUipcMemHandle` or `CUipcEventHandle`.
pub const IPC_HANDLE_SIZE: usize = 64;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, the only `cuIpcOpenMemHandle` flag (no peers here).
pub const IPC_MEM_LAZY_ENABLE_PEER_ACCESS: u32 = 0x1;
/// What a `CUipcMemHandle` vgpu made holds before its token.
const IPC_MAGIC: &[u8; 8] = b"VGPUIPC1";

/// Memory this process opened with `cuIpcOpenMemHandle`: base → times opened.
fn ipc_opened() -> MutexGuard<'static, HashMap<u64, u32>> {
    static S: OnceLock<Mutex<HashMap<u64, u32>>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// `cuIpcGetMemHandle`: a handle naming the `cuMemAlloc` allocation containing `ptr`, which
/// other processes of the same VM can open. It holds a random token vgpud made, never an
/// address.
pub fn ipc_get_mem_handle(ptr: u64) -> CuRes<[u8; IPC_HANDLE_SIZE]> {
    let c = ctx()?;
    let t = drv::driver()?.call(&msg::IpcGetMemHandle { ctx: c, ptr }, &[])?;
    let mut h = [0u8; IPC_HANDLE_SIZE];
    h[..8].copy_from_slice(IPC_MAGIC);
    h[8..16].copy_from_slice(&t.hi.to_le_bytes());
    h[16..24].copy_from_slice(&t.lo.to_le_bytes());
    Ok(h)
}

/// `cuIpcOpenMemHandle(_v2)`: the device pointer of memory another process of the VM exported.
pub fn ipc_open_mem_handle(handle: &[u8; IPC_HANDLE_SIZE], flags: u32) -> CuRes<u64> {
    let c = ctx()?;
    if flags & !IPC_MEM_LAZY_ENABLE_PEER_ACCESS != 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    if &handle[..8] != IPC_MAGIC {
        crate::debug!("cuIpcOpenMemHandle: not a handle vgpu made");
        return Err(cuda::CUDA_ERROR_INVALID_HANDLE);
    }
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&handle[i..i + 8]);
        u64::from_le_bytes(w)
    };
    let r = drv::driver()?.call(
        &msg::IpcOpenMemHandle {
            ctx: c,
            hi: word(8),
            lo: word(16),
        },
        &[],
    )?;
    *ipc_opened().entry(r.base).or_insert(0) += 1;
    drv::note_device_range(r.base, r.size);
    Ok(r.base)
}

/// `cuIpcCloseMemHandle`.
pub fn ipc_close_mem_handle(ptr: u64) -> CuRes<()> {
    let c = ctx()?;
    crate::sync_wait::before_settling(c)?;
    drv::driver()?.call(&msg::IpcCloseMemHandle { ctx: c, ptr }, &[])?;
    let mut o = ipc_opened();
    if let Some(n) = o.get_mut(&ptr) {
        *n -= 1;
        if *n == 0 {
            o.remove(&ptr);
            drv::forget_device_range(ptr);
        }
    }
    Ok(())
}

/// What a `CUipcEventHandle` vgpu made holds before its token.
const IPC_EVENT_MAGIC: &[u8; 8] = b"VGPUIPE1";

/// `cuIpcGetEventHandle`: a handle naming an event created with `CU_EVENT_INTERPROCESS |
/// CU_EVENT_DISABLE_TIMING`, which other processes of the same VM can open (a random token
/// vgpud made).
pub fn ipc_get_event_handle(event: u64) -> CuRes<[u8; IPC_HANDLE_SIZE]> {
    let c = ctx()?;
    let t = drv::driver()?.call(&msg::IpcGetEventHandle { ctx: c, event }, &[])?;
    let mut h = [0u8; IPC_HANDLE_SIZE];
    h[..8].copy_from_slice(IPC_EVENT_MAGIC);
    h[8..16].copy_from_slice(&t.hi.to_le_bytes());
    h[16..24].copy_from_slice(&t.lo.to_le_bytes());
    Ok(h)
}

/// `cuIpcOpenEventHandle`: an event of this process following one another process of the VM
/// exported: the same event, which any of them may record and all of them follow.
pub fn ipc_open_event_handle(handle: &[u8; IPC_HANDLE_SIZE]) -> CuRes<u64> {
    let c = ctx()?;
    if &handle[..8] != IPC_EVENT_MAGIC {
        crate::debug!("cuIpcOpenEventHandle: not an event handle vgpu made");
        return Err(cuda::CUDA_ERROR_INVALID_HANDLE);
    }
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&handle[i..i + 8]);
        u64::from_le_bytes(w)
    };
    Ok(drv::driver()?
        .call(
            &msg::IpcOpenEventHandle {
                ctx: c,
                hi: word(8),
                lo: word(16),
            },
            &[],
        )?
        .handle)
}

// ---- virtual memory management ------------------------------------------------------------

/// Granularity of physical allocations, reservations and mappings.
pub const VMM_GRANULARITY: u64 = 2 << 20;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub const HANDLE_TYPE_POSIX_FD: i32 = 1;
/// `CU_MEM_HANDLE_TYPE_FABRIC`.
pub const HANDLE_TYPE_FABRIC: i32 = 8;
/// What an exported file descriptor holds before its token.
const EXPORT_MAGIC: &[u8; 8] = b"VGPUMEM1";

#[derive(Debug, Default)]
struct VmmShim {
    /// Requested handle types by handle (for `cuMemGetAllocationPropertiesFromHandle`).
    handle_types: HashMap<u64, i32>,
    /// Mappings: address → size.
    mapped: BTreeMap<u64, u64>,
}

fn vmm() -> MutexGuard<'static, VmmShim> {
    static S: OnceLock<Mutex<VmmShim>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(VmmShim::default()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Checks a `CUmemAllocationProp`: pinned device memory on device 0, exportable as nothing,
/// a file descriptor or a fabric handle.
pub fn check_alloc_prop(
    alloc_type: i32,
    location_type: i32,
    location_id: i32,
    handle_types: i32,
) -> CuRes<()> {
    if alloc_type != 1 || location_type != 1 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    if location_id != 0 {
        return Err(cuda::CUDA_ERROR_INVALID_DEVICE);
    }
    if handle_types & !(HANDLE_TYPE_POSIX_FD | HANDLE_TYPE_FABRIC) != 0 {
        crate::debug!(
            "cuMemCreate: handle types {handle_types:#x}: only POSIX file descriptors and fabric handles, within the VM"
        );
        return Err(cuda::CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(())
}

/// `cuMemCreate`.
pub fn mem_create(size: u64, handle_types: i32) -> CuRes<u64> {
    let c = ctx()?;
    let h = drv::driver()?
        .call(&msg::MemCreate { ctx: c, size }, &[])?
        .handle;
    vmm().handle_types.insert(h, handle_types);
    Ok(h)
}

/// `cuMemRelease`.
pub fn mem_release(h: u64) -> CuRes<()> {
    drv::driver()?.call(&msg::MemRelease { handle: h }, &[])?;
    Ok(())
}

/// `cuMemAddressReserve` (the address hint is not honoured, as CUDA allows).
pub fn address_reserve(size: u64, align: u64) -> CuRes<u64> {
    let c = ctx()?;
    Ok(drv::driver()?
        .call(
            &msg::MemAddressReserve {
                ctx: c,
                size,
                align,
            },
            &[],
        )?
        .ptr)
}

/// `cuMemAddressFree`.
pub fn address_free(ptr: u64, size: u64) -> CuRes<()> {
    drv::driver()?
        .call(&msg::MemAddressFree { ptr, size }, &[])
        .map(drop)
}

/// `cuMemMap`.
pub fn mem_map(ptr: u64, size: u64, offset: u64, h: u64) -> CuRes<()> {
    drv::driver()?.call(
        &msg::MemMap {
            ptr,
            size,
            offset,
            handle: h,
        },
        &[],
    )?;
    vmm().mapped.insert(ptr, size);
    Ok(())
}

/// `cuMemUnmap`.
pub fn mem_unmap(ptr: u64, size: u64) -> CuRes<()> {
    if let Ok(c) = ctx() {
        crate::sync_wait::before_settling(c)?;
    }
    drv::driver()?.call(&msg::MemUnmap { ptr, size }, &[])?;
    let mut v = vmm();
    let end = ptr.saturating_add(size);
    let gone: Vec<u64> = v.mapped.range(ptr..end).map(|(b, _)| *b).collect();
    for b in gone {
        v.mapped.remove(&b);
        drv::forget_device_range(b);
    }
    Ok(())
}

/// `cuMemSetAccess` for device 0 (`flags`: 0, read or read-write).
pub fn mem_set_access(ptr: u64, size: u64, flags: u32) -> CuRes<()> {
    drv::driver()?.call(&msg::MemSetAccess { ptr, size, flags }, &[])?;
    let v = vmm();
    for (&b, &s) in v.mapped.range(ptr..ptr.saturating_add(size)) {
        if flags == 0 {
            drv::forget_device_range(b);
        } else {
            drv::note_device_range(b, s);
        }
    }
    Ok(())
}

/// `cuMemGetAccess` for device 0.
pub fn mem_get_access(ptr: u64) -> CuRes<u64> {
    Ok(drv::driver()?.call(&msg::MemGetAccess { ptr }, &[])?.value as u64)
}

/// `cuMemRetainAllocationHandle`.
pub fn mem_retain(ptr: u64) -> CuRes<u64> {
    Ok(drv::driver()?
        .call(&msg::MemRetainAllocationHandle { ptr }, &[])?
        .handle)
}

/// `cuMemGetAllocationPropertiesFromHandle`: (size, requested handle types).
pub fn mem_handle_props(h: u64) -> CuRes<(u64, i32)> {
    let size = drv::driver()?
        .call(&msg::MemGetAllocationSize { handle: h }, &[])?
        .bytes;
    Ok((size, vmm().handle_types.get(&h).copied().unwrap_or(0)))
}

/// `cuMemExportToShareableHandle`: the VM-local token, as a file descriptor (a memfd holding
/// it) or as the bytes of a fabric handle.
pub fn mem_export(h: u64, handle_type: i32) -> CuRes<Vec<u8>> {
    let allowed = vmm().handle_types.get(&h).copied().unwrap_or(0);
    if handle_type != HANDLE_TYPE_POSIX_FD && handle_type != HANDLE_TYPE_FABRIC {
        return Err(cuda::CUDA_ERROR_NOT_SUPPORTED);
    }
    if allowed & handle_type == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let t = drv::driver()?.call(&msg::MemExport { handle: h }, &[])?;
    let mut bytes = EXPORT_MAGIC.to_vec();
    bytes.extend_from_slice(&t.hi.to_le_bytes());
    bytes.extend_from_slice(&t.lo.to_le_bytes());
    Ok(bytes)
}

/// A memfd holding `bytes`, for a `POSIX_FILE_DESCRIPTOR` export.
pub fn export_fd(bytes: &[u8]) -> CuRes<i32> {
    // SAFETY: a NUL-terminated name and no flags.
    let fd = unsafe { libc::memfd_create(c"vgpu-mem-export".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(cuda::CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: `fd` is the memfd just created; `bytes` is valid for its length.
    let n = unsafe { libc::pwrite(fd, bytes.as_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        // SAFETY: closing the memfd created above.
        unsafe { libc::close(fd) };
        return Err(cuda::CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(fd)
}

/// Reads the export token from a file descriptor `cuMemExportToShareableHandle` made.
pub fn import_fd(fd: i32) -> CuRes<Vec<u8>> {
    let mut b = [0u8; 24];
    // SAFETY: reads at most 24 bytes into `b`; a bad descriptor fails with -1.
    let n = unsafe { libc::pread(fd, b.as_mut_ptr().cast(), b.len(), 0) };
    if n != 24 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(b.to_vec())
}

/// `cuMemImportFromShareableHandle` from the token bytes.
pub fn mem_import(bytes: &[u8]) -> CuRes<u64> {
    let d = drv::driver()?;
    if bytes.len() < 24 || &bytes[..8] != EXPORT_MAGIC {
        crate::debug!("cuMemImportFromShareableHandle: not a handle vgpu exported");
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[i..i + 8]);
        u64::from_le_bytes(w)
    };
    let h = d
        .call(
            &msg::MemImport {
                hi: word(8),
                lo: word(16),
            },
            &[],
        )?
        .handle;
    vmm()
        .handle_types
        .insert(h, HANDLE_TYPE_POSIX_FD | HANDLE_TYPE_FABRIC);
    Ok(h)
}
