//! vgpu-ptx: a PTX parser and interpreter for the vgpu simulated GPU.
//!
//! [`Module::load`] parses NVRTC-generated PTX (ISA 7.0–8.8, sm_52…sm_90) and pre-decodes it into a
//! compact instruction form with resolved registers. [`Module::launch`] runs a kernel with CUDA
//! semantics: 3-D grids and blocks, warps of 32 lanes executing in lockstep with IPDOM
//! reconvergence, barriers, atomics, shuffles and votes, and bounds-checked global, shared, local,
//! constant and parameter memory. Thread blocks are spread over the calling thread and threads of
//! a persistent pool shared by all launches (`pool`); a launch can yield between blocks and resume
//! later with identical results.
//!
//! Device memory belongs to the caller: global accesses go through [`GlobalMemory::lookup`], which
//! returns the tenant's [`Buffer`] containing an address. Shared, local and parameter memory are
//! reachable through generic addresses in windows above 2^48 ([`SHARED_WINDOW`], [`LOCAL_WINDOW`],
//! [`PARAM_WINDOW`]) that never collide with global addresses.
//!
//! See `docs/simulated-gpu.md` for the supported PTX subset, the execution and fault models and
//! benchmark figures.

mod cfg;
mod decode;
pub mod devlaunch;
mod devrt;
mod error;
mod exec;
mod float;
pub mod heap;
mod ir;
mod lexer;
pub mod mem;
mod parser;
mod pool;
pub mod printf;
pub mod slots;
pub mod testutils;
pub mod texture;
mod video;
mod watch;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use error::{
    CUDA_ERROR_ASSERT, CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_ILLEGAL_INSTRUCTION,
    CUDA_ERROR_INVALID_CONFIGURATION, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_LAUNCH_FAILED,
    CUDA_ERROR_LAUNCH_TIMEOUT, CUDA_ERROR_MISALIGNED_ADDRESS, Fault, FaultKind, LoadError,
    LoadErrorKind,
};
pub use exec::{LOCAL_WINDOW, PARAM_WINDOW, SHARED_WINDOW, WINDOW_SIZE};
pub use mem::{AllocError, Buffer, OutOfRange};
pub use pool::{MAX_POOL_THREADS, set_spawn_per_launch};
pub use printf::DeviceOutput;
pub use slots::{SlotUsage, WorkerSlots};
pub use watch::LoadWatch;

/// What one worker of a launch did: its counters, and the first block it faulted in with the
/// fault.
type WorkerResult = (Stats, Option<(u64, Fault)>);

/// Most threads in one block.
pub const MAX_THREADS_PER_BLOCK: u32 = decode::MAX_THREADS_PER_BLOCK;
/// Most shared memory (static plus dynamic) one block may use: the opt-in maximum of sm_90.
/// Drivers that enforce the 48 KiB default without opt-in check that before launching.
pub const MAX_SHARED_BYTES_PER_BLOCK: usize = 227 * 1024;
/// Largest block dimensions (x, y, z).
/// Threads of a warp.
const WARP_SIZE: u64 = 32;
/// Bytes of one register of one thread in the interpreter.
const REGISTER_BYTES: u64 = 8;
/// Most bytes of registers one block may hold (64 MiB: 8192 registers per
/// thread at 1024 threads); a launch needing more fails with
/// `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`.
pub const MAX_BLOCK_REGISTER_FILE: u64 = 64 << 20;
/// Most bytes all call frames of one block may hold at once: the registers, predicates and
/// parameter areas of the kernel's frames and of every function they call, recursion included.
/// Twice [`MAX_BLOCK_REGISTER_FILE`], so a kernel within that limit keeps room for calls; a
/// call past it faults as a stack overflow (`CUDA_ERROR_ILLEGAL_ADDRESS`).
pub const MAX_BLOCK_FRAME_BYTES: u64 = 2 * MAX_BLOCK_REGISTER_FILE;
pub const MAX_BLOCK_DIM: [u32; 3] = [1024, 1024, 64];
/// Largest grid dimensions (x, y, z).
pub const MAX_GRID_DIM: [u32; 3] = [0x7fff_ffff, 65535, 65535];
/// Lowest device address the simulated device hands out for global allocations.
pub const GLOBAL_BASE: u64 = 0x0000_0200_0000_0000;
/// Highest global device address.
pub const GLOBAL_END: u64 = 0x0000_7fff_ffff_ffff;

/// Device memory of one tenant as a kernel sees it.
pub trait GlobalMemory: Sync {
    /// The live allocation containing `addr`: (its base device address, its backing). `None` when
    /// the tenant owns no allocation there.
    fn lookup(&self, addr: u64) -> Option<(u64, Arc<Buffer>)>;

    /// The tenant's texture object `handle`; `None` when it owns none by that handle.
    fn texture(&self, _handle: u64) -> Option<texture::TextureView> {
        None
    }

    /// Level `level` (1 and up; level 0 is the view's own layout) of the tenant's mipmapped
    /// texture object `handle`; `None` when it has no such level.
    fn texture_level(&self, _handle: u64, _level: u32) -> Option<texture::Layout> {
        None
    }

    /// The tenant's surface object `handle`; `None` when it owns none by that handle.
    fn surface(&self, _handle: u64) -> Option<texture::SurfaceView> {
        None
    }
}

/// Placement of one kernel parameter in the parameter buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamInfo {
    /// Byte offset in the packed parameter buffer.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
    /// Alignment in bytes.
    pub align: usize,
}

/// What a driver needs to know about a kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelInfo {
    /// Entry name as in the PTX (`.visible .entry NAME`).
    pub name: String,
    /// Parameters in declaration order.
    pub params: Vec<ParamInfo>,
    /// Size of the packed parameter buffer.
    pub param_bytes: usize,
    /// Static shared memory per block, including shared variables of called functions.
    pub static_shared_bytes: usize,
    /// Local memory per thread declared by the kernel itself.
    pub local_bytes: usize,
    /// `.maxntid`/`.reqntid` product, or 1024.
    pub max_threads_per_block: u32,
    /// `.reqntid`, when declared.
    pub reqntid: Option<[u32; 3]>,
    /// Registers declared in the PTX (64-bit registers count twice), at most `.maxnreg`, for
    /// cuFuncGetAttribute.
    pub num_regs: u32,
}

/// State space of a module variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlobalSpace {
    /// `.global` (`__device__`).
    Global,
    /// `.const` (`__constant__`).
    Const,
}

/// A module-scope `.global` or `.const` variable the driver must allocate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalVar {
    /// Name as in the PTX (what cuModuleGetGlobal looks up).
    pub name: String,
    /// Global or constant.
    pub space: GlobalSpace,
    /// Size in bytes.
    pub size: usize,
    /// Required alignment.
    pub align: usize,
    /// Initial bytes (empty means all zero; otherwise exactly `size` bytes).
    pub init: Vec<u8>,
    /// Declared `.attribute(.managed)` (`__managed__`).
    pub managed: bool,
    /// `Some` for a texture or surface reference (`.global .texref`/`.surfref`): an 8-byte
    /// `.global` variable where the driver stores the handle of the bound texture or surface
    /// object (0 when unbound). `None` for ordinary variables.
    pub reference: Option<texture::ReferenceKind>,
    /// 8-byte elements of `init` that hold the address of a module variable or function
    /// (`.u64 p = generic(table);`), filled in once the module's variables have addresses
    /// ([`GlobalVar::image`]).
    pub relocs: Vec<Reloc>,
}

/// An address in a variable's initializer ([`GlobalVar::relocs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reloc {
    /// Byte offset in the variable.
    pub offset: usize,
    /// What it is the address of.
    pub target: RelocTarget,
    /// Bytes added to the address.
    pub addend: i64,
}

/// What a [`Reloc`] is the address of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelocTarget {
    /// The module variable at this index of [`Module::globals`].
    Global(usize),
    /// A function or kernel: the value the interpreter gives its address
    /// ([`FUNCTION_WINDOW`] plus its index), which no memory access reaches.
    Function(u64),
}

/// Base of the values kernels and functions have as addresses (`mov.u64 %rd, kernel;`), above
/// every memory window: dynamic parallelism names the kernel it launches so.
pub const FUNCTION_WINDOW: u64 = 0x0004_0000_0000_0000;

impl GlobalVar {
    /// The variable's initial bytes with its relocations applied, given every module variable's
    /// address (in [`Module::globals`] order); empty when it starts all zero.
    pub fn image(&self, addrs: &[u64]) -> std::borrow::Cow<'_, [u8]> {
        if self.relocs.is_empty() {
            return std::borrow::Cow::Borrowed(&self.init);
        }
        let mut b = if self.init.is_empty() {
            vec![0u8; self.size]
        } else {
            self.init.clone()
        };
        for r in &self.relocs {
            let base = match r.target {
                RelocTarget::Global(i) => addrs.get(i).copied().unwrap_or(0),
                RelocTarget::Function(v) => v,
            };
            let v = base.wrapping_add_signed(r.addend);
            if let Some(to) = b.get_mut(r.offset..r.offset + 8) {
                to.copy_from_slice(&v.to_le_bytes());
            }
        }
        std::borrow::Cow::Owned(b)
    }
}

/// A loaded module: parsed and pre-decoded PTX. Immutable, so it can be shared by launches on
/// many threads.
#[derive(Debug)]
pub struct Module {
    prog: decode::Program,
}

/// Arguments of one launch (or one resumption of a yielded launch).
pub struct Launch<'a> {
    /// Kernel name.
    pub kernel: &'a str,
    /// Grid dimensions in blocks.
    pub grid: [u32; 3],
    /// Block dimensions in threads.
    pub block: [u32; 3],
    /// Dynamic shared memory bytes per block.
    pub dynamic_shared: u32,
    /// Parameter buffer packed per [`KernelInfo::params`].
    pub params: &'a [u8],
    /// Device address of each [`Module::globals`] entry, in the same order.
    pub globals: &'a [u64],
    /// The tenant's device memory.
    pub memory: &'a dyn GlobalMemory,
    /// Linear block index to start from: 0, or a [`Progress::Yielded`] `next_block`.
    pub start_block: u64,
    /// Workers to use (at least 1): the calling thread and up to `workers - 1` threads of the
    /// process's interpreter pool, as many as are free.
    pub workers: usize,
    /// Yield, cancel and watchdog controls.
    pub control: &'a LaunchControl,
}

/// Host memory a tenant's running launches may hold in interpreter state, shared by all of
/// them ([`LaunchControl::set_state_budget`]). A launch takes, when it starts, what each of its
/// workers needs for one block (the kernel's register frames for every warp, local memory for
/// every thread, shared memory), running on fewer workers when the budget has room for fewer,
/// and fails with [`FaultKind::OutOfMemory`] when it has room for none; call frames past that
/// are taken as calls need them. Everything is given back when the launch (or resumption) ends.
pub trait StateBudget: Send + Sync + std::fmt::Debug {
    /// Takes `bytes`; `false`, taking nothing, when they do not fit.
    fn take(&self, bytes: u64) -> bool;
    /// Gives back `bytes` taken by [`StateBudget::take`].
    fn give_back(&self, bytes: u64);
}

/// The conditional handles of the CUDA graph launch a kernel runs in (conditional graph nodes,
/// CUDA 12.3+), as the kernel sets them with the device runtime's
/// `cudaGraphSetConditional(handle, value)` ([`LaunchControl::set_conditionals`]). Each calling
/// lane sets its handle in lane order, so the last lane of a warp to call it wins; across warps
/// and blocks the order is unspecified, as on a GPU.
pub trait GraphConditionals: Send + Sync + std::fmt::Debug {
    /// Sets `handle`'s value to `value`; `false`, setting nothing, when `handle` is not one of
    /// the graph launch's conditional handles (the launch then faults with
    /// [`FaultKind::IllegalInstruction`]).
    fn set(&self, handle: u64, value: u32) -> bool;
}

/// What a launch took from its [`StateBudget`], given back when dropped.
struct Taken<'a> {
    budget: Option<&'a dyn StateBudget>,
    bytes: u64,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.budget
            && self.bytes > 0
        {
            b.give_back(self.bytes);
        }
    }
}

/// Controls a running launch from another thread, and says where its device-side `printf` and
/// `assert` output goes.
#[derive(Debug, Default)]
pub struct LaunchControl {
    yield_requested: AtomicBool,
    cancelled: AtomicBool,
    deadline: Mutex<Option<Instant>>,
    output: Mutex<Option<Arc<dyn DeviceOutput>>>,
    slots: Mutex<Option<Arc<WorkerSlots>>>,
    /// CUDA's priority of the launch (lower numbers first) when it competes for slots.
    priority: std::sync::atomic::AtomicI32,
    grid_workspace: AtomicU64,
    state_budget: Mutex<Option<Arc<dyn StateBudget>>>,
    conditionals: Mutex<Option<Arc<dyn GraphConditionals>>>,
    heap: Mutex<Option<Arc<dyn heap::DeviceHeap>>>,
    device_launches: Mutex<Option<Arc<devlaunch::DeviceLaunches>>>,
    attributes: Mutex<Option<Arc<[i32]>>>,
    limits: Mutex<Option<Arc<[u64]>>>,
    function_attributes: Mutex<Option<Arc<[Vec<i32>]>>>,
}

impl LaunchControl {
    /// No yield request, not cancelled, no deadline.
    pub fn new() -> LaunchControl {
        LaunchControl::default()
    }

    /// Asks the launch to stop dispatching new blocks, finish the running ones and return
    /// [`Progress::Yielded`]. Checked between thread blocks.
    pub fn request_yield(&self) {
        self.yield_requested.store(true, Ordering::SeqCst);
        self.wake_waiters();
    }

    /// Clears a yield request (before resuming a yielded launch with the same control).
    pub fn clear_yield(&self) {
        self.yield_requested.store(false, Ordering::SeqCst);
    }

    /// Whether a yield is requested.
    pub fn yield_requested(&self) -> bool {
        self.yield_requested.load(Ordering::SeqCst)
    }

    /// Stops the launch as soon as possible with [`FaultKind::Cancelled`].
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        self.wake_waiters();
    }

    /// The launch's workers' group among the waiters for its slots: its control's address,
    /// unique among the launches running at once.
    fn slot_group(&self) -> u64 {
        std::ptr::from_ref(self) as usize as u64
    }

    /// Wakes the launch's workers waiting for a slot, so that they see a yield, a
    /// cancellation or the end of the launch.
    fn wake_waiters(&self) {
        if let Some(s) = self.slots() {
            s.wake(self.slot_group());
        }
    }

    /// Whether the launch was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// Sets (or clears) the watchdog deadline; a launch still running then fails with
    /// [`FaultKind::Timeout`]. Read when a launch (or resumption) starts.
    pub fn set_deadline(&self, deadline: Option<Instant>) {
        match self.deadline.lock() {
            Ok(mut g) => *g = deadline,
            Err(p) => *p.into_inner() = deadline,
        }
    }

    /// Sets the watchdog deadline to `timeout` from now.
    pub fn set_timeout(&self, timeout: Duration) {
        self.set_deadline(Instant::now().checked_add(timeout));
    }

    /// The current watchdog deadline.
    pub fn deadline(&self) -> Option<Instant> {
        match self.deadline.lock() {
            Ok(g) => *g,
            Err(p) => *p.into_inner(),
        }
    }

    /// Sends the launch's `printf` text and `assert` messages to `output` (read when a launch
    /// or resumption starts). Without one, `printf` prints nothing and returns 0.
    pub fn set_output(&self, output: Option<Arc<dyn DeviceOutput>>) {
        match self.output.lock() {
            Ok(mut g) => *g = output,
            Err(p) => *p.into_inner() = output,
        }
    }

    /// Where `printf` and `assert` output goes.
    pub fn output(&self) -> Option<Arc<dyn DeviceOutput>> {
        match self.output.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Makes the launch's workers share `slots` with the other launches
    /// running at the same time (read when a launch or resumption starts).
    /// Without slots a launch's workers run unconstrained.
    pub fn set_slots(&self, slots: Option<Arc<WorkerSlots>>) {
        match self.slots.lock() {
            Ok(mut g) => *g = slots,
            Err(p) => *p.into_inner() = slots,
        }
    }

    /// Sets the launch's priority among the launches sharing its slots (CUDA's stream
    /// priorities: lower numbers first; default 0).
    pub fn set_priority(&self, priority: i32) {
        self.priority.store(priority, Ordering::Relaxed);
    }

    /// The launch's priority (see [`LaunchControl::set_priority`]).
    pub fn priority(&self) -> i32 {
        self.priority.load(Ordering::Relaxed)
    }

    /// The execution slots the launch shares.
    pub fn slots(&self) -> Option<Arc<WorkerSlots>> {
        match self.slots.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Makes the launch cooperative (`cuLaunchCooperativeKernel`), with its grid workspace at
    /// device address `workspace` (at least [`GRID_WORKSPACE_BYTES`] zeroed bytes; 0: an
    /// ordinary launch). Every block of a cooperative launch runs at once, on a thread of its
    /// own, as a GPU keeps them co-resident, so blocks may wait for each other: cooperative
    /// groups' `grid.sync()` finds the workspace in `%envreg1`/`%envreg2` and keeps its
    /// barrier there. At most [`MAX_COOPERATIVE_BLOCKS`] blocks; such a launch neither yields
    /// nor shares execution slots. Read when a launch starts.
    pub fn set_grid_workspace(&self, workspace: u64) {
        self.grid_workspace.store(workspace, Ordering::SeqCst);
    }

    /// The grid workspace of a cooperative launch (0: not cooperative).
    pub fn grid_workspace(&self) -> u64 {
        self.grid_workspace.load(Ordering::SeqCst)
    }

    /// Charges the launch's interpreter state to `budget` (read when a launch or resumption
    /// starts). Without one, a launch's state is bounded per block only.
    pub fn set_state_budget(&self, budget: Option<Arc<dyn StateBudget>>) {
        match self.state_budget.lock() {
            Ok(mut g) => *g = budget,
            Err(p) => *p.into_inner() = budget,
        }
    }

    /// The budget the launch's interpreter state is charged to.
    pub fn state_budget(&self) -> Option<Arc<dyn StateBudget>> {
        match self.state_budget.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Lets the launch's kernels set the conditional handles of the graph launch they run in
    /// (`cudaGraphSetConditional`; read when a launch or resumption starts). Without them
    /// (`None`: a launch outside a graph with conditional nodes) a kernel that calls
    /// `cudaGraphSetConditional` faults with [`FaultKind::IllegalInstruction`].
    pub fn set_conditionals(&self, conditionals: Option<Arc<dyn GraphConditionals>>) {
        match self.conditionals.lock() {
            Ok(mut g) => *g = conditionals,
            Err(p) => *p.into_inner() = conditionals,
        }
    }

    /// The conditional handles the launch's kernels may set.
    pub fn conditionals(&self) -> Option<Arc<dyn GraphConditionals>> {
        match self.conditionals.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// The device heap the launch's `malloc` and `free` use (`None`: `malloc` answers `NULL`,
    /// and `free` of anything but `NULL` faults).
    pub fn set_heap(&self, heap: Option<Arc<dyn heap::DeviceHeap>>) {
        match self.heap.lock() {
            Ok(mut g) => *g = heap,
            Err(p) => *p.into_inner() = heap,
        }
    }

    /// The device heap the launch's kernels use.
    pub fn heap(&self) -> Option<Arc<dyn heap::DeviceHeap>> {
        match self.heap.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Where the launch's kernels' own launches (dynamic parallelism) are kept: the caller
    /// keeps it across the launch's resumptions after yields. `None`: device-side launches
    /// fail (their parameter buffers are `NULL`).
    pub fn set_device_launches(&self, launches: Option<Arc<devlaunch::DeviceLaunches>>) {
        match self.device_launches.lock() {
            Ok(mut g) => *g = launches,
            Err(p) => *p.into_inner() = launches,
        }
    }

    /// The context's limits, by `CUlimit` number (stack size, printf FIFO, heap, sync depth,
    /// pending launches), which kernels read with `cudaDeviceGetLimit` (the device runtime's
    /// `cnpGetLimit`; `None`: such a read fails with `cudaErrorInvalidValue`).
    pub fn set_device_limits(&self, limits: Option<Arc<[u64]>>) {
        *self.limits.lock().unwrap_or_else(|p| p.into_inner()) = limits;
    }

    /// The context's limits ([`LaunchControl::set_device_limits`]).
    pub fn device_limits(&self) -> Option<Arc<[u64]>> {
        self.limits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The module's kernels' attributes, by kernel index (the order of [`Module::kernels`]) and
    /// then `CUfunction_attribute` number, which kernels read with `cudaFuncGetAttributes` and
    /// `cudaOccupancyMaxActiveBlocksPerMultiprocessor` (the device runtime's
    /// `cnpFuncGetAttribute`, `…MaxActiveBlocksPerMultiprocessor`); without them those calls
    /// answer `cudaErrorInvalidValue`.
    pub fn set_function_attributes(&self, attributes: Option<Arc<[Vec<i32>]>>) {
        *self
            .function_attributes
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = attributes;
    }

    /// The kernels' attributes ([`LaunchControl::set_function_attributes`]).
    pub fn function_attributes(&self) -> Option<Arc<[Vec<i32>]>> {
        self.function_attributes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The device's attributes, indexed by `CUdevice_attribute`, that kernels read with
    /// `cudaDeviceGetAttribute` and the device runtime's occupancy calls (`None`: such a read
    /// fails with `cudaErrorInvalidValue`).
    pub fn set_device_attributes(&self, attributes: Option<Arc<[i32]>>) {
        match self.attributes.lock() {
            Ok(mut g) => *g = attributes,
            Err(p) => *p.into_inner() = attributes,
        }
    }

    /// The device's attributes kernels read.
    pub fn device_attributes(&self) -> Option<Arc<[i32]>> {
        match self.attributes.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// The launch's device-side launches.
    pub fn device_launches(&self) -> Option<Arc<devlaunch::DeviceLaunches>> {
        match self.device_launches.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

/// Takes one block's interpreter state (`per_block` bytes) for each of `workers` workers from
/// `budget`, halving the workers while it has no room; a cooperative launch needs them all.
/// Returns the workers that may run and what was taken.
fn take_state<'a>(
    budget: Option<&'a dyn StateBudget>,
    per_block: u64,
    workers: usize,
    cooperative: bool,
    kernel: &str,
) -> Result<(usize, Taken<'a>), Fault> {
    let Some(b) = budget else {
        return Ok((workers, Taken { budget, bytes: 0 }));
    };
    let mut n = workers.max(1);
    loop {
        let bytes = per_block.saturating_mul(n as u64);
        if b.take(bytes) {
            return Ok((n, Taken { budget, bytes }));
        }
        if cooperative || n == 1 {
            return Err(Fault::new(
                FaultKind::OutOfMemory,
                format!(
                    "kernel `{kernel}`: {n} block(s) at once need {} MiB of interpreter state (registers, local and shared memory), more than the tenant's interpreter budget has left",
                    bytes.div_ceil(1 << 20)
                ),
            ));
        }
        n = (n / 2).max(1);
    }
}

/// Bytes of a cooperative launch's grid workspace (cooperative groups keep a 32-bit barrier
/// counter at offset 4).
pub const GRID_WORKSPACE_BYTES: u64 = 16;
/// Most blocks a cooperative launch may have: each runs on a host thread of its own.
pub const MAX_COOPERATIVE_BLOCKS: u64 = 1024;
/// Most register memory all blocks of a cooperative launch may hold at once.
pub const MAX_COOPERATIVE_REGISTER_FILE: u64 = 256 << 20;

/// Execution counters of one launch call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Instructions executed, counted per active thread.
    pub thread_instructions: u64,
    /// Thread blocks completed by this call.
    pub blocks: u64,
}

/// How a launch call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Every block ran.
    Completed(Stats),
    /// Stopped after a yield request; resume with `start_block = next_block`.
    Yielded {
        /// First block not yet run.
        next_block: u64,
        /// Counters of this call.
        stats: Stats,
    },
}

impl Progress {
    /// The counters of this call.
    pub fn stats(&self) -> Stats {
        match self {
            Progress::Completed(s) | Progress::Yielded { stats: s, .. } => *s,
        }
    }
}

fn invalid(msg: String) -> Fault {
    Fault::new(FaultKind::InvalidConfig, msg)
}

impl Module {
    /// Parses and pre-decodes PTX text. Unknown or unsupported instructions fail here with
    /// [`LoadErrorKind::NotSupported`] and their line; syntax errors with `InvalidPtx`.
    pub fn load(ptx: &str) -> Result<Module, LoadError> {
        Self::load_in(ptx, &mut watch::Ticker::none())
    }

    /// [`Module::load`], asking `watch` every few tens of microseconds of work whether to go
    /// on: a load it stops fails with the [`LoadErrorKind`] it gives (`TimedOut` or
    /// `Cancelled`), however large or slow the module, and keeps nothing.
    pub fn load_watched(ptx: &str, watch: &mut dyn LoadWatch) -> Result<Module, LoadError> {
        Self::load_in(ptx, &mut watch::Ticker::new(watch))
    }

    fn load_in(ptx: &str, ticker: &mut watch::Ticker<'_>) -> Result<Module, LoadError> {
        // The device runtime's system calls a linked libcudadevrt makes, defined here.
        let ptx = devrt::with_syscalls(ptx);
        let toks = lexer::tokenize_watched(&ptx, ticker)?;
        let ast = parser::parse_watched(&toks, ticker)?;
        drop(toks);
        let prog = decode::decode(&ast, ticker)?;
        Ok(Module { prog })
    }

    /// Kernels (`.entry` functions) in PTX order.
    pub fn kernels(&self) -> &[KernelInfo] {
        &self.prog.kernels
    }

    /// A kernel by name.
    pub fn kernel(&self, name: &str) -> Option<&KernelInfo> {
        self.prog.kernels.iter().find(|k| k.name == name)
    }

    /// Whether its kernels may call the device heap (`malloc`, `free`, and device-side
    /// launches' parameter buffers): a launch of one needs [`LaunchControl::set_heap`], or
    /// their `malloc` answers `NULL`.
    pub fn uses_heap(&self) -> bool {
        self.prog.uses_heap
    }

    /// Whether its kernels may launch kernels (dynamic parallelism): a launch of one needs
    /// [`LaunchControl::set_device_launches`] and a heap.
    pub fn launches_kernels(&self) -> bool {
        self.prog.launches_kernels
    }

    /// Module-scope `.global` and `.const` variables in a fixed order.
    pub fn globals(&self) -> &[GlobalVar] {
        &self.prog.globals
    }

    /// Runs blocks of a kernel from `launch.start_block` until all have run, a yield is
    /// requested, or a fault stops it; then the grids its kernels launched (dynamic
    /// parallelism, [`devlaunch`]), and theirs, in launch order. A yield while a child grid
    /// runs answers `Yielded` with `next_block` past the parent's blocks; resumed so, the launch
    /// goes on with that child.
    pub fn launch(&self, launch: &Launch<'_>) -> Result<Progress, Fault> {
        let Some(launches) = launch.control.device_launches() else {
            return run_grid(&self.prog, launch, GridKind::Host);
        };
        let total = launch.grid.iter().map(|&d| u64::from(d)).product::<u64>();
        let r = self.launch_with_children(launch, &launches, total);
        if !matches!(r, Ok(Progress::Yielded { .. })) {
            // Buffers handed out and never launched go back to the heap.
            let heap = launch.control.heap();
            for addr in launches.finish() {
                if let Some(h) = &heap {
                    h.free(addr);
                }
            }
        }
        r
    }

    fn launch_with_children(
        &self,
        launch: &Launch<'_>,
        launches: &devlaunch::DeviceLaunches,
        total: u64,
    ) -> Result<Progress, Fault> {
        let mut stats = Stats::default();
        if launch.start_block < total {
            match run_grid(&self.prog, launch, GridKind::Host)? {
                Progress::Completed(s) => stats = s,
                y @ Progress::Yielded { .. } => return Ok(y),
            }
        }
        while let Some(child) = launches.next_child() {
            let info = &self.prog.kernels[child.kernel];
            check_between_grids(launch.control, &info.name)?;
            let r = run_grid(
                &self.prog,
                &Launch {
                    kernel: &info.name,
                    grid: child.grid,
                    block: child.block,
                    dynamic_shared: child.shared,
                    params: &child.params,
                    start_block: child.next_block,
                    ..*launch
                },
                GridKind::Child {
                    id: child.id,
                    depth: child.depth,
                },
            )?;
            match r {
                Progress::Completed(s) => {
                    stats.thread_instructions += s.thread_instructions;
                    stats.blocks += s.blocks;
                    launches.child_done();
                }
                Progress::Yielded {
                    next_block,
                    stats: s,
                } => {
                    launches.child_yielded(next_block);
                    stats.thread_instructions += s.thread_instructions;
                    stats.blocks += s.blocks;
                    return Ok(Progress::Yielded {
                        next_block: total,
                        stats,
                    });
                }
            }
        }
        Ok(Progress::Completed(stats))
    }
}

/// Which grid [`run_grid`] runs.
#[derive(Clone, Copy, Debug)]
enum GridKind {
    /// The host's launch.
    Host,
    /// A grid a kernel launched, at the launch's top level once its parent's blocks ran; never
    /// cooperative.
    Child { id: u64, depth: u32 },
    /// A grid a kernel launched, run within a `cudaDeviceSynchronize` of a block of its
    /// parent on that block's worker: one worker in the block's slot, to completion (no
    /// yield: the waiting block cannot be kept across one).
    Synced { id: u64, depth: u32 },
}

/// Stack of a thread that runs the grids a block waits for (`cudaDeviceSynchronize` in device
/// code): one level of interpreter, ample in a debug build.
const SYNC_THREAD_STACK: usize = 2 << 20;

/// A new grid id (`%gridid`), distinct within the process.
pub(crate) fn next_grid_id() -> u64 {
    static GRID_ID: AtomicU64 = AtomicU64::new(1);
    GRID_ID.fetch_add(1, Ordering::Relaxed)
}

/// Runs device-side `cudaDeviceSynchronize` for block `origin` of the grid `ctx` runs: the
/// grids that block launched that wait to run, each with its descendants, in its launch order,
/// while the calling worker waits.
///
/// They run on a thread of their own (one worker, in the waiting worker's slot), which waits
/// for the next level's on another: a waiting block's interpreter state stays on its worker's
/// stack, and grids may wait 24 levels deep whatever stack the worker has.
pub(crate) fn run_launched_by_block(
    ctx: &exec::Ctx<'_>,
    origin: devlaunch::Origin,
) -> Result<Stats, Fault> {
    let mut stats = Stats::default();
    let Some(launches) = ctx.launches else {
        return Ok(stats);
    };
    let Some(first) = launches.take_launched_by_block(origin) else {
        return Ok(stats);
    };
    let run = || -> Result<Stats, Fault> {
        let mut child = Some(first);
        while let Some(c) = child {
            run_synced(ctx, launches, &c, &mut stats)?;
            child = launches.take_launched_by_block(origin);
        }
        Ok(stats)
    };
    std::thread::scope(|s| {
        let spawned = std::thread::Builder::new()
            .name("vgpu-ptx-sync".into())
            .stack_size(SYNC_THREAD_STACK)
            .spawn_scoped(s, || catch_unwind(AssertUnwindSafe(run)));
        match spawned.map(|t| t.join()) {
            Ok(Ok(Ok(r))) => r,
            Ok(_) => Err(Fault::new(
                FaultKind::Trap,
                "the thread running the grids a block waits for panicked".to_string(),
            )),
            Err(_) => Err(Fault::new(
                FaultKind::OutOfResources,
                "cannot start a thread to run the grids a block waits for",
            )),
        }
    })
}

/// A fault once the launch's watchdog deadline passed or it was cancelled. Checked before each
/// grid a kernel launched: grids too small to reach the interpreter's own check (every 1024
/// warp instructions of a worker) may come by the million.
fn check_between_grids(control: &LaunchControl, kernel: &str) -> Result<(), Fault> {
    if control.is_cancelled() {
        return Err(Fault::new(
            FaultKind::Cancelled,
            format!("launch cancelled before a grid of kernel `{kernel}` ran"),
        ));
    }
    if control.deadline().is_some_and(|d| Instant::now() >= d) {
        return Err(Fault::new(
            FaultKind::Timeout,
            format!(
                "watchdog: the launch ran past its deadline before a grid of kernel `{kernel}` (launched by a kernel) ran"
            ),
        ));
    }
    Ok(())
}

/// Runs `child` and then the grids its blocks launched (and theirs) to completion.
fn run_synced(
    ctx: &exec::Ctx<'_>,
    launches: &devlaunch::DeviceLaunches,
    child: &devlaunch::ChildGrid,
    stats: &mut Stats,
) -> Result<(), Fault> {
    let info = &ctx.prog.kernels[child.kernel];
    check_between_grids(ctx.control, &info.name)?;
    let launch = Launch {
        kernel: &info.name,
        grid: child.grid,
        block: child.block,
        dynamic_shared: child.shared,
        params: &child.params,
        globals: ctx.globals,
        memory: ctx.memory,
        start_block: 0,
        workers: 1,
        control: ctx.control,
    };
    let kind = GridKind::Synced {
        id: child.id,
        depth: child.depth,
    };
    match run_grid(ctx.prog, &launch, kind)? {
        Progress::Completed(s) | Progress::Yielded { stats: s, .. } => {
            stats.thread_instructions += s.thread_instructions;
            stats.blocks += s.blocks;
        }
    }
    while let Some(grandchild) = launches.take_launched_by_grid(child.id) {
        run_synced(ctx, launches, &grandchild, stats)?;
    }
    Ok(())
}

/// Runs blocks of one grid from `launch.start_block`.
fn run_grid(
    prog: &decode::Program,
    launch: &Launch<'_>,
    kind: GridKind,
) -> Result<Progress, Fault> {
    let (grid_id, depth, child, synced) = match kind {
        GridKind::Host => (next_grid_id(), 0, false, false),
        GridKind::Child { id, depth } => (id, depth, true, false),
        GridKind::Synced { id, depth } => (id, depth, true, true),
    };
    let Some(kidx) = prog.kernels.iter().position(|k| k.name == launch.kernel) else {
        return Err(Fault::new(
            FaultKind::InvalidConfig,
            format!("no kernel named `{}` in the module", launch.kernel),
        ));
    };
    let info = &prog.kernels[kidx];
    let layout = &prog.layouts[kidx];
    let (grid, block) = (launch.grid, launch.block);
    for i in 0..3 {
        if block[i] == 0 || block[i] > MAX_BLOCK_DIM[i] {
            return Err(invalid(format!("invalid block dimensions {block:?}")));
        }
        if grid[i] == 0 || grid[i] > MAX_GRID_DIM[i] {
            return Err(invalid(format!("invalid grid dimensions {grid:?}")));
        }
    }
    let nthreads = u64::from(block[0]) * u64::from(block[1]) * u64::from(block[2]);
    // The interpreter keeps every declared register of every thread: a
    // kernel declaring a million registers must not make the host hold
    // gigabytes per block.
    let nregs = u64::from(prog.funcs[layout.func as usize].nregs);
    let file = nthreads
        .div_ceil(WARP_SIZE)
        .saturating_mul(WARP_SIZE)
        .saturating_mul(nregs)
        .saturating_mul(REGISTER_BYTES);
    if file > MAX_BLOCK_REGISTER_FILE {
        return Err(Fault::new(
            FaultKind::OutOfResources,
            format!(
                "kernel `{}` declares {nregs} registers: {nthreads} threads would need {} MiB of registers, more than a block may hold ({} MiB)",
                launch.kernel,
                file >> 20,
                MAX_BLOCK_REGISTER_FILE >> 20
            ),
        ));
    }
    if nthreads > u64::from(info.max_threads_per_block) {
        return Err(invalid(format!(
            "block of {nthreads} threads exceeds the kernel's limit of {}",
            info.max_threads_per_block
        )));
    }
    if let Some(r) = info.reqntid
        && r != block
    {
        return Err(invalid(format!(
            "kernel `{}` requires blocks of {r:?} threads",
            info.name
        )));
    }
    let shared_size = layout.dyn_shared_base as usize + launch.dynamic_shared as usize;
    if shared_size > MAX_SHARED_BYTES_PER_BLOCK {
        return Err(invalid(format!(
            "{shared_size} bytes of shared memory per block exceed the limit of {MAX_SHARED_BYTES_PER_BLOCK}"
        )));
    }
    if launch.params.len() != info.param_bytes {
        return Err(invalid(format!(
            "kernel `{}` takes {} parameter bytes, got {}",
            info.name,
            info.param_bytes,
            launch.params.len()
        )));
    }
    if launch.globals.len() != prog.globals.len() {
        return Err(invalid(format!(
            "module has {} globals, got {} addresses",
            prog.globals.len(),
            launch.globals.len()
        )));
    }
    let total = u64::from(grid[0]) * u64::from(grid[1]) * u64::from(grid[2]);
    if launch.start_block > total {
        return Err(invalid(format!(
            "start block {} is past the grid of {total} blocks",
            launch.start_block
        )));
    }
    let remaining = total - launch.start_block;
    if remaining == 0 {
        return Ok(Progress::Completed(Stats::default()));
    }
    let grid_workspace = if child {
        0
    } else {
        launch.control.grid_workspace()
    };
    let cooperative = grid_workspace != 0;
    if cooperative && (launch.start_block != 0 || total > MAX_COOPERATIVE_BLOCKS) {
        return Err(Fault::new(
            FaultKind::CooperativeTooLarge,
            format!(
                "a cooperative launch of {total} blocks: at most {MAX_COOPERATIVE_BLOCKS} run at once"
            ),
        ));
    }
    // All blocks of a cooperative launch hold their registers at once (an ordinary launch
    // holds at most one block's per worker).
    if cooperative && file.saturating_mul(total) > MAX_COOPERATIVE_REGISTER_FILE {
        return Err(Fault::new(
            FaultKind::CooperativeTooLarge,
            format!(
                "a cooperative launch of {total} blocks of kernel `{}` would hold {} MiB of registers at once, more than {} MiB",
                launch.kernel,
                file.saturating_mul(total) >> 20,
                MAX_COOPERATIVE_REGISTER_FILE >> 20
            ),
        ));
    }
    let stop = AtomicBool::new(false);
    // Every block of a cooperative launch has a worker of its own.
    let workers = if cooperative {
        remaining as usize
    } else {
        (launch.workers.max(1) as u64).min(remaining) as usize
    };
    // The state every worker holds for its block, taken from the tenant's budget before
    // anything runs.
    let kfunc = &prog.funcs[layout.func as usize];
    let nwarps = nthreads.div_ceil(WARP_SIZE);
    let frames_paid = nwarps.saturating_mul(exec::frame_bytes(kfunc));
    let per_block = frames_paid
        .saturating_add(layout.local_per_thread.saturating_mul(nwarps * WARP_SIZE))
        .saturating_add(shared_size as u64);
    let budget = launch.control.state_budget();
    let (workers, _taken) = take_state(
        budget.as_deref(),
        per_block,
        workers,
        cooperative,
        &info.name,
    )?;
    let output = launch.control.output();
    let conditionals = launch.control.conditionals();
    let heap = launch.control.heap();
    let launches = launch.control.device_launches();
    let attributes = launch.control.device_attributes();
    let limits = launch.control.device_limits();
    let function_attributes = launch.control.function_attributes();
    let ctx = exec::Ctx {
        prog,
        layout,
        kernel_name: &info.name,
        grid,
        block,
        nthreads: nthreads as u32,
        nwarps: (nthreads as u32).div_ceil(32),
        params: launch.params,
        globals: launch.globals,
        memory: launch.memory,
        control: launch.control,
        deadline: launch.control.deadline(),
        shared_size,
        dyn_shared: launch.dynamic_shared,
        workers: workers as u32,
        grid_id,
        depth,
        stop: &stop,
        output: output.as_deref(),
        conditionals: conditionals.as_deref(),
        heap: heap.as_deref(),
        launches: launches.as_deref(),
        attributes: attributes.as_deref(),
        limits: limits.as_deref(),
        function_attributes: function_attributes.as_deref(),
        grid_workspace,
        budget: budget.as_deref(),
        frames_paid,
    };
    let next = AtomicU64::new(launch.start_block);
    // Blocks of a cooperative launch may wait for each other: none may wait for a slot.
    // A synced grid runs in the slot its waiting block's worker holds.
    let slots = launch.control.slots().filter(|_| !cooperative && !synced);
    let priority = launch.control.priority();
    let group = launch.control.slot_group();
    // Wakes this launch's workers waiting for a slot after something `halt` reads changed.
    let wake = || {
        if let Some(s) = &slots {
            s.wake(group);
        }
    };
    let halt = || {
        stop.load(Ordering::Relaxed)
            || launch.control.yield_requested()
            || launch.control.is_cancelled()
            || next.load(Ordering::Relaxed) >= total
    };
    let run = |smid: u32| -> WorkerResult {
        let mut w = match exec::Worker::new(&ctx, smid) {
            Ok(w) => w,
            Err(f) => return (Stats::default(), Some((0, f))),
        };
        let mut fault = None;
        let mut held = None;
        loop {
            // A cooperative launch does not yield: its blocks wait for each other.
            if stop.load(Ordering::Relaxed)
                || (!cooperative && !synced && launch.control.yield_requested())
            {
                break;
            }
            if let Some(s) = &slots
                && held.is_none()
            {
                held = s
                    .acquire(priority, group, halt)
                    .map(|h| (h, Instant::now()));
                if held.is_none() {
                    break;
                }
            }
            let b = next.fetch_add(1, Ordering::SeqCst);
            if b + 1 == total {
                // The last block is claimed: siblings waiting for a slot can stop.
                wake();
            }
            if b >= total {
                break;
            }
            if let Err(f) = w.run_block(b) {
                if !w.stopped_by_sibling() {
                    fault = Some((b, f));
                }
                stop.store(true, Ordering::SeqCst);
                wake();
                break;
            }
            if let (Some(s), Some((_, since))) = (&slots, &held)
                && (s.preempted(priority)
                    || (s.contended(priority) && since.elapsed() >= slots::SLOT_TURN))
            {
                // Another launch's worker of a higher priority waits, or one of this
                // priority and this worker had its turn: let it run.
                held = None;
            }
        }
        drop(held);
        (
            Stats {
                thread_instructions: w.insts,
                blocks: w.blocks,
            },
            fault,
        )
    };
    let results: Mutex<Vec<WorkerResult>> = Mutex::new(Vec::with_capacity(workers));
    let task = |smid: u32| {
        let r = catch_unwind(AssertUnwindSafe(|| run(smid))).unwrap_or_else(|_| {
            // Stop the other workers; the launch fails instead of the process.
            stop.store(true, Ordering::SeqCst);
            wake();
            (
                Stats::default(),
                Some((
                    u64::MAX,
                    Fault::new(FaultKind::Trap, "interpreter worker panicked".to_string()),
                )),
            )
        });
        results.lock().unwrap_or_else(|p| p.into_inner()).push(r);
    };
    if cooperative {
        // Threads of its own, all at once: pool threads may be busy with other launches,
        // and a block waiting at a grid-wide barrier needs every other block running.
        std::thread::scope(|s| {
            for smid in 1..workers as u32 {
                let task = &task;
                let spawned = std::thread::Builder::new()
                    .name(format!("vgpu-ptx-coop-{smid}"))
                    .spawn_scoped(s, move || task(smid));
                if spawned.is_err() {
                    // Without its thread a block would never arrive: fail the launch.
                    stop.store(true, Ordering::SeqCst);
                    results.lock().unwrap_or_else(|p| p.into_inner()).push((
                        Stats::default(),
                        Some((
                            u64::MAX,
                            Fault::new(
                                FaultKind::CooperativeTooLarge,
                                "cannot start a thread for every block of a cooperative launch",
                            ),
                        )),
                    ));
                    break;
                }
            }
            task(0);
        });
    } else {
        pool::run(workers as u32, priority, &task);
    }
    let results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut stats = Stats::default();
    let mut first: Option<(u64, Fault)> = None;
    for (s, f) in results {
        stats.thread_instructions += s.thread_instructions;
        stats.blocks += s.blocks;
        if let Some((b, f)) = f
            && first.as_ref().is_none_or(|(fb, _)| b < *fb)
        {
            first = Some((b, f));
        }
    }
    if let Some((_, f)) = first {
        return Err(f);
    }
    let done = next.load(Ordering::SeqCst).min(total);
    if done >= total {
        Ok(Progress::Completed(stats))
    } else {
        Ok(Progress::Yielded {
            next_block: done,
            stats,
        })
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutils::{TestMemory, fixture};

    /// xorshift64*: deterministic mutations.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    fn mutate(src: &[u8], rng: &mut Rng) -> Vec<u8> {
        let mut b = src.to_vec();
        const JUNK: &[u8] = b"0123456789%{}[]();,.@!-+_xfd<>|\n ";
        for _ in 0..1 + rng.below(3) {
            if b.is_empty() {
                break;
            }
            let at = rng.below(b.len());
            // Mostly syntax-preserving edits (digits: registers, offsets, immediates; whole
            // lines moved), so that many mutants load and then run.
            if rng.below(3) > 0 {
                let digits: Vec<usize> = b
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.is_ascii_digit())
                    .map(|(i, _)| i)
                    .collect();
                if rng.below(2) == 0 && !digits.is_empty() {
                    let i = digits[rng.below(digits.len())];
                    b[i] = b'0' + rng.below(10) as u8;
                } else {
                    let mut lines: Vec<Vec<u8>> =
                        b.split(|&c| c == b'\n').map(<[u8]>::to_vec).collect();
                    let (x, y) = (rng.below(lines.len()), rng.below(lines.len()));
                    lines.swap(x, y);
                    b = lines.join(&b'\n');
                }
                continue;
            }
            match rng.below(5) {
                0 => b.truncate(at),
                1 => {
                    let end = (at + 1 + rng.below(40)).min(b.len());
                    b.drain(at..end);
                }
                2 => b[at] = JUNK[rng.below(JUNK.len())],
                3 => {
                    let end = (at + rng.below(200)).min(b.len());
                    let chunk = b[at..end].to_vec();
                    let to = rng.below(b.len());
                    b.splice(to..to, chunk);
                }
                _ => {
                    // Swap two bytes far apart: reorders operands, names and punctuation.
                    let other = rng.below(b.len());
                    b.swap(at, other);
                }
            }
        }
        b
    }

    /// Truncated and mutated PTX never panics at load, and whatever still loads never panics
    /// when launched with junk parameters.
    #[test]
    fn mutated_ptx_never_panics() {
        let sources: Vec<String> = [
            ("saxpy", "compute_90"),
            ("matmul", "compute_80"),
            ("warp", "compute_52"),
            ("generic", "compute_80"),
            ("atomics", "compute_90"),
            ("barriers", "compute_80"),
            ("texture/textures", "compute_70"),
        ]
        .iter()
        .map(|(n, a)| fixture(n, a))
        .collect();
        let mut rng = Rng(0x5eed_1234_abcd_9876);
        let mem = TestMemory::new();
        let scratch = mem.alloc(1 << 16);
        // Every 64-bit parameter is `scratch`: let it name a texture and a surface over the
        // scratch memory too, so that mutated texture kernels sample and store.
        let tex_layout = texture::Layout {
            base: scratch,
            format: texture::ChannelFormat::F32,
            channels: 4,
            dims: 2,
            width: 16,
            height: 16,
            depth: 1,
            layers: 2,
            pitch: 256,
            slice_pitch: 4096,
        };
        mem.add_texture(
            scratch,
            texture::TextureView {
                layout: tex_layout,
                sampler: texture::Sampler {
                    address: [texture::AddressMode::Mirror; 3],
                    filter: texture::FilterMode::Linear,
                    read_as_integer: false,
                    normalized_coords: true,
                    border_color: [0.0; 4],
                    mip: texture::MipSampler::ONE_LEVEL,
                },
            },
        );
        mem.add_surface(scratch, texture::SurfaceView { layout: tex_layout });
        let mut loaded = 0;
        for round in 0..400 {
            let src = sources[round % sources.len()].as_bytes();
            let text = if round % 10 == 0 {
                // Plain truncation at every point class.
                String::from_utf8_lossy(&src[..rng.below(src.len())]).into_owned()
            } else {
                String::from_utf8_lossy(&mutate(src, &mut rng)).into_owned()
            };
            let Ok(m) = Module::load(&text) else { continue };
            loaded += 1;
            let Some(k) = m.kernels().first().cloned() else {
                continue;
            };
            let mut params = vec![0u8; k.param_bytes];
            for p in &k.params {
                if p.size == 8 {
                    params[p.offset..p.offset + 8].copy_from_slice(&scratch.to_le_bytes());
                } else if p.size == 4 {
                    params[p.offset..p.offset + 4].copy_from_slice(&64u32.to_le_bytes());
                }
            }
            let globals: Vec<u64> = m.globals().iter().map(|_| scratch).collect();
            let control = LaunchControl::new();
            control.set_timeout(Duration::from_millis(20));
            let _ = m.launch(&Launch {
                kernel: &k.name,
                grid: [2, 1, 1],
                block: [64, 1, 1],
                dynamic_shared: 256,
                params: &params,
                globals: &globals,
                memory: &mem,
                start_block: 0,
                workers: 1,
                control: &control,
            });
        }
        assert!(
            loaded > 20,
            "mutations too destructive: only {loaded} modules loaded"
        );
    }

    #[test]
    fn load_errors_name_the_line_and_instruction() {
        let ptx = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n.reg .b32 %r<3>;\nmatch.any.sync.b64 %r1, %r2, 0xffffffff;\nwgmma.fence.sync.aligned;\nret;\n}\n";
        let e = Module::load(ptx).unwrap_err();
        assert_eq!(e.kind, LoadErrorKind::NotSupported);
        assert_eq!(
            e.to_string(),
            "line 8: unsupported instruction `wgmma.fence.sync.aligned`"
        );
        let e = Module::load(".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\nadd.s32 %r1, %r2;\n}\n").unwrap_err();
        assert_eq!(e.kind, LoadErrorKind::InvalidPtx);
        assert_eq!(e.line, 6);
        let e = Module::load(".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\nbra NOWHERE;\n}\n").unwrap_err();
        assert_eq!((e.kind, e.line), (LoadErrorKind::InvalidPtx, 6));
        assert!(Module::load("").is_err());
        assert!(Module::load(".version 8.0\n.target sm_90\n.address_size 32\n").is_err());
    }
}
