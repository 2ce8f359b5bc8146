//! Instruction selection: which family decodes an instruction, by opcode.

use super::*;

impl FnCtx<'_> {
    /// Instruction selection. Returns None when the instruction compiles to nothing.
    pub(super) fn select(&mut self, ins: &Instr) -> DResult<Option<Op>> {
        let mut m = Mods::new(&ins.mods);
        let op = match ins.opcode.as_str() {
            "mov" => self.sel_mov(ins, &mut m)?,
            "ld" | "ldu" => self.sel_ld(ins, &mut m)?,
            "st" => self.sel_st(ins, &mut m)?,
            "cvta" => {
                let to = m.has("to");
                let space = m.space();
                let ty = self.one_type(ins, &mut m)?;
                let o = self.ops(ins, 2)?;
                if space == Space::Generic {
                    return Err(self.err("cvta needs a state space"));
                }
                let d = self.dst(&o[0])?;
                let a = self.val(&o[1], ty)?;
                Op::Cvta {
                    d,
                    a,
                    space,
                    to,
                    narrow: ty.bytes() == 4,
                }
            }
            "isspacep" => {
                let space = m.space();
                let o = self.ops(ins, 2)?;
                let d = self.pred_dst(&o[0])?;
                let a = self.val(&o[1], Ty::U64)?;
                Op::Isspacep { d, a, space }
            }
            "cvt" => self.sel_cvt(ins, &mut m)?,
            "add" | "sub" | "addc" | "subc" => self.sel_addsub(ins, &mut m)?,
            "mul" | "mul24" => self.sel_mul(ins, &mut m)?,
            "mad" | "mad24" | "madc" | "fma" => self.sel_mad(ins, &mut m)?,
            "div" | "rem" | "min" | "max" | "copysign" => self.sel_divminmax(ins, &mut m)?,
            "abs" | "neg" | "sqrt" | "rsqrt" | "rcp" | "sin" | "cos" | "lg2" | "ex2" | "tanh" => {
                self.sel_unary(ins, &mut m)?
            }
            "and" | "or" | "xor" | "not" | "cnot" | "shl" | "shr" | "popc" | "clz" | "brev"
            | "bfind" | "bmsk" => self.sel_bits(ins, &mut m)?,
            "bfe" | "bfi" | "prmt" | "lop3" | "shf" | "dp4a" | "dp2a" | "sad" | "szext" => {
                self.sel_bitfield(ins, &mut m)?
            }
            "setp" | "set" => self.sel_setp(ins, &mut m)?,
            v if video::is_video(v) => self.sel_video(ins, &mut m)?,
            "selp" => {
                let ty = self.one_type(ins, &mut m)?;
                let o = self.ops(ins, 4)?;
                let d = self.dst(&o[0])?;
                let a = self.val(&o[1], ty)?;
                let b = self.val(&o[2], ty)?;
                let (p, neg) = self.pred_src(&o[3])?;
                if neg {
                    Op::Selp { d, a: b, b: a, p }
                } else {
                    Op::Selp { d, a, b, p }
                }
            }
            "slct" => {
                let ftz = m.has("ftz");
                let t = m.types();
                if t.len() != 2 {
                    return Err(self.err("slct needs two types"));
                }
                let o = self.ops(ins, 4)?;
                let d = self.dst(&o[0])?;
                let a = self.val(&o[1], t[0])?;
                let b = self.val(&o[2], t[0])?;
                let c = self.val(&o[3], t[1])?;
                Op::Slct {
                    float: t[1] == Ty::F32,
                    ftz,
                    d,
                    a,
                    b,
                    c,
                }
            }
            "testp" => {
                let k = match m.any(&[
                    "finite",
                    "infinite",
                    "number",
                    "notanumber",
                    "normal",
                    "subnormal",
                ]) {
                    Some("finite") => TestP::Finite,
                    Some("infinite") => TestP::Infinite,
                    Some("number") => TestP::Number,
                    Some("notanumber") => TestP::NotANumber,
                    Some("normal") => TestP::Normal,
                    Some("subnormal") => TestP::Subnormal,
                    _ => return Err(unsupported(ins)),
                };
                let ty = self.one_type(ins, &mut m)?;
                let o = self.ops(ins, 2)?;
                let d = self.pred_dst(&o[0])?;
                let a = self.val(&o[1], ty)?;
                Op::Testp { k, ty, d, a }
            }
            "bra" => {
                self.ops(ins, 1)?;
                Op::Bra {
                    target: 0,
                    rpc: NONE,
                }
            }
            "brx" => return Err(unsupported(ins)),
            "call" => self.sel_call(ins, &mut m)?,
            "ret" => {
                self.ops(ins, 0)?;
                if self.is_entry { Op::Exit } else { Op::Ret }
            }
            "exit" => Op::Exit,
            "trap" => Op::Trap,
            "nanosleep" => {
                m.types();
                Op::Yield
            }
            "brkpt" | "pmevent" | "prefetch" | "prefetchu" | "griddepcontrol" | "discard"
            | "applypriority" | "setmaxnreg" => return Ok(None),
            "bar" | "barrier" => self.sel_bar(ins, &mut m)?,
            "membar" | "fence" => {
                return Ok(Some(Op::Fence));
            }
            "atom" | "red" => self.sel_atom(ins, &mut m)?,
            "shfl" => self.sel_shfl(ins, &mut m)?,
            "vote" => self.sel_vote(ins, &mut m)?,
            "activemask" => {
                m.types();
                let o = self.ops(ins, 1)?;
                Op::Activemask {
                    d: self.dst(&o[0])?,
                }
            }
            "redux" => {
                m.has("sync");
                let op = match m.any(&["add", "min", "max", "and", "or", "xor"]) {
                    Some("add") => ReduxOp::Add,
                    Some("min") => ReduxOp::Min,
                    Some("max") => ReduxOp::Max,
                    Some("and") => ReduxOp::And,
                    Some("or") => ReduxOp::Or,
                    Some("xor") => ReduxOp::Xor,
                    _ => return Err(unsupported(ins)),
                };
                let ty = self.one_type(ins, &mut m)?;
                if ty.bytes() != 4 || ty.is_float() {
                    return Err(unsupported(ins));
                }
                let o = self.ops(ins, 3)?;
                Op::Redux {
                    op,
                    signed: ty.is_signed(),
                    d: self.dst(&o[0])?,
                    a: self.val(&o[1], ty)?,
                    mask: self.val(&o[2], Ty::B32)?,
                }
            }
            "match" => {
                m.has("sync");
                let all = match m.any(&["any", "all"]) {
                    Some("all") => true,
                    Some(_) => false,
                    None => return Err(unsupported(ins)),
                };
                let ty = self.one_type(ins, &mut m)?;
                let o = self.ops(ins, 3)?;
                let (d, p) = match &o[0] {
                    Operand::Pair(d, p) if all => {
                        let d = self.dst(&Operand::Name(d.clone()))?;
                        (d, self.pred_dst(&Operand::Name(p.clone()))?)
                    }
                    other => (self.dst(other)?, NONE),
                };
                Op::Match {
                    all,
                    wide: ty.bytes() == 8,
                    d,
                    p,
                    a: self.val(&o[1], ty)?,
                    mask: self.val(&o[2], Ty::B32)?,
                }
            }
            "elect" => {
                m.has("sync");
                let o = self.ops(ins, 2)?;
                let (d, p) = match &o[0] {
                    Operand::Pair(d, p) => {
                        let d = if d == "_" {
                            self.sink
                        } else {
                            self.dst(&Operand::Name(d.clone()))?
                        };
                        (d, self.pred_dst(&Operand::Name(p.clone()))?)
                    }
                    _ => return Err(self.err("elect.sync needs `d|p`")),
                };
                Op::Elect {
                    d,
                    p,
                    mask: self.val(&o[1], Ty::B32)?,
                }
            }
            "fns" => {
                m.types();
                let o = self.ops(ins, 4)?;
                Op::Fns {
                    d: self.dst(&o[0])?,
                    mask: self.val(&o[1], Ty::B32)?,
                    base: self.val(&o[2], Ty::U32)?,
                    off: self.val(&o[3], Ty::S32)?,
                }
            }
            "cp" => self.sel_cp(ins, &mut m)?,
            "mbarrier" => self.sel_mbarrier(ins, &mut m)?,
            "tex" | "tld4" => self.sel_tex(ins, &mut m)?,
            "wmma" => self.sel_wmma(ins, &mut m)?,
            "mma" => self.sel_mma(ins, &mut m)?,
            "ldmatrix" => self.sel_matrix(ins, &mut m, false)?,
            "stmatrix" => self.sel_matrix(ins, &mut m, true)?,
            "movmatrix" => self.sel_movmatrix(ins, &mut m)?,
            "suld" | "sust" => self.sel_surf(ins, &mut m)?,
            "txq" | "suq" => self.sel_query(ins, &mut m)?,
            _ => return Err(unsupported(ins)),
        };
        m.finish(ins)?;
        Ok(Some(op))
    }
}
