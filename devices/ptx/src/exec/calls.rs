//! Calls and returns, built-in functions (`vprintf`, `__assertfail`,
//! `cudaGraphSetConditional`) and special registers.

use super::*;

impl<'a> Worker<'a> {
    pub(super) fn pop_frame(&mut self, warp: &mut Warp) {
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
        self.recycle(callee);
    }

    pub(super) fn do_call(
        &mut self,
        warp: &mut Warp,
        info: &CallInfo,
        m: u32,
        line: u32,
    ) -> Result<(), Fault> {
        self.call_function(warp, info.func, &info.args, &info.rets, m, line)
    }

    /// Calls function `func` for the lanes in `m`: copies `args` (caller offset, callee offset,
    /// size) into its new frame; `rets` (callee offset, caller offset, size) are copied back
    /// when it returns.
    pub(super) fn call_function(
        &mut self,
        warp: &mut Warp,
        func: u32,
        args: &[(u32, u32, u32)],
        rets: &[(u32, u32, u32)],
        m: u32,
        line: u32,
    ) -> Result<(), Fault> {
        let prog = self.ctx.prog;
        let callee_fn = &prog.funcs[func as usize];
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
        // Each frame's registers count against the block's limit and the tenant's budget: a
        // recursion with large frames stops there, as a stack overflow, instead of holding
        // depth × warps × registers of host memory.
        let mut f = self
            .new_frame(callee_fn, func, local_base)
            .map_err(|(_, why)| {
                fault(
                    FaultKind::IllegalAddress,
                    format!(
                        "call stack overflow calling `{}` at depth {}: the block's call frames {why} {}",
                        callee_fn.name,
                        warp.frames.len(),
                        self.where_(w, m.trailing_zeros(), line)
                    ),
                )
            })?;
        f.call_mask = m;
        f.ret_copy.extend_from_slice(rets);
        let caller = warp
            .frames
            .last()
            .ok_or_else(|| fault(FaultKind::Trap, "no caller frame".into()))?;
        let (cpb, fpb) = (caller.param_bytes, f.param_bytes);
        for &(src, dst, size) in args {
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

    /// A call through the address in `c.target` for the lanes in `m` at `pc`: the lanes whose
    /// address is the lowest active lane's call that function now; the others stay at `pc` on
    /// an entry of their own, to call theirs when these return, and all go on at `pc + 1`.
    pub(super) fn call_indirect(
        &mut self,
        warp: &mut Warp,
        c: &IndirectCall,
        m: u32,
        pc: u32,
        line: u32,
    ) -> Result<(), Fault> {
        let Some(frame) = warp.frames.last() else {
            return Ok(());
        };
        let row = frame.regs[c.target as usize];
        let first = m.trailing_zeros();
        let addr = row[first as usize];
        let same = (0..32u32)
            .filter(|&l| m >> l & 1 != 0 && row[l as usize] == addr)
            .fold(0u32, |acc, l| acc | 1 << l);
        let prog = self.ctx.prog;
        let w = warp_ref(&warp.tid, warp.idx, warp.valid);
        let func = addr
            .checked_sub(crate::FUNCTION_WINDOW)
            .and_then(|i| u32::try_from(i).ok())
            .filter(|&i| (i as usize) < prog.funcs.len())
            .ok_or_else(|| {
                fault(
                    FaultKind::IllegalAddress,
                    format!(
                        "indirect call to {addr:#x}, which is no function's address {}",
                        self.where_(w, first, line)
                    ),
                )
            })?;
        let f = &prog.funcs[func as usize];
        if !f.defined || f.is_entry {
            return Err(fault(
                FaultKind::IllegalInstruction,
                format!(
                    "indirect call to `{}`, which is {} {}",
                    f.name,
                    if f.is_entry {
                        "a kernel"
                    } else {
                        "not defined in the module"
                    },
                    self.where_(w, first, line)
                ),
            ));
        }
        if f.formals != c.formals || f.rets != c.ret_layout {
            return Err(fault(
                FaultKind::IllegalInstruction,
                format!(
                    "indirect call to `{}` through a prototype of another signature {}",
                    f.name,
                    self.where_(w, first, line)
                ),
            ));
        }
        if same != m {
            warp.stack.push(Entry {
                pc,
                rpc: pc + 1,
                mask: m & !same,
                call: false,
            });
        }
        self.call_function(warp, func, &c.args, &c.rets, same, line)
    }

    /// `vprintf`, `__assertfail`, `cudaGraphSetConditional`, `malloc` or `free` for the lanes
    /// in `m`, in lane order.
    pub(super) fn builtin(
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
        let arg = |l: usize, i: usize| read_le(super::launches::arg_bytes(frame, b, l, i));
        match b.kind {
            Builtin::Vprintf => {
                let mut rets = [0u64; 32];
                for l in 0..32 {
                    if m >> l & 1 != 0 {
                        rets[l] = self.vprintf(w, l as u32, arg(l, 0), arg(l, 1)) as u32 as u64;
                    }
                }
                write_rets(warp, b, m, &rets);
                Ok(())
            }
            Builtin::Malloc | Builtin::AlignedMalloc => {
                // Each lane in lane order, as a GPU's heap serves a warp's requests one by one.
                let mut rets = [0u64; 32];
                for l in 0..32 {
                    if m >> l & 1 != 0 {
                        let align = if b.kind == Builtin::AlignedMalloc {
                            arg(l, 1)
                        } else {
                            crate::heap::MALLOC_ALIGN
                        };
                        rets[l] = self.ctx.heap.map_or(0, |h| h.malloc(arg(l, 0), align));
                    }
                }
                write_rets(warp, b, m, &rets);
                Ok(())
            }
            Builtin::GetParameterBuffer
            | Builtin::LaunchDevice(_)
            | Builtin::GetLastError
            | Builtin::PeekAtLastError
            | Builtin::SetLastError
            | Builtin::DeviceObjectCreate
            | Builtin::DeviceObjectNop
            | Builtin::GetDevice
            | Builtin::GetDeviceCount
            | Builtin::DeviceGetAttribute
            | Builtin::GetLimit
            | Builtin::GetCacheConfig
            | Builtin::GetSharedMemConfig
            | Builtin::FuncGetAttribute
            | Builtin::MaxActiveBlocks => {
                self.device_runtime(warp, b, m);
                Ok(())
            }
            Builtin::DeviceSynchronize => self.device_synchronize(warp, b, m, line),
            Builtin::Free => {
                for l in 0..32 {
                    let ptr = arg(l, 0);
                    if m >> l & 1 == 0 || ptr == 0 {
                        continue;
                    }
                    if !self.ctx.heap.is_some_and(|h| h.free(ptr)) {
                        return Err(fault(
                            FaultKind::IllegalAddress,
                            format!(
                                "free({ptr:#x}): no allocation of the device heap starts there (a pointer malloc did not return, or one already freed) ({})",
                                self.where_(w, l as u32, line)
                            ),
                        ));
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
            Builtin::SetConditional => {
                for l in 0..32 {
                    if m >> l & 1 == 0 {
                        continue;
                    }
                    let (handle, value) = (arg(l, 0), arg(l, 1) as u32);
                    let Some(conditionals) = self.ctx.conditionals else {
                        return Err(fault(
                            FaultKind::IllegalInstruction,
                            format!(
                                "cudaGraphSetConditional: {handle:#x} is not a conditional handle of the graph launch this kernel runs in: it runs outside any graph launch with conditional nodes ({})",
                                self.where_(w, l as u32, line)
                            ),
                        ));
                    };
                    if !conditionals.set(handle, value) {
                        return Err(fault(
                            FaultKind::IllegalInstruction,
                            format!(
                                "cudaGraphSetConditional: {handle:#x} is not a conditional handle of the graph launch this kernel runs in ({})",
                                self.where_(w, l as u32, line)
                            ),
                        ));
                    }
                }
                Ok(())
            }
        }
    }

    /// One lane's `vprintf(fmt, args)`: formats into the launch's output; returns the number
    /// of arguments read (-1 for a null format), as CUDA's `printf` does.
    pub(super) fn vprintf(&mut self, w: WarpRef<'_>, lane: u32, fmt: u64, args: u64) -> i32 {
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
    pub(super) fn read_cstr(
        &mut self,
        w: WarpRef<'_>,
        lane: u32,
        addr: u64,
        max: usize,
    ) -> Vec<u8> {
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

    pub(super) fn special(&self, w: WarpRef<'_>, s: Sreg) -> [u64; 32] {
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
            Sreg::EnvReg(1) => uni(c.grid_workspace >> 32),
            Sreg::EnvReg(2) => uni(c.grid_workspace & 0xffff_ffff),
            Sreg::EnvReg(_) => uni(0),
        }
    }
}

/// Writes each lane's result of builtin call `b` (for the lanes in `m`) into its `.param`.
pub(super) fn write_rets(warp: &mut Warp, b: &BuiltinCall, m: u32, rets: &[u64; 32]) {
    let (Some((off, size)), Some(frame)) = (b.ret, warp.frames.last_mut()) else {
        return;
    };
    let pb = frame.param_bytes;
    for (l, &r) in rets.iter().enumerate() {
        let s = l * pb + off as usize;
        if m >> l & 1 != 0
            && let Some(to) = frame.params.get_mut(s..s + size as usize)
        {
            write_le(to, r);
        }
    }
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
