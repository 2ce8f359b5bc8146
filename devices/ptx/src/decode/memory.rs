//! Data movement: `mov`, `ld` and `st` in every state space.

use super::*;

impl FnCtx<'_> {
    pub(super) fn sel_mov(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let ty = self.one_type(ins, m)?;
        let o = self.ops(ins, 2)?;
        if ty == Ty::Pred {
            let d = self.pred_dst(&o[0])?;
            let (a, neg) = self.pred_src(&o[1])?;
            return Ok(if neg {
                Op::PNot { d, a }
            } else {
                Op::PMov { d, a }
            });
        }
        if let Operand::Vec(parts) = &o[0] {
            let n = parts.len();
            if !(2..=4).contains(&n) || ty.bits() % n as u32 != 0 {
                return Err(self.err("bad vector unpack"));
            }
            let a = self.val(&o[1], ty)?;
            let mut regs = [self.sink; 4];
            for (i, p) in parts.iter().enumerate() {
                regs[i] = self.dst(p)?;
            }
            return Ok(Op::Unpack {
                a,
                parts: regs,
                n: n as u8,
                bits: (ty.bits() / n as u32) as u8,
            });
        }
        let d = self.dst(&o[0])?;
        if let Operand::Vec(parts) = &o[1] {
            let n = parts.len();
            if !(2..=4).contains(&n) || ty.bits() % n as u32 != 0 {
                return Err(self.err("bad vector pack"));
            }
            let bits = ty.bits() / n as u32;
            let pty = match bits {
                8 => Ty::B8,
                16 => Ty::B16,
                32 => Ty::B32,
                _ => Ty::B64,
            };
            let mut regs = [self.sink; 4];
            for (i, p) in parts.iter().enumerate() {
                regs[i] = self.val(p, pty)?;
            }
            return Ok(Op::Pack {
                d,
                parts: regs,
                n: n as u8,
                bits: bits as u8,
            });
        }
        if let Operand::Name(n) = &o[1]
            && self.lookup(n).is_none()
        {
            if let Some(s) = special_reg(n) {
                return Ok(Op::Special { d, s });
            }
            if n.starts_with('%') {
                return Err(LoadError::unsupported(
                    ins.line,
                    format!("unsupported special register `{n}`"),
                ));
            }
        }
        let a = self.val(&o[1], ty)?;
        Ok(Op::Mov { d, a })
    }

    pub(super) fn sel_ld(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let ord = m.ord();
        m.has("nc");
        let space = m.space();
        let n_vec = match m.any(&["v2", "v4", "v8"]) {
            Some("v2") => 2,
            Some("v4") => 4,
            Some(_) => return Err(unsupported(ins)),
            None => 1,
        };
        let ty = self.one_type(ins, m)?;
        if ty == Ty::B128 || ty == Ty::Pred {
            return Err(unsupported(ins));
        }
        let hint = m.has("L2::cache_hint");
        let want = if hint { 3 } else { 2 };
        let o = self.ops(ins, want)?;
        let (n, d) = self.dst_list(&o[0])?;
        if n != n_vec {
            return Err(self.err("vector size does not match the destination list"));
        }
        let bytes = ty.bytes() as u8;
        let sext = ty.is_signed();
        Ok(match self.address(&o[1], space)? {
            Addr::Reg(base, off) => Op::Ld {
                space,
                bytes,
                sext,
                n,
                d,
                base,
                off,
                ord,
            },
            Addr::KParam(off) => {
                if u32::from(bytes) * u32::from(n) + off
                    > self.m.sigs[self.func_id as usize].param_bytes
                {
                    return Err(self.err("load past the end of the kernel parameters"));
                }
                Op::LdKParam {
                    bytes,
                    sext,
                    n,
                    d,
                    off,
                }
            }
            Addr::FParam(off) => {
                if u32::from(bytes) * u32::from(n) + off > self.param_bytes {
                    return Err(self.err("load past the end of a parameter"));
                }
                Op::LdFParam {
                    bytes,
                    sext,
                    n,
                    d,
                    off,
                }
            }
        })
    }

    pub(super) fn sel_st(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let ord = m.ord();
        let space = m.space();
        let n_vec = match m.any(&["v2", "v4", "v8"]) {
            Some("v2") => 2,
            Some("v4") => 4,
            Some(_) => return Err(unsupported(ins)),
            None => 1,
        };
        let ty = self.one_type(ins, m)?;
        if ty == Ty::B128 || ty == Ty::Pred {
            return Err(unsupported(ins));
        }
        if space == Space::Const {
            return Err(self.err("constant memory is read-only"));
        }
        let hint = m.has("L2::cache_hint");
        let want = if hint { 3 } else { 2 };
        let o = self.ops(ins, want)?;
        let (n, s) = self.src_list(&o[1], ty)?;
        if n != n_vec {
            return Err(self.err("vector size does not match the source list"));
        }
        let bytes = ty.bytes() as u8;
        Ok(match self.address(&o[0], space)? {
            Addr::Reg(base, off) => Op::St {
                space,
                bytes,
                n,
                s,
                base,
                off,
                ord,
            },
            Addr::KParam(_) => return Err(self.err("kernel parameters are read-only")),
            Addr::FParam(off) => {
                if u32::from(bytes) * u32::from(n) + off > self.param_bytes {
                    return Err(self.err("store past the end of a parameter"));
                }
                Op::StFParam { bytes, n, s, off }
            }
        })
    }
}
