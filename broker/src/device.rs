//! The executor seam: a [`Device`] runs tenants' work, each tenant (VM) in its
//! own [`DeviceContext`]. The simulated GPU (`devices/sim`) and the real GPU
//! (`devices/cuda`) implement these traits; the broker validates every
//! pointer and charges every byte before it calls them.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use thiserror::Error;
use vgpu_proto::cuda::{self, CuResult};

use crate::devio::LaunchOutput;
use crate::error::CuError;
use crate::texture::{TexSampling, TexelLayout};

/// Granularity of virtual memory management allocations (`cuMemGetAllocationGranularity`):
/// physical memory sizes, reservations and mappings are multiples of it.
pub const VMM_GRANULARITY: u64 = 2 << 20;

/// Where an allocation's bytes live (docs/memory.md, "Overflow and address stability").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residence {
    /// Device memory.
    Device,
    /// Host memory the device's kernels can address (overflow).
    Host,
}

/// Static description of a device.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// Marketing name (`cuDeviceGetName`).
    pub name: String,
    /// `sim` or `cuda`.
    pub kind: &'static str,
    /// UUID (`cuDeviceGetUuid`).
    pub uuid: [u8; 16],
    /// Device memory in bytes.
    pub total_memory: u64,
    /// Allocation granularity: every allocation is charged rounded up to this.
    pub alloc_granularity: u64,
    /// `CUdevice_attribute` values, indexed by attribute number.
    pub attributes: Vec<i32>,
    /// A kernel running longer than this fails with `CUDA_ERROR_LAUNCH_TIMEOUT`.
    pub watchdog: Option<std::time::Duration>,
}

impl DeviceInfo {
    /// An attribute value (0 when unknown).
    pub fn attribute(&self, attr: usize) -> i32 {
        self.attributes.get(attr).copied().unwrap_or(0)
    }
}

/// Why a device operation failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DeviceError {
    /// The device itself has no room left (all slices together over-commit it).
    #[error("device memory is exhausted")]
    OutOfMemory,
    /// An address outside the context's allocations (the broker checks first; this is defence in depth).
    #[error("address range {addr:#x}+{len} is not inside a live allocation")]
    InvalidAddress {
        /// Start of the range.
        addr: u64,
        /// Length of the range.
        len: u64,
    },
    /// The operation is not implemented by this device.
    #[error("{0}")]
    NotSupported(String),
    /// A module image the device cannot load.
    #[error("{message}")]
    InvalidImage {
        /// `CUDA_ERROR_INVALID_PTX`, `CUDA_ERROR_INVALID_IMAGE`, `CUDA_ERROR_NOT_SUPPORTED`, …
        code: CuResult,
        /// What was wrong, with the line where there is one.
        message: String,
    },
    /// A kernel faulted (illegal address, trap, timeout, …).
    #[error("{message}")]
    Fault {
        /// The sticky `CUresult`.
        code: CuResult,
        /// Kernel, address and line.
        message: String,
    },
    /// A launch the device refuses (bad dimensions, too much shared memory, wrong parameter size).
    #[error("{message}")]
    InvalidLaunch {
        /// `CUDA_ERROR_INVALID_VALUE` or `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`.
        code: CuResult,
        /// Why.
        message: String,
    },
    /// A module load stopped before it finished: past its deadline, or its client has gone.
    /// `CUDA_ERROR_INVALID_PTX`, what `cuModuleLoadData` returns when the JIT compilation of a
    /// module fails.
    #[error("{0}")]
    LoadStopped(String),
    /// A driver call failed (real GPU).
    #[error("{call} failed with {}", cuda::result_name(*code).unwrap_or("an unknown CUresult"))]
    Driver {
        /// The driver function.
        call: &'static str,
        /// Its result.
        code: CuResult,
    },
}

impl DeviceError {
    /// The `CUresult` a guest sees for this error.
    pub fn cu_result(&self) -> CuResult {
        match self {
            DeviceError::OutOfMemory => cuda::CUDA_ERROR_OUT_OF_MEMORY,
            DeviceError::InvalidAddress { .. } => cuda::CUDA_ERROR_INVALID_VALUE,
            DeviceError::NotSupported(_) => cuda::CUDA_ERROR_NOT_SUPPORTED,
            DeviceError::LoadStopped(_) => cuda::CUDA_ERROR_INVALID_PTX,
            DeviceError::InvalidImage { code, .. }
            | DeviceError::Fault { code, .. }
            | DeviceError::InvalidLaunch { code, .. }
            | DeviceError::Driver { code, .. } => *code,
        }
    }
}

/// The bytes a [`DeviceContext::memset`] of `count` elements of `elem_size` bytes at `dst`
/// covers: refuses element sizes other than 1, 2 and 4, and counts that overflow.
pub fn memset_len(dst: u64, elem_size: u32, count: u64) -> Result<u64, DeviceError> {
    if !matches!(elem_size, 1 | 2 | 4) {
        return Err(DeviceError::NotSupported(format!(
            "memset element size {elem_size}"
        )));
    }
    count
        .checked_mul(u64::from(elem_size))
        .ok_or(DeviceError::InvalidAddress {
            addr: dst,
            len: u64::MAX,
        })
}

/// The bytes of a scatter-gather copy at `addr` ([`DeviceContext::write_gathered`],
/// [`DeviceContext::read_scattered`]): the pieces' lengths added up, refusing a total that does
/// not fit in a `u64`.
pub fn pieces_len(addr: u64, lens: impl IntoIterator<Item = usize>) -> Result<u64, DeviceError> {
    lens.into_iter()
        .try_fold(0u64, |t, l| t.checked_add(u64::try_from(l).ok()?))
        .ok_or(DeviceError::InvalidAddress {
            addr,
            len: u64::MAX,
        })
}

impl From<DeviceError> for CuError {
    fn from(e: DeviceError) -> CuError {
        CuError::new(e.cu_result(), e.to_string())
    }
}

/// A device: creates one context per tenant.
pub trait Device: Send + Sync {
    /// Static description.
    fn info(&self) -> &DeviceInfo;
    /// Opens the context of tenant `tenant` (one per VM; sessions of the VM share it).
    fn open(&self, tenant: &str) -> Result<Arc<dyn DeviceContext>, DeviceError>;
    /// Bytes of device memory allocated by all contexts.
    fn memory_used(&self) -> u64;
    /// How the kernels running at once share the device's execution units now, for a device
    /// that shares them out itself (the simulated GPU's interpreter workers); `None` where the
    /// hardware does (a real GPU's block scheduler).
    fn execution_units(&self) -> Option<ExecutionUnits> {
        None
    }
}

/// A device's execution units at one moment ([`Device::execution_units`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecutionUnits {
    /// Units the device has.
    pub total: u32,
    /// Units running a thread block now.
    pub busy: u32,
    /// Workers of running kernels waiting for a unit (kernels of other streams queued behind
    /// those running, by priority).
    pub waiting: u32,
}

/// Grid and block of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchDims {
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared_bytes: u32,
    /// A cooperative launch (`cuLaunchCooperativeKernel`): every block runs at once, and
    /// blocks may wait for each other (cooperative groups' `grid.sync()`).
    pub cooperative: bool,
    /// The multiprocessors of the green context it was launched in (`cuGreenCtxCreate`): its
    /// blocks run on at most this many execution units at a time. `None`: on all of them.
    pub units: Option<u32>,
}

/// One kernel of a run of kernels launched as one unit ([`DeviceContext::launch_chain`]).
#[derive(Clone, Copy)]
pub struct ChainKernel<'a> {
    /// Its module.
    pub module: &'a dyn DeviceModule,
    /// The kernel's index in the module.
    pub kernel: usize,
    /// Grid and block (never cooperative).
    pub dims: LaunchDims,
    /// The packed parameter buffer.
    pub params: &'a [u8],
}

impl std::fmt::Debug for ChainKernel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainKernel")
            .field("kernel", &self.kernel)
            .field("dims", &self.dims)
            .field("params", &self.params.len())
            .finish()
    }
}

/// A kernel's parameter layout and attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelDesc {
    /// Entry name.
    pub name: String,
    /// Byte offset of each parameter in the packed buffer.
    pub param_offsets: Vec<u32>,
    /// Size of each parameter.
    pub param_sizes: Vec<u32>,
    /// `CUfunction_attribute` values indexed by attribute number.
    pub attributes: Vec<i32>,
    /// Whether the device can run it: a cubin's kernel on the simulated GPU (SASS) cannot, and
    /// the guest refuses its launches at once, as CUDA refuses a kernel without an image.
    pub runnable: bool,
}

/// A module global (`__device__` or `__constant__` variable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalDesc {
    /// Symbol name.
    pub name: String,
    /// Device address.
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// A `__managed__` variable (`.attribute(.managed)`): the guest process
    /// also reaches it through host memory, as managed memory.
    pub managed: bool,
    /// A texture or surface reference's handle slot, not a variable of the program.
    pub reference: Option<crate::texture::ReferenceKind>,
}

/// A loaded module. Dropping it unloads it and frees its globals.
pub trait DeviceModule: Send + Sync + Any {
    /// The module as `Any`, so its device can downcast it.
    fn as_any(&self) -> &dyn Any;
    /// The kernels.
    fn kernels(&self) -> &[KernelDesc];
    /// The globals, with the addresses the device gave them.
    fn globals(&self) -> &[GlobalDesc];
    /// Bytes of device memory the globals take (charged to the tenant).
    fn global_bytes(&self) -> u64 {
        self.globals().iter().map(|g| g.size).sum()
    }
    /// Whether its kernels call the device heap (device-side `malloc` and `free`): the broker
    /// gives the launching process its heap before the first launch of one of them.
    fn uses_heap(&self) -> bool {
        false
    }
}

/// A process's device heap, the memory its kernels' `malloc` draws on
/// ([`DeviceContext::heap_create`]). Dropping it frees that memory.
pub trait DeviceHeap: Send + Sync + Any {
    /// The heap as `Any`, so its device can downcast it.
    fn as_any(&self) -> &dyn Any;
}

thread_local! {
    /// The engine lane whose job runs on this thread (0: none).
    static LANE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// The priority of the job that runs on this thread (CUDA's: lower numbers first; 0 outside
    /// any job).
    static PRIORITY: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

/// The engine lane (a guest stream, see [`crate::engine`]) whose job the
/// calling thread runs; 0 for work outside any lane (allocation, module
/// loading, reads of a synchronous copy, which the engine orders itself).
/// An executor with several hardware queues may issue each lane's work on a
/// queue of its own, so that the work of different streams overlaps; the
/// order between lanes is the engine's (a job starts only once what it
/// depends on has completed).
pub fn current_lane() -> u64 {
    LANE.with(std::cell::Cell::get)
}

/// Runs `f` as work of lane `lane` (see [`current_lane`]).
pub fn with_lane<R>(lane: u64, f: impl FnOnce() -> R) -> R {
    with_lane_at(lane, 0, f)
}

/// The priority of the job the calling thread runs (its own, else its stream's; lower numbers
/// first, as CUDA's stream priorities): among one VM's kernels competing for the device's
/// execution units, a device lets the highest priority go first (see [`with_lane_at`]).
pub fn current_priority() -> i32 {
    PRIORITY.with(std::cell::Cell::get)
}

/// Runs `f` as work of lane `lane` at `priority` (see [`current_lane`], [`current_priority`]).
pub fn with_lane_at<R>(lane: u64, priority: i32, f: impl FnOnce() -> R) -> R {
    let before = LANE.with(|l| l.replace(lane));
    let before_priority = PRIORITY.with(|p| p.replace(priority));
    let r = f();
    LANE.with(|l| l.set(before));
    PRIORITY.with(|p| p.set(before_priority));
    r
}

/// A signal sent to a running launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Stop at the next preemption point.
    Yield,
    /// Stop as soon as possible; the session ended.
    Cancel,
}

/// A device's listener for signals to the launch it is running.
pub type SignalHook = Arc<dyn Fn(Signal) + Send + Sync>;

/// Host memory a tenant's launches may hold in device state kept on the host (the simulated
/// GPU's interpreter: register files, call frames, local and shared memory of running blocks),
/// shared by the tenant's launches: taken as a launch starts and as it needs more, given back
/// when it ends (`limits.interpreter_bytes`, docs/admin.md).
pub trait HostStateBudget: Send + Sync + std::fmt::Debug {
    /// Takes `bytes`; `false`, taking nothing, when they do not fit (the refusal is counted).
    fn take(&self, bytes: u64) -> bool;
    /// Gives back `bytes` taken by [`HostStateBudget::take`].
    fn give_back(&self, bytes: u64);
}

/// The values of one graph launch's conditional handles (`cuGraphConditionalHandleCreate`):
/// kernels of the launch set them with `cudaGraphSetConditional`, and the launch's conditional
/// nodes read them to choose what runs next.
#[derive(Debug, Default)]
pub struct GraphConditionals {
    /// The handles, sorted.
    handles: Vec<u64>,
    /// Their values, in the same order.
    values: Vec<AtomicU32>,
}

impl GraphConditionals {
    /// A launch's handles with their values at its start (a handle named twice keeps its
    /// first value).
    pub fn new(start: impl IntoIterator<Item = (u64, u32)>) -> Self {
        let mut start: Vec<(u64, u32)> = start.into_iter().collect();
        start.sort_by_key(|&(h, _)| h);
        start.dedup_by_key(|&mut (h, _)| h);
        let (handles, values) = start
            .into_iter()
            .map(|(h, v)| (h, AtomicU32::new(v)))
            .unzip();
        Self { handles, values }
    }

    /// Sets `handle`'s value; `false` when `handle` is not one of the launch's.
    pub fn set(&self, handle: u64, value: u32) -> bool {
        match self.handles.binary_search(&handle) {
            Ok(i) => {
                self.values[i].store(value, Ordering::Release);
                true
            }
            Err(_) => false,
        }
    }

    /// `handle`'s value; `None` when it is not one of the launch's.
    pub fn get(&self, handle: u64) -> Option<u32> {
        let i = self.handles.binary_search(&handle).ok()?;
        Some(self.values[i].load(Ordering::Acquire))
    }
}

/// Asks whether the client a request came from has gone (see [`RunControl::watch_hangup`]).
pub type HangupCheck = Arc<dyn Fn() -> bool + Send + Sync>;

/// How a running launch is steered: preemption between thread blocks,
/// cancellation when its session ends, and a watchdog deadline. A device
/// that keeps its own control state attaches a hook to receive the signals.
/// It also says where the launch's device-side `printf` and `assert` output goes.
#[derive(Default)]
pub struct RunControl {
    yield_requested: AtomicBool,
    cancelled: AtomicBool,
    deadline: Mutex<Option<Instant>>,
    hook: Mutex<Option<SignalHook>>,
    output: Mutex<Option<Arc<LaunchOutput>>>,
    state_budget: Mutex<Option<Arc<dyn HostStateBudget>>>,
    hangup: Mutex<Option<HangupCheck>>,
    conditionals: Mutex<Option<Arc<GraphConditionals>>>,
    heap: Mutex<Option<Arc<dyn DeviceHeap>>>,
    device_state: Mutex<Option<Arc<dyn Any + Send + Sync>>>,
    limits: Mutex<Option<Arc<[u64]>>>,
    attributes: Mutex<Option<Arc<[i32]>>>,
}

impl std::fmt::Debug for RunControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunControl")
            .field("yield_requested", &self.yield_requested())
            .field("cancelled", &self.cancelled())
            .field("deadline", &self.deadline())
            .finish()
    }
}

impl RunControl {
    /// A control with a watchdog deadline.
    pub fn with_deadline(deadline: Option<Instant>) -> Self {
        let c = Self::default();
        c.set_deadline(deadline);
        c
    }

    /// Sets the watchdog: the launch fails with `CUDA_ERROR_LAUNCH_TIMEOUT` past this instant.
    pub fn set_deadline(&self, deadline: Option<Instant>) {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) = deadline;
    }

    /// The watchdog deadline.
    pub fn deadline(&self) -> Option<Instant> {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&self, s: Signal) {
        let hook = self.hook.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(h) = hook {
            h(s);
        }
    }

    /// Asks the launch to stop at the next preemption point.
    pub fn request_yield(&self) {
        self.yield_requested.store(true, Ordering::Release);
        self.send(Signal::Yield);
    }
    /// Clears a yield request (before resuming).
    pub fn clear_yield(&self) {
        self.yield_requested.store(false, Ordering::Release);
    }
    /// Whether a yield was requested.
    pub fn yield_requested(&self) -> bool {
        self.yield_requested.load(Ordering::Acquire)
    }
    /// Cancels the launch (its session ended).
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        self.send(Signal::Cancel);
    }
    /// Whether the launch was cancelled.
    pub fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }
    /// Routes later signals to `hook` (until [`RunControl::detach`]). Signals
    /// already given are replayed, so none is lost between the check and the attach.
    pub fn attach(&self, hook: SignalHook) {
        *self.hook.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&hook));
        if self.yield_requested() {
            hook(Signal::Yield);
        }
        if self.cancelled() {
            hook(Signal::Cancel);
        }
    }
    /// Stops routing signals.
    pub fn detach(&self) {
        *self.hook.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
    /// Sets where the launch's `printf` text and `assert` messages go.
    pub fn set_output(&self, output: Option<Arc<LaunchOutput>>) {
        *self.output.lock().unwrap_or_else(|p| p.into_inner()) = output;
    }
    /// Where the launch's `printf` text and `assert` messages go; `None` discards them.
    pub fn output(&self) -> Option<Arc<LaunchOutput>> {
        self.output
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
    /// Charges the host memory the launch's device state takes to `budget` (devices that
    /// keep such state on the host, such as the simulated GPU).
    pub fn set_state_budget(&self, budget: Option<Arc<dyn HostStateBudget>>) {
        *self.state_budget.lock().unwrap_or_else(|p| p.into_inner()) = budget;
    }
    /// The budget the launch's host-side device state is charged to.
    pub fn state_budget(&self) -> Option<Arc<dyn HostStateBudget>> {
        self.state_budget
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
    /// Lets the launch's kernels set the conditional handles of the graph launch they belong
    /// to (`cudaGraphSetConditional`); `None` outside graphs with conditional nodes.
    pub fn set_conditionals(&self, conditionals: Option<Arc<GraphConditionals>>) {
        *self.conditionals.lock().unwrap_or_else(|p| p.into_inner()) = conditionals;
    }
    /// The conditional handles the launch's kernels may set.
    pub fn conditionals(&self) -> Option<Arc<GraphConditionals>> {
        self.conditionals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
    /// The device heap the launch's kernels' `malloc` and `free` use (the launching process's,
    /// [`DeviceContext::heap_create`]); `None`: a kernel that calls `malloc` gets `NULL`.
    pub fn set_heap(&self, heap: Option<Arc<dyn DeviceHeap>>) {
        *self.heap.lock().unwrap_or_else(|p| p.into_inner()) = heap;
    }
    /// The device heap the launch's kernels use.
    pub fn heap(&self) -> Option<Arc<dyn DeviceHeap>> {
        self.heap.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    /// The process's limits by `CUlimit` number ([`vgpu_proto::cuda::limit`]): what kernels
    /// read with `cudaDeviceGetLimit`, and the device runtime's pending launch count and sync
    /// depth the device applies to the launch (`None`: the device's defaults).
    pub fn set_device_limits(&self, limits: Option<Arc<[u64]>>) {
        *self.limits.lock().unwrap_or_else(|p| p.into_inner()) = limits;
    }
    /// The context's limits ([`RunControl::set_device_limits`]).
    pub fn device_limits(&self) -> Option<Arc<[u64]>> {
        self.limits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
    /// The device's attributes as the VM sees them, which kernels read with
    /// `cudaDeviceGetAttribute` (dynamic parallelism's device runtime).
    pub fn set_device_attributes(&self, attributes: Option<Arc<[i32]>>) {
        *self.attributes.lock().unwrap_or_else(|p| p.into_inner()) = attributes;
    }
    /// The device's attributes as the VM sees them.
    pub fn device_attributes(&self) -> Option<Arc<[i32]>> {
        self.attributes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
    /// State the device keeps for this launch across its resumptions after yields (the
    /// simulated GPU's grids launched by the kernel and not yet run), made by `make` at the
    /// first call; `None` when state of another type is kept.
    pub fn device_state<T: Any + Send + Sync>(&self, make: impl FnOnce() -> T) -> Option<Arc<T>> {
        let mut g = self.device_state.lock().unwrap_or_else(|p| p.into_inner());
        let s = g.get_or_insert_with(|| Arc::new(make()) as Arc<dyn Any + Send + Sync>);
        Arc::clone(s).downcast::<T>().ok()
    }
    /// Lets [`RunControl::poll_cancelled`] cancel the work when `check` says its client has
    /// gone: for work the device runs on the caller's thread (a module load), which nothing
    /// else could cancel.
    pub fn watch_hangup(&self, check: Option<HangupCheck>) {
        *self.hangup.lock().unwrap_or_else(|p| p.into_inner()) = check;
    }
    /// Whether the work is cancelled, asking the hangup check first (and cancelling when the
    /// client has gone). A device calls it every so often during long work on the caller's
    /// thread; with a hangup check it costs a system call, so not in a tight loop.
    pub fn poll_cancelled(&self) -> bool {
        if self.cancelled() {
            return true;
        }
        let check = self
            .hangup
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if check.is_some_and(|c| c()) {
            self.cancel();
            return true;
        }
        false
    }
    /// Whether the watchdog deadline has passed.
    pub fn past_deadline(&self) -> bool {
        self.deadline().is_some_and(|d| Instant::now() >= d)
    }
}

/// How far a launch got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchProgress {
    /// Every block ran.
    Completed,
    /// Stopped at a preemption point; resume from `next_block`.
    Yielded {
        /// First block not yet run.
        next_block: u64,
    },
}

/// One tenant's view of a device. Addresses passed in were validated by the
/// broker against the tenant's allocations; implementations still refuse
/// addresses they do not know instead of touching them.
pub trait DeviceContext: Send + Sync {
    /// Whether the context is usable. A context a sticky error broke (a real
    /// GPU's context after an illegal address, say) answers with that error:
    /// the tenant then opens a fresh context for its next session, while the
    /// sessions that saw the fault keep failing with it.
    fn health(&self) -> Result<(), DeviceError> {
        Ok(())
    }
    /// Allocates `size` bytes (the broker already charged the slice).
    fn alloc(&self, size: u64) -> Result<u64, DeviceError>;
    /// Frees an allocation made by `alloc`.
    fn free(&self, ptr: u64) -> Result<(), DeviceError>;
    /// Allocates `size` bytes at an address that is a multiple of `align` (a power of two):
    /// managed and mapped host memory, whose guest mirror is mapped at the same address. Freed
    /// by `free`. The default asks `alloc` for the size, then for the size rounded up to 2 MiB
    /// (which real allocators align), and refuses with `NotSupported` when neither is aligned.
    fn alloc_aligned(&self, size: u64, align: u64) -> Result<u64, DeviceError> {
        let p = self.alloc(size)?;
        if align <= 1 || p % align == 0 {
            return Ok(p);
        }
        let _ = self.free(p);
        let big = align.max(2 << 20);
        let rounded = size
            .checked_add(big - 1)
            .map(|s| s / big * big)
            .ok_or(DeviceError::OutOfMemory)?;
        let p = self.alloc(rounded)?;
        if p % align == 0 {
            return Ok(p);
        }
        let _ = self.free(p);
        Err(DeviceError::NotSupported(format!(
            "this device cannot place allocations at {align}-byte boundaries"
        )))
    }
    /// Allocates `size` bytes of host memory at a device address kernels can use like device
    /// memory (overflow when the device is full). Freed by `free`; moved by `migrate`.
    fn alloc_host(&self, size: u64) -> Result<u64, DeviceError> {
        let _ = size;
        Err(DeviceError::NotSupported(
            "this device cannot place allocations in host memory".into(),
        ))
    }
    /// Moves the backing of the allocation at `ptr` (made by `alloc` or `alloc_host`) to
    /// `to`, keeping its address and contents. Waits until none of this context's kernels or
    /// copies is running (a running kernel is asked to yield).
    fn migrate(&self, ptr: u64, to: Residence) -> Result<(), DeviceError> {
        let _ = (ptr, to);
        Err(DeviceError::NotSupported(
            "this device cannot move allocations between device and host memory".into(),
        ))
    }
    /// Virtual memory management: creates `size` bytes of physical memory (a multiple of
    /// [`VMM_GRANULARITY`]), not yet mapped anywhere; returns its id. The broker charged it.
    fn phys_create(&self, size: u64) -> Result<u64, DeviceError> {
        let _ = size;
        Err(DeviceError::NotSupported(
            "this device has no virtual memory management".into(),
        ))
    }
    /// Releases physical memory made by `phys_create` (the broker unmapped it everywhere).
    fn phys_release(&self, id: u64) -> Result<(), DeviceError> {
        let _ = id;
        Err(DeviceError::NotSupported(
            "this device has no virtual memory management".into(),
        ))
    }
    /// Reserves `size` bytes of device address space at a multiple of `align`.
    fn va_reserve(&self, size: u64, align: u64) -> Result<u64, DeviceError> {
        let _ = (size, align);
        Err(DeviceError::NotSupported(
            "this device has no virtual memory management".into(),
        ))
    }
    /// Frees a reservation made by `va_reserve` (nothing is mapped in it any more).
    fn va_free(&self, addr: u64, size: u64) -> Result<(), DeviceError> {
        let _ = (addr, size);
        Err(DeviceError::NotSupported(
            "this device has no virtual memory management".into(),
        ))
    }
    /// Maps all of physical memory `id` (`size` bytes) at `va`, inside a reservation, with
    /// read-write access for this context.
    fn map(&self, va: u64, size: u64, id: u64) -> Result<(), DeviceError> {
        let _ = (va, size, id);
        Err(DeviceError::NotSupported(
            "this device has no virtual memory management".into(),
        ))
    }
    /// Removes a mapping made by `map`.
    fn unmap(&self, va: u64, size: u64) -> Result<(), DeviceError> {
        let _ = (va, size);
        Err(DeviceError::NotSupported(
            "this device has no virtual memory management".into(),
        ))
    }
    /// Host to device.
    fn write(&self, dst: u64, data: &[u8]) -> Result<(), DeviceError>;
    /// Device to host.
    fn read(&self, src: u64, out: &mut [u8]) -> Result<(), DeviceError>;
    /// Host to device from several host slices laid back to back from `dst`: a scatter-gather
    /// copy out of the guest pages a transfer lies in. The default writes them one by one;
    /// executors override it to move them in fewer, larger operations.
    fn write_gathered(&self, dst: u64, pieces: &[&[u8]]) -> Result<(), DeviceError> {
        let mut at = dst;
        for p in pieces {
            self.write(at, p)?;
            at += p.len() as u64;
        }
        Ok(())
    }
    /// Device to host into several host slices, filled in order from `src`; see
    /// [`DeviceContext::write_gathered`].
    fn read_scattered(&self, src: u64, pieces: &mut [&mut [u8]]) -> Result<(), DeviceError> {
        let mut at = src;
        for p in pieces.iter_mut() {
            self.read(at, p)?;
            at += p.len() as u64;
        }
        Ok(())
    }
    /// Device to device (overlapping ranges behave like memmove).
    fn copy(&self, dst: u64, src: u64, len: u64) -> Result<(), DeviceError>;
    /// Fills `count` elements of `elem_size` (1, 2 or 4) bytes with the low bytes of `value`.
    fn memset(&self, dst: u64, value: u32, elem_size: u32, count: u64) -> Result<(), DeviceError>;
    /// Loads a module image, refusing it with `OutOfMemory` when its globals need more than
    /// `budget` bytes. A device that parses or compiles the image itself stops when `control`
    /// is cancelled ([`RunControl::poll_cancelled`]) or past its deadline, failing with
    /// [`DeviceError::LoadStopped`].
    fn load_module(
        &self,
        image: &[u8],
        budget: u64,
        control: &RunControl,
    ) -> Result<Arc<dyn DeviceModule>, DeviceError> {
        let _ = (image, budget, control);
        Err(DeviceError::NotSupported(
            "this device does not run kernels".into(),
        ))
    }
    /// Runs kernel `kernel` of `module` from block `start_block` until it completes, faults or yields.
    fn launch(
        &self,
        module: &dyn DeviceModule,
        kernel: usize,
        dims: &LaunchDims,
        params: &[u8],
        start_block: u64,
        control: &RunControl,
    ) -> Result<LaunchProgress, DeviceError> {
        let _ = (module, kernel, dims, params, start_block, control);
        Err(DeviceError::NotSupported(
            "this device does not run kernels".into(),
        ))
    }
    /// Creates a texture object sampling the texels of `layout` (checked by the broker to lie
    /// in one allocation of the context) as `sampling` says; returns the handle kernels receive.
    fn texture_create(
        &self,
        layout: &TexelLayout,
        sampling: &TexSampling,
    ) -> Result<u64, DeviceError> {
        let _ = (layout, sampling);
        Err(DeviceError::NotSupported(
            "this device has no texture objects".into(),
        ))
    }
    /// Destroys a texture object this context created.
    fn texture_destroy(&self, handle: u64) -> Result<(), DeviceError> {
        let _ = handle;
        Err(DeviceError::NotSupported(
            "this device has no texture objects".into(),
        ))
    }
    /// Creates a surface object over the texels of `layout`; returns the handle kernels receive.
    fn surface_create(&self, layout: &TexelLayout) -> Result<u64, DeviceError> {
        let _ = layout;
        Err(DeviceError::NotSupported(
            "this device has no surface objects".into(),
        ))
    }
    /// Destroys a surface object this context created.
    fn surface_destroy(&self, handle: u64) -> Result<(), DeviceError> {
        let _ = handle;
        Err(DeviceError::NotSupported(
            "this device has no surface objects".into(),
        ))
    }
    /// Creates a device heap of `size` bytes (the broker charged them to the tenant) for one
    /// process's kernels: what their `malloc` returns comes from it, and stays allocated across
    /// launches until they `free` it or the heap is dropped ([`RunControl::set_heap`]).
    fn heap_create(&self, size: u64) -> Result<Arc<dyn DeviceHeap>, DeviceError> {
        let _ = size;
        Err(DeviceError::NotSupported(
            "this device has no device-side heap".into(),
        ))
    }
    /// Whether the device's kernels can set the conditional handles of the graph launch they
    /// run in (`cudaGraphSetConditional`, through [`RunControl::conditionals`]), so that the
    /// broker can run graphs with conditional nodes. The default: no (the broker then refuses
    /// such graphs with `CUDA_ERROR_NOT_SUPPORTED` at instantiation).
    fn sets_graph_conditionals(&self) -> bool {
        false
    }
    /// Runs `kernels` one after the other, each after the previous one completed, as one unit
    /// (a real GPU: one CUDA graph launch), at the calling job's priority
    /// ([`current_priority`]), until all completed or one failed; the watchdog deadline of
    /// `control` covers them all. A device that can stop a kernel between thread blocks (the
    /// simulated GPU) keeps the default, `NotSupported`: the broker then launches the kernels one
    /// by one with [`DeviceContext::launch`].
    fn launch_chain(
        &self,
        kernels: &[ChainKernel<'_>],
        control: &RunControl,
    ) -> Result<(), DeviceError> {
        let _ = (kernels, control);
        Err(DeviceError::NotSupported(
            "this device launches kernels one by one".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_launchs_conditional_values_start_at_their_defaults_and_take_only_its_handles() {
        let v = GraphConditionals::new([(0x30, 1), (0x10, 0), (0x20, 5), (0x10, 9)]);
        assert_eq!(
            (v.get(0x10), v.get(0x20), v.get(0x30)),
            (Some(0), Some(5), Some(1))
        );
        assert!(v.set(0x20, 7));
        assert_eq!(v.get(0x20), Some(7));
        assert!(!v.set(0x40, 1), "a handle the launch does not have");
        assert_eq!(v.get(0x40), None);
        assert_eq!(
            v.get(0x10),
            Some(0),
            "the first value of a handle named twice"
        );
    }

    #[test]
    fn scatter_gather_totals_refuse_to_overflow() {
        assert_eq!(pieces_len(0, [1usize, 2, 3]).unwrap(), 6);
        assert_eq!(pieces_len(0, std::iter::empty()).unwrap(), 0);
        assert_eq!(
            pieces_len(7, [usize::MAX, usize::MAX]),
            Err(DeviceError::InvalidAddress {
                addr: 7,
                len: u64::MAX
            })
        );
    }

    #[test]
    fn device_errors_map_to_cuda_codes() {
        assert_eq!(
            DeviceError::OutOfMemory.cu_result(),
            cuda::CUDA_ERROR_OUT_OF_MEMORY
        );
        let e = DeviceError::Fault {
            code: cuda::CUDA_ERROR_ILLEGAL_ADDRESS,
            message: "kernel k: load from 0x10".into(),
        };
        let cu: CuError = e.into();
        assert_eq!(cu.code, 700);
        assert!(cu.message.contains("0x10"));
        let d = DeviceError::Driver {
            call: "cuMemAlloc_v2",
            code: 2,
        };
        assert_eq!(
            d.to_string(),
            "cuMemAlloc_v2 failed with CUDA_ERROR_OUT_OF_MEMORY"
        );
    }

    #[test]
    fn run_control_routes_signals_to_an_attached_hook() {
        let c = RunControl::default();
        c.request_yield();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = Arc::clone(&seen);
        c.attach(Arc::new(move |s| s2.lock().unwrap().push(s)));
        c.cancel();
        c.detach();
        c.request_yield();
        assert_eq!(*seen.lock().unwrap(), vec![Signal::Yield, Signal::Cancel]);
    }

    #[test]
    fn run_control_flags() {
        let c = RunControl::default();
        assert!(!c.yield_requested() && !c.cancelled());
        c.request_yield();
        c.cancel();
        assert!(c.yield_requested() && c.cancelled());
        c.clear_yield();
        assert!(!c.yield_requested());
    }
}
