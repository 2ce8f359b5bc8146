//! Atomics, shuffles, votes and asynchronous copies.

use super::*;

impl FnCtx<'_> {
    pub(super) fn sel_atom(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        m.ord();
        let space = m.space();
        let op = match m.any(&[
            "add", "min", "max", "and", "or", "xor", "exch", "cas", "inc", "dec",
        ]) {
            Some("add") => AtomOp::Add,
            Some("min") => AtomOp::Min,
            Some("max") => AtomOp::Max,
            Some("and") => AtomOp::And,
            Some("or") => AtomOp::Or,
            Some("xor") => AtomOp::Xor,
            Some("exch") => AtomOp::Exch,
            Some("cas") => AtomOp::Cas,
            Some("inc") => AtomOp::Inc,
            Some("dec") => AtomOp::Dec,
            _ => return Err(unsupported(ins)),
        };
        if m.any(&["v2", "v4", "v8"]).is_some() {
            return Err(unsupported(ins));
        }
        let ty = self.one_type(ins, m)?;
        let ok = match op {
            AtomOp::Add => matches!(
                ty,
                Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64 | Ty::F32 | Ty::F64
            ),
            AtomOp::Min | AtomOp::Max => matches!(ty, Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64),
            AtomOp::And | AtomOp::Or | AtomOp::Xor => matches!(
                ty,
                Ty::B32 | Ty::B64 | Ty::U32 | Ty::U64 | Ty::S32 | Ty::S64
            ),
            AtomOp::Exch => matches!(
                ty,
                Ty::B32 | Ty::B64 | Ty::U32 | Ty::U64 | Ty::S32 | Ty::S64 | Ty::F32 | Ty::F64
            ),
            AtomOp::Cas => matches!(
                ty,
                Ty::B16 | Ty::B32 | Ty::B64 | Ty::U32 | Ty::U64 | Ty::S32 | Ty::S64
            ),
            AtomOp::Inc | AtomOp::Dec => ty == Ty::U32,
        };
        if !ok {
            return Err(unsupported(ins));
        }
        let is_red = ins.opcode == "red";
        let hint = m.has("L2::cache_hint");
        let nsrc = if op == AtomOp::Cas { 2 } else { 1 };
        let want = usize::from(!is_red) + 1 + nsrc + usize::from(hint);
        let o = self.ops(ins, want)?;
        let (d, rest) = if is_red {
            (NONE, o)
        } else {
            (self.dst(&o[0])?, &o[1..])
        };
        let (base, off) = match self.address(&rest[0], space)? {
            Addr::Reg(b, off) => (b, off),
            _ => {
                return Err(LoadError::unsupported(
                    ins.line,
                    "atomics on parameters are not supported",
                ));
            }
        };
        let b = self.val(&rest[1], ty)?;
        let c = if op == AtomOp::Cas {
            self.val(&rest[2], ty)?
        } else {
            NONE
        };
        if space == Space::Const || space == Space::Param || space == Space::Local {
            return Err(unsupported(ins));
        }
        Ok(Op::Atom {
            space,
            op,
            ty,
            d,
            base,
            off,
            b,
            c,
        })
    }

    pub(super) fn sel_shfl(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let sync = m.has("sync");
        let mode = match m.any(&["up", "down", "bfly", "idx"]) {
            Some("up") => ShflMode::Up,
            Some("down") => ShflMode::Down,
            Some("bfly") => ShflMode::Bfly,
            Some("idx") => ShflMode::Idx,
            _ => return Err(unsupported(ins)),
        };
        let ty = self.one_type(ins, m)?;
        if ty.bytes() != 4 {
            return Err(unsupported(ins));
        }
        let o = self.ops(ins, if sync { 5 } else { 4 })?;
        let (d, p) = match &o[0] {
            Operand::Pair(d, p) => (
                self.dst(&Operand::Name(d.clone()))?,
                self.pred_dst(&Operand::Name(p.clone()))?,
            ),
            other => (self.dst(other)?, NONE),
        };
        let a = self.val(&o[1], Ty::B32)?;
        let b = self.val(&o[2], Ty::B32)?;
        let c = self.val(&o[3], Ty::B32)?;
        let mask = if sync {
            self.val(&o[4], Ty::B32)?
        } else {
            self.imm(u64::from(u32::MAX))?
        };
        Ok(Op::Shfl {
            mode,
            d,
            p,
            a,
            b,
            c,
            mask,
        })
    }

    pub(super) fn sel_vote(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let sync = m.has("sync");
        let mode = match m.any(&["all", "any", "uni", "ballot"]) {
            Some("all") => VoteMode::All,
            Some("any") => VoteMode::Any,
            Some("uni") => VoteMode::Uni,
            Some("ballot") => VoteMode::Ballot,
            _ => return Err(unsupported(ins)),
        };
        m.types();
        let o = self.ops(ins, if sync { 3 } else { 2 })?;
        let d = if mode == VoteMode::Ballot {
            self.dst(&o[0])?
        } else {
            self.pred_dst(&o[0])?
        };
        let (a, aneg) = self.pred_src(&o[1])?;
        let mask = if sync {
            self.val(&o[2], Ty::B32)?
        } else {
            self.imm(u64::from(u32::MAX))?
        };
        Ok(Op::Vote {
            mode,
            d,
            a,
            aneg,
            mask,
        })
    }

    pub(super) fn sel_cp(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        if !m.has("async") {
            return Err(unsupported(ins));
        }
        if m.has("commit_group") || m.has("wait_group") || m.has("wait_all") {
            m.finish(ins)?;
            return Ok(Op::Nop);
        }
        m.has("shared");
        m.has("shared::cta");
        m.has("global");
        if m.has("mbarrier") {
            return self.sel_cp_mbarrier(ins, m);
        }
        let hint = m.has("L2::cache_hint");
        if m.has("bulk") {
            return Err(unsupported(ins));
        }
        let o = &ins.operands;
        let n = o.len() - usize::from(hint);
        if !(3..=4).contains(&n) {
            return Err(self.err("cp.async expects 3 or 4 operands"));
        }
        let (dbase, doff) = match self.address(&o[0], Space::Shared)? {
            Addr::Reg(b, off) => (b, off),
            _ => return Err(self.err("bad cp.async destination")),
        };
        let (sbase, soff) = match self.address(&o[1], Space::Global)? {
            Addr::Reg(b, off) => (b, off),
            _ => return Err(self.err("bad cp.async source")),
        };
        let size = match &o[2] {
            Operand::Int(v @ (4 | 8 | 16)) => *v as u8,
            _ => return Err(self.err("cp.async size must be 4, 8 or 16")),
        };
        let src_size = if n == 4 {
            self.val(&o[3], Ty::U32)?
        } else {
            NONE
        };
        Ok(Op::CpAsync {
            dbase,
            doff,
            sbase,
            soff,
            size,
            src_size,
        })
    }

    /// `cp.async.mbarrier.arrive{.noinc}.shared.b64 [a]`: an arrive once the thread's earlier
    /// `cp.async` copies are done, which they are (they run at once). Without `.noinc` the
    /// arrival's count is added to the pending count first, so nothing changes.
    fn sel_cp_mbarrier(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        if !m.has("arrive") || !m.has("b64") {
            return Err(unsupported(ins));
        }
        let noinc = m.has("noinc");
        let space = m.space();
        let o = self.ops(ins, 1)?;
        let Addr::Reg(base, off) = self.address(&o[0], space)? else {
            return Err(unsupported(ins));
        };
        m.finish(ins)?;
        if !noinc {
            return Ok(Op::Nop);
        }
        Ok(Op::Mbarrier(Box::new(Mbarrier {
            kind: MbarKind::Arrive { drop: false },
            space,
            base,
            off,
            d: self.sink,
            p: NONE,
            a: NONE,
        })))
    }

    /// `mbarrier.init`, `inval`, `arrive`, `arrive_drop`, `test_wait`, `try_wait` (each with
    /// `.parity` where it has one) and `pending_count`, on barrier objects in shared memory
    /// (or generic addresses of it). The transaction counts of Hopper's bulk copies
    /// (`expect_tx`, `complete_tx`) and barriers of other blocks of a cluster are refused.
    pub(super) fn sel_mbarrier(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let kind = m
            .any(&[
                "init",
                "inval",
                "arrive",
                "arrive_drop",
                "test_wait",
                "try_wait",
                "pending_count",
            ])
            .ok_or_else(|| unsupported(ins))?;
        if m.has("expect_tx") || m.has("noComplete") || m.has("shared::cluster") {
            return Err(unsupported(ins));
        }
        // Orderings and scopes: the interpreter's shared memory is sequentially consistent.
        for sem in ["release", "acquire", "relaxed", "cluster"] {
            m.has(sem);
        }
        let parity = m.has("parity");
        if !m.has("b64") {
            return Err(unsupported(ins));
        }
        let space = m.space();
        let o = &ins.operands;
        let addr = |this: &mut Self, op: &Operand| -> DResult<(Reg, i64)> {
            match this.address(op, space)? {
                Addr::Reg(base, off) => Ok((base, off)),
                _ => Err(unsupported(ins)),
            }
        };
        let count = |n: usize| -> DResult<()> {
            if o.len() == n {
                Ok(())
            } else {
                Err(self.err(format!(
                    "`{}` expects {n} operands, found {}",
                    ins.full_name(),
                    o.len()
                )))
            }
        };
        let op = match kind {
            "init" => {
                count(2)?;
                let (base, off) = addr(self, &o[0])?;
                Mbarrier {
                    kind: MbarKind::Init,
                    space,
                    base,
                    off,
                    d: NONE,
                    p: NONE,
                    a: self.val(&o[1], Ty::U32)?,
                }
            }
            "inval" => {
                count(1)?;
                let (base, off) = addr(self, &o[0])?;
                Mbarrier {
                    kind: MbarKind::Inval,
                    space,
                    base,
                    off,
                    d: NONE,
                    p: NONE,
                    a: NONE,
                }
            }
            "arrive" | "arrive_drop" => {
                if !(2..=3).contains(&o.len()) {
                    return Err(self.err(format!("`{}` expects 2 or 3 operands", ins.full_name())));
                }
                let d = self.dst(&o[0])?;
                let (base, off) = addr(self, &o[1])?;
                let a = match o.get(2) {
                    Some(c) => self.val(c, Ty::U32)?,
                    None => NONE,
                };
                Mbarrier {
                    kind: MbarKind::Arrive {
                        drop: kind == "arrive_drop",
                    },
                    space,
                    base,
                    off,
                    d,
                    p: NONE,
                    a,
                }
            }
            "test_wait" | "try_wait" => {
                // try_wait's optional suspend-time hint changes nothing here.
                if !(3..=4).contains(&o.len()) || (kind == "test_wait" && o.len() == 4) {
                    return Err(self.err(format!(
                        "`{}` has the wrong number of operands",
                        ins.full_name()
                    )));
                }
                let p = self.pred_dst(&o[0])?;
                let (base, off) = addr(self, &o[1])?;
                let a = self.val(&o[2], if parity { Ty::U32 } else { Ty::B64 })?;
                Mbarrier {
                    kind: MbarKind::TestWait { parity },
                    space,
                    base,
                    off,
                    d: NONE,
                    p,
                    a,
                }
            }
            _ => {
                count(2)?;
                Mbarrier {
                    kind: MbarKind::PendingCount,
                    space,
                    base: NONE,
                    off: 0,
                    d: self.dst(&o[0])?,
                    p: NONE,
                    a: self.val(&o[1], Ty::B64)?,
                }
            }
        };
        Ok(Op::Mbarrier(Box::new(op)))
    }
}
