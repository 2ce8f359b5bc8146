//! The warp interpreter: one worker runs whole thread blocks, warp by warp, 32 lanes in lockstep.
//!
//! * Registers are struct-of-arrays: a frame's register file is `Vec<[u64; 32]>` (one row per
//!   register, one column per lane) and predicates are one `u32` lane mask each.
//! * Divergence uses a SIMT reconvergence stack: a conditional branch whose lanes disagree
//!   replaces the top entry's pc with the branch's immediate post-dominator and pushes one entry per
//!   side; an entry is popped when its pc reaches its reconvergence pc. Calls push a marker entry
//!   and a register frame; `ret` retires lanes until the marker empties.
//! * `bar.sync` parks the warp; the block scheduler resumes warps when the barrier completes.
//!   Threads that exited count as arrived, so the common `if (i >= n) return; __syncthreads();`
//!   pattern works. A block whose warps all wait on barriers that cannot complete is a deadlock
//!   and faults as a timeout (the hardware would hang until the watchdog).

// Lane loops index several register rows in lockstep; iterator chains would obscure that.
#![allow(clippy::needless_range_loop)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::decode::{Func, KernelLayout, MAX_CALL_DEPTH, Program, SymInit};
use crate::error::{Fault, FaultKind};
use crate::float::{self, bits32, bits64, ftz32};
use crate::ir::*;
use crate::mem::{AccessError, KernelView, Width};
use crate::printf::{self, DeviceOutput};
use crate::{GlobalMemory, GraphConditionals, LaunchControl, MAX_BLOCK_FRAME_BYTES, StateBudget};

/// Base of the generic-address window for shared memory (above every global address).
pub const SHARED_WINDOW: u64 = 0x0001_0000_0000_0000;
/// Base of the generic-address window for local memory.
pub const LOCAL_WINDOW: u64 = 0x0002_0000_0000_0000;
/// Base of the generic-address window for kernel parameters.
pub const PARAM_WINDOW: u64 = 0x0003_0000_0000_0000;
/// Size of each non-global window.
pub const WINDOW_SIZE: u64 = 1 << 32;
/// Global addresses lie below this bound (the simulated device allocates under 2^47).
const GLOBAL_LIMIT: u64 = 1 << 48;

const FULL: u32 = u32::MAX;
/// Warp-instructions between checks of the watchdog, cancellation and sibling faults.
const CHECK_INTERVAL: u32 = 1024;
/// The same in a cooperative launch, whose blocks each give up their thread's CPU at every
/// check (blocks spinning at a grid barrier wait for blocks that need a CPU to arrive).
const COOPERATIVE_CHECK_INTERVAL: u32 = 128;
/// Value of %nwarpid (warp slots per SM on current GPUs).
const NWARPID: u32 = 64;
/// Distinct allocations a worker keeps pinned and cached.
const MAX_VIEWS: usize = 64;
/// Barriers per block.
const NUM_BARRIERS: usize = 16;
/// Bytes of one register row of a frame (one 64-bit value per lane).
const REGISTER_ROW_BYTES: u64 = 32 * 8;
/// Bytes of one predicate of a frame (a lane mask).
const PREDICATE_BYTES: u64 = 4;
/// Lanes of a warp, each with its own `.param` area in a frame.
const LANES: u64 = 32;
/// Largest frame (in bytes) a worker keeps for reuse after its call returns; larger ones are
/// freed, so that the memory a worker holds follows its live frames.
const POOLED_FRAME_MAX: u64 = 64 << 10;
/// Smallest piece of the tenant's interpreter budget a worker takes at once for call frames
/// past what its launch reserved (fewer trips to a budget shared by the tenant's launches).
const FRAME_BUDGET_CHUNK: u64 = 1 << 20;

/// Host bytes of a frame of `func` as the interpreter lays it out: register rows, predicate
/// masks and the per-lane `.param` area.
pub(crate) fn frame_bytes(func: &Func) -> u64 {
    u64::from(func.nregs) * REGISTER_ROW_BYTES
        + u64::from(func.npreds) * PREDICATE_BYTES
        + u64::from(func.param_bytes) * LANES
}

fn clock_base() -> Instant {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// Launch-wide, read-only context shared by all workers.
pub(crate) struct Ctx<'a> {
    pub prog: &'a Program,
    pub layout: &'a KernelLayout,
    pub kernel_name: &'a str,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub nthreads: u32,
    pub nwarps: u32,
    pub params: &'a [u8],
    pub globals: &'a [u64],
    pub memory: &'a dyn GlobalMemory,
    pub control: &'a LaunchControl,
    pub deadline: Option<Instant>,
    pub shared_size: usize,
    pub dyn_shared: u32,
    pub workers: u32,
    pub grid_id: u64,
    /// How deep the grid is nested (the host's launch is 0; dynamic parallelism).
    pub depth: u32,
    /// Set when any worker faulted: the others stop at their next check.
    pub stop: &'a AtomicBool,
    /// Where `printf` and `assert` output goes.
    pub output: Option<&'a dyn DeviceOutput>,
    /// The conditional handles of the graph launch the kernel runs in (`cudaGraphSetConditional`).
    pub conditionals: Option<&'a dyn GraphConditionals>,
    /// The device heap of `malloc` and `free`.
    pub heap: Option<&'a dyn crate::heap::DeviceHeap>,
    /// The launch's device-side launches (dynamic parallelism).
    pub launches: Option<&'a crate::devlaunch::DeviceLaunches>,
    /// The device's attributes as the VM sees them (`cudaDeviceGetAttribute` in kernels).
    pub attributes: Option<&'a [i32]>,
    /// The context's limits by `CUlimit` number (`cudaDeviceGetLimit` in kernels).
    pub limits: Option<&'a [u64]>,
    /// The module's kernels' attributes by kernel index and `CUfunction_attribute` number
    /// (`cudaFuncGetAttributes` and occupancy in kernels).
    pub function_attributes: Option<&'a [Vec<i32>]>,
    /// A cooperative launch's grid workspace (0: not cooperative).
    pub grid_workspace: u64,
    /// The tenant's budget for interpreter state, charged for call frames past `frames_paid`.
    pub budget: Option<&'a dyn StateBudget>,
    /// Bytes of frames per worker the launch already took from `budget` (the kernel's own
    /// frames of one block).
    pub frames_paid: u64,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    pc: u32,
    rpc: u32,
    mask: u32,
    /// A call marker: lanes still inside the callee of the frame above it.
    call: bool,
}

struct Frame {
    func: u32,
    regs: Vec<[u64; 32]>,
    preds: Vec<u32>,
    /// Per-lane `.param` area, lane-major (`lane * param_bytes + offset`).
    params: Vec<u8>,
    param_bytes: usize,
    local_base: u64,
    /// For callee frames: the call's return-value copies and the calling lanes.
    ret_copy: Vec<(u32, u32, u32)>,
    call_mask: u32,
}

/// Why a frame could not be set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FrameRefusal {
    /// The block's frames would pass [`MAX_BLOCK_FRAME_BYTES`].
    BlockLimit,
    /// The tenant's interpreter budget has no room left.
    Budget,
}

impl Frame {
    /// Host bytes the frame holds, by capacity.
    fn bytes(&self) -> u64 {
        self.regs.capacity() as u64 * REGISTER_ROW_BYTES
            + self.preds.capacity() as u64 * PREDICATE_BYTES
            + self.params.capacity() as u64
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum WState {
    Ready,
    Barrier,
    Done,
}

struct Warp {
    idx: u32,
    /// Lanes that exist (the last warp of a block may be partial).
    valid: u32,
    stack: Vec<Entry>,
    frames: Vec<Frame>,
    state: WState,
    carry: u32,
    /// bar.red result destination: (kind, register or predicate, lanes).
    red: Option<(BarKind, u32, u32)>,
    tid: [[u32; 32]; 3],
}

#[derive(Clone, Copy, Default)]
struct Barrier {
    arrived: u32,
    expected: u32,
    waiting: u64,
    popc: u32,
    all: bool,
    any: bool,
}

/// Why a warp stopped running.
enum Stop {
    Done,
    Barrier,
    /// The warp waits on the block's other warps (an `mbarrier` wait that found its phase
    /// incomplete, `nanosleep`): they run before it goes on.
    Yield,
}

/// Per-worker state: memory caches, the current block's shared/local memory and warps.
pub(crate) struct Worker<'a> {
    ctx: &'a Ctx<'a>,
    smid: u32,
    views: Vec<(u64, u64, KernelView)>,
    last_view: usize,
    shared: Vec<u8>,
    local: Vec<u8>,
    local_stride: usize,
    warps: Vec<Warp>,
    bars: [Barrier; NUM_BARRIERS],
    exited_threads: u32,
    block_idx: [u32; 3],
    pub insts: u64,
    pub blocks: u64,
    budget: u32,
    frame_pool: Vec<Frame>,
    sibling_stop: bool,
    /// Host bytes of every frame this worker owns (in its warps and its pool), by capacity.
    frame_bytes: u64,
    /// Bytes of frames paid for: the launch's share plus `frame_extra`.
    frame_paid: u64,
    /// Bytes this worker took from the tenant's budget itself (given back when it ends).
    frame_extra: u64,
}

impl Drop for Worker<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.ctx.budget
            && self.frame_extra > 0
        {
            b.give_back(self.frame_extra);
        }
    }
}

fn fault(kind: FaultKind, msg: String) -> Fault {
    Fault::new(kind, msg)
}

#[macro_use]
mod lanes;
mod atomics;
mod calls;
mod dispatch;
mod fp;
mod int;
mod launches;
mod mbarrier;
mod memory;
mod mma;
mod sched;
mod texture;

use atomics::*;
use fp::*;
use int::*;
use lanes::*;

/// The parts of a warp that fault messages and per-lane addressing need (lets the interpreter
/// keep mutable borrows of the frame while reporting).
#[derive(Clone, Copy)]
struct WarpRef<'w> {
    tid: &'w [[u32; 32]; 3],
    idx: u32,
}

fn warp_ref(tid: &[[u32; 32]; 3], idx: u32, _valid: u32) -> WarpRef<'_> {
    WarpRef { tid, idx }
}
