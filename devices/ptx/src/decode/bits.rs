//! Logic, shifts, bit fields and comparisons (`setp`, `selp`, `set`, …).

use super::*;

impl FnCtx<'_> {
    pub(super) fn sel_bits(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let shiftamt = m.has("shiftamt");
        let clamp = m.any(&["clamp", "wrap"]);
        let ty = self.one_type(ins, m)?;
        let opc = ins.opcode.as_str();
        if ty == Ty::Pred {
            return match opc {
                "and" | "or" | "xor" => {
                    let o = self.ops(ins, 3)?;
                    let d = self.pred_dst(&o[0])?;
                    let (a, an) = self.pred_src(&o[1])?;
                    let (b, bn) = self.pred_src(&o[2])?;
                    let op = match opc {
                        "and" => BoolOp::And,
                        "or" => BoolOp::Or,
                        _ => BoolOp::Xor,
                    };
                    Ok(Op::PLogic {
                        op,
                        d,
                        a,
                        an,
                        b,
                        bn,
                    })
                }
                "not" => {
                    let o = self.ops(ins, 2)?;
                    let d = self.pred_dst(&o[0])?;
                    let (a, an) = self.pred_src(&o[1])?;
                    Ok(if an {
                        Op::PMov { d, a }
                    } else {
                        Op::PNot { d, a }
                    })
                }
                _ => Err(unsupported(ins)),
            };
        }
        if !ty.is_int() {
            return Err(unsupported(ins));
        }
        match opc {
            "and" | "or" | "xor" | "shl" | "shr" | "bmsk" => {
                let o = self.ops(ins, 3)?;
                let d = self.dst(&o[0])?;
                let a = self.val(&o[1], ty)?;
                let bty = if matches!(opc, "shl" | "shr" | "bmsk") {
                    Ty::U32
                } else {
                    ty
                };
                let b = self.val(&o[2], bty)?;
                let k = match opc {
                    "and" => IBin::And,
                    "or" => IBin::Or,
                    "xor" => IBin::Xor,
                    "shl" => IBin::Shl,
                    "shr" => IBin::Shr,
                    _ => IBin::Bmsk {
                        clamp: clamp == Some("clamp"),
                    },
                };
                Ok(Op::IBin { k, ty, d, a, b })
            }
            _ => {
                let o = self.ops(ins, 2)?;
                let d = self.dst(&o[0])?;
                let a = self.val(&o[1], ty)?;
                let k = match opc {
                    "not" => IUn::Not,
                    "cnot" => IUn::Cnot,
                    "popc" => IUn::Popc,
                    "clz" => IUn::Clz,
                    "brev" => IUn::Brev,
                    "bfind" => IUn::Bfind { shiftamt },
                    _ => return Err(unsupported(ins)),
                };
                Ok(Op::IUn { k, ty, d, a })
            }
        }
    }

    pub(super) fn sel_bitfield(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        match ins.opcode.as_str() {
            "bfe" => {
                let ty = self.one_type(ins, m)?;
                let o = self.ops(ins, 4)?;
                Ok(Op::ITern {
                    k: ITern::Bfe,
                    ty,
                    d: self.dst(&o[0])?,
                    a: self.val(&o[1], ty)?,
                    b: self.val(&o[2], Ty::U32)?,
                    c: self.val(&o[3], Ty::U32)?,
                })
            }
            "bfi" => {
                let ty = self.one_type(ins, m)?;
                let o = self.ops(ins, 5)?;
                Ok(Op::Bfi {
                    ty,
                    d: self.dst(&o[0])?,
                    a: self.val(&o[1], ty)?,
                    b: self.val(&o[2], ty)?,
                    c: self.val(&o[3], Ty::U32)?,
                    e: self.val(&o[4], Ty::U32)?,
                })
            }
            "prmt" => {
                let mode = match m.any(&["f4e", "b4e", "rc8", "ecl", "ecr", "rc16"]) {
                    None => 0,
                    Some("f4e") => 1,
                    Some("b4e") => 2,
                    Some("rc8") => 3,
                    Some("ecl") => 4,
                    Some("ecr") => 5,
                    Some(_) => 6,
                };
                m.types();
                let o = self.ops(ins, 4)?;
                Ok(Op::Prmt {
                    mode,
                    d: self.dst(&o[0])?,
                    a: self.val(&o[1], Ty::B32)?,
                    b: self.val(&o[2], Ty::B32)?,
                    c: self.val(&o[3], Ty::B32)?,
                })
            }
            "lop3" => {
                m.types();
                let o = self.ops(ins, 5)?;
                let lut = match &o[4] {
                    Operand::Int(v) if *v <= 255 => *v as u8,
                    _ => return Err(self.err("lop3 needs an immediate lookup table")),
                };
                Ok(Op::Lop3 {
                    d: self.dst(&o[0])?,
                    a: self.val(&o[1], Ty::B32)?,
                    b: self.val(&o[2], Ty::B32)?,
                    c: self.val(&o[3], Ty::B32)?,
                    lut,
                })
            }
            "shf" => {
                let left = match m.any(&["l", "r"]) {
                    Some("l") => true,
                    Some(_) => false,
                    None => return Err(unsupported(ins)),
                };
                let clamp = m.any(&["clamp", "wrap"]) == Some("clamp");
                m.types();
                let o = self.ops(ins, 4)?;
                Ok(Op::Shf {
                    left,
                    clamp,
                    d: self.dst(&o[0])?,
                    a: self.val(&o[1], Ty::B32)?,
                    b: self.val(&o[2], Ty::B32)?,
                    c: self.val(&o[3], Ty::U32)?,
                })
            }
            "dp4a" | "dp2a" => {
                let hi = m.any(&["lo", "hi"]) == Some("hi");
                let t = m.types();
                if t.len() != 2 {
                    return Err(self.err("dp4a/dp2a need two types"));
                }
                let o = self.ops(ins, 4)?;
                let (sa, sb) = (t[0].is_signed(), t[1].is_signed());
                let k = if ins.opcode == "dp4a" {
                    ITern::Dp4a { sa, sb }
                } else {
                    ITern::Dp2a { sa, sb, hi }
                };
                let rty = if sa || sb { Ty::S32 } else { Ty::U32 };
                Ok(Op::ITern {
                    k,
                    ty: rty,
                    d: self.dst(&o[0])?,
                    a: self.val(&o[1], Ty::B32)?,
                    b: self.val(&o[2], Ty::B32)?,
                    c: self.val(&o[3], rty)?,
                })
            }
            "sad" => {
                let ty = self.one_type(ins, m)?;
                let o = self.ops(ins, 4)?;
                Ok(Op::ITern {
                    k: ITern::Sad,
                    ty,
                    d: self.dst(&o[0])?,
                    a: self.val(&o[1], ty)?,
                    b: self.val(&o[2], ty)?,
                    c: self.val(&o[3], ty)?,
                })
            }
            _ => {
                // szext.mode.type d, a, b
                let clamp = match m.any(&["clamp", "wrap"]) {
                    Some(c) => c == "clamp",
                    None => return Err(unsupported(ins)),
                };
                let ty = self.one_type(ins, m)?;
                let o = self.ops(ins, 3)?;
                let d = self.dst(&o[0])?;
                let a = self.val(&o[1], ty)?;
                let b = self.val(&o[2], Ty::U32)?;
                Ok(Op::ITern {
                    k: ITern::Szext {
                        signed: ty.is_signed(),
                        clamp,
                    },
                    ty,
                    d,
                    a,
                    b,
                    c: b,
                })
            }
        }
    }

    pub(super) fn sel_setp(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let cmp = m.comparison(false).ok_or_else(|| unsupported(ins))?;
        let bop = match m.any(&["and", "or", "xor"]) {
            Some("and") => Some(BoolOp::And),
            Some("or") => Some(BoolOp::Or),
            Some("xor") => Some(BoolOp::Xor),
            _ => None,
        };
        let ftz = m.has("ftz");
        let t = m.types();
        let setp = ins.opcode == "setp";
        let (dty, ty) = match (setp, t.as_slice()) {
            (true, [ty]) => (Ty::Pred, *ty),
            (false, [d, s]) => (*d, *s),
            _ => {
                return Err(self.err(format!(
                    "`{}` has the wrong number of types",
                    ins.full_name()
                )));
            }
        };
        let packed = matches!(ty, Ty::F16x2 | Ty::Bf16x2);
        if ty == Ty::Pred || ty == Ty::B128 {
            return Err(unsupported(ins));
        }
        let n = ins.operands.len();
        let want = if bop.is_some() { 4 } else { 3 };
        if n != want {
            return Err(self.err(format!(
                "`{}` expects {want} operands, found {n}",
                ins.full_name()
            )));
        }
        let o = &ins.operands;
        let a = self.val(&o[1], ty)?;
        let b = self.val(&o[2], ty)?;
        let (c, cneg) = if bop.is_some() {
            self.pred_src(&o[3])?
        } else {
            (NONE, false)
        };
        if setp {
            let (p, q) = match &o[0] {
                Operand::Pair(p, q) => (
                    self.pred_dst(&Operand::Name(p.clone()))?,
                    self.pred_dst(&Operand::Name(q.clone()))?,
                ),
                other => (self.pred_dst(other)?, NONE),
            };
            Ok(Op::Setp {
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
            })
        } else {
            // 1.0 or all ones where the comparison holds: a 32-bit or 16-bit destination for
            // one comparison, a pair of halves (or a 32-bit integer) for a packed one.
            let allowed = if packed {
                matches!(dty, Ty::F16x2 | Ty::Bf16x2 | Ty::U32 | Ty::S32 | Ty::B32)
            } else {
                matches!(
                    dty,
                    Ty::U32 | Ty::S32 | Ty::F32 | Ty::B32 | Ty::F16 | Ty::Bf16 | Ty::U16 | Ty::S16
                )
            };
            if !allowed {
                return Err(unsupported(ins));
            }
            let d = self.dst(&o[0])?;
            Ok(Op::Set {
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
            })
        }
    }
}
