//! The CUDA driver API in safe Rust. `exports` wraps these functions in the C
//! ABI; every function returns the `CUresult` CUDA would.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use vgpu_hugemem::{HUGE_PAGE, HugeMapping};
use vgpu_proto::cuda::{self, CuResult};
use vgpu_proto::msg;

use crate::client::{CallError, Client};
use crate::transport;

/// A driver call's result.
pub type CuRes<T> = Result<T, CuResult>;

/// `CU_STREAM_LEGACY`.
pub const STREAM_LEGACY: u64 = 0x1;
/// `CU_STREAM_PER_THREAD`.
pub const STREAM_PER_THREAD: u64 = 0x2;
/// `CU_MEMHOSTALLOC_DEVICEMAP`.
pub const MEMHOSTALLOC_DEVICEMAP: u32 = 0x2;
/// Flags `cuMemHostAlloc` accepts: PORTABLE | DEVICEMAP | WRITECOMBINED.
pub const MEMHOSTALLOC_KNOWN: u32 = 0x7;
/// `CU_MEMHOSTREGISTER_DEVICEMAP`.
pub const MEMHOSTREGISTER_DEVICEMAP: u32 = 0x2;
/// `CU_MEMHOSTREGISTER_IOMEMORY`.
pub const MEMHOSTREGISTER_IOMEMORY: u32 = 0x4;
/// Flags `cuMemHostRegister` accepts: PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY.
pub const MEMHOSTREGISTER_KNOWN: u32 = 0xf;
/// Alignment of `cuMemAllocHost` buffers.
pub const HOST_ALLOC_ALIGN: usize = 4096;
/// A slow host's memcpy speed, for how long a copy vgpud makes in place should take: the wait
/// for its reply polls about that long before it blocks (a blocked thread's wake-up costs about
/// 50 µs on a VM whose CPUs idle, as long as a 1 MiB copy).
const IN_PLACE_COPY_BYTES_PER_SEC: f64 = 1024.0 * 1024.0 * 1024.0;
/// What an in-place copy's reply takes besides the copy: the round trip and vgpud's checks.
const IN_PLACE_COPY_SPIN_BASE: Duration = vgpu_proto::spin::DEFAULT_SPIN;

/// State of an initialised driver.
pub struct Driver {
    client: Mutex<Client>,
    /// Device properties as the host reported them at `cuInit`.
    pub props: msg::DeviceProperties,
    /// The VM (tenant) name the host identified.
    pub tenant: String,
    /// How this process reaches vgpud (`VGPU_TRANSPORT` syntax).
    pub transport: String,
    /// With the virtio-vgpu device: its virtio device ID and this process's session on it.
    pub device: Option<(u32, u32)>,
    /// Whether `CUDA_VISIBLE_DEVICES` shows CUDA the VM's GPU ([`crate::visible`]); when it does
    /// not, `cuInit` fails and only NVML and vgpu-smi use the session.
    cuda_visible: bool,
    /// Most bulk bytes one copy request carries on this transport.
    chunk: usize,
    device_ranges: Mutex<BTreeMap<u64, u64>>,
    host_allocs: Mutex<HashMap<usize, HostAlloc>>,
    /// Pinned buffers shared with vgpud ([`crate::pinned`]): start → (length, region).
    shared_pinned: Mutex<BTreeMap<usize, (usize, u64)>>,
    /// Whether `cuMemHostAlloc` tries to share its buffers (unix socket, not turned off).
    share_pinned: AtomicBool,
    /// `cuMemHostRegister`ed ranges: start → length.
    host_registered: Mutex<BTreeMap<usize, usize>>,
    /// The registered ranges whose whole pages were moved into memfds shared with vgpud
    /// ([`crate::pinned::AdoptedRange`]), by the start of the registered range.
    host_adopted: Mutex<HashMap<usize, crate::pinned::AdoptedRange>>,
    /// Contexts that queued an asynchronous device-to-host copy into a shared region, by
    /// region: unregistering the region's range waits for them first.
    shared_dtoh_contexts: Mutex<HashMap<u64, HashSet<u64>>>,
    /// Created streams: (flags, priority, context).
    streams: Mutex<HashMap<u64, (u32, i32, u64)>>,
    functions: Mutex<HashMap<u64, FuncLayout>>,
    /// Modules (libraries) loaded and not unloaded.
    modules: Mutex<HashSet<u64>>,
    /// Libraries loaded with no current context, each holding a retain of
    /// the primary context.
    library_retains: Mutex<HashSet<u64>>,
    /// Libraries with no image the device runs: handle (the address of the
    /// box, unique while it lives) → why. Loading them succeeds, as CUDA's
    /// lazy loading does; using them fails.
    unusable_libraries: Mutex<HashMap<u64, (Box<u8>, String)>>,
    flush_wanted: (Mutex<bool>, Condvar),
    /// Set while the flush thread has been asked to flush and has not yet
    /// taken the batch: later posts need not wake it again (no lock on the
    /// hot path).
    flush_armed: AtomicBool,
    /// Whether vgpud has synchronizing calls that wait on a connection of their own
    /// ([`crate::sync_wait`]).
    pub(crate) sync_tickets: bool,
    /// The client's [`Client::enqueued`] count when vgpud last said the session was idle
    /// (`msg::SYNC_IDLE`); `u64::MAX` before.
    pub(crate) idle_at: AtomicU64,
}

/// A kernel's parameter layout, cached by the shim to pack `kernelParams`.
#[derive(Debug, Clone, Default)]
pub struct FuncLayout {
    /// The kernel's entry name (`cuFuncGetName` hands out a pointer into it).
    pub name: Arc<CStr>,
    /// The module (library) it was looked up in.
    pub module: u64,
    /// Offset of each parameter in the packed buffer.
    pub offsets: Vec<u32>,
    /// Size of each parameter.
    pub sizes: Vec<u32>,
    /// `CUfunction_attribute` values when it was looked up.
    pub attributes: Vec<i32>,
}

impl FuncLayout {
    /// Bytes of the packed parameter buffer.
    pub fn param_bytes(&self) -> usize {
        self.offsets
            .iter()
            .zip(&self.sizes)
            .map(|(o, s)| (o + s) as usize)
            .max()
            .unwrap_or(0)
    }
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("tenant", &self.tenant)
            .finish()
    }
}

static DRIVER: OnceLock<CuRes<Driver>> = OnceLock::new();

/// Contexts a thread may have pushed at once (`cuCtxPushCurrent` past it
/// fails with `CUDA_ERROR_OUT_OF_MEMORY`; libraries nest two or three).
const MAX_CTX_STACK: usize = 64;

/// A thread's context stack. It owns no heap memory, so the thread-local
/// holding it has no destructor and stays usable while a thread (or the
/// process, in `exit`) runs other libraries' destructors: cuFFT frees its
/// buffers from one, after the thread's destructible locals are gone.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CtxStack {
    entries: [u64; MAX_CTX_STACK],
    len: usize,
}

impl CtxStack {
    const EMPTY: CtxStack = CtxStack {
        entries: [0; MAX_CTX_STACK],
        len: 0,
    };

    fn last(&self) -> Option<u64> {
        self.len.checked_sub(1).map(|i| self.entries[i])
    }

    fn push(&mut self, c: u64) -> CuRes<()> {
        let slot = self
            .entries
            .get_mut(self.len)
            .ok_or(cuda::CUDA_ERROR_OUT_OF_MEMORY)?;
        *slot = c;
        self.len += 1;
        Ok(())
    }

    fn pop(&mut self) -> Option<u64> {
        let top = self.last()?;
        self.len -= 1;
        Some(top)
    }

    /// Removes every entry equal to `c`, keeping the others' order.
    fn remove_all(&mut self, c: u64) {
        let mut kept = 0;
        for i in 0..self.len {
            if self.entries[i] != c {
                self.entries[kept] = self.entries[i];
                kept += 1;
            }
        }
        self.len = kept;
    }
}

thread_local! {
    static CTX_STACK: RefCell<CtxStack> = const { RefCell::new(CtxStack::EMPTY) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn process_name() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn connect() -> CuRes<Driver> {
    let ep = transport::endpoint_from_env().map_err(|m| {
        crate::warn!("{m}");
        cuda::CUDA_ERROR_INVALID_VALUE
    })?;
    let link = transport::open(&ep).map_err(|e| {
        crate::warn!(
            "cuInit: cannot reach vgpud at {ep}: {e} (set VGPU_TRANSPORT, see docs/guest.md)"
        );
        cuda::CUDA_ERROR_NO_DEVICE
    })?;
    let mut client = Client::with_link(link);
    let chunk = client.max_chunk();
    let hello = client.hello(&process_name()).map_err(|e| {
        crate::warn!("cuInit: vgpud at {ep} refused the session: {}", e.message);
        e.code
    })?;
    let (props, _) = client
        .call(&msg::DeviceGetProperties { device: 0 }, &[])
        .map_err(|e| e.code)?;
    crate::debug!(
        "cuInit: session {} of VM `{}` via {ep}",
        hello.session_id,
        hello.tenant
    );
    let device = client
        .device()
        .map(|d| (d.info().device_id, d.info().session));
    let share_pinned = client.passes_fds() && crate::pinned::enabled();
    let sync_tickets = client.features() & msg::FEATURE_SYNC_TICKETS != 0;
    let visible = std::env::var(crate::visible::VAR).ok();
    let cuda_visible =
        crate::visible::shows_the_gpu(visible.as_deref(), &cuda::gpu_uuid_text(&props.uuid));
    if !cuda_visible {
        crate::warn!(
            "{}={:?} does not name this VM's GPU (0 or its UUID): CUDA sees no device",
            crate::visible::VAR,
            visible.unwrap_or_default()
        );
    }
    Ok(Driver {
        client: Mutex::new(client),
        props,
        tenant: hello.tenant,
        transport: ep.to_string(),
        device,
        cuda_visible,
        chunk,
        device_ranges: Mutex::new(BTreeMap::new()),
        host_allocs: Mutex::new(HashMap::new()),
        shared_pinned: Mutex::new(BTreeMap::new()),
        share_pinned: AtomicBool::new(share_pinned),
        host_registered: Mutex::new(BTreeMap::new()),
        host_adopted: Mutex::new(HashMap::new()),
        shared_dtoh_contexts: Mutex::new(HashMap::new()),
        streams: Mutex::new(HashMap::new()),
        functions: Mutex::new(HashMap::new()),
        modules: Mutex::new(HashSet::new()),
        library_retains: Mutex::new(HashSet::new()),
        unusable_libraries: Mutex::new(HashMap::new()),
        flush_wanted: (Mutex::new(false), Condvar::new()),
        flush_armed: AtomicBool::new(false),
        sync_tickets,
        idle_at: AtomicU64::new(u64::MAX),
    })
}

/// `cuInit`: connects once per process (later calls return the first result) and fails with
/// `CUDA_ERROR_NO_DEVICE` when `CUDA_VISIBLE_DEVICES` hides the VM's GPU.
pub fn init(flags: u32) -> CuRes<()> {
    if flags != 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    if connect_session()?.cuda_visible {
        Ok(())
    } else {
        Err(cuda::CUDA_ERROR_NO_DEVICE)
    }
}

/// The process's session with vgpud, connected on first use (by `cuInit`, NVML or vgpu-smi),
/// whatever `CUDA_VISIBLE_DEVICES` says.
pub fn connect_session() -> CuRes<&'static Driver> {
    match DRIVER.get_or_init(connect) {
        Ok(d) => {
            static FLUSHER: OnceLock<()> = OnceLock::new();
            FLUSHER.get_or_init(|| {
                let spawned = std::thread::Builder::new()
                    .name("vgpu-flush".into())
                    .spawn(move || d.flush_loop());
                if spawned.is_err() {
                    crate::warn!("cannot start the flush thread; asynchronous calls are sent at the next synchronous call");
                }
            });
            Ok(d)
        }
        Err(c) => Err(*c),
    }
}

/// The initialised driver: `cuInit` succeeded.
pub fn driver() -> CuRes<&'static Driver> {
    match DRIVER.get() {
        Some(Ok(d)) if d.cuda_visible => Ok(d),
        _ => Err(cuda::CUDA_ERROR_NOT_INITIALIZED),
    }
}

/// The session, connected (by [`connect_session`]) whether or not CUDA may use the GPU.
pub fn session() -> CuRes<&'static Driver> {
    match DRIVER.get() {
        Some(Ok(d)) => Ok(d),
        _ => Err(cuda::CUDA_ERROR_NOT_INITIALIZED),
    }
}

fn log_err<T>(op: &str, r: Result<T, CallError>) -> CuRes<T> {
    r.map_err(|e| {
        crate::debug!(
            "{op} -> {} ({}): {}",
            cuda::result_name(e.code).unwrap_or("?"),
            e.code,
            e.message
        );
        crate::logs::note_host_message(&e.message);
        e.code
    })
}

/// About how long vgpud takes to copy `len` bytes in place before it answers
/// ([`IN_PLACE_COPY_SPIN_BASE`] plus `len` at [`IN_PLACE_COPY_BYTES_PER_SEC`]).
fn in_place_copy_takes(len: usize) -> Duration {
    IN_PLACE_COPY_SPIN_BASE + Duration::from_secs_f64(len as f64 / IN_PLACE_COPY_BYTES_PER_SEC)
}

impl Driver {
    pub(crate) fn call<O: msg::Op>(&self, req: &O, tail: &[u8]) -> CuRes<O::Reply> {
        let r = lock(&self.client).call(req, tail).map(|(r, _)| r);
        log_err(std::any::type_name::<O>(), r)
    }

    /// [`Driver::call`], with the client's [`Client::enqueued`] count right after it (no other
    /// thread's request between them).
    pub(crate) fn call_counted<O: msg::Op>(&self, req: &O) -> CuRes<(O::Reply, u64)> {
        let mut c = lock(&self.client);
        let r = c.call(req, &[]).map(|(r, _)| (r, c.enqueued()));
        drop(c);
        log_err(std::any::type_name::<O>(), r)
    }

    /// The client's [`Client::enqueued`] count now.
    pub(crate) fn enqueued(&self) -> u64 {
        lock(&self.client).enqueued()
    }

    /// A synchronous copy of `len` bytes that vgpud makes in place (a pinned buffer it shares):
    /// the reply comes after the copy, so the wait may poll for about as long as the copy takes
    /// ([`IN_PLACE_COPY_SPIN_BASE`] plus `len` at [`IN_PLACE_COPY_BYTES_PER_SEC`]) instead of
    /// blocking and paying a wake-up. Rung in the doorbell page where the session has one
    /// ([`crate::doorbell`]).
    pub(crate) fn call_copy_in_place<O: msg::Op<Reply = msg::Empty>>(
        &self,
        req: &O,
        len: usize,
    ) -> CuRes<()> {
        let r = lock(&self.client).call_shared_copy(req, in_place_copy_takes(len));
        log_err(std::any::type_name::<O>(), r)
    }

    pub(crate) fn post<O: msg::Op>(&self, req: &O, tail: &[u8]) -> CuRes<()> {
        let mut c = lock(&self.client);
        let r = c.post(req, tail);
        if c.pending() > 0 && !self.flush_armed.swap(true, Ordering::AcqRel) {
            drop(c);
            let (m, cv) = &self.flush_wanted;
            *lock(m) = true;
            cv.notify_one();
        }
        log_err(std::any::type_name::<O>(), r)
    }

    /// Sends batched asynchronous calls that no later call has sent within
    /// the flush interval, so work never waits in the guest for long.
    fn flush_loop(&self) {
        let (m, cv) = &self.flush_wanted;
        loop {
            let mut wanted = lock(m);
            while !*wanted {
                wanted = cv.wait(wanted).unwrap_or_else(|p| p.into_inner());
            }
            *wanted = false;
            drop(wanted);
            let interval = lock(&self.client).flush_interval();
            std::thread::sleep(interval);
            // Posts from now on re-arm; this flush takes everything before them.
            self.flush_armed.store(false, Ordering::Release);
            let mut c = lock(&self.client);
            if c.pending() > 0 {
                let _ = c.flush();
            }
        }
    }

    /// The shared region and offset of `[addr, addr + len)` when it lies inside one pinned
    /// buffer shared with vgpud.
    fn shared_range(&self, addr: usize, len: usize) -> Option<(u64, u64)> {
        let m = lock(&self.shared_pinned);
        if m.is_empty() {
            return None;
        }
        crate::pinned::lookup(&m, addr, len)
    }

    /// Where `[addr, addr + len)` overlaps a shared buffer by at least
    /// [`crate::pinned::ADOPT_MIN`] bytes without lying inside it: the bytes before the overlap
    /// and its length ([`crate::pinned::overlap`]). A copy of a whole registered range whose
    /// ends are not page-aligned is such a copy.
    fn shared_split(&self, addr: usize, len: usize) -> Option<(usize, usize)> {
        let m = lock(&self.shared_pinned);
        if m.is_empty() {
            return None;
        }
        crate::pinned::overlap(&m, addr, len, crate::pinned::ADOPT_MIN)
    }

    /// Remembers that context `ctx` queued a device-to-host copy into shared region `region`.
    fn note_shared_dtoh(&self, region: u64, ctx: u64) {
        lock(&self.shared_dtoh_contexts)
            .entry(region)
            .or_default()
            .insert(ctx);
    }

    /// Whether `ptr` lies in device memory this process allocated.
    pub fn is_device_ptr(&self, ptr: u64) -> bool {
        let r = lock(&self.device_ranges);
        r.range(..=ptr)
            .next_back()
            .is_some_and(|(b, s)| ptr - b < *s)
    }
}

/// `CUDA_ERROR_INVALID_DEVICE` for any device but the VM's one, 0.
pub(crate) fn check_device(dev: i32) -> CuRes<()> {
    if dev == 0 {
        Ok(())
    } else {
        Err(cuda::CUDA_ERROR_INVALID_DEVICE)
    }
}

// ---- version, devices ----------------------------------------------------

/// The calling thread's id as NVIDIA's runtime hashes it (`pthread_self`, low 32 bits).
pub fn thread_id_low() -> u32 {
    // SAFETY: pthread_self has no preconditions and cannot fail.
    (unsafe { libc::pthread_self() }) as u32
}

/// `cuDriverGetVersion` (needs no `cuInit`).
pub fn driver_version() -> i32 {
    vgpu_proto::CUDA_DRIVER_VERSION
}

/// `cuDeviceGetCount`.
pub fn device_count() -> CuRes<i32> {
    driver()?;
    Ok(1)
}

/// `cuDeviceGet`.
pub fn device_get(ordinal: i32) -> CuRes<i32> {
    driver()?;
    check_device(ordinal)?;
    Ok(ordinal)
}

/// `cuDeviceGetName`.
pub fn device_name(dev: i32) -> CuRes<String> {
    let d = driver()?;
    check_device(dev)?;
    Ok(d.props.name.clone())
}

/// `cuDeviceGetUuid`.
pub fn device_uuid(dev: i32) -> CuRes<[u8; 16]> {
    let d = driver()?;
    check_device(dev)?;
    Ok(d.props.uuid)
}

/// `cuDeviceTotalMem`: the VM's memory slice (live).
pub fn device_total_mem(dev: i32) -> CuRes<u64> {
    let d = driver()?;
    check_device(dev)?;
    Ok(d.call(&msg::DeviceTotalMem { device: 0 }, &[])?.bytes)
}

/// `cuDeviceGetAttribute`.
pub fn device_attribute(attr: i32, dev: i32) -> CuRes<i32> {
    let d = driver()?;
    check_device(dev)?;
    d.attribute(attr)
}

impl Driver {
    /// A device attribute as the host reported it (`CUDA_ERROR_INVALID_VALUE` for one vgpu does
    /// not know).
    pub fn attribute(&self, attr: i32) -> CuRes<i32> {
        usize::try_from(attr)
            .ok()
            .filter(|&a| a > 0 && a < cuda::attr::COUNT)
            .and_then(|a| self.props.attributes.get(a).copied())
            .ok_or_else(|| {
                crate::debug!("device attribute {attr}: an attribute vgpu does not know");
                cuda::CUDA_ERROR_INVALID_VALUE
            })
    }
}

/// A device attribute that is a limit (a size or a count), as `u64`: 0 when negative.
pub fn device_limit(attr: usize) -> CuRes<u64> {
    let a = i32::try_from(attr).map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?;
    Ok(u64::try_from(device_attribute(a, 0)?).unwrap_or(0))
}

/// The device's architecture as fat binaries name it: 80 for compute capability 8.0.
pub fn device_arch() -> CuRes<u32> {
    let major = device_attribute(cuda::attr::COMPUTE_CAPABILITY_MAJOR as i32, 0)?;
    let minor = device_attribute(cuda::attr::COMPUTE_CAPABILITY_MINOR as i32, 0)?;
    u32::try_from(major * 10 + minor).map_err(|_| cuda::CUDA_ERROR_INVALID_DEVICE)
}

/// Which PTX the device runs: any architecture's where vgpud says so (the simulated GPU,
/// [`cuda::attr::VGPU_ANY_PTX`]), else CUDA's rule.
pub fn device_ptx_range() -> CuRes<vgpu_fatbin::PtxRange> {
    let any = driver()?.props.attributes.get(cuda::attr::VGPU_ANY_PTX) == Some(&1);
    Ok(if any {
        vgpu_fatbin::PtxRange::Any
    } else {
        vgpu_fatbin::PtxRange::UpTo
    })
}

/// `cuDeviceGetPCIBusId` text, as NVIDIA's driver writes it: a four-digit domain (wider only
/// past 0xffff), upper-case hexadecimal, "0000:3B:00.0", which fits the 13 bytes programs give it
/// (nvidia-smi's eight-digit domain does not).
pub fn device_pci_bus_id(dev: i32) -> CuRes<String> {
    let domain = device_attribute(cuda::attr::PCI_DOMAIN_ID as i32, dev)?;
    let bus = device_attribute(cuda::attr::PCI_BUS_ID as i32, dev)?;
    let device = device_attribute(cuda::attr::PCI_DEVICE_ID as i32, dev)?;
    Ok(format!("{domain:04X}:{bus:02X}:{device:02X}.0"))
}

// ---- contexts --------------------------------------------------------------

/// Runs `f` on the calling thread's context stack (which has no destructor,
/// so it is there while other libraries' thread-exit and `atexit` hooks run).
fn with_ctx_stack<R>(f: impl FnOnce(&mut CtxStack) -> R) -> CuRes<R> {
    CTX_STACK
        .try_with(|s| f(&mut s.borrow_mut()))
        .map_err(|_| cuda::CUDA_ERROR_DEINITIALIZED)
}

/// The calling thread's current context.
pub fn current_ctx() -> Option<u64> {
    with_ctx_stack(|s| s.last()).ok().flatten()
}

pub(crate) fn ctx() -> CuRes<u64> {
    driver()?;
    current_ctx().ok_or(cuda::CUDA_ERROR_INVALID_CONTEXT)
}

/// `CU_CTX_SCHED_MASK`: the scheduling mode's bits of a context's flags.
const CTX_SCHED_MASK: u32 = 0x07;
/// The scheduling modes: `CU_CTX_SCHED_AUTO`, `_SPIN`, `_YIELD`, `_BLOCKING_SYNC`.
const CTX_SCHED_MODES: [u32; 4] = [0x0, 0x1, 0x2, 0x4];
/// The other flags `cuCtxSetFlags` takes (those of `cuDevicePrimaryCtxSetFlags`):
/// `CU_CTX_MAP_HOST` (ignored by CUDA, kept), `LMEM_RESIZE_TO_MAX`, `COREDUMP_ENABLE`,
/// `USER_COREDUMP_ENABLE`, `SYNC_MEMOPS`.
const CTX_OTHER_FLAGS: u32 = 0x08 | 0x10 | 0x20 | 0x40 | 0x80;

/// The flags of the contexts `cuCtxCreate` made (the primary context's are vgpud's).
fn created_ctx_flags() -> MutexGuard<'static, HashMap<u64, u32>> {
    static FLAGS: OnceLock<Mutex<HashMap<u64, u32>>> = OnceLock::new();
    lock(FLAGS.get_or_init(|| Mutex::new(HashMap::new())))
}

/// `cuCtxCreate`: creates a context and makes it current.
pub fn ctx_create(flags: u32, dev: i32) -> CuRes<u64> {
    check_device(dev)?;
    ctx_create_with(&msg::CtxCreate { device: 0, flags }, flags)
}

/// Creates a context with `req` (`CtxCreate` or `CtxCreateAffinity`) and makes it current.
pub fn ctx_create_with<R: msg::Op<Reply = msg::Handle>>(req: &R, flags: u32) -> CuRes<u64> {
    let d = driver()?;
    let h = d.call(req, &[])?.handle;
    with_ctx_stack(|s| s.push(h))??;
    created_ctx_flags().insert(h, flags);
    Ok(h)
}

/// `cuCtxGetFlags`: the current context's flags, as created or last set.
pub fn ctx_flags() -> CuRes<u32> {
    let c = ctx()?;
    if let Some(&f) = created_ctx_flags().get(&c) {
        return Ok(f);
    }
    Ok(primary_state(0)?.0)
}

/// `cuCtxSetFlags`: replaces the current context's flags.
pub fn ctx_set_flags(flags: u32) -> CuRes<()> {
    let c = ctx()?;
    if !CTX_SCHED_MODES.contains(&(flags & CTX_SCHED_MASK))
        || flags & !(CTX_SCHED_MASK | CTX_OTHER_FLAGS) != 0
    {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    if let Some(f) = created_ctx_flags().get_mut(&c) {
        *f = flags;
        return Ok(());
    }
    primary_set_flags(0, flags)
}

/// The uses `cuCtxAttach` added to contexts, beyond their creator's.
fn ctx_attachments() -> MutexGuard<'static, HashMap<u64, u32>> {
    static USES: OnceLock<Mutex<HashMap<u64, u32>>> = OnceLock::new();
    lock(USES.get_or_init(|| Mutex::new(HashMap::new())))
}

/// `cuCtxAttach` (deprecated since CUDA 4.0): one more use of the current context.
pub fn ctx_attach() -> CuRes<u64> {
    let c = ctx()?;
    let mut uses = ctx_attachments();
    let n = uses.entry(c).or_default();
    *n = n.checked_add(1).ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    Ok(c)
}

/// `cuCtxDetach` (deprecated since CUDA 4.0): one use of the current context less; the last use of
/// a context `cuCtxCreate` made destroys it. A primary context is not destroyed here (its retains
/// are `cuDevicePrimaryCtxRelease`'s), so detaching it more often than it was attached fails.
pub fn ctx_detach(c: u64) -> CuRes<()> {
    if ctx()? != c {
        return Err(cuda::CUDA_ERROR_INVALID_CONTEXT);
    }
    {
        let mut uses = ctx_attachments();
        if let Some(n) = uses.get_mut(&c) {
            *n -= 1;
            if *n == 0 {
                uses.remove(&c);
            }
            return Ok(());
        }
    }
    if !created_ctx_flags().contains_key(&c) {
        return Err(cuda::CUDA_ERROR_INVALID_CONTEXT);
    }
    ctx_destroy(c)
}

/// `cuCtxDestroy`.
pub fn ctx_destroy(c: u64) -> CuRes<()> {
    let d = driver()?;
    crate::sync_wait::before_destroy(c);
    d.call(&msg::CtxDestroy { ctx: c }, &[])?;
    created_ctx_flags().remove(&c);
    ctx_attachments().remove(&c);
    crate::stream_attrs::forget(LEGACY_STREAM_ID_BIT | c);
    forget_per_thread_stream(c);
    let _ = with_ctx_stack(|s| s.remove_all(c));
    crate::ctx_storage::context_gone(c);
    crate::alloc_api::context_gone(c);
    crate::arrays::context_gone(c);
    crate::textures::context_gone(c);
    crate::exec_affinity::context_gone(c);
    Ok(())
}

/// `cuCtxSetCurrent`: replaces the top of the stack (NULL pops it).
pub fn ctx_set_current(c: u64) -> CuRes<()> {
    driver()?;
    with_ctx_stack(|s| {
        s.pop();
        if c != 0 { s.push(c) } else { Ok(()) }
    })?
}

/// `cuCtxPushCurrent`.
pub fn ctx_push(c: u64) -> CuRes<()> {
    driver()?;
    if c == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_CONTEXT);
    }
    with_ctx_stack(|s| s.push(c))?
}

/// `cuCtxPopCurrent`.
pub fn ctx_pop() -> CuRes<u64> {
    driver()?;
    with_ctx_stack(|s| s.pop())?.ok_or(cuda::CUDA_ERROR_INVALID_CONTEXT)
}

/// `cuCtxGetCurrent` (NULL when none).
pub fn ctx_get_current() -> CuRes<u64> {
    driver()?;
    Ok(current_ctx().unwrap_or(0))
}

/// `cuCtxGetDevice`.
pub fn ctx_get_device() -> CuRes<i32> {
    ctx()?;
    Ok(0)
}

/// `cuCtxSynchronize`.
pub fn ctx_synchronize() -> CuRes<()> {
    ctx_synchronize_of(ctx()?)
}

/// `cuCtxSynchronize_v2`: waits for a given context (the host checks that it
/// is one of this process's).
pub fn ctx_synchronize_of(c: u64) -> CuRes<()> {
    crate::stream_capture::check_unsafe()?;
    crate::sync_wait::synchronize(msg::SYNC_CONTEXT, c, 0)?;
    crate::alloc_api::after_sync()
}

/// `cuCtxSetLimit` for a limit vgpud enforces (`CU_LIMIT_PRINTF_FIFO_SIZE`,
/// `CU_LIMIT_MALLOC_HEAP_SIZE`). An older vgpud
/// without the op enforces none: accepted.
pub fn ctx_set_limit(limit: u32, value: u64) -> CuRes<()> {
    let c = ctx()?;
    match driver()?.call(
        &msg::CtxSetLimit {
            ctx: c,
            limit,
            value,
        },
        &[],
    ) {
        Err(cuda::CUDA_ERROR_NOT_SUPPORTED) => Ok(()),
        r => r.map(|_| ()),
    }
}

/// `cuDevicePrimaryCtxRetain`.
pub fn primary_retain(dev: i32) -> CuRes<u64> {
    let d = driver()?;
    check_device(dev)?;
    Ok(d.call(&msg::PrimaryCtxRetain { device: 0 }, &[])?.handle)
}

/// The primary context's handle without changing its reference count (the
/// runtime's interface table asks for it before it retains it).
pub fn primary_handle(dev: i32) -> CuRes<u64> {
    let d = driver()?;
    check_device(dev)?;
    primary_peek(d)
}

/// Runs `f` with a context current. The library API (`cuLibrary*`,
/// `cuKernel*`) needs none; vgpu keeps libraries loaded without a current
/// context in the device's primary context, which is where NVIDIA's runtime
/// then runs their kernels.
/// Loads a library (`f` returns its handle) in the current context, or, with
/// none current, in the primary context, which the library then keeps
/// retained until [`library_unloaded`]: the CUDA runtime loads its fat
/// binaries before it retains the primary context itself, and a context
/// whose last reference goes is destroyed with its modules.
pub fn library_load(f: impl FnOnce() -> CuRes<u64>) -> CuRes<u64> {
    if current_ctx().is_some() {
        return f();
    }
    let d = driver()?;
    let r = in_context(primary_retain(0)?, f);
    match r {
        Ok(lib) => {
            lock(&d.library_retains).insert(lib);
            Ok(lib)
        }
        Err(e) => {
            let _ = primary_release(0);
            Err(e)
        }
    }
}

/// After `cuLibraryUnload`: the primary context retain the library held, if
/// any, is released.
pub fn library_unloaded(lib: u64) -> CuRes<()> {
    let d = driver()?;
    let held = lock(&d.library_retains).remove(&lib);
    if held {
        primary_release(0)?;
    }
    Ok(())
}

/// A handle for a library none of whose images the device runs.
pub fn unusable_library(why: String) -> CuRes<u64> {
    let d = driver()?;
    let anchor = Box::new(0u8);
    let handle = std::ptr::from_ref::<u8>(&anchor) as u64;
    lock(&d.unusable_libraries).insert(handle, (anchor, why));
    Ok(handle)
}

/// Why `lib` cannot be used, if it is such a library.
pub fn unusable_reason(lib: u64) -> CuRes<Option<String>> {
    Ok(lock(&driver()?.unusable_libraries)
        .get(&lib)
        .map(|(_, why)| why.clone()))
}

/// Forgets an unusable library; false if `lib` is not one.
pub fn drop_unusable(lib: u64) -> CuRes<bool> {
    Ok(lock(&driver()?.unusable_libraries).remove(&lib).is_some())
}

pub fn in_library_context<R>(f: impl FnOnce() -> CuRes<R>) -> CuRes<R> {
    if current_ctx().is_some() {
        return f();
    }
    in_context(primary_handle(0)?, f)
}

/// Runs `f` with `ctx` pushed as the current context (0: the current one, as it is).
pub fn in_context<R>(ctx: u64, f: impl FnOnce() -> CuRes<R>) -> CuRes<R> {
    if ctx == 0 {
        return f();
    }
    ctx_push(ctx)?;
    let r = f();
    let _ = ctx_pop();
    r
}

/// The primary context's handle, by a retain and a release (the handle
/// stays the same for the session's life).
fn primary_peek(d: &Driver) -> CuRes<u64> {
    let h = d.call(&msg::PrimaryCtxRetain { device: 0 }, &[])?.handle;
    d.call(&msg::PrimaryCtxRelease { device: 0 }, &[])?;
    Ok(h)
}

/// `cuDevicePrimaryCtxRelease`: the last release resets the context, and
/// what the runtime stored in it is destroyed.
pub fn primary_release(dev: i32) -> CuRes<()> {
    let d = driver()?;
    check_device(dev)?;
    // The last release resets the context, after the process's earlier work.
    if let Ok(c) = ctx() {
        crate::sync_wait::before_settling(c)?;
    }
    d.call(&msg::PrimaryCtxRelease { device: 0 }, &[])?;
    let state = d.call(&msg::PrimaryCtxGetState { device: 0 }, &[])?;
    if state.active == 0 {
        primary_gone(d)?;
    }
    Ok(())
}

/// The primary context was reset or released for the last time.
fn primary_gone(d: &Driver) -> CuRes<()> {
    // Libraries loaded in the primary context went with it, and so did the
    // references they held.
    lock(&d.library_retains).clear();
    let c = primary_peek(d)?;
    crate::ctx_storage::context_gone(c);
    crate::alloc_api::context_gone(c);
    crate::arrays::context_gone(c);
    crate::textures::context_gone(c);
    Ok(())
}

/// After vgpud dropped a reference to the primary context on the process's behalf (a green
/// context's destroy): the shim forgets the primary context's state if that was the last.
pub fn primary_released_elsewhere() -> CuRes<()> {
    let d = driver()?;
    if d.call(&msg::PrimaryCtxGetState { device: 0 }, &[])?.active == 0 {
        primary_gone(d)?;
    }
    Ok(())
}

/// `cuDevicePrimaryCtxReset`.
pub fn primary_reset(dev: i32) -> CuRes<()> {
    let d = driver()?;
    check_device(dev)?;
    if let Ok(c) = ctx() {
        crate::sync_wait::before_settling(c)?;
    }
    d.call(&msg::PrimaryCtxReset { device: 0 }, &[])?;
    primary_gone(d)
}

/// `cuDevicePrimaryCtxGetState`: (flags, active).
pub fn primary_state(dev: i32) -> CuRes<(u32, bool)> {
    let d = driver()?;
    check_device(dev)?;
    let s = d.call(&msg::PrimaryCtxGetState { device: 0 }, &[])?;
    Ok((s.flags, s.active != 0))
}

/// `cuDevicePrimaryCtxSetFlags`.
pub fn primary_set_flags(dev: i32, flags: u32) -> CuRes<()> {
    let d = driver()?;
    check_device(dev)?;
    d.call(&msg::PrimaryCtxSetFlags { device: 0, flags }, &[])?;
    Ok(())
}

// ---- memory ----------------------------------------------------------------

/// `cuMemAlloc`.
pub fn mem_alloc(size: u64) -> CuRes<u64> {
    let c = ctx()?;
    crate::stream_capture::check_unsafe()?;
    let d = driver()?;
    let ptr = d.call(&msg::MemAlloc { ctx: c, size }, &[])?.ptr;
    lock(&d.device_ranges).insert(ptr, size);
    Ok(ptr)
}

/// `cuMemAllocPitch`: (ptr, pitch).
pub fn mem_alloc_pitch(width: u64, height: u64, elem_size: u32) -> CuRes<(u64, u64)> {
    let c = ctx()?;
    let d = driver()?;
    let r = d.call(
        &msg::MemAllocPitch {
            ctx: c,
            width,
            height,
            elem_size,
        },
        &[],
    )?;
    lock(&d.device_ranges).insert(r.ptr, r.pitch * height);
    Ok((r.ptr, r.pitch))
}

/// `cuMemFree`.
pub fn mem_free(ptr: u64) -> CuRes<()> {
    let c = ctx()?;
    let d = driver()?;
    crate::stream_capture::check_unsafe()?;
    if crate::graph::api::is_graph_alloc(ptr) {
        return crate::graph::api::free_graph_alloc(ptr, None);
    }
    if ptr != 0 {
        crate::sync_wait::before_settling(c)?;
    }
    if let Some(r) = crate::alloc_api::free_hook(ptr) {
        return r;
    }
    d.call(&msg::MemFree { ctx: c, ptr }, &[])?;
    if !crate::alloc_api::pool_import_still_open(ptr) {
        crate::alloc_api::forget_pool_block(ptr);
        lock(&d.device_ranges).remove(&ptr);
    }
    Ok(())
}

/// `cuMemGetInfo`: (free, total) of the VM's slice.
pub fn mem_get_info() -> CuRes<(u64, u64)> {
    let c = ctx()?;
    let r = driver()?.call(&msg::MemGetInfo { ctx: c }, &[])?;
    Ok((r.free, r.total))
}

/// `cuMemGetAddressRange`: (base, size).
pub fn mem_get_address_range(ptr: u64) -> CuRes<(u64, u64)> {
    let c = ctx()?;
    let r = driver()?.call(&msg::MemGetAddressRange { ctx: c, ptr }, &[])?;
    Ok((r.base, r.size))
}

/// Records device memory allocated outside `mem_alloc` (pool blocks), for `cuMemcpy`.
pub fn note_device_range(ptr: u64, size: u64) {
    if let Ok(d) = driver() {
        lock(&d.device_ranges).insert(ptr, size);
    }
}

/// Forgets a range recorded by [`note_device_range`].
pub fn forget_device_range(ptr: u64) {
    if let Ok(d) = driver() {
        lock(&d.device_ranges).remove(&ptr);
    }
}

/// Host to device; `sync` waits for completion (and earlier errors).
pub fn memcpy_htod(dst: u64, src: &[u8], stream: u64, sync: bool) -> CuRes<()> {
    // Pointers to page-locked buffers a kernel will find in device memory.
    crate::pinned_uva::note_pointers(src);
    let op = || crate::graph::Op::HtoD {
        dst,
        src: src.as_ptr() as usize,
        len: src.len(),
    };
    if let Some(r) = crate::stream_capture::intercept(stream, sync, op) {
        return r;
    }
    if sync {
        crate::sync_wait::before_blocking_copy(stream)?;
    }
    if let Some(r) = crate::alloc_api::htod_hook(dst, src) {
        return r;
    }
    memcpy_htod_raw(dst, src, stream, sync)
}

/// [`memcpy_htod`] to device memory, never to a mirror.
pub(crate) fn memcpy_htod_raw(dst: u64, src: &[u8], stream: u64, sync: bool) -> CuRes<()> {
    let c = ctx()?;
    let stream_handle = stream;
    let stream = wire_stream(stream)?;
    let d = driver()?;
    if src.is_empty() {
        return Ok(());
    }
    if let Some((region, offset)) = d.shared_range(src.as_ptr() as usize, src.len()) {
        let req = msg::MemcpyHtoDShared {
            ctx: c,
            stream,
            dst,
            region,
            offset,
            len: src.len() as u64,
        };
        return if sync {
            d.call_copy_in_place(&req, src.len()).map(drop)
        } else {
            d.post(&req, &[])
        };
    }
    if let Some((head, mid)) = d.shared_split(src.as_ptr() as usize, src.len()) {
        // The part inside the shared buffer travels without its bytes, the rest as usual. The
        // ends are posted first (the stream keeps the order); the shared part goes last, `sync`,
        // so that a synchronous copy waits once, polling as long as its copy should take.
        let (head_bytes, rest) = src.split_at(head);
        let (mid_bytes, tail) = rest.split_at(mid);
        let tail_at = dst + (head + mid) as u64;
        for (at, p) in [(dst, head_bytes), (tail_at, tail)] {
            if !p.is_empty() {
                memcpy_htod_raw(at, p, stream_handle, false)?;
            }
        }
        memcpy_htod_raw(dst + head as u64, mid_bytes, stream_handle, sync)?;
        return Ok(());
    }
    let chunks: Vec<&[u8]> = src.chunks(d.chunk).collect();
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let req = msg::MemcpyHtoD {
            ctx: c,
            stream,
            dst: dst + (i * d.chunk) as u64,
        };
        if sync && i == last {
            d.call(&req, chunk)?;
        } else if sync {
            // The final call returns after this chunk ran: the device may read it meanwhile.
            let r = lock(&d.client).post_deferred(&req, chunk);
            log_err("MemcpyHtoD", r)?;
        } else {
            d.post(&req, chunk)?;
        }
    }
    Ok(())
}

/// Device to host (always waits: the data must arrive).
pub fn memcpy_dtoh(dst: &mut [u8], src: u64, stream: u64) -> CuRes<()> {
    let op = || crate::graph::Op::DtoH {
        dst: dst.as_ptr() as usize,
        src,
        len: dst.len(),
    };
    // Synchronous unless on a stream of its own (cuMemcpyDtoHAsync).
    let sync = stream == 0 || stream == 1;
    if let Some(r) = crate::stream_capture::intercept(stream, sync, op) {
        return r;
    }
    // An asynchronous copy into memory vgpud does not share waits for its bytes too (as CUDA's
    // copies to pageable memory do), so it waits for its stream first as a synchronous one does.
    let unshared =
        || driver().is_ok_and(|d| d.shared_range(dst.as_ptr() as usize, dst.len()).is_none());
    if sync {
        crate::sync_wait::before_blocking_copy(stream)?;
    } else {
        crate::sync_wait::before_blocking_copy_if(stream, unshared)?;
    }
    if let Some(r) = crate::alloc_api::dtoh_hook(dst, src) {
        return r;
    }
    memcpy_dtoh_routed(dst, src, stream, sync)
}

/// [`memcpy_dtoh`] past the hooks: into a shared buffer without bytes, the ordinary way
/// otherwise, split at a shared buffer's ends when the range covers part of one.
fn memcpy_dtoh_routed(dst: &mut [u8], src: u64, stream: u64, sync: bool) -> CuRes<()> {
    if let Some(r) = memcpy_dtoh_shared(dst, src, stream, sync) {
        return r;
    }
    let d = driver()?;
    let split = d.shared_split(dst.as_ptr() as usize, dst.len());
    if let Some((head, mid)) = split {
        let tail_at = src + (head + mid) as u64;
        let (head_bytes, rest) = dst.split_at_mut(head);
        let (mid_bytes, tail) = rest.split_at_mut(mid);
        let shares = |p: &[u8]| {
            !p.is_empty()
                && (d.shared_range(p.as_ptr() as usize, p.len()).is_some()
                    || d.shared_split(p.as_ptr() as usize, p.len()).is_some())
        };
        if !shares(head_bytes)
            && !shares(tail)
            && let Some((region, offset)) = d.shared_range(mid_bytes.as_ptr() as usize, mid)
        {
            // The ends first, then the shared part (without bytes). A synchronous copy sends
            // them all at once: one wait for the whole copy, and the shared part still runs at
            // once on vgpud's session thread. An asynchronous one posts the shared part after
            // reading the ends (which wait for the stream), as CUDA's copies to pinned memory
            // are asynchronous.
            let c = ctx()?;
            let wire = wire_stream(stream)?;
            let shared = msg::MemcpyDtoHShared {
                ctx: c,
                stream: wire,
                src: src + head as u64,
                region,
                offset,
                len: mid as u64,
            };
            let (reqs, outs) = dtoh_chunks(c, wire, d.chunk, [(src, head_bytes), (tail_at, tail)]);
            if sync {
                let takes = in_place_copy_takes(mid);
                let r = lock(&d.client).call_into_chunks_then(&reqs, outs, &shared, takes);
                log_err("MemcpyDtoH", r)?;
                return crate::alloc_api::after_sync();
            }
            let r = lock(&d.client).call_into_chunks(&reqs, outs);
            log_err("MemcpyDtoH", r)?;
            crate::alloc_api::after_sync()?;
            d.note_shared_dtoh(region, c);
            return d.post(&shared, &[]);
        }
        // The ends first, the shared part last (as for host-to-device copies).
        for (at, p) in [(src, head_bytes), (tail_at, tail)] {
            if !p.is_empty() {
                memcpy_dtoh_routed(p, at, stream, sync)?;
            }
        }
        return memcpy_dtoh_routed(mid_bytes, src + head as u64, stream, sync);
    }
    memcpy_dtoh_raw(dst, src, stream)?;
    crate::alloc_api::after_sync()
}

/// [`memcpy_dtoh`] into a pinned buffer shared with vgpud: no bytes travel, and on a stream of
/// its own the copy is asynchronous, as CUDA's copies to pinned memory are. `None`: `dst` is
/// not inside one shared buffer.
fn memcpy_dtoh_shared(dst: &mut [u8], src: u64, stream: u64, sync: bool) -> Option<CuRes<()>> {
    let d = driver().ok()?;
    if dst.is_empty() {
        return None;
    }
    let (region, offset) = d.shared_range(dst.as_ptr() as usize, dst.len())?;
    Some((|| {
        let req = msg::MemcpyDtoHShared {
            ctx: ctx()?,
            stream: wire_stream(stream)?,
            src,
            region,
            offset,
            len: dst.len() as u64,
        };
        if sync {
            d.call_copy_in_place(&req, dst.len())?;
            crate::alloc_api::after_sync()
        } else {
            d.note_shared_dtoh(region, req.ctx);
            d.post(&req, &[])
        }
    })())
}

/// [`memcpy_dtoh`] from device memory, never from a mirror.
pub(crate) fn memcpy_dtoh_raw(dst: &mut [u8], src: u64, stream: u64) -> CuRes<()> {
    let c = ctx()?;
    let stream = wire_stream(stream)?;
    let d = driver()?;
    let (reqs, chunks) = dtoh_chunks(c, stream, d.chunk, [(src, dst)]);
    let r = lock(&d.client).call_into_chunks(&reqs, chunks);
    log_err("MemcpyDtoH", r)
}

/// The `MemcpyDtoH` requests that read each `(device address, destination)` part, in
/// `chunk`-byte pieces, and the destination of each.
fn dtoh_chunks<const N: usize>(
    ctx: u64,
    stream: u64,
    chunk: usize,
    parts: [(u64, &mut [u8]); N],
) -> (Vec<msg::MemcpyDtoH>, Vec<&mut [u8]>) {
    let mut reqs = Vec::new();
    let mut outs = Vec::new();
    for (src, dst) in parts {
        for (i, piece) in dst.chunks_mut(chunk).enumerate() {
            reqs.push(msg::MemcpyDtoH {
                ctx,
                stream,
                src: src + (i * chunk) as u64,
                len: piece.len() as u64,
            });
            outs.push(piece);
        }
    }
    (reqs, outs)
}

/// Device to host of what changed: `dst` holds what the device held when `hashes` (one per
/// page of `dst`, `vgpu_proto::pagehash`) were taken; only the pages whose bytes differ now
/// travel, and their hashes are updated. Returns the bytes received.
pub(crate) fn memcpy_dtoh_delta(dst: &mut [u8], src: u64, hashes: &mut [u64]) -> CuRes<u64> {
    use vgpu_proto::pagehash::{self, DELTA_PAGE};
    let c = ctx()?;
    let d = driver()?;
    // Whole pages per request, and a reply (bitmap and pages) within one chunk's frame.
    let chunk = (d.chunk / DELTA_PAGE).max(1) * DELTA_PAGE;
    let mut got = 0u64;
    for (i, (part, theirs)) in dst
        .chunks_mut(chunk)
        .zip(hashes.chunks_mut(chunk / DELTA_PAGE))
        .enumerate()
    {
        let req = msg::MemcpyDtoHDelta {
            ctx: c,
            stream: 0,
            src: src + (i * chunk) as u64,
            len: part.len() as u64,
        };
        let tail: Vec<u8> = theirs.iter().flat_map(|h| h.to_le_bytes()).collect();
        let r = lock(&d.client).call(&req, &tail);
        let reply = match r {
            Ok((_, reply)) => reply,
            // A vgpud from before delta copies.
            Err(e) if e.code == cuda::CUDA_ERROR_NOT_SUPPORTED => {
                memcpy_dtoh_raw(part, req.src, 0)?;
                for (h, page) in theirs.iter_mut().zip(part.chunks(DELTA_PAGE)) {
                    *h = pagehash::page_hash(page);
                }
                got += part.len() as u64;
                continue;
            }
            Err(e) => return log_err("MemcpyDtoHDelta", Err(e)),
        };
        let pages = theirs.len();
        let (bitmap, mut data) = reply
            .split_at_checked(pages.div_ceil(8))
            .ok_or(cuda::CUDA_ERROR_UNKNOWN)?;
        for (p, (page, h)) in part
            .chunks_mut(DELTA_PAGE)
            .zip(theirs.iter_mut())
            .enumerate()
        {
            if bitmap[p / 8] & (1 << (p % 8)) == 0 {
                continue;
            }
            let (bytes, rest) = data
                .split_at_checked(page.len())
                .ok_or(cuda::CUDA_ERROR_UNKNOWN)?;
            page.copy_from_slice(bytes);
            *h = pagehash::page_hash(page);
            got += page.len() as u64;
            data = rest;
        }
    }
    Ok(got)
}

/// Device to device.
pub fn memcpy_dtod(dst: u64, src: u64, len: u64, stream: u64, sync: bool) -> CuRes<()> {
    let c = ctx()?;
    let app_stream = stream;
    let stream = wire_stream(stream)?;
    let d = driver()?;
    if len == 0 {
        return Ok(());
    }
    let op = || crate::graph::Op::DtoD { dst, src, len };
    if let Some(r) = crate::stream_capture::intercept(stream, sync, op) {
        return r;
    }
    if let Some(r) = crate::alloc_api::dtod_hook(dst, src, len, stream, sync) {
        return r;
    }
    let req = msg::MemcpyDtoD {
        ctx: c,
        stream,
        dst,
        src,
        len,
    };
    if sync {
        // vgpud answers once the stream's work, this copy's too, is done: not on the process's
        // connection while other threads' calls wait behind it.
        crate::sync_wait::before_blocking_copy(app_stream)?;
        d.call(&req, &[]).map(drop)
    } else {
        d.post(&req, &[])
    }
}

/// Memory the shim knows an address to be in (`cuPointerGetAttribute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// This process's device memory: the allocation's range.
    Device { base: u64, size: u64 },
    /// Page-locked host memory (`cuMemHostAlloc`, `cuMemHostRegister`): its range.
    PinnedHost { base: u64, size: u64 },
}

/// The allocation `ptr` lies in, if the shim handed it out.
pub fn allocation_of(ptr: u64) -> CuRes<Option<Allocation>> {
    let d = driver()?;
    if let Some((&base, &size)) = lock(&d.device_ranges).range(..=ptr).next_back()
        && ptr - base < size
    {
        return Ok(Some(Allocation::Device { base, size }));
    }
    let inside = |base: usize, len: usize| (base as u64..base as u64 + len as u64).contains(&ptr);
    let pinned = lock(&d.host_allocs).iter().find_map(|(&base, a)| {
        let len = match a {
            HostAlloc::Heap(len) | HostAlloc::Placed(len) => *len,
            HostAlloc::Mapped {
                _unmapped_on_drop: m,
            } => m.len(),
            HostAlloc::Shared(b) => b.len(),
        };
        inside(base, len).then_some((base, len))
    });
    let pinned = pinned.or_else(|| {
        lock(&d.host_registered)
            .range(..=ptr as usize)
            .next_back()
            .map(|(&b, &l)| (b, l))
            .filter(|&(b, l)| inside(b, l))
    });
    Ok(pinned.map(|(base, size)| Allocation::PinnedHost {
        base: base as u64,
        size: size as u64,
    }))
}

/// What a unified-addressing pointer refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// This process's device memory.
    Device,
    /// Host memory.
    Host,
}

/// Classifies a pointer for `cuMemcpy`.
pub fn space_of(ptr: u64) -> CuRes<Space> {
    if let Some(dev) = crate::alloc_api::space_hook(ptr) {
        return Ok(if dev { Space::Device } else { Space::Host });
    }
    Ok(if driver()?.is_device_ptr(ptr) {
        Space::Device
    } else {
        Space::Host
    })
}

/// `cuMemsetD8/16/32` (and Async).
pub fn memset(
    dst: u64,
    value: u32,
    elem_size: u32,
    count: u64,
    stream: u64,
    sync: bool,
) -> CuRes<()> {
    let c = ctx()?;
    let app_stream = stream;
    let stream = wire_stream(stream)?;
    let d = driver()?;
    if count == 0 {
        return Ok(());
    }
    let op = || crate::graph::Op::Memset {
        dst,
        value,
        elem: elem_size,
        count,
    };
    if let Some(r) = crate::stream_capture::intercept(stream, sync, op) {
        return r;
    }
    if let Some(r) = crate::alloc_api::memset_hook(dst, value, elem_size, count) {
        return r;
    }
    let req = msg::Memset {
        ctx: c,
        stream,
        dst,
        value,
        elem_size,
        count,
    };
    if sync {
        // As a synchronous device-to-device copy.
        crate::sync_wait::before_blocking_copy(app_stream)?;
        d.call(&req, &[]).map(drop)
    } else {
        d.post(&req, &[])
    }
}

/// A `cuMemHostAlloc` buffer.
enum HostAlloc {
    /// From the heap, with this size (smaller than [`HOST_ALLOC_HUGE_MIN`]).
    Heap(usize),
    /// A huge-page-advised mapping of its own, held for its `Drop` (which unmaps it); the
    /// application reaches it through the pointer `host_alloc` returned.
    Mapped { _unmapped_on_drop: HugeMapping },
    /// A sealed memfd shared with vgpud ([`crate::pinned`]), unmapped by its `Drop`.
    Shared(crate::pinned::SharedBuffer),
    /// Private pages mapped at a device address reserved for it ([`crate::pinned_uva`]), this
    /// many bytes (smaller than [`HOST_ALLOC_HUGE_MIN`]); unmapped at `cuMemFreeHost`.
    Placed(usize),
}

/// `cuMemHostAlloc` buffers at least this large get a huge-page-advised mapping of their own: in
/// a guest whose transparent huge pages are `madvise` (Ubuntu's default) the buffer is then made
/// of physically contiguous 2 MiB runs, which the `vgpu` module hands to the device as a few
/// large descriptors instead of one per 4 KiB page (`vgpu-bench vgpu-dev`: 1.5–1.8× the copy
/// bandwidth at 16 MiB, docs/vgpu-device.md).
pub const HOST_ALLOC_HUGE_MIN: usize = HUGE_PAGE;

/// `cuMemAllocHost` / `cuMemHostAlloc`: guest-local, page-aligned host memory.
pub fn host_alloc(size: usize, flags: u32) -> CuRes<*mut u8> {
    let d = driver()?;
    ctx()?;
    if flags & !MEMHOSTALLOC_KNOWN != 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    if flags & MEMHOSTALLOC_DEVICEMAP != 0 {
        return crate::alloc_api::host_alloc_mapped(size, flags);
    }
    let p = host_alloc_plain(d, size)?;
    crate::alloc_api::note_host_flags(p as usize, flags);
    Ok(p)
}

/// A plain page-locked buffer, placed at a device address reserved for it so that kernels can
/// use it ([`crate::pinned_uva`]); where that cannot be, anywhere.
fn host_alloc_plain(d: &Driver, size: usize) -> CuRes<*mut u8> {
    let c = ctx()?;
    if let Some(va) = crate::pinned_uva::reserve(c, size) {
        if let Ok(p) = host_alloc_at(d, size, Some(va))
            && p as u64 == va
        {
            crate::pinned_uva::placed(va, size);
            return Ok(p);
        }
        crate::debug!(
            "cuMemHostAlloc: {va:#x} is taken in this process; an ordinary buffer instead"
        );
        crate::pinned_uva::unreserve(va, size);
    }
    host_alloc_at(d, size, None)
}

/// A page-locked buffer of `size` bytes, at `at` when given.
fn host_alloc_at(d: &Driver, size: usize, at: Option<u64>) -> CuRes<*mut u8> {
    if d.share_pinned.load(Ordering::Relaxed) {
        let at_addr = at.and_then(|a| usize::try_from(a).ok());
        let shared = crate::pinned::SharedBuffer::create_at(&mut lock(&d.client), size, at_addr);
        match shared {
            Ok(b) => {
                let p = b.addr();
                lock(&d.shared_pinned).insert(p, (b.len(), b.region()));
                lock(&d.host_allocs).insert(p, HostAlloc::Shared(b));
                return Ok(p as *mut u8);
            }
            Err(e) => {
                let refused = matches!(&e, crate::pinned::ShareError::Refused { code, .. }
                    if *code == cuda::CUDA_ERROR_NOT_SUPPORTED);
                if refused {
                    // An older vgpud, or a transport without descriptors: stop trying.
                    d.share_pinned.store(false, Ordering::Relaxed);
                }
                crate::debug!(
                    "cuMemHostAlloc: not shared with vgpud ({e}); a private buffer instead"
                );
            }
        }
    }
    if let Some(a) = at {
        // Large buffers are whole huge pages, advised, as below (the reserved range is made of
        // 2 MiB granules, so it has room); small ones are pages of their own.
        let alloc = if size >= HOST_ALLOC_HUGE_MIN {
            let at = std::ptr::NonNull::new(a as *mut u8).ok_or(cuda::CUDA_ERROR_OUT_OF_MEMORY)?;
            let m = HugeMapping::new_at(size, at).map_err(|_| cuda::CUDA_ERROR_OUT_OF_MEMORY)?;
            HostAlloc::Mapped {
                _unmapped_on_drop: m,
            }
        } else if crate::alloc_api::map_mirror(a, size.max(1)) {
            HostAlloc::Placed(size.max(1))
        } else {
            return Err(cuda::CUDA_ERROR_OUT_OF_MEMORY);
        };
        lock(&d.host_allocs).insert(a as usize, alloc);
        return Ok(a as *mut u8);
    }
    if size >= HOST_ALLOC_HUGE_MIN {
        let m = HugeMapping::new(size).map_err(|_| cuda::CUDA_ERROR_OUT_OF_MEMORY)?;
        let p = m.as_non_null().as_ptr();
        lock(&d.host_allocs).insert(
            p as usize,
            HostAlloc::Mapped {
                _unmapped_on_drop: m,
            },
        );
        return Ok(p);
    }
    let layout = std::alloc::Layout::from_size_align(size.max(1), HOST_ALLOC_ALIGN)
        .map_err(|_| cuda::CUDA_ERROR_OUT_OF_MEMORY)?;
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err(cuda::CUDA_ERROR_OUT_OF_MEMORY);
    }
    lock(&d.host_allocs).insert(p as usize, HostAlloc::Heap(size.max(1)));
    Ok(p)
}

/// `cuMemFreeHost`. `p` is only compared with the buffers `host_alloc`
/// returned; anything else is refused without being touched.
pub fn host_free(addr: usize) -> CuRes<()> {
    let d = driver()?;
    // A mapped buffer's device mirror is freed as `cuMemFree` frees, after the process's earlier
    // work: that wait comes first.
    if let Ok(c) = ctx() {
        crate::sync_wait::before_settling_if(c, || crate::alloc_api::is_mapped_host_alloc(addr))?;
    }
    if let Some(r) = crate::alloc_api::host_free_hook(addr) {
        return r;
    }
    let alloc = lock(&d.host_allocs)
        .remove(&addr)
        .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    // Its device memory and address range, if it was placed for kernels.
    crate::pinned_uva::free(addr as u64);
    if let HostAlloc::Shared(b) = &alloc {
        lock(&d.shared_pinned).remove(&addr);
        lock(&d.shared_dtoh_contexts).remove(&b.region());
        // vgpud keeps the region mapped for copies still queued; this process's mapping goes.
        let r = d.call(&msg::HostUnshare { region: b.region() }, &[]);
        if let Err(code) = r {
            crate::debug!("cuMemFreeHost: HostUnshare failed ({code})");
        }
    }
    if let HostAlloc::Placed(len) = alloc {
        // SAFETY: the mapping `host_alloc_at` made at `addr` for `len` bytes (recorded in
        // host_allocs, removed above), unmapped once.
        unsafe { libc::munmap(addr as *mut libc::c_void, len) };
        return Ok(());
    }
    // A mapping unmaps itself when dropped.
    let HostAlloc::Heap(size) = alloc else {
        return Ok(());
    };
    let layout = std::alloc::Layout::from_size_align(size, HOST_ALLOC_ALIGN)
        .map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?;
    let owned = addr as *mut u8;
    // SAFETY: `owned` was returned by `alloc_zeroed` with this layout (recorded in host_allocs,
    // removed above) and is freed once.
    unsafe { std::alloc::dealloc(owned, layout) };
    Ok(())
}

/// `cuMemHostRegister`: records `addr..addr + size` as registered. CUDA's rules hold: a range
/// that overlaps a registered one is refused with `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`;
/// I/O memory is not supported; mapped (`DEVICEMAP`) ranges get a device mirror
/// ([`crate::alloc_api`]).
///
/// On the unix socket the range's whole pages are moved into a memfd shared with vgpud when
/// they are private anonymous memory (the heap, `malloc`ed or `mmap`ed buffers):
/// [`crate::pinned::AdoptedRange`], same addresses and bytes, so that copies from and to them
/// are one memcpy on the host, as from a `cuMemHostAlloc` buffer. Otherwise (a file mapping,
/// read-only pages, another transport, `DEVICEMAP`, a small range) the memory stays as it is: the
/// shim's copies read and write any host memory, and with the virtio-vgpu device the `vgpu`
/// module pins an application's pages for the duration of each transfer anyway.
pub fn host_register(addr: usize, size: usize, flags: u32) -> CuRes<()> {
    let d = driver()?;
    ctx()?;
    if addr == 0 || size == 0 || flags & !MEMHOSTREGISTER_KNOWN != 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let end = addr
        .checked_add(size)
        .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    if flags & MEMHOSTREGISTER_IOMEMORY != 0 {
        crate::debug!("cuMemHostRegister: I/O memory is not supported");
        return Err(cuda::CUDA_ERROR_NOT_SUPPORTED);
    }
    let mut regs = lock(&d.host_registered);
    let before = regs.range(..end).next_back();
    if before.is_some_and(|(&start, &len)| start + len > addr) {
        return Err(cuda::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    }
    if flags & MEMHOSTREGISTER_DEVICEMAP != 0 {
        crate::alloc_api::register_mapped(addr, size, flags)?;
    } else if d.share_pinned.load(Ordering::Relaxed) {
        adopt_registered(d, addr, size);
    }
    regs.insert(addr, size);
    Ok(())
}

/// Shares the whole pages of a registered range with vgpud where possible
/// ([`host_register`]); anything that fails leaves the range as it was.
fn adopt_registered(d: &Driver, addr: usize, size: usize) {
    let adopted = crate::pinned::AdoptedRange::adopt(&mut lock(&d.client), addr, size);
    match adopted {
        Ok(Some(r)) => {
            let (start, entry) = r.entry();
            lock(&d.shared_pinned).insert(start, entry);
            lock(&d.host_adopted).insert(addr, r);
        }
        Ok(None) => {}
        Err(e) => {
            let refused = matches!(&e, crate::pinned::ShareError::Refused { code, .. }
                if *code == cuda::CUDA_ERROR_NOT_SUPPORTED);
            if refused {
                d.share_pinned.store(false, Ordering::Relaxed);
            }
            crate::debug!("cuMemHostRegister: the range stays private ({e})");
        }
    }
}

/// `cuMemHostUnregister`: `addr` must be where a registered range starts. A range whose pages
/// were shared with vgpud gets them back as private memory, bytes unchanged, once the
/// device-to-host copies queued into it have run; an error of those copies is returned (as
/// CUDA may return errors of earlier asynchronous work), after the range was unregistered.
pub fn host_unregister(addr: usize) -> CuRes<()> {
    let d = driver()?;
    let c = ctx()?;
    let registered = lock(&d.host_registered).contains_key(&addr);
    // A mapped range's device mirror is read back and freed as `cuMemFree` frees, after the
    // process's earlier work: that wait comes first.
    crate::sync_wait::before_settling_if(c, || {
        registered && crate::alloc_api::is_mapped_registration(addr)
    })?;
    if registered && let Some(r) = crate::alloc_api::unregister_hook(addr) {
        r?;
    }
    lock(&d.host_registered)
        .remove(&addr)
        .ok_or(cuda::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)?;
    let Some(adopted) = lock(&d.host_adopted).remove(&addr) else {
        return Ok(());
    };
    lock(&d.shared_pinned).remove(&adopted.start());
    let pending = waited_for_shared_dtoh(d, adopted.region());
    if let Err(code) = d.call(
        &msg::HostUnshare {
            region: adopted.region(),
        },
        &[],
    ) {
        crate::debug!("cuMemHostUnregister: HostUnshare failed ({code})");
    }
    if let Err(e) = adopted.restore() {
        crate::debug!("cuMemHostUnregister: the pages stay shared ({e})");
    }
    pending
}

/// Waits for the contexts that queued device-to-host copies into shared region `region`
/// (so that nothing writes to it any more) and forgets them; the first error a context
/// reports, other than its being gone.
fn waited_for_shared_dtoh(d: &Driver, region: u64) -> CuRes<()> {
    let contexts = lock(&d.shared_dtoh_contexts)
        .remove(&region)
        .unwrap_or_default();
    let mut first = Ok(());
    for c in contexts {
        // Not on the process's connection while another thread's work is queued before.
        match crate::sync_wait::synchronize(msg::SYNC_CONTEXT, c, 0) {
            Err(cuda::CUDA_ERROR_INVALID_CONTEXT | cuda::CUDA_ERROR_CONTEXT_IS_DESTROYED) => {}
            Err(code) if first.is_ok() => first = Err(code),
            _ => {}
        }
    }
    first.map(drop)
}

// ---- streams and events ----------------------------------------------------

thread_local! {
    /// Set while a `_ptsz`/`_ptds` entry point runs: stream 0 (and the
    /// implicit stream of synchronous calls) means the per-thread default
    /// stream, as for a program built with `--default-stream per-thread`.
    static PER_THREAD_DEFAULT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// This thread's per-thread default streams, destroyed when it exits.
    static PER_THREAD_STREAMS: RefCell<PerThreadStreams> = const { RefCell::new(PerThreadStreams(Vec::new())) };
}

/// A thread's per-thread default streams: (context, stream handle).
struct PerThreadStreams(Vec<(u64, u64)>);

impl Drop for PerThreadStreams {
    fn drop(&mut self) {
        let Ok(d) = driver() else {
            return;
        };
        for (ctx, stream) in self.0.drain(..) {
            // The context may be gone already; then so is the stream.
            let _ = d.call(&msg::StreamDestroy { ctx, stream }, &[]);
        }
    }
}

/// Whether `s` names the legacy default stream: `CU_STREAM_LEGACY`, or 0 outside a
/// `_ptsz`/`_ptds` entry point.
pub fn is_legacy_stream(s: u64) -> bool {
    s == STREAM_LEGACY || (s == 0 && !PER_THREAD_DEFAULT.with(std::cell::Cell::get))
}

/// Runs `f` as a `_ptsz`/`_ptds` entry point: stream 0 is the calling
/// thread's per-thread default stream.
pub fn with_per_thread_default<T>(f: impl FnOnce() -> T) -> T {
    let before = PER_THREAD_DEFAULT.with(|c| c.replace(true));
    let r = f();
    PER_THREAD_DEFAULT.with(|c| c.set(before));
    r
}

/// The stream handle to send for `s`: the calling thread's per-thread
/// default stream of the current context for `CU_STREAM_PER_THREAD` (and for
/// 0 inside a `_ptsz`/`_ptds` entry point), a blocking stream the shim
/// creates on first use; `s` itself otherwise.
pub fn wire_stream(s: u64) -> CuRes<u64> {
    let per_thread =
        s == STREAM_PER_THREAD || (s == 0 && PER_THREAD_DEFAULT.with(std::cell::Cell::get));
    if !per_thread {
        return Ok(s);
    }
    let c = ctx()?;
    let known = PER_THREAD_STREAMS
        .try_with(|p| p.borrow().0.iter().find(|e| e.0 == c).map(|e| e.1))
        .map_err(|_| cuda::CUDA_ERROR_DEINITIALIZED)?;
    if let Some(h) = known {
        return Ok(h);
    }
    let h = driver()?
        .call(
            &msg::StreamCreate {
                ctx: c,
                flags: 0,
                priority: 0,
            },
            &[],
        )?
        .handle;
    PER_THREAD_STREAMS
        .try_with(|p| p.borrow_mut().0.push((c, h)))
        .map_err(|_| cuda::CUDA_ERROR_DEINITIALIZED)?;
    Ok(h)
}

/// Forgets the calling thread's per-thread default stream of context `c`
/// (it was destroyed with the context).
fn forget_per_thread_stream(c: u64) {
    let _ = PER_THREAD_STREAMS.try_with(|p| {
        p.borrow_mut().0.retain(|&(ctx, stream)| {
            if ctx == c {
                crate::stream_attrs::forget(stream);
            }
            ctx != c
        })
    });
}

/// `cuStreamCreateWithPriority`.
pub fn stream_create(flags: u32, priority: i32) -> CuRes<u64> {
    stream_create_in(ctx()?, flags, priority)
}

/// Creates a stream in context `c` (`cuGreenCtxStreamCreate`: whichever is current).
pub fn stream_create_in(c: u64, flags: u32, priority: i32) -> CuRes<u64> {
    let d = driver()?;
    let priority = priority.clamp(GREATEST_PRIORITY, 0);
    let h = d
        .call(
            &msg::StreamCreate {
                ctx: c,
                flags,
                priority,
            },
            &[],
        )?
        .handle;
    lock(&d.streams).insert(h, (flags, priority, c));
    Ok(h)
}

/// `cuStreamDestroy`.
pub fn stream_destroy(s: u64) -> CuRes<()> {
    let c = ctx()?;
    let d = driver()?;
    d.call(&msg::StreamDestroy { ctx: c, stream: s }, &[])?;
    lock(&d.streams).remove(&s);
    crate::stream_attrs::forget(s);
    Ok(())
}

/// `cuStreamGetPriority` / `cuStreamGetFlags`: (flags, priority).
pub fn stream_params(s: u64) -> CuRes<(u32, i32)> {
    let d = driver()?;
    if s == 0 || s == STREAM_PER_THREAD || s == STREAM_LEGACY {
        return Ok((0, 0));
    }
    lock(&d.streams)
        .get(&s)
        .map(|&(flags, priority, _)| (flags, priority))
        .ok_or(cuda::CUDA_ERROR_INVALID_HANDLE)
}

/// `cuStreamGetCtx`: the context a created stream belongs to; the default streams' is the
/// calling thread's current context (the primary context when none is current).
pub fn stream_context(s: u64) -> CuRes<u64> {
    let d = driver()?;
    if s == 0 || s == STREAM_PER_THREAD || s == STREAM_LEGACY {
        return match current_ctx() {
            Some(c) => Ok(c),
            None => primary_handle(0),
        };
    }
    lock(&d.streams)
        .get(&s)
        .map(|&(_, _, c)| c)
        .ok_or(cuda::CUDA_ERROR_INVALID_HANDLE)
}

/// Set in the ID of a context's legacy default stream: no handle has it (their bits 63..47 are
/// zero), so the ID differs from every stream's and context's.
const LEGACY_STREAM_ID_BIT: u64 = 1 << 63;

/// `cuStreamGetId`: a stream's ID, unique among the process's live streams. A created stream's
/// (and a per-thread default stream's) is its handle; the legacy default stream's is its
/// context's handle with [`LEGACY_STREAM_ID_BIT`].
pub fn stream_id(s: u64) -> CuRes<u64> {
    let c = ctx()?;
    let per_thread =
        s == STREAM_PER_THREAD || (s == 0 && PER_THREAD_DEFAULT.with(std::cell::Cell::get));
    if per_thread {
        return wire_stream(s);
    }
    if s == 0 || s == STREAM_LEGACY {
        return Ok(LEGACY_STREAM_ID_BIT | c);
    }
    stream_params(s)?;
    Ok(s)
}

/// `cuCtxGetId`: a context's ID, its handle (the current context's for 0). The host checks a
/// given context with a query that waits for nothing.
pub fn ctx_id(c: u64) -> CuRes<u64> {
    let c = if c == 0 { ctx()? } else { c };
    driver()?.call(&msg::MemGetInfo { ctx: c }, &[])?;
    Ok(c)
}

/// `cuStreamSynchronize`.
pub fn stream_synchronize(s: u64) -> CuRes<()> {
    let c = ctx()?;
    crate::stream_capture::check_stream_sync(s)?;
    let s = wire_stream(s)?;
    crate::sync_wait::synchronize(msg::SYNC_STREAM, c, s)?;
    crate::alloc_api::after_sync()
}

/// `cuStreamQuery`.
pub fn stream_query(s: u64) -> CuRes<()> {
    let c = ctx()?;
    crate::stream_capture::check_stream_sync(s)?;
    let s = wire_stream(s)?;
    driver()?.call(&msg::StreamQuery { ctx: c, stream: s }, &[])?;
    crate::alloc_api::after_sync()
}

/// `cuStreamWaitEvent`.
pub fn stream_wait_event(s: u64, e: u64, flags: u32) -> CuRes<()> {
    let c = ctx()?;
    if let Some(r) = crate::stream_capture::on_stream_wait(s, e, flags) {
        return r;
    }
    let s = wire_stream(s)?;
    driver()?.post(
        &msg::StreamWaitEvent {
            ctx: c,
            stream: s,
            event: e,
            flags,
        },
        &[],
    )
}

/// `cuEventCreate`.
pub fn event_create(flags: u32) -> CuRes<u64> {
    let c = ctx()?;
    Ok(driver()?
        .call(&msg::EventCreate { ctx: c, flags }, &[])?
        .handle)
}

/// `cuEventDestroy`.
pub fn event_destroy(e: u64) -> CuRes<()> {
    let c = ctx()?;
    driver()?
        .call(&msg::EventDestroy { ctx: c, event: e }, &[])
        .map(drop)?;
    Ok(())
}

/// `cuEventRecord`.
pub fn event_record(e: u64, s: u64) -> CuRes<()> {
    let c = ctx()?;
    if let Some(r) = crate::stream_capture::on_event_record(e, s) {
        return r;
    }
    let s = wire_stream(s)?;
    driver()?.post(
        &msg::EventRecord {
            ctx: c,
            stream: s,
            event: e,
        },
        &[],
    )
}

/// `cuCtxRecordEvent`: `event` (of context `c`, the current one for 0) completes once all of
/// `c`'s work submitted so far has run.
pub fn ctx_record_event(c: u64, event: u64) -> CuRes<()> {
    let ctx = context_wide(c, event)?;
    driver()?
        .call(&msg::CtxRecordEvent { ctx, event }, &[])
        .map(drop)
}

/// `cuCtxWaitEvent`: all of context `c`'s (the current one's for 0) work submitted from now on
/// waits for `event`.
pub fn ctx_wait_event(c: u64, event: u64) -> CuRes<()> {
    let ctx = context_wide(c, event)?;
    driver()?
        .call(&msg::CtxWaitEvent { ctx, event }, &[])
        .map(drop)
}

/// The context of a call about all its streams (`c`, or the current one for 0), unless a stream
/// captures or the event is in a capture: then `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, the
/// captures invalidated.
fn context_wide(c: u64, event: u64) -> CuRes<u64> {
    driver()?;
    let ctx = if c == 0 { ctx()? } else { c };
    if crate::stream_capture::check_event(event).is_err() {
        crate::stream_capture::check_context_wide()?;
        return Err(cuda::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    crate::stream_capture::check_context_wide()?;
    Ok(ctx)
}

/// `cuEventQuery`.
pub fn event_query(e: u64) -> CuRes<()> {
    let c = ctx()?;
    crate::stream_capture::check_event(e)?;
    driver()?.call(&msg::EventQuery { ctx: c, event: e }, &[])?;
    crate::alloc_api::after_sync()
}

/// `cuEventSynchronize`.
pub fn event_synchronize(e: u64) -> CuRes<()> {
    let c = ctx()?;
    crate::stream_capture::check_event(e)?;
    crate::sync_wait::synchronize(msg::SYNC_EVENT, c, e)?;
    crate::alloc_api::after_sync()
}

/// `cuEventElapsedTime` in milliseconds.
pub fn event_elapsed(start: u64, end: u64) -> CuRes<f32> {
    let c = ctx()?;
    Ok(driver()?
        .call(&msg::EventElapsedTime { ctx: c, start, end }, &[])?
        .ms)
}

/// The VM's slice and sessions as JSON (for vgpu-smi and NVML), over the session.
pub fn tenant_info() -> CuRes<String> {
    Ok(session()?.call(&msg::TenantInfo {}, &[])?.json)
}

/// Round trip without side effects (for benchmarks).
pub fn ping() -> CuRes<()> {
    driver()?.call(&msg::Ping {}, &[]).map(drop)
}

// ---- modules and launches ----------------------------------------------------

/// The largest module image one request carries (room left for the request's fields); larger
/// images go in parts of this size ([`msg::ModuleLoadPart`]).
const MODULE_PART_BYTES: usize = vgpu_proto::frame::MAX_PAYLOAD - 64;

/// `cuModuleLoadData`: returns the module, or the code and the host's message
/// (for `CU_JIT_ERROR_LOG_BUFFER`).
pub fn module_load(image: &[u8]) -> Result<u64, (CuResult, String)> {
    let c = ctx().map_err(|e| (e, String::new()))?;
    let d = driver().map_err(|e| (e, String::new()))?;
    let r = if image.len() <= MODULE_PART_BYTES {
        lock(&d.client)
            .call(&msg::ModuleLoad { ctx: c }, image)
            .map(|(h, _)| h)
    } else {
        // Larger than one request (CuPy's Thrust: 8.9 MB of PTX for compute 10.0, compressed):
        // in parts, which vgpud charges to the VM's module budget as a whole from the first.
        let total = image.len() as u64;
        let mut client = lock(&d.client);
        let mut loaded = Ok(msg::Handle { handle: 0 });
        for (i, part) in image.chunks(MODULE_PART_BYTES).enumerate() {
            let offset = (i * MODULE_PART_BYTES) as u64;
            loaded = client
                .call(
                    &msg::ModuleLoadPart {
                        ctx: c,
                        total,
                        offset,
                    },
                    part,
                )
                .map(|(h, _)| h);
            if loaded.is_err() {
                break;
            }
        }
        loaded
    };
    match r {
        Ok(h) => {
            lock(&d.modules).insert(h.handle);
            Ok(h.handle)
        }
        Err(e) => {
            crate::debug!("cuModuleLoadData -> {}: {}", e.code, e.message);
            Err((e.code, e.message))
        }
    }
}

/// `cuModuleUnload`.
pub fn module_unload(m: u64) -> CuRes<()> {
    let c = ctx()?;
    let d = driver()?;
    crate::sync_wait::before_settling(c)?;
    crate::texrefs::module_gone(m);
    d.call(&msg::ModuleUnload { ctx: c, module: m }, &[])?;
    crate::alloc_api::module_gone(m);
    lock(&d.modules).remove(&m);
    lock(&d.functions).retain(|_, f| f.module != m);
    Ok(())
}

/// `cuModuleGetFunction`.
pub fn module_get_function(m: u64, name: &str) -> CuRes<u64> {
    let c = ctx()?;
    let d = driver()?;
    let r = d.call(
        &msg::ModuleGetFunction {
            ctx: c,
            module: m,
            name: name.to_string(),
        },
        &[],
    )?;
    // A function looked up again keeps its cached entry, so that a name
    // handed out by `cuFuncGetName` stays valid while the module is loaded.
    lock(&d.functions)
        .entry(r.function)
        .or_insert_with(|| FuncLayout {
            name: CString::new(name).unwrap_or_default().into(),
            module: m,
            offsets: r.param_offsets,
            sizes: r.param_sizes,
            attributes: r.attributes,
        });
    Ok(r.function)
}

/// Whether `m` is a module (library) this process loaded and has not unloaded.
pub fn is_module(m: u64) -> CuRes<bool> {
    Ok(lock(&driver()?.modules).contains(&m))
}

/// The names of a module's kernels, in the module's order
/// (`cuModuleEnumerateFunctions`, `cuLibraryEnumerateKernels`).
pub fn module_function_names(m: u64) -> CuRes<Vec<String>> {
    let c = ctx()?;
    let r = driver()?.call(&msg::ModuleFunctionNames { ctx: c, module: m }, &[])?;
    Ok(r.names.split_terminator('\0').map(str::to_string).collect())
}

/// `cuModuleGetGlobal`: (address, size). A `__managed__` variable becomes reachable from
/// the process at its address ([`crate::alloc_api::adopt_module_variable`]).
pub fn module_get_global(m: u64, name: &str) -> CuRes<(u64, u64)> {
    module_global(m, name).map(|(base, size, _)| (base, size))
}

/// A module variable's (address, size, whether it is `__managed__`); see
/// [`module_get_global`].
pub fn module_global(m: u64, name: &str) -> CuRes<(u64, u64, bool)> {
    let c = ctx()?;
    let d = driver()?;
    let info = d.call(
        &msg::ModuleGetGlobalInfo {
            ctx: c,
            module: m,
            name: name.to_string(),
        },
        &[],
    );
    let (base, size, flags) = match info {
        Ok(r) => (r.base, r.size, r.flags),
        // A vgpud from before `ModuleGetGlobalInfo`: no managed variables.
        Err(e) if e == cuda::CUDA_ERROR_NOT_SUPPORTED => {
            let r = d.call(
                &msg::ModuleGetGlobal {
                    ctx: c,
                    module: m,
                    name: name.to_string(),
                },
                &[],
            )?;
            (r.base, r.size, 0)
        }
        Err(e) => return Err(e),
    };
    if flags & (msg::GLOBAL_TEXREF | msg::GLOBAL_SURFREF) != 0 {
        // A texture or surface reference's slot: not a variable (`cuModuleGetTexRef` finds it).
        return Err(cuda::CUDA_ERROR_NOT_FOUND);
    }
    let managed = flags & msg::GLOBAL_MANAGED != 0;
    if managed {
        let len = usize::try_from(size).map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?;
        crate::alloc_api::adopt_module_variable(m, base, len, c)?;
    } else {
        lock(&d.device_ranges).insert(base, size);
    }
    Ok((base, size, managed))
}

/// The slot of module `m`'s texture (`surface` false) or surface reference `name`: its device
/// address, where the handle of the object it is bound to goes.
pub fn module_reference(m: u64, name: &str, surface: bool) -> CuRes<u64> {
    let c = ctx()?;
    let r = driver()?.call(
        &msg::ModuleGetGlobalInfo {
            ctx: c,
            module: m,
            name: name.to_string(),
        },
        &[],
    )?;
    let want = if surface {
        msg::GLOBAL_SURFREF
    } else {
        msg::GLOBAL_TEXREF
    };
    if r.flags & want == 0 {
        return Err(cuda::CUDA_ERROR_NOT_FOUND);
    }
    Ok(r.base)
}

/// The cached layout of a function.
pub fn func_layout(f: u64) -> CuRes<FuncLayout> {
    lock(&driver()?.functions)
        .get(&f)
        .cloned()
        .ok_or(cuda::CUDA_ERROR_INVALID_HANDLE)
}

/// `cuLaunchKernel` with a packed parameter buffer.
pub fn launch(
    f: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: u64,
    params: &[u8],
) -> CuRes<()> {
    launch_with(f, grid, block, shared, stream, params, false, None)
}

/// `cuLaunchCooperativeKernel`: every block at once (vgpud refuses a grid larger than the
/// device holds at once with `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`). Not capturable into a
/// graph here: `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, and the capture is invalidated.
pub fn launch_cooperative(
    f: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: u64,
    params: &[u8],
) -> CuRes<()> {
    if crate::stream_capture::recording() {
        return Err(cuda::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    crate::stream_capture::check_stream_sync(stream)?;
    launch_with(f, grid, block, shared, stream, params, true, None)
}

/// Highest stream and kernel priority the device reports (`cuCtxGetStreamPriorityRange`'s
/// greatest; its least is 0). Priorities outside `[GREATEST_PRIORITY, 0]` are clamped, as CUDA
/// clamps them.
pub const GREATEST_PRIORITY: i32 = -5;

/// `cuLaunchKernelEx`: a launch with the attributes vgpu keeps, cooperative and a priority of
/// its own (`CU_LAUNCH_ATTRIBUTE_PRIORITY`, clamped to the device's range; `None`: the
/// stream's).
#[allow(clippy::too_many_arguments)]
pub fn launch_ex(
    f: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: u64,
    params: &[u8],
    cooperative: bool,
    priority: Option<i32>,
) -> CuRes<()> {
    if cooperative {
        if crate::stream_capture::recording() {
            return Err(cuda::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        crate::stream_capture::check_stream_sync(stream)?;
    }
    launch_with(
        f,
        grid,
        block,
        shared,
        stream,
        params,
        cooperative,
        priority,
    )
}

#[allow(clippy::too_many_arguments)]
fn launch_with(
    f: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: u64,
    params: &[u8],
    cooperative: bool,
    priority: Option<i32>,
) -> CuRes<()> {
    let c = ctx()?;
    let d = driver()?;
    // Launch limits fail at the launch, as CUDA reports them, not at the next
    // synchronization: the device's grid and block limits, and the kernel's
    // limits as cached at lookup (and updated by cuFuncSetAttribute).
    let attr = |a: usize| d.props.attributes.get(a).copied().unwrap_or(i32::MAX);
    let grid_max = [
        attr(cuda::attr::MAX_GRID_DIM_X),
        attr(cuda::attr::MAX_GRID_DIM_Y),
        attr(cuda::attr::MAX_GRID_DIM_Z),
    ];
    let block_max = [
        attr(cuda::attr::MAX_BLOCK_DIM_X),
        attr(cuda::attr::MAX_BLOCK_DIM_Y),
        attr(cuda::attr::MAX_BLOCK_DIM_Z),
    ];
    let within = |dims: [u32; 3], max: [i32; 3]| {
        dims.iter()
            .zip(max)
            .all(|(&v, m)| v > 0 && i64::from(v) <= i64::from(m))
    };
    if !within(grid, grid_max) || !within(block, block_max) {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    if let Some(l) = lock(&d.functions).get(&f) {
        if l.attributes.get(cuda::func_attr::VGPU_NO_BINARY) == Some(&1) {
            crate::library::no_binary(&format!(
                "kernel `{}` comes from a cubin (SASS), which this device cannot run: the simulated GPU runs PTX (build with -gencode arch=compute_XX,code=compute_XX)",
                l.name.to_string_lossy()
            ));
            return Err(cuda::CUDA_ERROR_NO_BINARY_FOR_GPU);
        }
        let limit = |a: usize| l.attributes.get(a).map_or(i64::MAX, |&v| i64::from(v));
        let threads = block.iter().map(|&b| i64::from(b)).product::<i64>();
        if i64::from(shared) > limit(cuda::func_attr::MAX_DYNAMIC_SHARED_SIZE_BYTES)
            || threads > limit(cuda::func_attr::MAX_THREADS_PER_BLOCK)
        {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
    }
    let req = msg::LaunchKernel {
        ctx: c,
        stream: wire_stream(stream)?,
        function: f,
        grid_x: grid[0],
        grid_y: grid[1],
        grid_z: grid[2],
        block_x: block[0],
        block_y: block[1],
        block_z: block[2],
        shared_bytes: shared,
    };
    // The stream's own priority: a launch priority equal to it changes nothing, and the
    // captured node's priority is the stream's unless the launch has its own (CUDA).
    let stream_priority = stream_params(stream).map_or(0, |(_, p)| p);
    let priority = priority.map(|p| p.clamp(GREATEST_PRIORITY, 0));
    let op = || crate::graph::Op::Kernel {
        f,
        grid,
        block,
        shared,
        params: params.to_vec(),
        priority: priority.unwrap_or(stream_priority),
    };
    if let Some(r) = crate::stream_capture::intercept(stream, false, op) {
        return r;
    }
    crate::pinned_uva::back_args(c, params)?;
    crate::alloc_api::before_launch(stream)?;
    match priority {
        // Only a priority that differs from the stream's needs the newer op.
        Some(p) if p != stream_priority => d.post(&req.with_priority(cooperative, p), params),
        _ if cooperative => d.post(&req.cooperative(), params),
        _ => d.post(&req, params),
    }
}

/// `cuFuncGetAttribute` (live: reflects `cuFuncSetAttribute`).
pub fn func_get_attribute(f: u64, attribute: i32) -> CuRes<i32> {
    let c = ctx()?;
    Ok(driver()?
        .call(
            &msg::FuncGetAttribute {
                ctx: c,
                function: f,
                attribute,
            },
            &[],
        )?
        .value)
}

/// `cuFuncSetAttribute`.
pub fn func_set_attribute(f: u64, attribute: i32, value: i32) -> CuRes<()> {
    let c = ctx()?;
    let d = driver()?;
    d.call(
        &msg::FuncSetAttribute {
            ctx: c,
            function: f,
            attribute,
            value,
        },
        &[],
    )?;
    if let Some(l) = lock(&d.functions).get_mut(&f)
        && let Some(a) = usize::try_from(attribute)
            .ok()
            .and_then(|a| l.attributes.get_mut(a))
    {
        *a = value;
    }
    Ok(())
}

/// Occupancy: resident blocks of `block_size` threads per multiprocessor.
pub fn occupancy_blocks_per_sm(f: u64, block_size: i32, dyn_smem: usize) -> CuRes<i32> {
    let d = driver()?;
    let l = func_layout(f)?;
    if block_size <= 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let dev = |a: usize| i64::from(d.props.attributes.get(a).copied().unwrap_or(0));
    let fa = |a: usize| i64::from(l.attributes.get(a).copied().unwrap_or(0));
    let n = cuda::blocks_per_multiprocessor(
        &dev,
        &fa,
        i64::from(block_size),
        i64::try_from(dyn_smem).unwrap_or(i64::MAX),
    );
    Ok(i32::try_from(n).unwrap_or(i32::MAX))
}

/// `cuOccupancyAvailableDynamicSMemPerBlock`: the most dynamic shared memory per block (up to
/// the function's `MAX_DYNAMIC_SHARED_SIZE_BYTES`) with which `blocks` blocks of `block_size`
/// threads still fit one multiprocessor at once, by the same model as
/// [`occupancy_blocks_per_sm`]; 0 when they do not fit even without any.
pub fn occupancy_available_dyn_smem(f: u64, blocks: i32, block_size: i32) -> CuRes<usize> {
    use vgpu_proto::cuda::func_attr;
    let l = func_layout(f)?;
    if blocks <= 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let fits = |smem: usize| occupancy_blocks_per_sm(f, block_size, smem).map(|n| n >= blocks);
    if !fits(0)? {
        return Ok(0);
    }
    let limit = l
        .attributes
        .get(func_attr::MAX_DYNAMIC_SHARED_SIZE_BYTES)
        .copied()
        .unwrap_or(0);
    // Occupancy never grows with more shared memory: the largest size that fits, by bisection.
    let (mut lo, mut hi) = (0usize, usize::try_from(limit).unwrap_or(0));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Ok(lo)
}

/// `cuOccupancyMaxPotentialBlockSize`: (min grid size, block size).
pub fn occupancy_max_block_size(
    f: u64,
    dyn_smem: &dyn Fn(i32) -> usize,
    limit: i32,
) -> CuRes<(i32, i32)> {
    use vgpu_proto::cuda::{attr, func_attr};
    let d = driver()?;
    let l = func_layout(f)?;
    let warp = d
        .props
        .attributes
        .get(attr::WARP_SIZE)
        .copied()
        .unwrap_or(32)
        .max(1);
    let sms = d
        .props
        .attributes
        .get(attr::MULTIPROCESSOR_COUNT)
        .copied()
        .unwrap_or(1)
        .max(1);
    let mut max = l
        .attributes
        .get(func_attr::MAX_THREADS_PER_BLOCK)
        .copied()
        .unwrap_or(1024);
    if limit > 0 {
        max = max.min(limit);
    }
    let (mut best, mut best_blocks, mut best_occ) = (warp.min(max.max(1)), 0, -1i64);
    let mut bs = (max / warp) * warp;
    while bs >= warp {
        let blocks = occupancy_blocks_per_sm(f, bs, dyn_smem(bs))?;
        let occ = i64::from(blocks) * i64::from(bs);
        if occ > best_occ {
            (best, best_blocks, best_occ) = (bs, blocks, occ);
        }
        bs -= warp;
    }
    Ok((best_blocks.saturating_mul(sms), best))
}

/// Operations that the host does not support yet.
pub fn unsupported(what: &str) -> CuResult {
    crate::debug!("{what}: not supported by vgpu");
    cuda::CUDA_ERROR_NOT_SUPPORTED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_stack_is_last_in_first_out_and_bounded() {
        let mut s = CtxStack::EMPTY;
        assert_eq!(s.pop(), None);
        for c in 1..=MAX_CTX_STACK as u64 {
            s.push(c).expect("room");
        }
        assert_eq!(s.push(99), Err(cuda::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(s.last(), Some(MAX_CTX_STACK as u64));
        s.remove_all(MAX_CTX_STACK as u64);
        s.remove_all(1);
        assert_eq!(s.pop(), Some(MAX_CTX_STACK as u64 - 1));
        assert_eq!(s.len, MAX_CTX_STACK - 3);
        assert_eq!(s.entries[0], 2, "the order below is kept");
    }

    #[test]
    fn the_context_stack_needs_no_destructor() {
        // So the thread-local holding it stays readable while other
        // libraries' thread-exit and atexit hooks call the driver.
        assert!(!std::mem::needs_drop::<RefCell<CtxStack>>());
    }
}
