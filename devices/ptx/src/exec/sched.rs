//! Thread blocks on one worker: setting a worker up, running a block warp by warp, barriers,
//! and the checks between warps (watchdog, cancellation, a sibling's fault).

use super::*;

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
            budget: check_interval(ctx.grid_workspace),
            frame_pool: Vec::new(),
            sibling_stop: false,
            frame_bytes: 0,
            frame_paid: ctx.frames_paid,
            frame_extra: 0,
        };
        for wi in 0..ctx.nwarps {
            // The launch checked the kernel's register file against the block limits: a
            // refusal here is of the same kind (nothing ran yet).
            let frame = w
                .new_frame(kfunc, ctx.layout.func, 0)
                .map_err(|(kind, why)| {
                    let kind = match kind {
                        FrameRefusal::BlockLimit => FaultKind::OutOfResources,
                        FrameRefusal::Budget => FaultKind::OutOfMemory,
                    };
                    fault(
                        kind,
                        format!("kernel `{}`: its frames {why}", ctx.kernel_name),
                    )
                })?;
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

    /// Gives a frame that is no longer used back to the pool, or frees it when it is large.
    pub(super) fn recycle(&mut self, f: Frame) {
        let bytes = f.bytes();
        if bytes > POOLED_FRAME_MAX {
            self.frame_bytes = self.frame_bytes.saturating_sub(bytes);
        } else {
            self.frame_pool.push(f);
        }
    }

    /// Builds a frame for `func` with its hidden registers initialised. Its memory counts
    /// against the block's [`MAX_BLOCK_FRAME_BYTES`] and, past what the launch reserved, the
    /// tenant's budget; either refusal says why (nothing is allocated then).
    pub(super) fn new_frame(
        &mut self,
        func: &Func,
        id: u32,
        local_base: u64,
    ) -> Result<Frame, (FrameRefusal, String)> {
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
        let old = f.bytes();
        let pb = func.param_bytes as usize * LANES as usize;
        let new = (f.regs.capacity().max(func.nregs as usize) as u64) * REGISTER_ROW_BYTES
            + (f.preds.capacity().max(func.npreds as usize) as u64) * PREDICATE_BYTES
            + f.params.capacity().max(pb) as u64;
        let total = self.frame_bytes - old + new;
        if total > MAX_BLOCK_FRAME_BYTES {
            self.frame_pool.push(f);
            return Err((
                FrameRefusal::BlockLimit,
                format!(
                    "would hold {} MiB of registers and parameters, more than a block may ({} MiB)",
                    total >> 20,
                    MAX_BLOCK_FRAME_BYTES >> 20
                ),
            ));
        }
        if total > self.frame_paid
            && let Some(b) = self.ctx.budget
        {
            let take = (total - self.frame_paid).max(FRAME_BUDGET_CHUNK);
            if !b.take(take) {
                self.frame_pool.push(f);
                return Err((
                    FrameRefusal::Budget,
                    format!(
                        "need {} MiB more host memory than the tenant's interpreter budget has left",
                        (total - self.frame_paid).div_ceil(1 << 20)
                    ),
                ));
            }
            self.frame_extra += take;
            self.frame_paid += take;
        }
        f.func = id;
        f.local_base = local_base;
        f.regs.clear();
        f.regs.reserve_exact(func.nregs as usize);
        f.regs.resize(func.nregs as usize, [0u64; 32]);
        f.preds.clear();
        f.preds.reserve_exact(func.npreds as usize);
        f.preds.resize(func.npreds as usize, 0);
        f.param_bytes = func.param_bytes as usize;
        f.params.clear();
        f.params.reserve_exact(pb);
        f.params.resize(pb, 0);
        self.frame_bytes = self.frame_bytes - old + f.bytes();
        f.ret_copy.clear();
        f.call_mask = 0;
        for &(r, init) in &func.init_regs {
            let v = self.sym_value(init, local_base);
            f.regs[r as usize] = [v; 32];
        }
        for &(p, v) in &func.init_preds {
            f.preds[p as usize] = if v { FULL } else { 0 };
        }
        Ok(f)
    }

    pub(super) fn sym_value(&self, init: SymInit, local_base: u64) -> u64 {
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
        let mut warps = std::mem::take(&mut self.warps);
        for w in &mut warps {
            while w.frames.len() > 1 {
                if let Some(f) = w.frames.pop() {
                    self.recycle(f);
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
        let r = self.schedule(&mut warps);
        self.warps = warps;
        self.blocks += 1;
        r
    }

    pub(super) fn schedule(&mut self, warps: &mut [Warp]) -> Result<(), Fault> {
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
                    Stop::Yield => {}
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

    pub(super) fn release_barriers(&mut self, warps: &mut [Warp]) {
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

    pub(super) fn where_(&self, warp: WarpRef<'_>, lane: u32, line: u32) -> String {
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
    pub(super) fn mem_fault(
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

    pub(super) fn check_control(&mut self, warp: WarpRef<'_>, line: u32) -> Result<(), Fault> {
        self.budget = check_interval(self.ctx.grid_workspace);
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
        // A cooperative launch's blocks each run on a thread of their own and wait for each
        // other at grid barriers by spinning on global memory (cooperative groups' code). With
        // more blocks than CPUs a spinning block would hold its CPU for a whole time slice
        // while the blocks it waits for cannot run; giving the CPU up here lets them.
        if self.ctx.grid_workspace != 0 {
            std::thread::yield_now();
        }
        Ok(())
    }
}

/// Warp-instructions between a worker's checks of its launch's control.
fn check_interval(grid_workspace: u64) -> u32 {
    if grid_workspace != 0 {
        COOPERATIVE_CHECK_INTERVAL
    } else {
        CHECK_INTERVAL
    }
}
