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
use crate::{GlobalMemory, LaunchControl};

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
/// Value of %nwarpid (warp slots per SM on current GPUs).
const NWARPID: u32 = 64;
/// Distinct allocations a worker keeps pinned and cached.
const MAX_VIEWS: usize = 64;
/// Barriers per block.
const NUM_BARRIERS: usize = 16;

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
    /// Set when any worker faulted: the others stop at their next check.
    pub stop: &'a AtomicBool,
    /// Where `printf` and `assert` output goes.
    pub output: Option<&'a dyn DeviceOutput>,
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
}

fn fault(kind: FaultKind, msg: String) -> Fault {
    Fault::new(kind, msg)
}

impl<'a> Worker<'a> {
    pub(crate) fn new(ctx: &'a Ctx<'a>, smid: u32) -> Result<Worker<'a>, Fault> {
        let kfunc = &ctx.prog.funcs[ctx.layout.func as usize];
        let local_stride = ctx.layout.local_per_thread as usize;
        let local_len = local_stride
            .checked_mul(ctx.nwarps as usize * 32)
            .ok_or_else(|| fault(FaultKind::InvalidConfig, "local memory too large".into()))?;
        let mut w = Worker {
            ctx,
            smid,
            views: Vec::new(),
            last_view: 0,
            shared: vec![0u8; ctx.shared_size],
            local: vec![0u8; local_len],
            local_stride,
            warps: Vec::with_capacity(ctx.nwarps as usize),
            bars: [Barrier::default(); NUM_BARRIERS],
            exited_threads: 0,
            block_idx: [0; 3],
            insts: 0,
            blocks: 0,
            budget: CHECK_INTERVAL,
            frame_pool: Vec::new(),
            sibling_stop: false,
        };
        for wi in 0..ctx.nwarps {
            let frame = w.new_frame(kfunc, ctx.layout.func, 0);
            let first = wi * 32;
            let n = (ctx.nthreads - first).min(32);
            let valid = if n == 32 { FULL } else { (1u32 << n) - 1 };
            let mut tid = [[0u32; 32]; 3];
            let [bx, by, _] = ctx.block;
            for l in 0..32u32 {
                let t = first + l;
                tid[0][l as usize] = t % bx;
                tid[1][l as usize] = (t / bx) % by;
                tid[2][l as usize] = t / (bx * by);
            }
            w.warps.push(Warp {
                idx: wi,
                valid,
                stack: Vec::with_capacity(8),
                frames: vec![frame],
                state: WState::Ready,
                carry: 0,
                red: None,
                tid,
            });
        }
        Ok(w)
    }

    /// Builds a frame for `func` with its hidden registers initialised.
    fn new_frame(&mut self, func: &Func, id: u32, local_base: u64) -> Frame {
        let mut f = self.frame_pool.pop().unwrap_or(Frame {
            func: id,
            regs: Vec::new(),
            preds: Vec::new(),
            params: Vec::new(),
            param_bytes: 0,
            local_base,
            ret_copy: Vec::new(),
            call_mask: 0,
        });
        f.func = id;
        f.local_base = local_base;
        f.regs.clear();
        f.regs.resize(func.nregs as usize, [0u64; 32]);
        f.preds.clear();
        f.preds.resize(func.npreds as usize, 0);
        f.param_bytes = func.param_bytes as usize;
        f.params.clear();
        f.params.resize(func.param_bytes as usize * 32, 0);
        f.ret_copy.clear();
        f.call_mask = 0;
        for &(r, init) in &func.init_regs {
            let v = self.sym_value(init, local_base);
            f.regs[r as usize] = [v; 32];
        }
        for &(p, v) in &func.init_preds {
            f.preds[p as usize] = if v { FULL } else { 0 };
        }
        f
    }

    fn sym_value(&self, init: SymInit, local_base: u64) -> u64 {
        match init {
            SymInit::Imm(v) => v,
            SymInit::Global { idx, off } => self
                .ctx
                .globals
                .get(idx as usize)
                .copied()
                .unwrap_or(0)
                .wrapping_add(off as u64),
            SymInit::Shared { var, off, generic } => {
                let base = self
                    .ctx
                    .layout
                    .shared_off
                    .get(var as usize)
                    .copied()
                    .unwrap_or(u64::MAX);
                let v = base.wrapping_add(off as u64);
                if generic {
                    v.wrapping_add(SHARED_WINDOW)
                } else {
                    v
                }
            }
            SymInit::Local { off, generic } => {
                let v = local_base.wrapping_add(off as u64);
                if generic {
                    v.wrapping_add(LOCAL_WINDOW)
                } else {
                    v
                }
            }
            SymInit::KParam { off } => PARAM_WINDOW.wrapping_add(off as u64),
        }
    }

    /// True when the last error only reflects another worker's fault.
    pub(crate) fn stopped_by_sibling(&self) -> bool {
        self.sibling_stop
    }

    /// Runs block `linear` to completion.
    pub(crate) fn run_block(&mut self, linear: u64) -> Result<(), Fault> {
        let [gx, gy, _] = self.ctx.grid;
        let (gx, gy) = (u64::from(gx), u64::from(gy));
        self.block_idx = [
            (linear % gx) as u32,
            ((linear / gx) % gy) as u32,
            (linear / (gx * gy)) as u32,
        ];
        self.bars = [Barrier::default(); NUM_BARRIERS];
        self.exited_threads = 0;
        for w in &mut self.warps {
            while w.frames.len() > 1 {
                if let Some(f) = w.frames.pop() {
                    self.frame_pool.push(f);
                }
            }
            w.stack.clear();
            w.stack.push(Entry {
                pc: 0,
                rpc: NONE,
                mask: w.valid,
                call: false,
            });
            w.state = WState::Ready;
            w.carry = 0;
            w.red = None;
        }
        let mut warps = std::mem::take(&mut self.warps);
        let r = self.schedule(&mut warps);
        self.warps = warps;
        self.blocks += 1;
        r
    }

    fn schedule(&mut self, warps: &mut [Warp]) -> Result<(), Fault> {
        loop {
            let mut ran = false;
            let mut all_done = true;
            for wi in 0..warps.len() {
                match warps[wi].state {
                    WState::Done => continue,
                    WState::Barrier => {
                        all_done = false;
                        continue;
                    }
                    WState::Ready => {}
                }
                all_done = false;
                ran = true;
                let stop = self.run_warp(&mut warps[wi])?;
                match stop {
                    Stop::Done => warps[wi].state = WState::Done,
                    Stop::Barrier => warps[wi].state = WState::Barrier,
                }
                self.release_barriers(warps);
            }
            if all_done {
                return Ok(());
            }
            if !ran {
                self.release_barriers(warps);
                if warps.iter().all(|w| w.state != WState::Ready) {
                    return Err(fault(
                        FaultKind::Timeout,
                        format!(
                            "kernel `{}` deadlocked: every warp of block ({}, {}, {}) waits at a barrier that cannot complete",
                            self.ctx.kernel_name,
                            self.block_idx[0],
                            self.block_idx[1],
                            self.block_idx[2]
                        ),
                    ));
                }
            }
        }
    }

    fn release_barriers(&mut self, warps: &mut [Warp]) {
        for b in 0..NUM_BARRIERS {
            let bar = self.bars[b];
            if bar.waiting == 0 && bar.arrived == 0 {
                continue;
            }
            let need = if bar.expected == 0 {
                self.ctx.nthreads.saturating_sub(self.exited_threads)
            } else {
                bar.expected
            };
            if bar.arrived < need {
                continue;
            }
            for (wi, w) in warps.iter_mut().enumerate() {
                if bar.waiting >> wi & 1 == 0 {
                    continue;
                }
                w.state = WState::Ready;
                if let Some((kind, d, lanes)) = w.red.take()
                    && let Some(frame) = w.frames.last_mut()
                {
                    {
                        match kind {
                            BarKind::RedPopc => {
                                if let Some(row) = frame.regs.get_mut(d as usize) {
                                    for l in 0..32 {
                                        if lanes >> l & 1 != 0 {
                                            row[l] = u64::from(bar.popc);
                                        }
                                    }
                                }
                            }
                            BarKind::RedAnd | BarKind::RedOr => {
                                let v = if kind == BarKind::RedAnd {
                                    bar.all
                                } else {
                                    bar.any
                                };
                                if let Some(p) = frame.preds.get_mut(d as usize) {
                                    *p = (*p & !lanes) | if v { lanes } else { 0 };
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
            self.bars[b] = Barrier::default();
        }
    }

    fn where_(&self, warp: WarpRef<'_>, lane: u32, line: u32) -> String {
        format!(
            "in kernel `{}` at PTX line {}, block ({}, {}, {}), thread ({}, {}, {})",
            self.ctx.kernel_name,
            line,
            self.block_idx[0],
            self.block_idx[1],
            self.block_idx[2],
            warp.tid[0][lane as usize & 31],
            warp.tid[1][lane as usize & 31],
            warp.tid[2][lane as usize & 31]
        )
    }

    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn mem_fault(
        &self,
        warp: WarpRef<'_>,
        lane: u32,
        line: u32,
        what: &str,
        addr: u64,
        size: usize,
        e: AccessError,
    ) -> Fault {
        let (kind, desc) = match e {
            AccessError::OutOfRange => (FaultKind::IllegalAddress, "illegal address"),
            AccessError::Misaligned => (FaultKind::MisalignedAddress, "misaligned address"),
        };
        fault(
            kind,
            format!(
                "{desc} {addr:#x} ({what} of {size} bytes) {}",
                self.where_(warp, lane, line)
            ),
        )
    }

    fn check_control(&mut self, warp: WarpRef<'_>, line: u32) -> Result<(), Fault> {
        self.budget = CHECK_INTERVAL;
        if self.ctx.stop.load(Ordering::Relaxed) {
            self.sibling_stop = true;
            return Err(fault(
                FaultKind::Cancelled,
                "stopped because another block faulted".into(),
            ));
        }
        if self.ctx.control.is_cancelled() {
            return Err(fault(
                FaultKind::Cancelled,
                format!("launch of `{}` cancelled", self.ctx.kernel_name),
            ));
        }
        if let Some(d) = self.ctx.deadline
            && Instant::now() >= d
        {
            return Err(fault(
                FaultKind::Timeout,
                format!(
                    "watchdog: kernel `{}` ran past its deadline {}",
                    self.ctx.kernel_name,
                    self.where_(warp, 0, line)
                ),
            ));
        }
        Ok(())
    }

    // ---- global memory -------------------------------------------------------------------

    #[inline]
    fn view_index(&mut self, addr: u64) -> Option<usize> {
        if let Some(v) = self.views.get(self.last_view)
            && addr.wrapping_sub(v.0) < v.1
        {
            return Some(self.last_view);
        }
        self.view_slow(addr)
    }

    #[cold]
    fn view_slow(&mut self, addr: u64) -> Option<usize> {
        if let Some(i) = self.views.iter().position(|v| addr.wrapping_sub(v.0) < v.1) {
            self.last_view = i;
            return Some(i);
        }
        let (base, buf): (u64, Arc<crate::mem::Buffer>) = self.ctx.memory.lookup(addr)?;
        let len = buf.len() as u64;
        if addr.wrapping_sub(base) >= len {
            return None;
        }
        if self.views.len() >= MAX_VIEWS {
            self.views.swap_remove(0);
        }
        self.views.push((base, len, buf.kernel_view()));
        self.last_view = self.views.len() - 1;
        Some(self.last_view)
    }

    #[inline]
    fn gload(&mut self, addr: u64, w: Width, ord: Ordering) -> Result<u64, AccessError> {
        if addr >= GLOBAL_LIMIT {
            return Err(AccessError::OutOfRange);
        }
        let i = self.view_index(addr).ok_or(AccessError::OutOfRange)?;
        let v = &self.views[i];
        v.2.kernel_load(addr - v.0, w, ord)
    }

    #[inline]
    fn gstore(&mut self, addr: u64, w: Width, val: u64, ord: Ordering) -> Result<(), AccessError> {
        if addr >= GLOBAL_LIMIT {
            return Err(AccessError::OutOfRange);
        }
        let i = self.view_index(addr).ok_or(AccessError::OutOfRange)?;
        let v = &self.views[i];
        v.2.kernel_store(addr - v.0, w, val, ord)
    }

    fn local_range(
        &self,
        warp: WarpRef<'_>,
        lane: u32,
        addr: u64,
        size: usize,
    ) -> Result<usize, AccessError> {
        if addr & (size as u64 - 1) != 0 {
            return Err(AccessError::Misaligned);
        }
        let stride = self.local_stride as u64;
        if addr >= stride || stride - addr < size as u64 {
            return Err(AccessError::OutOfRange);
        }
        let t = u64::from(warp.idx) * 32 + u64::from(lane);
        Ok((t * stride + addr) as usize)
    }

    #[inline]
    fn shared_range(&self, addr: u64, size: usize) -> Result<usize, AccessError> {
        if addr & (size as u64 - 1) != 0 {
            return Err(AccessError::Misaligned);
        }
        let len = self.shared.len() as u64;
        if addr >= len || len - addr < size as u64 {
            return Err(AccessError::OutOfRange);
        }
        Ok(addr as usize)
    }

    /// Resolves an address in `space` to a concrete space and offset.
    #[inline]
    fn resolve(space: Space, addr: u64) -> Result<(Space, u64), AccessError> {
        match space {
            Space::Generic => {
                if addr < GLOBAL_LIMIT {
                    Ok((Space::Global, addr))
                } else if addr.wrapping_sub(SHARED_WINDOW) < WINDOW_SIZE {
                    Ok((Space::Shared, addr - SHARED_WINDOW))
                } else if addr.wrapping_sub(LOCAL_WINDOW) < WINDOW_SIZE {
                    Ok((Space::Local, addr - LOCAL_WINDOW))
                } else if addr.wrapping_sub(PARAM_WINDOW) < WINDOW_SIZE {
                    Ok((Space::Param, addr - PARAM_WINDOW))
                } else {
                    Err(AccessError::OutOfRange)
                }
            }
            Space::Param => {
                if addr.wrapping_sub(PARAM_WINDOW) < WINDOW_SIZE {
                    Ok((Space::Param, addr - PARAM_WINDOW))
                } else {
                    Ok((Space::Param, addr))
                }
            }
            Space::Const => Ok((Space::Global, addr)),
            s => Ok((s, addr)),
        }
    }

    fn load_any(
        &mut self,
        warp: WarpRef<'_>,
        lane: u32,
        space: Space,
        addr: u64,
        size: usize,
        ord: Ordering,
    ) -> Result<u64, AccessError> {
        let (sp, a) = Self::resolve(space, addr)?;
        let w = Width::from_bytes(size).ok_or(AccessError::Misaligned)?;
        match sp {
            Space::Global | Space::Const => self.gload(a, w, ord),
            Space::Shared => {
                let o = self.shared_range(a, size)?;
                Ok(read_le(&self.shared[o..o + size]))
            }
            Space::Local => {
                let o = self.local_range(warp, lane, a, size)?;
                Ok(read_le(&self.local[o..o + size]))
            }
            Space::Param => {
                if a & (size as u64 - 1) != 0 {
                    return Err(AccessError::Misaligned);
                }
                let p = self.ctx.params;
                if a >= p.len() as u64 || (p.len() as u64 - a) < size as u64 {
                    return Err(AccessError::OutOfRange);
                }
                Ok(read_le(&p[a as usize..a as usize + size]))
            }
            Space::Generic => Err(AccessError::OutOfRange),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn store_any(
        &mut self,
        warp: WarpRef<'_>,
        lane: u32,
        space: Space,
        addr: u64,
        size: usize,
        val: u64,
        ord: Ordering,
    ) -> Result<(), AccessError> {
        let (sp, a) = Self::resolve(space, addr)?;
        let w = Width::from_bytes(size).ok_or(AccessError::Misaligned)?;
        match sp {
            Space::Global => self.gstore(a, w, val, ord),
            Space::Shared => {
                let o = self.shared_range(a, size)?;
                write_le(&mut self.shared[o..o + size], val);
                Ok(())
            }
            Space::Local => {
                let o = self.local_range(warp, lane, a, size)?;
                write_le(&mut self.local[o..o + size], val);
                Ok(())
            }
            // Constant memory and kernel parameters are read-only.
            _ => Err(AccessError::OutOfRange),
        }
    }

    // ---- the interpreter loop ------------------------------------------------------------

    fn run_warp(&mut self, warp: &mut Warp) -> Result<Stop, Fault> {
        let prog = self.ctx.prog;
        'outer: loop {
            // Pop entries that reached their reconvergence point or have no lanes left.
            loop {
                let Some(top) = warp.stack.last().copied() else {
                    return Ok(Stop::Done);
                };
                if top.mask == 0 {
                    warp.stack.pop();
                    if top.call {
                        self.pop_frame(warp);
                    }
                    continue;
                }
                if !top.call && top.pc == top.rpc {
                    warp.stack.pop();
                    continue;
                }
                if top.call {
                    // A marker on top means its callee frame has finished.
                    warp.stack.pop();
                    self.pop_frame(warp);
                    continue;
                }
                break;
            }
            let depth = warp.stack.len() - 1;
            let Entry {
                pc: start_pc,
                rpc,
                mask,
                ..
            } = warp.stack[depth];
            let mut pc = start_pc;
            let in_callee = warp.frames.len() > 1;
            let Some(frame) = warp.frames.last_mut() else {
                return Ok(Stop::Done);
            };
            let func = &prog.funcs[frame.func as usize];
            let code = &func.code[..];
            loop {
                if pc == rpc {
                    warp.stack[depth].pc = pc;
                    continue 'outer;
                }
                let Some(inst) = code.get(pc as usize) else {
                    return Err(fault(
                        FaultKind::IllegalInstruction,
                        format!(
                            "kernel `{}` ran past the end of function `{}`",
                            self.ctx.kernel_name, func.name
                        ),
                    ));
                };
                let m = if inst.guard == NONE {
                    mask
                } else {
                    let p = frame.preds[inst.guard as usize];
                    mask & if inst.guard_neg { !p } else { p }
                };
                self.insts += u64::from(m.count_ones());
                self.budget -= 1;
                if self.budget == 0 {
                    self.check_control(warp_ref(&warp.tid, warp.idx, warp.valid), inst.line)?;
                }
                let regs = &mut frame.regs;
                match &inst.op {
                    Op::Nop => {}
                    Op::Fence => std::sync::atomic::fence(Ordering::SeqCst),
                    Op::Mov { d, a } => map1(regs, m, *d, *a, |x| x),
                    Op::Special { d, s } => {
                        let vals = self.special(warp_ref(&warp.tid, warp.idx, warp.valid), *s);
                        write_masked(&mut regs[*d as usize], m, &vals);
                    }
                    Op::Pack { d, parts, n, bits } => {
                        let mut out = [0u64; 32];
                        let bmask = lowmask(u32::from(*bits));
                        for i in (0..*n as usize).rev() {
                            let p = regs[parts[i] as usize];
                            for l in 0..32 {
                                out[l] = (out[l] << *bits) | (p[l] & bmask);
                            }
                        }
                        write_masked(&mut regs[*d as usize], m, &out);
                    }
                    Op::Unpack { a, parts, n, bits } => {
                        let src = regs[*a as usize];
                        let bmask = lowmask(u32::from(*bits));
                        for i in 0..*n as usize {
                            let sh = u32::from(*bits) * i as u32;
                            let row = &mut regs[parts[i] as usize];
                            for l in 0..32 {
                                if m >> l & 1 != 0 {
                                    row[l] = (src[l] >> sh) & bmask;
                                }
                            }
                        }
                    }
                    Op::Ld {
                        space,
                        bytes,
                        sext,
                        n,
                        d,
                        base,
                        off,
                        ord,
                    } => {
                        let basev = regs[*base as usize];
                        let size = usize::from(*bytes);
                        let total = size * usize::from(*n);
                        let order = mem_order(*ord);
                        let mut lanes = m;
                        while lanes != 0 {
                            let l = lanes.trailing_zeros();
                            lanes &= lanes - 1;
                            let addr = basev[l as usize].wrapping_add(*off as u64);
                            if addr & (total as u64 - 1) != 0 {
                                let w = warp_ref(&warp.tid, warp.idx, warp.valid);
                                return Err(self.mem_fault(
                                    w,
                                    l,
                                    inst.line,
                                    "load",
                                    addr,
                                    total,
                                    AccessError::Misaligned,
                                ));
                            }
                            for i in 0..usize::from(*n) {
                                let a = addr.wrapping_add((i * size) as u64);
                                let w = warp_ref(&warp.tid, warp.idx, warp.valid);
                                let v = match space {
                                    Space::Global => self.gload(
                                        a,
                                        Width::from_bytes(size).unwrap_or(Width::B1),
                                        order,
                                    ),
                                    Space::Shared => self
                                        .shared_range(a, size)
                                        .map(|o| read_le(&self.shared[o..o + size])),
                                    _ => self.load_any(w, l, *space, a, size, order),
                                };
                                let v = match v {
                                    Ok(v) => v,
                                    Err(e) => {
                                        return Err(
                                            self.mem_fault(w, l, inst.line, "load", a, size, e)
                                        );
                                    }
                                };
                                regs[d[i] as usize][l as usize] = if *sext {
                                    sext_bits(v, size as u32 * 8)
                                } else {
                                    v
                                };
                            }
                        }
                    }
                    Op::St {
                        space,
                        bytes,
                        n,
                        s,
                        base,
                        off,
                        ord,
                    } => {
                        let basev = regs[*base as usize];
                        let size = usize::from(*bytes);
                        let total = size * usize::from(*n);
                        let order = mem_order(*ord);
                        let mut lanes = m;
                        while lanes != 0 {
                            let l = lanes.trailing_zeros();
                            lanes &= lanes - 1;
                            let addr = basev[l as usize].wrapping_add(*off as u64);
                            if addr & (total as u64 - 1) != 0 {
                                let w = warp_ref(&warp.tid, warp.idx, warp.valid);
                                return Err(self.mem_fault(
                                    w,
                                    l,
                                    inst.line,
                                    "store",
                                    addr,
                                    total,
                                    AccessError::Misaligned,
                                ));
                            }
                            for i in 0..usize::from(*n) {
                                let a = addr.wrapping_add((i * size) as u64);
                                let v = regs[s[i] as usize][l as usize];
                                let w = warp_ref(&warp.tid, warp.idx, warp.valid);
                                let r = match space {
                                    Space::Global => self.gstore(
                                        a,
                                        Width::from_bytes(size).unwrap_or(Width::B1),
                                        v,
                                        order,
                                    ),
                                    Space::Shared => self
                                        .shared_range(a, size)
                                        .map(|o| write_le(&mut self.shared[o..o + size], v)),
                                    _ => self.store_any(w, l, *space, a, size, v, order),
                                };
                                if let Err(e) = r {
                                    return Err(
                                        self.mem_fault(w, l, inst.line, "store", a, size, e)
                                    );
                                }
                            }
                        }
                    }
                    Op::LdKParam {
                        bytes,
                        sext,
                        n,
                        d,
                        off,
                    } => {
                        let size = usize::from(*bytes);
                        for i in 0..usize::from(*n) {
                            let at = *off as usize + i * size;
                            let Some(src) = self.ctx.params.get(at..at + size) else {
                                return Err(fault(
                                    FaultKind::InvalidConfig,
                                    format!(
                                        "kernel `{}` read past its parameter buffer",
                                        self.ctx.kernel_name
                                    ),
                                ));
                            };
                            let mut v = read_le(src);
                            if *sext {
                                v = sext_bits(v, size as u32 * 8);
                            }
                            let row = &mut regs[d[i] as usize];
                            for l in 0..32 {
                                if m >> l & 1 != 0 {
                                    row[l] = v;
                                }
                            }
                        }
                    }
                    Op::LdFParam {
                        bytes,
                        sext,
                        n,
                        d,
                        off,
                    } => {
                        let size = usize::from(*bytes);
                        let pb = frame.param_bytes;
                        for i in 0..usize::from(*n) {
                            let at = *off as usize + i * size;
                            for l in 0..32 {
                                if m >> l & 1 != 0 {
                                    let o = l * pb + at;
                                    let mut v = read_le(&frame.params[o..o + size]);
                                    if *sext {
                                        v = sext_bits(v, size as u32 * 8);
                                    }
                                    frame.regs[d[i] as usize][l] = v;
                                }
                            }
                        }
                    }
                    Op::StFParam { bytes, n, s, off } => {
                        let size = usize::from(*bytes);
                        let pb = frame.param_bytes;
                        for i in 0..usize::from(*n) {
                            let at = *off as usize + i * size;
                            for l in 0..32 {
                                if m >> l & 1 != 0 {
                                    let o = l * pb + at;
                                    let v = frame.regs[s[i] as usize][l];
                                    write_le(&mut frame.params[o..o + size], v);
                                }
                            }
                        }
                    }
                    Op::Cvta {
                        d,
                        a,
                        space,
                        to,
                        narrow,
                    } => {
                        let window = match space {
                            Space::Shared => SHARED_WINDOW,
                            Space::Local => LOCAL_WINDOW,
                            _ => 0,
                        };
                        let (to, narrow) = (*to, *narrow);
                        map1(regs, m, *d, *a, |x| {
                            let v = if to {
                                x.wrapping_sub(window)
                            } else {
                                x.wrapping_add(window)
                            };
                            if narrow { v & 0xffff_ffff } else { v }
                        });
                    }
                    Op::Isspacep { d, a, space } => {
                        let av = regs[*a as usize];
                        let mut bits = 0u32;
                        for l in 0..32 {
                            let x = av[l];
                            let r = match space {
                                Space::Global | Space::Const => x < GLOBAL_LIMIT,
                                Space::Shared => x.wrapping_sub(SHARED_WINDOW) < WINDOW_SIZE,
                                Space::Local => x.wrapping_sub(LOCAL_WINDOW) < WINDOW_SIZE,
                                Space::Param => x.wrapping_sub(PARAM_WINDOW) < WINDOW_SIZE,
                                Space::Generic => true,
                            };
                            bits |= u32::from(r) << l;
                        }
                        let p = &mut frame.preds[*d as usize];
                        *p = (*p & !m) | (bits & m);
                    }
                    Op::Cvt {
                        d,
                        a,
                        dty,
                        sty,
                        rnd,
                        sat,
                        ftz,
                    } => exec_cvt(regs, m, *d, *a, *dty, *sty, *rnd, *sat, *ftz),
                    Op::CvtPack {
                        d,
                        a,
                        b,
                        bf,
                        rnd,
                        relu,
                    } => {
                        let (bf, rnd, relu) = (*bf, *rnd, *relu);
                        map2(regs, m, *d, *a, *b, |hi, lo| {
                            let cv = |x: u64| {
                                let mut f = f64::from(f32::from_bits(x as u32));
                                if relu && f < 0.0 {
                                    f = 0.0;
                                }
                                u64::from(if bf {
                                    float::f64_to_bf16(f, 0, rnd)
                                } else {
                                    float::f64_to_f16(f, 0, rnd)
                                })
                            };
                            (cv(hi) << 16) | cv(lo)
                        });
                    }
                    Op::IBin { k, ty, d, a, b } => {
                        if let IBin::AddCarry { sub, cin, cout } = k {
                            warp.carry =
                                exec_addc(regs, m, *ty, *d, *a, *b, *sub, *cin, *cout, warp.carry);
                        } else {
                            exec_ibin(regs, m, *k, *ty, *d, *a, *b);
                        }
                    }
                    Op::IUn { k, ty, d, a } => exec_iun(regs, m, *k, *ty, *d, *a),
                    Op::ITern { k, ty, d, a, b, c } => {
                        if let ITern::MadCarry { hi, cin, cout } = k {
                            warp.carry = exec_madc(
                                regs, m, *ty, *d, *a, *b, *c, *hi, *cin, *cout, warp.carry,
                            );
                        } else {
                            exec_itern(regs, m, *k, *ty, *d, *a, *b, *c);
                        }
                    }
                    Op::Bfi { ty, d, a, b, c, e } => {
                        let bits = ty.bits();
                        let (av, bv, cv, ev) = (
                            regs[*a as usize],
                            regs[*b as usize],
                            regs[*c as usize],
                            regs[*e as usize],
                        );
                        let mut out = [0u64; 32];
                        for l in 0..32 {
                            let pos = (cv[l] & 0xff) as u32;
                            let len = (ev[l] & 0xff) as u32;
                            let mut r = bv[l] & lowmask(bits);
                            if pos < bits && len > 0 {
                                let n = len.min(bits - pos);
                                let fm = lowmask(n) << pos;
                                r = (r & !fm) | ((av[l] << pos) & fm);
                            }
                            out[l] = r;
                        }
                        write_masked(&mut regs[*d as usize], m, &out);
                    }
                    Op::Prmt { mode, d, a, b, c } => {
                        let mode = *mode;
                        map3(regs, m, *d, *a, *b, *c, |x, y, s| {
                            u64::from(prmt(x as u32, y as u32, s as u32, mode))
                        });
                    }
                    Op::Lop3 { d, a, b, c, lut } => {
                        let lut = *lut;
                        map3(regs, m, *d, *a, *b, *c, |x, y, z| {
                            u64::from(lop3(x as u32, y as u32, z as u32, lut))
                        });
                    }
                    Op::Shf {
                        left,
                        clamp,
                        d,
                        a,
                        b,
                        c,
                    } => {
                        let (left, clamp) = (*left, *clamp);
                        map3(regs, m, *d, *a, *b, *c, |lo, hi, n| {
                            let n = n as u32;
                            let n = if clamp { n.min(32) } else { n & 31 };
                            let v = ((hi & 0xffff_ffff) << 32) | (lo & 0xffff_ffff);
                            if left {
                                ((v << n) >> 32) & 0xffff_ffff
                            } else {
                                (v >> n) & 0xffff_ffff
                            }
                        });
                    }
                    Op::FBin {
                        k,
                        ty,
                        rnd,
                        ftz,
                        sat,
                        d,
                        a,
                        b,
                    } => exec_fbin(regs, m, *k, *ty, *rnd, *ftz, *sat, *d, *a, *b),
                    Op::FUn {
                        k,
                        ty,
                        rnd,
                        ftz,
                        sat,
                        d,
                        a,
                    } => exec_fun(regs, m, *k, *ty, *rnd, *ftz, *sat, *d, *a),
                    Op::Fma {
                        ty,
                        rnd,
                        ftz,
                        sat,
                        relu,
                        d,
                        a,
                        b,
                        c,
                    } => exec_fma(regs, m, *ty, *rnd, *ftz, *sat, *relu, *d, *a, *b, *c),
                    Op::Setp {
                        cmp,
                        ty,
                        ftz,
                        bop,
                        c,
                        cneg,
                        p,
                        q,
                        a,
                        b,
                    } => {
                        let bits = compare(regs, *cmp, *ty, *ftz, *a, *b);
                        let preds = &mut frame.preds;
                        let cval = if *c == NONE {
                            0
                        } else {
                            preds[*c as usize] ^ if *cneg { FULL } else { 0 }
                        };
                        let comb = |x: u32| match bop {
                            None => x,
                            Some(BoolOp::And) => x & cval,
                            Some(BoolOp::Or) => x | cval,
                            Some(BoolOp::Xor) => x ^ cval,
                        };
                        let r = comb(bits);
                        let pr = &mut preds[*p as usize];
                        *pr = (*pr & !m) | (r & m);
                        if *q != NONE {
                            let r2 = comb(!bits);
                            let qr = &mut preds[*q as usize];
                            *qr = (*qr & !m) | (r2 & m);
                        }
                    }
                    Op::Set {
                        cmp,
                        ty,
                        dty,
                        ftz,
                        bop,
                        c,
                        cneg,
                        d,
                        a,
                        b,
                    } => {
                        let bits = compare(regs, *cmp, *ty, *ftz, *a, *b);
                        let cval = if *c == NONE {
                            0
                        } else {
                            frame.preds[*c as usize] ^ if *cneg { FULL } else { 0 }
                        };
                        let r = match bop {
                            None => bits,
                            Some(BoolOp::And) => bits & cval,
                            Some(BoolOp::Or) => bits | cval,
                            Some(BoolOp::Xor) => bits ^ cval,
                        };
                        let t = if *dty == Ty::F32 {
                            u64::from(1.0f32.to_bits())
                        } else {
                            0xffff_ffff
                        };
                        let row = &mut frame.regs[*d as usize];
                        for l in 0..32 {
                            if m >> l & 1 != 0 {
                                row[l] = if r >> l & 1 != 0 { t } else { 0 };
                            }
                        }
                    }
                    Op::Selp { d, a, b, p } => {
                        let pv = frame.preds[*p as usize];
                        let (av, bv) = (frame.regs[*a as usize], frame.regs[*b as usize]);
                        let row = &mut frame.regs[*d as usize];
                        for l in 0..32 {
                            if m >> l & 1 != 0 {
                                row[l] = if pv >> l & 1 != 0 { av[l] } else { bv[l] };
                            }
                        }
                    }
                    Op::Slct {
                        float,
                        ftz,
                        d,
                        a,
                        b,
                        c,
                    } => {
                        let (fl, ftz) = (*float, *ftz);
                        map3(regs, m, *d, *a, *b, *c, |x, y, z| {
                            let ge = if fl {
                                let f = f32::from_bits(z as u32);
                                let f = if ftz { ftz32(f) } else { f };
                                f >= 0.0
                            } else {
                                z as u32 as i32 >= 0
                            };
                            if ge { x } else { y }
                        });
                    }
                    Op::PLogic {
                        op,
                        d,
                        a,
                        an,
                        b,
                        bn,
                    } => {
                        let preds = &mut frame.preds;
                        let av = preds[*a as usize] ^ if *an { FULL } else { 0 };
                        let bv = preds[*b as usize] ^ if *bn { FULL } else { 0 };
                        let r = match op {
                            BoolOp::And => av & bv,
                            BoolOp::Or => av | bv,
                            BoolOp::Xor => av ^ bv,
                        };
                        let dp = &mut preds[*d as usize];
                        *dp = (*dp & !m) | (r & m);
                    }
                    Op::PNot { d, a } => {
                        let r = !frame.preds[*a as usize];
                        let dp = &mut frame.preds[*d as usize];
                        *dp = (*dp & !m) | (r & m);
                    }
                    Op::PMov { d, a } => {
                        let r = frame.preds[*a as usize];
                        let dp = &mut frame.preds[*d as usize];
                        *dp = (*dp & !m) | (r & m);
                    }
                    Op::Testp { k, ty, d, a } => {
                        let av = frame.regs[*a as usize];
                        let mut bits = 0u32;
                        for l in 0..32 {
                            let x = if *ty == Ty::F64 {
                                f64::from_bits(av[l])
                            } else {
                                f64::from(f32::from_bits(av[l] as u32))
                            };
                            let sub = if *ty == Ty::F64 {
                                x.is_subnormal()
                            } else {
                                f32::from_bits(av[l] as u32).is_subnormal()
                            };
                            let r = match k {
                                TestP::Finite => x.is_finite(),
                                TestP::Infinite => x.is_infinite(),
                                TestP::Number => !x.is_nan(),
                                TestP::NotANumber => x.is_nan(),
                                TestP::Normal => x.is_finite() && x != 0.0 && !sub,
                                TestP::Subnormal => sub,
                            };
                            bits |= u32::from(r) << l;
                        }
                        let dp = &mut frame.preds[*d as usize];
                        *dp = (*dp & !m) | (bits & m);
                    }
                    Op::Bra { target, rpc: brpc } => {
                        let taken = m;
                        let not = mask & !m;
                        if not == 0 {
                            pc = *target;
                            continue;
                        }
                        if taken == 0 {
                            pc += 1;
                            continue;
                        }
                        // Divergence.
                        let top = warp.stack[depth];
                        // Paths that only meet at exit, or at the point where this entry ends
                        // anyway, replace the entry instead of stacking a reconvergence entry
                        // (keeps loops whose lanes leave one by one from growing the stack).
                        if *brpc == NONE || *brpc == top.rpc {
                            warp.stack[depth] = Entry {
                                pc: pc + 1,
                                rpc: top.rpc,
                                mask: not,
                                call: false,
                            };
                            warp.stack.push(Entry {
                                pc: *target,
                                rpc: top.rpc,
                                mask: taken,
                                call: false,
                            });
                        } else {
                            warp.stack[depth].pc = *brpc;
                            warp.stack.push(Entry {
                                pc: pc + 1,
                                rpc: *brpc,
                                mask: not,
                                call: false,
                            });
                            warp.stack.push(Entry {
                                pc: *target,
                                rpc: *brpc,
                                mask: taken,
                                call: false,
                            });
                        }
                        continue 'outer;
                    }
                    Op::Call(info) => {
                        if m == 0 {
                            pc += 1;
                            continue;
                        }
                        warp.stack[depth].pc = pc + 1;
                        self.do_call(warp, info, m, inst.line)?;
                        continue 'outer;
                    }
                    Op::CallBuiltin(b) => {
                        if m != 0 {
                            warp.stack[depth].pc = pc + 1;
                            self.builtin(warp, b, m, inst.line)?;
                            continue 'outer;
                        }
                    }
                    Op::Ret if in_callee => {
                        if m == 0 {
                            pc += 1;
                            continue;
                        }
                        warp.stack[depth].pc = pc + 1;
                        // Retire the lanes from every entry down to the call marker.
                        for e in warp.stack.iter_mut().rev() {
                            e.mask &= !m;
                            if e.call {
                                break;
                            }
                        }
                        continue 'outer;
                    }
                    Op::Exit | Op::Ret => {
                        if m == 0 {
                            pc += 1;
                            continue;
                        }
                        warp.stack[depth].pc = pc + 1;
                        for e in warp.stack.iter_mut() {
                            e.mask &= !m;
                        }
                        self.exited_threads += m.count_ones();
                        continue 'outer;
                    }
                    Op::Trap => {
                        if m == 0 {
                            pc += 1;
                            continue;
                        }
                        let l = m.trailing_zeros();
                        return Err(fault(
                            FaultKind::Trap,
                            format!(
                                "trap {}",
                                self.where_(
                                    warp_ref(&warp.tid, warp.idx, warp.valid),
                                    l,
                                    inst.line
                                )
                            ),
                        ));
                    }
                    Op::Bar {
                        k,
                        id,
                        count,
                        p,
                        pneg,
                        d,
                    } => {
                        if m == 0 {
                            pc += 1;
                            continue;
                        }
                        let first = m.trailing_zeros() as usize;
                        let bid = regs[*id as usize][first] as usize;
                        if bid >= NUM_BARRIERS {
                            return Err(fault(
                                FaultKind::IllegalInstruction,
                                format!(
                                    "barrier id {bid} out of range {}",
                                    self.where_(
                                        warp_ref(&warp.tid, warp.idx, warp.valid),
                                        first as u32,
                                        inst.line
                                    )
                                ),
                            ));
                        }
                        let cnt = if *count == NONE {
                            0
                        } else {
                            regs[*count as usize][first] as u32
                        };
                        let bar = &mut self.bars[bid];
                        if bar.arrived == 0 && bar.waiting == 0 {
                            *bar = Barrier {
                                all: true,
                                ..Barrier::default()
                            };
                        }
                        bar.expected = cnt;
                        bar.arrived += m.count_ones();
                        if matches!(k, BarKind::RedPopc | BarKind::RedAnd | BarKind::RedOr) {
                            let pv = frame.preds[*p as usize] ^ if *pneg { FULL } else { 0 };
                            let t = pv & m;
                            bar.popc += t.count_ones();
                            bar.all &= t == m;
                            bar.any |= t != 0;
                            warp.red = Some((*k, *d, m));
                        }
                        warp.stack[depth].pc = pc + 1;
                        if *k == BarKind::Arrive {
                            pc += 1;
                            continue;
                        }
                        bar.waiting |= 1u64 << warp.idx;
                        return Ok(Stop::Barrier);
                    }
                    Op::Atom {
                        space,
                        op,
                        ty,
                        d,
                        base,
                        off,
                        b,
                        c,
                    } => {
                        let w = WarpRef {
                            tid: &warp.tid,
                            idx: warp.idx,
                        };
                        let bytes = ty.bytes();
                        let (basev, bv) = (regs[*base as usize], regs[*b as usize]);
                        let cv = if *c == NONE {
                            [0u64; 32]
                        } else {
                            regs[*c as usize]
                        };
                        let mut lanes = m;
                        while lanes != 0 {
                            let l = lanes.trailing_zeros();
                            lanes &= lanes - 1;
                            let addr = basev[l as usize].wrapping_add(*off as u64);
                            let r = self.atomic(
                                w,
                                l,
                                *space,
                                *op,
                                *ty,
                                addr,
                                bv[l as usize],
                                cv[l as usize],
                            );
                            match r {
                                Ok(old) => {
                                    if *d != NONE {
                                        regs[*d as usize][l as usize] = old;
                                    }
                                }
                                Err(e) => {
                                    return Err(
                                        self.mem_fault(w, l, inst.line, "atomic", addr, bytes, e)
                                    );
                                }
                            }
                        }
                    }
                    Op::Shfl {
                        mode,
                        d,
                        p,
                        a,
                        b,
                        c,
                        mask: mreg,
                    } => {
                        let _ = mreg;
                        let (av, bv, cv) =
                            (regs[*a as usize], regs[*b as usize], regs[*c as usize]);
                        let mut out = [0u64; 32];
                        let mut pbits = 0u32;
                        for l in 0..32i32 {
                            let bval = (bv[l as usize] & 31) as i32;
                            let cval = (cv[l as usize] & 31) as i32;
                            let seg = ((cv[l as usize] >> 8) & 31) as i32;
                            let maxl = (l & seg) | (cval & !seg);
                            let minl = l & seg;
                            let (j, ok) = match mode {
                                ShflMode::Up => (l - bval, l - bval >= maxl),
                                ShflMode::Down => (l + bval, l + bval <= maxl),
                                ShflMode::Bfly => (l ^ bval, (l ^ bval) <= maxl),
                                ShflMode::Idx => {
                                    let j = minl | (bval & !seg);
                                    (j, j <= maxl)
                                }
                            };
                            let j = if ok { j } else { l };
                            out[l as usize] = av[(j & 31) as usize];
                            pbits |= u32::from(ok) << l;
                        }
                        write_masked(&mut regs[*d as usize], m, &out);
                        if *p != NONE {
                            let pr = &mut frame.preds[*p as usize];
                            *pr = (*pr & !m) | (pbits & m);
                        }
                    }
                    Op::Vote {
                        mode,
                        d,
                        a,
                        aneg,
                        mask: mreg,
                    } => {
                        let first = m.trailing_zeros() as usize & 31;
                        let member = regs[*mreg as usize][first] as u32;
                        let pv = frame.preds[*a as usize] ^ if *aneg { FULL } else { 0 };
                        let set = m & member;
                        let t = pv & set;
                        match mode {
                            VoteMode::Ballot => {
                                let row = &mut frame.regs[*d as usize];
                                for l in 0..32 {
                                    if m >> l & 1 != 0 {
                                        row[l] = u64::from(t);
                                    }
                                }
                            }
                            _ => {
                                let r = match mode {
                                    VoteMode::All => t == set,
                                    VoteMode::Any => t != 0,
                                    _ => t == 0 || t == set,
                                };
                                let dp = &mut frame.preds[*d as usize];
                                *dp = (*dp & !m) | if r { m } else { 0 };
                            }
                        }
                    }
                    Op::Activemask { d } => {
                        let row = &mut regs[*d as usize];
                        for l in 0..32 {
                            if m >> l & 1 != 0 {
                                row[l] = u64::from(m);
                            }
                        }
                    }
                    Op::Redux {
                        op,
                        signed,
                        d,
                        a,
                        mask: mreg,
                    } => {
                        let first = m.trailing_zeros() as usize & 31;
                        let set = m & regs[*mreg as usize][first] as u32;
                        let av = regs[*a as usize];
                        let mut acc: Option<u32> = None;
                        for l in 0..32 {
                            if set >> l & 1 == 0 {
                                continue;
                            }
                            let x = av[l] as u32;
                            acc = Some(match acc {
                                None => x,
                                Some(y) => match op {
                                    ReduxOp::Add => y.wrapping_add(x),
                                    ReduxOp::Min if *signed => (y as i32).min(x as i32) as u32,
                                    ReduxOp::Max if *signed => (y as i32).max(x as i32) as u32,
                                    ReduxOp::Min => y.min(x),
                                    ReduxOp::Max => y.max(x),
                                    ReduxOp::And => y & x,
                                    ReduxOp::Or => y | x,
                                    ReduxOp::Xor => y ^ x,
                                },
                            });
                        }
                        let v = u64::from(acc.unwrap_or(0));
                        let row = &mut regs[*d as usize];
                        for l in 0..32 {
                            if m >> l & 1 != 0 {
                                row[l] = v;
                            }
                        }
                    }
                    Op::Match {
                        all,
                        wide,
                        d,
                        p,
                        a,
                        mask: mreg,
                    } => {
                        let first = m.trailing_zeros() as usize & 31;
                        let set = m & regs[*mreg as usize][first] as u32;
                        let av = regs[*a as usize];
                        let key = |l: usize| if *wide { av[l] } else { av[l] & 0xffff_ffff };
                        let mut out = [0u64; 32];
                        let mut pbits = 0u32;
                        let all_eq = (0..32)
                            .filter(|&l| set >> l & 1 != 0)
                            .all(|l| key(l) == key(first));
                        for l in 0..32 {
                            if m >> l & 1 == 0 {
                                continue;
                            }
                            if *all {
                                out[l] = if all_eq { u64::from(set) } else { 0 };
                                pbits |= u32::from(all_eq) << l;
                            } else {
                                let mut same = 0u32;
                                for j in 0..32 {
                                    if set >> j & 1 != 0 && key(j) == key(l) {
                                        same |= 1 << j;
                                    }
                                }
                                out[l] = u64::from(same);
                            }
                        }
                        write_masked(&mut regs[*d as usize], m, &out);
                        if *p != NONE {
                            let pr = &mut frame.preds[*p as usize];
                            *pr = (*pr & !m) | (pbits & m);
                        }
                    }
                    Op::Elect { d, p, mask: mreg } => {
                        let first = m.trailing_zeros() as usize & 31;
                        let set = m & regs[*mreg as usize][first] as u32;
                        let leader = if set == 0 { 0 } else { set.trailing_zeros() };
                        let row = &mut regs[*d as usize];
                        for l in 0..32 {
                            if m >> l & 1 != 0 {
                                row[l] = u64::from(leader);
                            }
                        }
                        let pr = &mut frame.preds[*p as usize];
                        let lb = if set == 0 { 0 } else { 1u32 << leader };
                        *pr = (*pr & !m) | (lb & m);
                    }
                    Op::Fns {
                        d,
                        mask: mr,
                        base,
                        off,
                    } => {
                        let (mv, bv, ov) = (
                            regs[*mr as usize],
                            regs[*base as usize],
                            regs[*off as usize],
                        );
                        let mut out = [0u64; 32];
                        for l in 0..32 {
                            out[l] =
                                u64::from(fns(mv[l] as u32, bv[l] as u32, ov[l] as u32 as i32));
                        }
                        write_masked(&mut regs[*d as usize], m, &out);
                    }
                    Op::CpAsync {
                        dbase,
                        doff,
                        sbase,
                        soff,
                        size,
                        src_size,
                    } => {
                        let (dv, sv) = (regs[*dbase as usize], regs[*sbase as usize]);
                        let ssv = if *src_size == NONE {
                            [u64::from(*size); 32]
                        } else {
                            regs[*src_size as usize]
                        };
                        let w = WarpRef {
                            tid: &warp.tid,
                            idx: warp.idx,
                        };
                        let mut lanes = m;
                        while lanes != 0 {
                            let l = lanes.trailing_zeros();
                            lanes &= lanes - 1;
                            let da = dv[l as usize].wrapping_add(*doff as u64);
                            let sa = sv[l as usize].wrapping_add(*soff as u64);
                            let n = usize::from(*size);
                            let valid = (ssv[l as usize] as usize).min(n);
                            if da & (n as u64 - 1) != 0 || sa & (n as u64 - 1) != 0 {
                                return Err(self.mem_fault(
                                    w,
                                    l,
                                    inst.line,
                                    "cp.async",
                                    sa,
                                    n,
                                    AccessError::Misaligned,
                                ));
                            }
                            for i in 0..n {
                                let v = if i < valid {
                                    match self.load_any(
                                        w,
                                        l,
                                        Space::Global,
                                        sa + i as u64,
                                        1,
                                        Ordering::Relaxed,
                                    ) {
                                        Ok(v) => v,
                                        Err(e) => {
                                            return Err(self.mem_fault(
                                                w,
                                                l,
                                                inst.line,
                                                "cp.async load",
                                                sa,
                                                n,
                                                e,
                                            ));
                                        }
                                    }
                                } else {
                                    0
                                };
                                if let Err(e) = self.store_any(
                                    w,
                                    l,
                                    Space::Shared,
                                    da + i as u64,
                                    1,
                                    v,
                                    Ordering::Relaxed,
                                ) {
                                    return Err(self.mem_fault(
                                        w,
                                        l,
                                        inst.line,
                                        "cp.async store",
                                        da,
                                        n,
                                        e,
                                    ));
                                }
                            }
                        }
                    }
                }
                pc += 1;
            }
        }
    }

    fn pop_frame(&mut self, warp: &mut Warp) {
        if warp.frames.len() <= 1 {
            return;
        }
        let Some(callee) = warp.frames.pop() else {
            return;
        };
        if let Some(caller) = warp.frames.last_mut() {
            let (cpb, ppb) = (callee.param_bytes, caller.param_bytes);
            for &(src, dst, size) in &callee.ret_copy {
                let (src, dst, size) = (src as usize, dst as usize, size as usize);
                for l in 0..32 {
                    if callee.call_mask >> l & 1 != 0 {
                        let s = l * cpb + src;
                        let d = l * ppb + dst;
                        if let (Some(from), true) = (
                            callee.params.get(s..s + size),
                            d + size <= caller.params.len(),
                        ) {
                            caller.params[d..d + size].copy_from_slice(from);
                        }
                    }
                }
            }
        }
        self.frame_pool.push(callee);
    }

    fn do_call(
        &mut self,
        warp: &mut Warp,
        info: &CallInfo,
        m: u32,
        line: u32,
    ) -> Result<(), Fault> {
        let prog = self.ctx.prog;
        let callee_fn = &prog.funcs[info.func as usize];
        let w = WarpRef {
            tid: &warp.tid,
            idx: warp.idx,
        };
        if warp.frames.len() >= MAX_CALL_DEPTH {
            return Err(fault(
                FaultKind::IllegalAddress,
                format!(
                    "call stack overflow (depth {MAX_CALL_DEPTH}) {}",
                    self.where_(w, m.trailing_zeros(), line)
                ),
            ));
        }
        let Some(caller) = warp.frames.last() else {
            return Ok(());
        };
        let caller_fn = &prog.funcs[caller.func as usize];
        let local_base = caller.local_base + caller_fn.local_bytes;
        if local_base + callee_fn.local_bytes > self.local_stride as u64 {
            return Err(fault(
                FaultKind::IllegalAddress,
                format!(
                    "stack overflow calling `{}` {}",
                    callee_fn.name,
                    self.where_(w, m.trailing_zeros(), line)
                ),
            ));
        }
        let mut f = self.new_frame(callee_fn, info.func, local_base);
        f.call_mask = m;
        f.ret_copy.extend_from_slice(&info.rets);
        let caller = warp
            .frames
            .last()
            .ok_or_else(|| fault(FaultKind::Trap, "no caller frame".into()))?;
        let (cpb, fpb) = (caller.param_bytes, f.param_bytes);
        for &(src, dst, size) in &info.args {
            let (src, dst, size) = (src as usize, dst as usize, size as usize);
            for l in 0..32 {
                if m >> l & 1 != 0 {
                    let s = l * cpb + src;
                    let d = l * fpb + dst;
                    if let (Some(from), Some(to)) = (
                        caller.params.get(s..s + size),
                        f.params.get_mut(d..d + size),
                    ) {
                        to.copy_from_slice(from);
                    }
                }
            }
        }
        warp.frames.push(f);
        warp.stack.push(Entry {
            pc: 0,
            rpc: NONE,
            mask: m,
            call: true,
        });
        warp.stack.push(Entry {
            pc: 0,
            rpc: NONE,
            mask: m,
            call: false,
        });
        Ok(())
    }

    /// `vprintf` or `__assertfail` for the lanes in `m`, in lane order.
    fn builtin(
        &mut self,
        warp: &mut Warp,
        b: &BuiltinCall,
        m: u32,
        line: u32,
    ) -> Result<(), Fault> {
        let w = warp_ref(&warp.tid, warp.idx, warp.valid);
        let Some(frame) = warp.frames.last() else {
            return Ok(());
        };
        let pb = frame.param_bytes;
        let arg = |l: usize, i: usize| -> u64 {
            let Some(&(off, size)) = b.args.get(i) else {
                return 0;
            };
            let s = l * pb + off as usize;
            frame.params.get(s..s + size as usize).map_or(0, read_le)
        };
        match b.kind {
            Builtin::Vprintf => {
                let mut rets = [0u64; 32];
                for l in 0..32 {
                    if m >> l & 1 != 0 {
                        rets[l] = self.vprintf(w, l as u32, arg(l, 0), arg(l, 1)) as u32 as u64;
                    }
                }
                if let (Some((off, size)), Some(frame)) = (b.ret, warp.frames.last_mut()) {
                    for l in 0..32 {
                        let s = l * pb + off as usize;
                        if m >> l & 1 != 0
                            && let Some(to) = frame.params.get_mut(s..s + size as usize)
                        {
                            write_le(to, rets[l]);
                        }
                    }
                }
                Ok(())
            }
            Builtin::AssertFail => {
                let mut first = None;
                for l in 0..32 {
                    if m >> l & 1 == 0 {
                        continue;
                    }
                    let lane = l as u32;
                    let expr = self.read_cstr(w, lane, arg(l, 0), printf::MAX_FORMAT);
                    let file = self.read_cstr(w, lane, arg(l, 1), printf::MAX_FORMAT);
                    let func = self.read_cstr(w, lane, arg(l, 3), printf::MAX_FORMAT);
                    let text = format!(
                        "{}:{}: {}: block: [{},{},{}], thread: [{},{},{}] Assertion `{}` failed.\n",
                        String::from_utf8_lossy(&file),
                        arg(l, 2) as u32,
                        String::from_utf8_lossy(&func),
                        self.block_idx[0],
                        self.block_idx[1],
                        self.block_idx[2],
                        w.tid[0][l],
                        w.tid[1][l],
                        w.tid[2][l],
                        String::from_utf8_lossy(&expr),
                    );
                    if let Some(out) = self.ctx.output {
                        out.assert_failed(text.as_bytes());
                    }
                    first.get_or_insert((lane, text));
                }
                let (lane, text) = first.unwrap_or_default();
                Err(fault(
                    FaultKind::Assert,
                    format!(
                        "device-side assert triggered ({}) {}",
                        text.trim_end(),
                        self.where_(w, lane, line)
                    ),
                ))
            }
        }
    }

    /// One lane's `vprintf(fmt, args)`: formats into the launch's output; returns the number
    /// of arguments read (-1 for a null format), as CUDA's `printf` does.
    fn vprintf(&mut self, w: WarpRef<'_>, lane: u32, fmt: u64, args: u64) -> i32 {
        if fmt == 0 {
            return -1;
        }
        let Some(out) = self.ctx.output else {
            return 0;
        };
        let fmt = self.read_cstr(w, lane, fmt, printf::MAX_FORMAT);
        let mut text = Vec::new();
        let room = out.room();
        let n = printf::format(
            &fmt,
            &mut LaneArgs {
                worker: self,
                w,
                lane,
                base: args,
                at: 0,
            },
            &mut text,
            // One byte more than fits tells a record that does not fit (dropped whole).
            room.saturating_add(1),
        );
        if text.len() <= room {
            out.printf(&text);
        }
        n
    }

    /// The NUL-terminated string at generic address `addr` as lane `lane` sees it: at most
    /// `max` bytes, ending early where memory cannot be read.
    fn read_cstr(&mut self, w: WarpRef<'_>, lane: u32, addr: u64, max: usize) -> Vec<u8> {
        let mut s = Vec::new();
        if addr == 0 {
            return s;
        }
        for i in 0..max as u64 {
            match self.load_any(
                w,
                lane,
                Space::Generic,
                addr.wrapping_add(i),
                1,
                Ordering::Relaxed,
            ) {
                Ok(0) | Err(_) => break,
                Ok(c) => s.push(c as u8),
            }
        }
        s
    }

    fn special(&self, w: WarpRef<'_>, s: Sreg) -> [u64; 32] {
        let c = self.ctx;
        let uni = |v: u64| [v; 32];
        match s {
            Sreg::Tid(i) => {
                let mut out = [0u64; 32];
                for l in 0..32 {
                    out[l] = u64::from(w.tid[usize::from(i) % 3][l]);
                }
                out
            }
            Sreg::Ntid(i) => uni(u64::from(c.block[usize::from(i) % 3])),
            Sreg::Ctaid(i) | Sreg::ClusterId(i) => {
                uni(u64::from(self.block_idx[usize::from(i) % 3]))
            }
            Sreg::Nctaid(i) | Sreg::NClusterId(i) => uni(u64::from(c.grid[usize::from(i) % 3])),
            Sreg::ClusterCtaId(_) | Sreg::ClusterCtaRank | Sreg::IsExplicitCluster => uni(0),
            Sreg::ClusterNCtaId(_) | Sreg::ClusterNCtaRank => uni(1),
            Sreg::LaneId => std::array::from_fn(|l| l as u64),
            Sreg::WarpId => uni(u64::from(w.idx)),
            Sreg::NWarpId => uni(u64::from(NWARPID)),
            Sreg::SmId => uni(u64::from(self.smid)),
            Sreg::NSmId => uni(u64::from(c.workers)),
            Sreg::GridId => uni(c.grid_id),
            Sreg::Clock => uni(clock_base().elapsed().as_nanos() as u64 & 0xffff_ffff),
            Sreg::Clock64 => uni(clock_base().elapsed().as_nanos() as u64),
            Sreg::GlobalTimer | Sreg::GlobalTimerLo | Sreg::GlobalTimerHi => {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0);
                uni(match s {
                    Sreg::GlobalTimerLo => t & 0xffff_ffff,
                    Sreg::GlobalTimerHi => t >> 32,
                    _ => t,
                })
            }
            Sreg::LanemaskEq => std::array::from_fn(|l| 1u64 << l),
            Sreg::LanemaskLe => std::array::from_fn(|l| lowmask(l as u32 + 1)),
            Sreg::LanemaskLt => std::array::from_fn(|l| lowmask(l as u32)),
            Sreg::LanemaskGe => std::array::from_fn(|l| 0xffff_ffff & !lowmask(l as u32)),
            Sreg::LanemaskGt => std::array::from_fn(|l| 0xffff_ffff & !lowmask(l as u32 + 1)),
            Sreg::DynamicSmemSize => uni(u64::from(c.dyn_shared)),
            Sreg::TotalSmemSize => uni(c.shared_size as u64),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn atomic(
        &mut self,
        w: WarpRef<'_>,
        lane: u32,
        space: Space,
        op: AtomOp,
        ty: Ty,
        addr: u64,
        b: u64,
        c: u64,
    ) -> Result<u64, AccessError> {
        let bytes = ty.bytes();
        if addr & (bytes as u64 - 1) != 0 {
            return Err(AccessError::Misaligned);
        }
        let (sp, a) = Self::resolve(space, addr)?;
        match sp {
            Space::Global => {
                if a >= GLOBAL_LIMIT {
                    return Err(AccessError::OutOfRange);
                }
                let i = self.view_index(a).ok_or(AccessError::OutOfRange)?;
                let v = &self.views[i];
                let off = a - v.0;
                match bytes {
                    2 => {
                        v.2.kernel_update_u16(off, |old| {
                            atom_apply(op, ty, u64::from(old), b, c) as u16
                        })
                        .map(u64::from)
                    }
                    4 if op == AtomOp::Add && ty.is_int() => {
                        v.2.kernel_fetch_add_u32(off, b as u32).map(u64::from)
                    }
                    4 => {
                        v.2.kernel_update_u32(off, |old| {
                            atom_apply(op, ty, u64::from(old), b, c) as u32
                        })
                        .map(u64::from)
                    }
                    _ if op == AtomOp::Add && ty.is_int() => v.2.kernel_fetch_add_u64(off, b),
                    _ => {
                        v.2.kernel_update_u64(off, |old| atom_apply(op, ty, old, b, c))
                    }
                }
            }
            Space::Shared => {
                let o = self.shared_range(a, bytes)?;
                let old = read_le(&self.shared[o..o + bytes]);
                write_le(
                    &mut self.shared[o..o + bytes],
                    atom_apply(op, ty, old, b, c),
                );
                Ok(old)
            }
            Space::Local => {
                let o = self.local_range(w, lane, a, bytes)?;
                let old = read_le(&self.local[o..o + bytes]);
                write_le(&mut self.local[o..o + bytes], atom_apply(op, ty, old, b, c));
                Ok(old)
            }
            _ => Err(AccessError::OutOfRange),
        }
    }
}

/// The parts of a warp that fault messages and per-lane addressing need (lets the interpreter
/// keep mutable borrows of the frame while reporting).
#[derive(Clone, Copy)]
struct WarpRef<'w> {
    tid: &'w [[u32; 32]; 3],
    idx: u32,
}

/// A `vprintf` argument buffer in one lane's view of device memory.
struct LaneArgs<'x, 'a, 'w> {
    worker: &'x mut Worker<'a>,
    w: WarpRef<'w>,
    lane: u32,
    base: u64,
    at: u64,
}

impl printf::Args for LaneArgs<'_, '_, '_> {
    fn next(&mut self, size: usize) -> Option<u64> {
        if self.base == 0 {
            return None;
        }
        let at = self.at.next_multiple_of(size as u64);
        let v = self
            .worker
            .load_any(
                self.w,
                self.lane,
                Space::Generic,
                self.base.wrapping_add(at),
                size,
                Ordering::Relaxed,
            )
            .ok()?;
        self.at = at + size as u64;
        Some(v)
    }

    fn string(&mut self, addr: u64, max: usize) -> Vec<u8> {
        self.worker.read_cstr(self.w, self.lane, addr, max)
    }
}

fn warp_ref(tid: &[[u32; 32]; 3], idx: u32, _valid: u32) -> WarpRef<'_> {
    WarpRef { tid, idx }
}

fn mem_order(o: MemOrd) -> Ordering {
    match o {
        MemOrd::Relaxed => Ordering::Relaxed,
        MemOrd::Acquire => Ordering::Acquire,
        MemOrd::Release => Ordering::Release,
    }
}

#[inline]
fn lowmask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

#[inline]
fn sext_bits(v: u64, bits: u32) -> u64 {
    if bits >= 64 {
        v
    } else {
        let sh = 64 - bits;
        (((v << sh) as i64) >> sh) as u64
    }
}

#[inline]
fn read_le(b: &[u8]) -> u64 {
    match b.len() {
        4 => u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        8 => u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        _ => {
            let mut out = [0u8; 8];
            let n = b.len().min(8);
            out[..n].copy_from_slice(&b[..n]);
            u64::from_le_bytes(out)
        }
    }
}

#[inline]
fn write_le(b: &mut [u8], v: u64) {
    let n = b.len().min(8);
    b[..n].copy_from_slice(&v.to_le_bytes()[..n]);
}

#[inline(always)]
fn write_masked(row: &mut [u64; 32], m: u32, vals: &[u64; 32]) {
    if m == FULL {
        *row = *vals;
    } else {
        for l in 0..32 {
            if m >> l & 1 != 0 {
                row[l] = vals[l];
            }
        }
    }
}

#[inline(always)]
fn apply1(row: &mut [u64; 32], av: &[u64; 32], m: u32, f: impl Fn(u64) -> u64) {
    if m == FULL {
        for l in 0..32 {
            row[l] = f(av[l]);
        }
    } else {
        for l in 0..32 {
            if m >> l & 1 != 0 {
                row[l] = f(av[l]);
            }
        }
    }
}

#[inline(always)]
fn map1(regs: &mut [[u64; 32]], m: u32, d: Reg, a: Reg, f: impl Fn(u64) -> u64) {
    let (d, a) = (d as usize, a as usize);
    if let Ok([row, av]) = regs.get_disjoint_mut([d, a]) {
        apply1(row, av, m, f);
    } else {
        let av = regs[a];
        apply1(&mut regs[d], &av, m, f);
    }
}

#[inline(always)]
fn apply2(
    row: &mut [u64; 32],
    av: &[u64; 32],
    bv: &[u64; 32],
    m: u32,
    f: impl Fn(u64, u64) -> u64,
) {
    if m == FULL {
        for l in 0..32 {
            row[l] = f(av[l], bv[l]);
        }
    } else {
        for l in 0..32 {
            if m >> l & 1 != 0 {
                row[l] = f(av[l], bv[l]);
            }
        }
    }
}

/// d = f(a, b) lane-wise. Rows are borrowed in place when the registers are distinct (the common
/// case), and copied only when the destination aliases a source.
#[inline(always)]
fn map2(regs: &mut [[u64; 32]], m: u32, d: Reg, a: Reg, b: Reg, f: impl Fn(u64, u64) -> u64) {
    let (d, a, b) = (d as usize, a as usize, b as usize);
    if let Ok([row, av, bv]) = regs.get_disjoint_mut([d, a, b]) {
        apply2(row, av, bv, m, f);
    } else {
        let (av, bv) = (regs[a], regs[b]);
        apply2(&mut regs[d], &av, &bv, m, f);
    }
}

#[inline(always)]
fn apply3(
    row: &mut [u64; 32],
    av: &[u64; 32],
    bv: &[u64; 32],
    cv: &[u64; 32],
    m: u32,
    f: impl Fn(u64, u64, u64) -> u64,
) {
    if m == FULL {
        for l in 0..32 {
            row[l] = f(av[l], bv[l], cv[l]);
        }
    } else {
        for l in 0..32 {
            if m >> l & 1 != 0 {
                row[l] = f(av[l], bv[l], cv[l]);
            }
        }
    }
}

#[inline(always)]
fn map3(
    regs: &mut [[u64; 32]],
    m: u32,
    d: Reg,
    a: Reg,
    b: Reg,
    c: Reg,
    f: impl Fn(u64, u64, u64) -> u64,
) {
    let (d, a, b, c) = (d as usize, a as usize, b as usize, c as usize);
    if let Ok([row, av, bv, cv]) = regs.get_disjoint_mut([d, a, b, c]) {
        apply3(row, av, bv, cv, m, f);
    } else {
        let (av, bv, cv) = (regs[a], regs[b], regs[c]);
        apply3(&mut regs[d], &av, &bv, &cv, m, f);
    }
}

/// Runs `$body` with `$T` bound to the Rust integer type of PTX type `$ty`.
macro_rules! with_int {
    ($ty:expr, $T:ident, $body:expr) => {
        match $ty {
            Ty::U8 | Ty::B8 => {
                type $T = u8;
                $body
            }
            Ty::U16 | Ty::B16 | Ty::F16 | Ty::Bf16 => {
                type $T = u16;
                $body
            }
            Ty::U32 | Ty::B32 | Ty::F32 | Ty::F16x2 | Ty::Bf16x2 => {
                type $T = u32;
                $body
            }
            Ty::S8 => {
                type $T = i8;
                $body
            }
            Ty::S16 => {
                type $T = i16;
                $body
            }
            Ty::S32 => {
                type $T = i32;
                $body
            }
            Ty::S64 => {
                type $T = i64;
                $body
            }
            _ => {
                type $T = u64;
                $body
            }
        }
    };
}

// `with_int!` instantiates each body for every width, including u64 (a no-op cast there).
#[allow(clippy::unnecessary_cast)]
fn exec_ibin(regs: &mut [[u64; 32]], m: u32, k: IBin, ty: Ty, d: Reg, a: Reg, b: Reg) {
    match k {
        IBin::Add => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| (x as T).wrapping_add(y as T)
                as u64)
        ),
        IBin::Sub => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| (x as T).wrapping_sub(y as T)
                as u64)
        ),
        IBin::AddSat => map2(regs, m, d, a, b, |x, y| {
            (x as i32).saturating_add(y as i32) as u32 as u64
        }),
        IBin::SubSat => map2(regs, m, d, a, b, |x, y| {
            (x as i32).saturating_sub(y as i32) as u32 as u64
        }),
        IBin::MulLo => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| (x as T).wrapping_mul(y as T)
                as u64)
        ),
        IBin::MulHi => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| {
                (((x as T) as i128).wrapping_mul((y as T) as i128) >> T::BITS) as T as u64
            })
        ),
        IBin::MulWide => with_int!(
            ty,
            T,
            map2(
                regs,
                m,
                d,
                a,
                b,
                |x, y| ((x as T) as i128).wrapping_mul((y as T) as i128) as u64
            )
        ),
        IBin::Mul24Lo | IBin::Mul24Hi => {
            let signed = ty.is_signed();
            let hi = k == IBin::Mul24Hi;
            map2(regs, m, d, a, b, |x, y| {
                let (x, y) = if signed {
                    (sext_bits(x, 24) as i64, sext_bits(y, 24) as i64)
                } else {
                    ((x & 0xff_ffff) as i64, (y & 0xff_ffff) as i64)
                };
                let p = x * y;
                (if hi { (p >> 16) as u64 } else { p as u64 }) & 0xffff_ffff
            })
        }
        IBin::Div => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| {
                let (x, y) = (x as T, y as T);
                if y == 0 {
                    !(0 as T) as u64
                } else {
                    x.wrapping_div(y) as u64
                }
            })
        ),
        IBin::Rem => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| {
                let (x, y) = (x as T, y as T);
                if y == 0 {
                    x as u64
                } else {
                    x.wrapping_rem(y) as u64
                }
            })
        ),
        IBin::Min => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| (x as T).min(y as T) as u64)
        ),
        IBin::Max => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| (x as T).max(y as T) as u64)
        ),
        IBin::And => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| ((x as T) & (y as T)) as u64)
        ),
        IBin::Or => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| ((x as T) | (y as T)) as u64)
        ),
        IBin::Xor => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| ((x as T) ^ (y as T)) as u64)
        ),
        IBin::Shl => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| {
                let n = y as u32;
                if n >= T::BITS {
                    0
                } else {
                    ((x as T) << n) as u64
                }
            })
        ),
        IBin::Shr => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| {
                let n = y as u32;
                let v = x as T;
                if n >= T::BITS {
                    (v >> (T::BITS - 1) >> 1) as u64
                } else {
                    (v >> n) as u64
                }
            })
        ),
        IBin::Bmsk { clamp } => map2(regs, m, d, a, b, |x, y| {
            let (pos, len) = if clamp {
                ((x as u32).min(32), (y as u32).min(32))
            } else {
                (x as u32 & 31, y as u32 & 31)
            };
            let mask = lowmask(len.min(32)) << pos;
            mask & 0xffff_ffff
        }),
        IBin::AddCarry { .. } => {}
    }
}

#[allow(clippy::too_many_arguments)]
fn exec_addc(
    regs: &mut [[u64; 32]],
    m: u32,
    ty: Ty,
    d: Reg,
    a: Reg,
    b: Reg,
    sub: bool,
    cin: bool,
    cout: bool,
    carry: u32,
) -> u32 {
    let bits = ty.bits();
    let (av, bv) = (regs[a as usize], regs[b as usize]);
    let mask = lowmask(bits);
    let mut out = [0u64; 32];
    let mut newc = carry;
    for l in 0..32 {
        let x = u128::from(av[l] & mask);
        let y = u128::from(bv[l] & mask);
        let ci = u128::from(cin && (carry >> l & 1 != 0));
        let (r, c) = if sub {
            let need = y + ci;
            (x.wrapping_sub(need), x < need)
        } else {
            let s = x + y + ci;
            (s, s >> bits != 0)
        };
        out[l] = (r as u64) & mask;
        if cout && m >> l & 1 != 0 {
            newc = (newc & !(1 << l)) | (u32::from(c) << l);
        }
    }
    write_masked(&mut regs[d as usize], m, &out);
    newc
}

#[allow(clippy::too_many_arguments)]
fn exec_madc(
    regs: &mut [[u64; 32]],
    m: u32,
    ty: Ty,
    d: Reg,
    a: Reg,
    b: Reg,
    c: Reg,
    hi: bool,
    cin: bool,
    cout: bool,
    carry: u32,
) -> u32 {
    let bits = ty.bits();
    let signed = ty.is_signed();
    let (av, bv, cv) = (regs[a as usize], regs[b as usize], regs[c as usize]);
    let mask = lowmask(bits);
    let mut out = [0u64; 32];
    let mut newc = carry;
    for l in 0..32 {
        let p: u128 = if signed {
            (sext_bits(av[l], bits) as i64 as i128)
                .wrapping_mul(sext_bits(bv[l], bits) as i64 as i128) as u128
        } else {
            u128::from(av[l] & mask) * u128::from(bv[l] & mask)
        };
        let part = if hi {
            (p >> bits) as u64 & mask
        } else {
            p as u64 & mask
        };
        let ci = u128::from(cin && (carry >> l & 1 != 0));
        let s = u128::from(part) + u128::from(cv[l] & mask) + ci;
        out[l] = s as u64 & mask;
        if cout && m >> l & 1 != 0 {
            newc = (newc & !(1 << l)) | (u32::from(s >> bits != 0) << l);
        }
    }
    write_masked(&mut regs[d as usize], m, &out);
    newc
}

// `with_int!` instantiates each body for every width, including u64 (a no-op cast there).
#[allow(clippy::unnecessary_cast)]
fn exec_iun(regs: &mut [[u64; 32]], m: u32, k: IUn, ty: Ty, d: Reg, a: Reg) {
    match k {
        IUn::Abs => with_int!(
            ty,
            T,
            map1(regs, m, d, a, |x| {
                let v = x as T;
                (if v < v.wrapping_sub(v) {
                    v.wrapping_neg()
                } else {
                    v
                }) as u64
            })
        ),
        IUn::Neg => with_int!(
            ty,
            T,
            map1(regs, m, d, a, |x| (x as T).wrapping_neg() as u64)
        ),
        IUn::Not => with_int!(ty, T, map1(regs, m, d, a, |x| (!(x as T)) as u64)),
        IUn::Cnot => with_int!(ty, T, map1(regs, m, d, a, |x| u64::from((x as T) == 0))),
        IUn::Popc => {
            let bits = ty.bits();
            map1(regs, m, d, a, |x| {
                u64::from((x & lowmask(bits)).count_ones())
            })
        }
        IUn::Clz => {
            let bits = ty.bits();
            map1(regs, m, d, a, |x| {
                u64::from((x & lowmask(bits)).leading_zeros() - (64 - bits))
            })
        }
        IUn::Brev => {
            let bits = ty.bits();
            map1(regs, m, d, a, |x| {
                (x & lowmask(bits)).reverse_bits() >> (64 - bits)
            })
        }
        IUn::Bfind { shiftamt } => {
            let bits = ty.bits();
            let signed = ty.is_signed();
            map1(regs, m, d, a, |x| {
                let mut v = x & lowmask(bits);
                if signed && (v >> (bits - 1)) & 1 != 0 {
                    v = !v & lowmask(bits);
                }
                if v == 0 {
                    0xffff_ffff
                } else {
                    let pos = 63 - v.leading_zeros();
                    u64::from(if shiftamt { bits - 1 - pos } else { pos })
                }
            })
        }
    }
}

#[allow(clippy::too_many_arguments)]
// `with_int!` instantiates each body for every width, including u64 (a no-op cast there).
#[allow(clippy::unnecessary_cast)]
fn exec_itern(regs: &mut [[u64; 32]], m: u32, k: ITern, ty: Ty, d: Reg, a: Reg, b: Reg, c: Reg) {
    match k {
        ITern::MadLo => {
            with_int!(
                ty,
                T,
                map3(regs, m, d, a, b, c, |x, y, z| (x as T)
                    .wrapping_mul(y as T)
                    .wrapping_add(z as T)
                    as u64)
            )
        }
        ITern::MadHi => with_int!(
            ty,
            T,
            map3(regs, m, d, a, b, c, |x, y, z| {
                let hi = (((x as T) as i128).wrapping_mul((y as T) as i128) >> T::BITS) as T;
                hi.wrapping_add(z as T) as u64
            })
        ),
        ITern::MadLoSat => map3(regs, m, d, a, b, c, |x, y, z| {
            let hi = ((x as i32 as i64) * (y as i32 as i64)) >> 32;
            (hi + (z as i32 as i64)).clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32 as u32
                as u64
        }),
        ITern::MadWide => with_int!(
            ty,
            T,
            map3(regs, m, d, a, b, c, |x, y, z| ((x as T) as i128)
                .wrapping_mul((y as T) as i128)
                .wrapping_add(z as i128)
                as u64)
        ),
        ITern::Mad24Lo | ITern::Mad24Hi => {
            let signed = ty.is_signed();
            let hi = k == ITern::Mad24Hi;
            map3(regs, m, d, a, b, c, |x, y, z| {
                let (x, y) = if signed {
                    (sext_bits(x, 24) as i64, sext_bits(y, 24) as i64)
                } else {
                    ((x & 0xff_ffff) as i64, (y & 0xff_ffff) as i64)
                };
                let p = x * y;
                let part = if hi { (p >> 16) as u64 } else { p as u64 };
                part.wrapping_add(z) & 0xffff_ffff
            })
        }
        ITern::Sad => with_int!(
            ty,
            T,
            map3(regs, m, d, a, b, c, |x, y, z| {
                let (x, y) = (x as T, y as T);
                let diff = if x > y {
                    x.wrapping_sub(y)
                } else {
                    y.wrapping_sub(x)
                };
                diff.wrapping_add(z as T) as u64
            })
        ),
        ITern::Bfe => {
            let bits = ty.bits();
            let signed = ty.is_signed();
            map3(regs, m, d, a, b, c, |x, p, l| {
                let pos = (p & 0xff) as u32;
                let len = (l & 0xff) as u32;
                let v = x & lowmask(bits);
                if len == 0 {
                    return 0;
                }
                let sbit = if signed {
                    let sb = (pos + len - 1).min(bits - 1);
                    (v >> sb) & 1
                } else {
                    0
                };
                let avail = bits.saturating_sub(pos);
                let take = len.min(avail);
                let mut r = if take == 0 {
                    0
                } else {
                    (v >> pos) & lowmask(take)
                };
                if sbit != 0 {
                    r |= !lowmask(take) & lowmask(bits);
                }
                if signed { sext_bits(r, bits) } else { r }
            })
        }
        ITern::Dp4a { sa, sb } => map3(regs, m, d, a, b, c, |x, y, z| {
            let mut acc = z as u32 as i64;
            if sa || sb {
                acc = z as u32 as i32 as i64;
            }
            for i in 0..4 {
                let xa = (x >> (8 * i)) as u8;
                let yb = (y >> (8 * i)) as u8;
                let xa = if sa {
                    i64::from(xa as i8)
                } else {
                    i64::from(xa)
                };
                let yb = if sb {
                    i64::from(yb as i8)
                } else {
                    i64::from(yb)
                };
                acc = acc.wrapping_add(xa * yb);
            }
            acc as u32 as u64
        }),
        ITern::Dp2a { sa, sb, hi } => map3(regs, m, d, a, b, c, |x, y, z| {
            let mut acc = if sa || sb {
                z as u32 as i32 as i64
            } else {
                z as u32 as i64
            };
            for i in 0..2 {
                let xa = (x >> (16 * i)) as u16;
                let yb = (y >> (8 * (i + if hi { 2 } else { 0 }))) as u8;
                let xa = if sa {
                    i64::from(xa as i16)
                } else {
                    i64::from(xa)
                };
                let yb = if sb {
                    i64::from(yb as i8)
                } else {
                    i64::from(yb)
                };
                acc = acc.wrapping_add(xa * yb);
            }
            acc as u32 as u64
        }),
        ITern::Szext { signed, clamp } => {
            let bits = ty.bits();
            map2(regs, m, d, a, b, |x, y| {
                let n = if clamp {
                    (y as u32).min(bits)
                } else {
                    y as u32 % bits
                };
                let v = x & lowmask(n);
                let r = if signed && n > 0 { sext_bits(v, n) } else { v };
                r & lowmask(bits)
            })
        }
        ITern::MadCarry { .. } => {}
    }
}

fn prmt(a: u32, b: u32, c: u32, mode: u8) -> u32 {
    let bytes = (u64::from(b) << 32) | u64::from(a);
    let byte = |i: u32| ((bytes >> (8 * (i & 7))) & 0xff) as u32;
    if mode == 0 {
        let mut r = 0u32;
        for i in 0..4 {
            let sel = (c >> (4 * i)) & 0xf;
            let mut v = byte(sel & 7);
            if sel & 8 != 0 {
                v = if v & 0x80 != 0 { 0xff } else { 0 };
            }
            r |= v << (8 * i);
        }
        return r;
    }
    const TABLE: [[[u32; 4]; 4]; 6] = [
        [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]], // f4e (d.b0..b3)
        [[0, 7, 6, 5], [1, 0, 7, 6], [2, 1, 0, 7], [3, 2, 1, 0]], // b4e
        [[0, 0, 0, 0], [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]], // rc8
        [[0, 1, 2, 3], [1, 1, 2, 3], [2, 2, 2, 3], [3, 3, 3, 3]], // ecl
        [[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 2, 2], [0, 1, 2, 3]], // ecr
        [[0, 1, 0, 1], [2, 3, 2, 3], [0, 1, 0, 1], [2, 3, 2, 3]], // rc16
    ];
    let t = &TABLE[usize::from(mode - 1).min(5)][(c & 3) as usize];
    let mut r = 0u32;
    for (i, &s) in t.iter().enumerate() {
        r |= byte(s) << (8 * i);
    }
    r
}

fn lop3(a: u32, b: u32, c: u32, lut: u8) -> u32 {
    let mut r = 0u32;
    for i in 0..8u32 {
        if lut >> i & 1 == 0 {
            continue;
        }
        let ta = if i & 4 != 0 { a } else { !a };
        let tb = if i & 2 != 0 { b } else { !b };
        let tc = if i & 1 != 0 { c } else { !c };
        r |= ta & tb & tc;
    }
    r
}

fn fns(mask: u32, base: u32, offset: i32) -> u32 {
    let base = base.min(31);
    if offset == 0 {
        return if mask >> base & 1 != 0 {
            base
        } else {
            u32::MAX
        };
    }
    let mut count = offset.unsigned_abs();
    if offset > 0 {
        for pos in base..32 {
            if mask >> pos & 1 != 0 {
                count -= 1;
                if count == 0 {
                    return pos;
                }
            }
        }
    } else {
        for pos in (0..=base).rev() {
            if mask >> pos & 1 != 0 {
                count -= 1;
                if count == 0 {
                    return pos;
                }
            }
        }
    }
    u32::MAX
}

fn atom_apply(op: AtomOp, ty: Ty, old: u64, b: u64, c: u64) -> u64 {
    let bits = ty.bits();
    let mask = lowmask(bits);
    match (op, ty) {
        (AtomOp::Add, Ty::F32) => {
            let r = ftz32(ftz32(f32::from_bits(old as u32)) + ftz32(f32::from_bits(b as u32)));
            bits32(r)
        }
        (AtomOp::Add, Ty::F64) => bits64(f64::from_bits(old) + f64::from_bits(b)),
        (AtomOp::Add, _) => old.wrapping_add(b) & mask,
        (AtomOp::Min, Ty::S32) => ((old as i32).min(b as i32)) as u32 as u64,
        (AtomOp::Max, Ty::S32) => ((old as i32).max(b as i32)) as u32 as u64,
        (AtomOp::Min, Ty::S64) => ((old as i64).min(b as i64)) as u64,
        (AtomOp::Max, Ty::S64) => ((old as i64).max(b as i64)) as u64,
        (AtomOp::Min, _) => (old & mask).min(b & mask),
        (AtomOp::Max, _) => (old & mask).max(b & mask),
        (AtomOp::And, _) => old & b & mask,
        (AtomOp::Or, _) => (old | b) & mask,
        (AtomOp::Xor, _) => (old ^ b) & mask,
        (AtomOp::Exch, _) => b & mask,
        (AtomOp::Cas, _) => {
            if old & mask == b & mask {
                c & mask
            } else {
                old
            }
        }
        (AtomOp::Inc, _) => {
            let (o, b) = (old as u32, b as u32);
            u64::from(if o >= b { 0 } else { o + 1 })
        }
        (AtomOp::Dec, _) => {
            let (o, b) = (old as u32, b as u32);
            u64::from(if o == 0 || o > b { b } else { o - 1 })
        }
    }
}

/// Per-lane comparison results as a lane mask.
fn compare(regs: &[[u64; 32]], cmp: Cmp, ty: Ty, ftz: bool, a: Reg, b: Reg) -> u32 {
    let (av, bv) = (&regs[a as usize], &regs[b as usize]);
    let mut bits = 0u32;
    if ty.is_float() {
        for l in 0..32 {
            let (x, y) = match ty {
                Ty::F64 => (f64::from_bits(av[l]), f64::from_bits(bv[l])),
                Ty::F16 => (
                    float::f16_to_f64(av[l] as u16),
                    float::f16_to_f64(bv[l] as u16),
                ),
                Ty::Bf16 => (
                    float::bf16_to_f64(av[l] as u16),
                    float::bf16_to_f64(bv[l] as u16),
                ),
                _ => {
                    let (mut x, mut y) =
                        (f32::from_bits(av[l] as u32), f32::from_bits(bv[l] as u32));
                    if ftz {
                        x = ftz32(x);
                        y = ftz32(y);
                    }
                    (f64::from(x), f64::from(y))
                }
            };
            let unord = x.is_nan() || y.is_nan();
            let r = match cmp {
                Cmp::Eq => !unord && x == y,
                Cmp::Ne => !unord && x != y,
                Cmp::Lt | Cmp::Lo => !unord && x < y,
                Cmp::Le | Cmp::Ls => !unord && x <= y,
                Cmp::Gt | Cmp::Hi => !unord && x > y,
                Cmp::Ge | Cmp::Hs => !unord && x >= y,
                Cmp::Equ => unord || x == y,
                Cmp::Neu => unord || x != y,
                Cmp::Ltu => unord || x < y,
                Cmp::Leu => unord || x <= y,
                Cmp::Gtu => unord || x > y,
                Cmp::Geu => unord || x >= y,
                Cmp::Num => !unord,
                Cmp::Nan => unord,
            };
            bits |= u32::from(r) << l;
        }
        return bits;
    }
    let nbits = ty.bits();
    let signed = ty.is_signed();
    for l in 0..32 {
        let (x, y) = (av[l] & lowmask(nbits), bv[l] & lowmask(nbits));
        let (sx, sy) = (sext_bits(x, nbits) as i64, sext_bits(y, nbits) as i64);
        let r = match cmp {
            Cmp::Eq => x == y,
            Cmp::Ne => x != y,
            Cmp::Lt => {
                if signed {
                    sx < sy
                } else {
                    x < y
                }
            }
            Cmp::Le => {
                if signed {
                    sx <= sy
                } else {
                    x <= y
                }
            }
            Cmp::Gt => {
                if signed {
                    sx > sy
                } else {
                    x > y
                }
            }
            Cmp::Ge => {
                if signed {
                    sx >= sy
                } else {
                    x >= y
                }
            }
            Cmp::Lo => x < y,
            Cmp::Ls => x <= y,
            Cmp::Hi => x > y,
            Cmp::Hs => x >= y,
            _ => false,
        };
        bits |= u32::from(r) << l;
    }
    bits
}

/// Applies a binary f32 operation lane-wise to 16-bit halves (f16 / bf16), computing in f64.
fn half_op(x: u64, y: u64, bf: bool, rnd: Rnd, f: impl Fn(f64, f64) -> f64) -> u64 {
    let dec = |v: u16| {
        if bf {
            float::bf16_to_f64(v)
        } else {
            float::f16_to_f64(v)
        }
    };
    let r = f(dec(x as u16), dec(y as u16));
    let rnd = if rnd == Rnd::Default { Rnd::Rn } else { rnd };
    u64::from(if bf {
        float::f64_to_bf16(r, 0, rnd)
    } else {
        float::f64_to_f16(r, 0, rnd)
    })
}

fn f64_op(k: FBin, x: f64, y: f64, rnd: Rnd) -> f64 {
    match k {
        FBin::Add => float::add_f64(x, y, rnd),
        FBin::Sub => float::add_f64(x, -y, rnd),
        FBin::Mul => float::mul_f64(x, y, rnd),
        FBin::Div => float::div_f64(x, y, rnd),
        FBin::Min => float::fmin(x, y, x.is_nan(), y.is_nan(), x.is_sign_negative()),
        FBin::Max => float::fmax(x, y, x.is_nan(), y.is_nan(), x.is_sign_negative()),
        FBin::MinNaN => {
            if x.is_nan() || y.is_nan() {
                f64::NAN
            } else {
                float::fmin(x, y, false, false, x.is_sign_negative())
            }
        }
        FBin::MaxNaN => {
            if x.is_nan() || y.is_nan() {
                f64::NAN
            } else {
                float::fmax(x, y, false, false, x.is_sign_negative())
            }
        }
        FBin::Copysign => y.copysign(x),
    }
}

fn f32_op(k: FBin, x: f32, y: f32, rnd: Rnd) -> f32 {
    match k {
        FBin::Add => float::add_f32(x, y, rnd),
        FBin::Sub => float::add_f32(x, -y, rnd),
        FBin::Mul => float::mul_f32(x, y, rnd),
        FBin::Div => float::div_f32(x, y, rnd),
        FBin::Min => float::fmin(x, y, x.is_nan(), y.is_nan(), x.is_sign_negative()),
        FBin::Max => float::fmax(x, y, x.is_nan(), y.is_nan(), x.is_sign_negative()),
        FBin::MinNaN => {
            if x.is_nan() || y.is_nan() {
                f32::NAN
            } else {
                float::fmin(x, y, false, false, x.is_sign_negative())
            }
        }
        FBin::MaxNaN => {
            if x.is_nan() || y.is_nan() {
                f32::NAN
            } else {
                float::fmax(x, y, false, false, x.is_sign_negative())
            }
        }
        FBin::Copysign => y.copysign(x),
    }
}

#[allow(clippy::too_many_arguments)]
fn exec_fbin(
    regs: &mut [[u64; 32]],
    m: u32,
    k: FBin,
    ty: Ty,
    rnd: Rnd,
    ftz: bool,
    sat: bool,
    d: Reg,
    a: Reg,
    b: Reg,
) {
    match ty {
        Ty::F32 => {
            if !ftz && !sat && float::is_nearest(rnd) {
                match k {
                    FBin::Add => {
                        return map2(regs, m, d, a, b, |x, y| {
                            bits32(f32::from_bits(x as u32) + f32::from_bits(y as u32))
                        });
                    }
                    FBin::Sub => {
                        return map2(regs, m, d, a, b, |x, y| {
                            bits32(f32::from_bits(x as u32) - f32::from_bits(y as u32))
                        });
                    }
                    FBin::Mul => {
                        return map2(regs, m, d, a, b, |x, y| {
                            bits32(f32::from_bits(x as u32) * f32::from_bits(y as u32))
                        });
                    }
                    _ => {}
                }
            }
            map2(regs, m, d, a, b, |x, y| {
                let (mut x, mut y) = (f32::from_bits(x as u32), f32::from_bits(y as u32));
                if ftz {
                    x = ftz32(x);
                    y = ftz32(y);
                }
                let mut r = f32_op(k, x, y, rnd);
                if ftz {
                    r = ftz32(r);
                }
                if sat {
                    r = float::sat32(r);
                }
                if k == FBin::Copysign {
                    u64::from(r.to_bits())
                } else {
                    bits32(r)
                }
            })
        }
        Ty::F64 => map2(regs, m, d, a, b, |x, y| {
            let mut r = f64_op(k, f64::from_bits(x), f64::from_bits(y), rnd);
            if sat {
                r = float::sat64(r);
            }
            if k == FBin::Copysign {
                r.to_bits()
            } else {
                bits64(r)
            }
        }),
        Ty::F16 | Ty::Bf16 => {
            let bf = ty == Ty::Bf16;
            map2(regs, m, d, a, b, |x, y| {
                let r = half_op(x, y, bf, rnd, |p, q| f64_op(k, p, q, Rnd::Rn));
                if sat { half_sat(r, bf) } else { r }
            })
        }
        Ty::F16x2 | Ty::Bf16x2 => {
            let bf = ty == Ty::Bf16x2;
            map2(regs, m, d, a, b, |x, y| {
                let lo = half_op(x & 0xffff, y & 0xffff, bf, rnd, |p, q| {
                    f64_op(k, p, q, Rnd::Rn)
                });
                let hi = half_op((x >> 16) & 0xffff, (y >> 16) & 0xffff, bf, rnd, |p, q| {
                    f64_op(k, p, q, Rnd::Rn)
                });
                let (lo, hi) = if sat {
                    (half_sat(lo, bf), half_sat(hi, bf))
                } else {
                    (lo, hi)
                };
                (hi << 16) | lo
            })
        }
        _ => {}
    }
}

fn half_sat(v: u64, bf: bool) -> u64 {
    let f = if bf {
        float::bf16_to_f64(v as u16)
    } else {
        float::f16_to_f64(v as u16)
    };
    let s = float::sat64(f);
    u64::from(if bf {
        float::f64_to_bf16(s, 0, Rnd::Rn)
    } else {
        float::f64_to_f16(s, 0, Rnd::Rn)
    })
}

fn fun_f64(k: FUn, x: f64, rnd: Rnd) -> f64 {
    match k {
        FUn::Abs => x.abs(),
        FUn::Neg => -x,
        FUn::Sqrt => float::sqrt_f64(x, rnd),
        FUn::Rsqrt => 1.0 / x.sqrt(),
        FUn::Rcp => float::div_f64(1.0, x, rnd),
        FUn::Sin => x.sin(),
        FUn::Cos => x.cos(),
        FUn::Lg2 => x.log2(),
        FUn::Ex2 => x.exp2(),
        FUn::Tanh => x.tanh(),
    }
}

#[allow(clippy::too_many_arguments)]
fn exec_fun(
    regs: &mut [[u64; 32]],
    m: u32,
    k: FUn,
    ty: Ty,
    rnd: Rnd,
    ftz: bool,
    sat: bool,
    d: Reg,
    a: Reg,
) {
    match ty {
        Ty::F32 => map1(regs, m, d, a, |x| {
            let mut x = f32::from_bits(x as u32);
            if ftz {
                x = ftz32(x);
            }
            let mut r = match k {
                FUn::Abs => return u64::from(if ftz { ftz32(x.abs()) } else { x.abs() }.to_bits()),
                FUn::Neg => return u64::from(if ftz { ftz32(-x) } else { -x }.to_bits()),
                FUn::Sqrt => float::sqrt_f32(x, rnd),
                FUn::Rsqrt => 1.0 / x.sqrt(),
                FUn::Rcp => float::div_f32(1.0, x, rnd),
                FUn::Sin => x.sin(),
                FUn::Cos => x.cos(),
                FUn::Lg2 => x.log2(),
                FUn::Ex2 => x.exp2(),
                FUn::Tanh => x.tanh(),
            };
            if ftz {
                r = ftz32(r);
            }
            if sat {
                r = float::sat32(r);
            }
            bits32(r)
        }),
        Ty::F64 => map1(regs, m, d, a, |x| {
            let x = f64::from_bits(x);
            match k {
                FUn::Abs => x.abs().to_bits(),
                FUn::Neg => (-x).to_bits(),
                _ => {
                    let r = fun_f64(k, x, rnd);
                    bits64(if sat { float::sat64(r) } else { r })
                }
            }
        }),
        Ty::F16 | Ty::Bf16 | Ty::F16x2 | Ty::Bf16x2 => {
            let bf = matches!(ty, Ty::Bf16 | Ty::Bf16x2);
            let pair = matches!(ty, Ty::F16x2 | Ty::Bf16x2);
            let one = move |h: u64| -> u64 {
                match k {
                    FUn::Abs => h & 0x7fff,
                    FUn::Neg => h ^ 0x8000,
                    _ => half_op(h, 0, bf, rnd, |p, _| fun_f64(k, p, Rnd::Rn)),
                }
            };
            map1(regs, m, d, a, |x| {
                if pair {
                    (one((x >> 16) & 0xffff) << 16) | one(x & 0xffff)
                } else {
                    one(x & 0xffff)
                }
            })
        }
        _ => {}
    }
}

#[allow(clippy::too_many_arguments)]
fn exec_fma(
    regs: &mut [[u64; 32]],
    m: u32,
    ty: Ty,
    rnd: Rnd,
    ftz: bool,
    sat: bool,
    relu: bool,
    d: Reg,
    a: Reg,
    b: Reg,
    c: Reg,
) {
    match ty {
        Ty::F32 => {
            if !ftz && !sat && float::is_nearest(rnd) {
                return map3(regs, m, d, a, b, c, |x, y, z| {
                    bits32(float::fma32(
                        f32::from_bits(x as u32),
                        f32::from_bits(y as u32),
                        f32::from_bits(z as u32),
                    ))
                });
            }
            map3(regs, m, d, a, b, c, |x, y, z| {
                let (mut x, mut y, mut z) = (
                    f32::from_bits(x as u32),
                    f32::from_bits(y as u32),
                    f32::from_bits(z as u32),
                );
                if ftz {
                    x = ftz32(x);
                    y = ftz32(y);
                    z = ftz32(z);
                }
                let mut r = float::fma_f32(x, y, z, rnd);
                if ftz {
                    r = ftz32(r);
                }
                if sat {
                    r = float::sat32(r);
                }
                bits32(r)
            })
        }
        Ty::F64 => map3(regs, m, d, a, b, c, |x, y, z| {
            let r = float::fma_f64(f64::from_bits(x), f64::from_bits(y), f64::from_bits(z), rnd);
            bits64(if sat { float::sat64(r) } else { r })
        }),
        Ty::F16 | Ty::Bf16 | Ty::F16x2 | Ty::Bf16x2 => {
            let bf = matches!(ty, Ty::Bf16 | Ty::Bf16x2);
            let pair = matches!(ty, Ty::F16x2 | Ty::Bf16x2);
            let rnd = if rnd == Rnd::Default { Rnd::Rn } else { rnd };
            let one = move |x: u64, y: u64, z: u64| -> u64 {
                let dec = |v: u64| {
                    if bf {
                        float::bf16_to_f64(v as u16)
                    } else {
                        float::f16_to_f64(v as u16)
                    }
                };
                let p = dec(x) * dec(y);
                let (s, e) = float::two_sum(p, dec(z));
                let mut s = s;
                let mut err = if e.is_finite() { float::sign(e) } else { 0 };
                if relu && (s < 0.0 || s.is_nan()) {
                    s = if s.is_nan() { s } else { 0.0 };
                    err = 0;
                }
                if sat {
                    s = float::sat64(s);
                    err = 0;
                }
                u64::from(if bf {
                    float::f64_to_bf16(s, err, rnd)
                } else {
                    float::f64_to_f16(s, err, rnd)
                })
            };
            map3(regs, m, d, a, b, c, |x, y, z| {
                if pair {
                    (one((x >> 16) & 0xffff, (y >> 16) & 0xffff, (z >> 16) & 0xffff) << 16)
                        | one(x & 0xffff, y & 0xffff, z & 0xffff)
                } else {
                    one(x & 0xffff, y & 0xffff, z & 0xffff)
                }
            })
        }
        _ => {}
    }
}

#[allow(clippy::too_many_arguments)]
fn exec_cvt(
    regs: &mut [[u64; 32]],
    m: u32,
    d: Reg,
    a: Reg,
    dty: Ty,
    sty: Ty,
    rnd: Rnd,
    sat: bool,
    ftz: bool,
) {
    if dty.is_int() && sty.is_int() && !sat {
        let (sb, ss, db, ds) = (sty.bits(), sty.is_signed(), dty.bits(), dty.is_signed());
        return map1(regs, m, d, a, |x| {
            let v = if ss {
                sext_bits(x, sb)
            } else {
                x & lowmask(sb)
            };
            if ds {
                sext_bits(v, db)
            } else {
                v & lowmask(db)
            }
        });
    }
    if dty == Ty::F32 && sty == Ty::F32 && !sat && !ftz && rnd == Rnd::Default {
        return map1(regs, m, d, a, |x| x & 0xffff_ffff);
    }
    map1(regs, m, d, a, |x| cvt_one(x, dty, sty, rnd, sat, ftz));
}

fn int_range(ty: Ty) -> (i128, i128) {
    let bits = ty.bits();
    if ty.is_signed() {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    }
}

fn cvt_one(x: u64, dty: Ty, sty: Ty, rnd: Rnd, sat: bool, ftz: bool) -> u64 {
    if sty.is_int() {
        let sb = sty.bits();
        let v: i128 = if sty.is_signed() {
            sext_bits(x, sb) as i64 as i128
        } else {
            i128::from(x & lowmask(sb))
        };
        if dty.is_int() {
            let (lo, hi) = int_range(dty);
            let v = if sat { v.clamp(lo, hi) } else { v };
            let r = v as u64;
            return if dty.is_signed() {
                sext_bits(r, dty.bits())
            } else {
                r & lowmask(dty.bits())
            };
        }
        let rnd = if rnd == Rnd::Default { Rnd::Rn } else { rnd };
        return match dty {
            Ty::F32 => {
                let mut f = float::int_to_f32(v, rnd);
                if sat {
                    f = float::sat32(f);
                }
                u64::from(f.to_bits())
            }
            Ty::F64 => {
                let mut f = float::int_to_f64(v, rnd);
                if sat {
                    f = float::sat64(f);
                }
                f.to_bits()
            }
            Ty::F16 => u64::from(float::int_to_16(v, false, rnd)),
            Ty::Bf16 => u64::from(float::int_to_16(v, true, rnd)),
            _ => 0,
        };
    }
    // Widening a half NaN keeps its payload, like the hardware conversion.
    if dty == Ty::F32 && matches!(sty, Ty::F16 | Ty::Bf16) {
        let h = x as u16;
        if sty == Ty::Bf16 && float::bf16_to_f64(h).is_nan() {
            return u64::from(h) << 16;
        }
        if sty == Ty::F16 && float::f16_to_f64(h).is_nan() {
            return u64::from(
                (u32::from(h & 0x8000) << 16) | 0x7f80_0000 | (u32::from(h & 0x3ff) << 13),
            );
        }
    }
    // Float source, as an exact f64.
    let f: f64 = match sty {
        Ty::F32 => {
            let v = f32::from_bits(x as u32);
            f64::from(if ftz { ftz32(v) } else { v })
        }
        Ty::F64 => f64::from_bits(x),
        Ty::F16 => float::f16_to_f64(x as u16),
        Ty::Bf16 => float::bf16_to_f64(x as u16),
        _ => 0.0,
    };
    if dty.is_int() {
        if f.is_nan() {
            return 0;
        }
        let r = float::round_integral(f, rnd);
        let (lo, hi) = int_range(dty);
        let v = (r as i128).clamp(lo, hi);
        let bits = v as u64;
        return if dty.is_signed() {
            sext_bits(bits, dty.bits())
        } else {
            bits & lowmask(dty.bits())
        };
    }
    let int_round = matches!(rnd, Rnd::Rni | Rnd::Rzi | Rnd::Rmi | Rnd::Rpi);
    let f = if int_round && !f.is_nan() {
        float::round_integral(f, rnd)
    } else {
        f
    };
    let rnd = if int_round || rnd == Rnd::Default {
        Rnd::Rn
    } else {
        rnd
    };
    match dty {
        Ty::F32 => {
            let mut r = float::f64_to_f32(f, 0, rnd);
            if ftz {
                r = ftz32(r);
            }
            if sat {
                r = float::sat32(r);
            }
            bits32(r)
        }
        Ty::F64 => {
            let r = if sat { float::sat64(f) } else { f };
            bits64(r)
        }
        Ty::F16 => {
            let v = if sat { float::sat64(f) } else { f };
            u64::from(float::f64_to_f16(v, 0, rnd))
        }
        Ty::Bf16 => {
            let v = if sat { float::sat64(f) } else { f };
            u64::from(float::f64_to_bf16(v, 0, rnd))
        }
        _ => 0,
    }
}
