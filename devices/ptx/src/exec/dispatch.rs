//! The interpreter loop: `run_warp` decodes nothing, it dispatches pre-decoded instructions
//! for one warp until the warp exits, waits at a barrier or faults. Kept whole for speed.

use super::*;

impl<'a> Worker<'a> {
    // ---- the interpreter loop ------------------------------------------------------------

    pub(super) fn run_warp(&mut self, warp: &mut Warp) -> Result<Stop, Fault> {
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
                            let _whole = memory::VectorLock::for_access(*space, *n, total, addr);
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
                            let _whole = memory::VectorLock::for_access(*space, *n, total, addr);
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
                        // A packed pair's halves go to `p` and `q`; otherwise `q` is `!p`.
                        let (bits, second) = if matches!(ty, Ty::F16x2 | Ty::Bf16x2) {
                            compare_halves(regs, *cmp, *ty, *a, *b)
                        } else {
                            let bits = compare(regs, *cmp, *ty, *ftz, *a, *b);
                            (bits, !bits)
                        };
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
                            let r2 = comb(second);
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
                        // Packed sources: one result per half, in the destination's halves.
                        let packed = matches!(ty, Ty::F16x2 | Ty::Bf16x2);
                        let (bits, high) = if packed {
                            compare_halves(regs, *cmp, *ty, *a, *b)
                        } else {
                            (compare(regs, *cmp, *ty, *ftz, *a, *b), 0)
                        };
                        let cval = if *c == NONE {
                            0
                        } else {
                            frame.preds[*c as usize] ^ if *cneg { FULL } else { 0 }
                        };
                        let comb = |x: u32| match bop {
                            None => x,
                            Some(BoolOp::And) => x & cval,
                            Some(BoolOp::Or) => x | cval,
                            Some(BoolOp::Xor) => x ^ cval,
                        };
                        let (r, rh) = (comb(bits), comb(high));
                        let t = set_true(*dty);
                        let row = &mut frame.regs[*d as usize];
                        for l in 0..32 {
                            if m >> l & 1 != 0 {
                                let lo = if r >> l & 1 != 0 { t } else { 0 };
                                let hi = if packed && rh >> l & 1 != 0 {
                                    t << 16
                                } else {
                                    0
                                };
                                row[l] = lo | hi;
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
                    Op::CallIndirect(c) => {
                        if m == 0 {
                            pc += 1;
                            continue;
                        }
                        warp.stack[depth].pc = pc + 1;
                        self.call_indirect(warp, c, m, pc, inst.line)?;
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
                    // Warp-wide: a warp whose guard holds in no lane skips them. Out of line,
                    // so that they cost the other instructions' dispatch nothing.
                    Op::WmmaLoad(_)
                    | Op::WmmaStore(_)
                    | Op::WmmaMma(_)
                    | Op::MmaSync(_)
                    | Op::LdMatrix(_)
                    | Op::StMatrix(_)
                    | Op::MovMatrix { .. } => {
                        if m != 0 {
                            let w = warp_ref(&warp.tid, warp.idx, warp.valid);
                            self.matrix_op(w, regs, m, &inst.op, inst.line)?;
                        }
                    }
                    Op::Mbarrier(op) if m != 0 => {
                        let w = warp_ref(&warp.tid, warp.idx, warp.valid);
                        let done = self.mbarrier(w, regs, m, op, inst.line)?;
                        if op.p != NONE {
                            let pr = &mut frame.preds[op.p as usize];
                            *pr = (*pr & !m) | done;
                            if done != m {
                                warp.stack[depth].pc = pc + 1;
                                return Ok(Stop::Yield);
                            }
                        }
                    }
                    Op::Mbarrier(_) => {}
                    Op::Yield => {
                        if m != 0 {
                            warp.stack[depth].pc = pc + 1;
                            return Ok(Stop::Yield);
                        }
                    }
                    Op::CvtFp8 {
                        kind,
                        format,
                        relu,
                        d,
                        a,
                        b,
                    } => fp::cvt_fp8(regs, m, *kind, *format, *relu, [*d, *a, *b]),
                    Op::CvtTf32 { d, a } => {
                        map1(regs, m, *d, *a, |x| u64::from(mma::tf32_rna(x as u32)));
                    }
                    Op::Tex(t) => {
                        let w = WarpRef {
                            tid: &warp.tid,
                            idx: warp.idx,
                        };
                        self.tex(w, regs, m, t, inst.line)?;
                    }
                    Op::Suld(s) | Op::Sust(s) => {
                        let w = WarpRef {
                            tid: &warp.tid,
                            idx: warp.idx,
                        };
                        let store = matches!(inst.op, Op::Sust(_));
                        self.surf(w, regs, m, s, store, inst.line)?;
                    }
                    Op::Txq {
                        q,
                        surface,
                        d,
                        handle,
                    } => {
                        let w = WarpRef {
                            tid: &warp.tid,
                            idx: warp.idx,
                        };
                        self.txq(w, regs, m, *q, *surface, *d, *handle, inst.line)?;
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
}
