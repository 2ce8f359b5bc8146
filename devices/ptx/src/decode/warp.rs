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
        let hint = m.has("L2::cache_hint");
        if m.has("bulk") || m.has("mbarrier") {
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
}
