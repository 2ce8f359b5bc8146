//! Arithmetic: conversions, add/sub, mul, mad/fma, div/min/max and unary operations.

use super::*;
use crate::video::{Video, VideoOp};

impl FnCtx<'_> {
    pub(super) fn sel_cvt(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let rnd = m.rnd();
        let ftz = m.has("ftz");
        let sat = m.has("sat");
        let relu = m.has("relu");
        if m.has("tf32") {
            // `cvt.rna.tf32.f32` (the only TF32 conversion before sm_90's other roundings).
            if rnd != Rnd::Rna || ftz || sat || relu || m.types() != [Ty::F32] {
                return Err(unsupported(ins));
            }
            let o = self.ops(ins, 2)?;
            return Ok(Op::CvtTf32 {
                d: self.dst(&o[0])?,
                a: self.val(&o[1], Ty::F32)?,
            });
        }
        if let Some(f) = m.any(&["e4m3x2", "e5m2x2"]) {
            return self.sel_cvt_fp8(ins, m, f, rnd, relu);
        }
        let t = m.types();
        if t.len() != 2 {
            return Err(self.err("cvt needs two types"));
        }
        let (dty, sty) = (t[0], t[1]);
        if matches!(dty, Ty::F16x2 | Ty::Bf16x2) {
            if sty != Ty::F32 {
                return Err(unsupported(ins));
            }
            let o = self.ops(ins, 3)?;
            return Ok(Op::CvtPack {
                d: self.dst(&o[0])?,
                a: self.val(&o[1], Ty::F32)?,
                b: self.val(&o[2], Ty::F32)?,
                bf: dty == Ty::Bf16x2,
                rnd,
                relu,
            });
        }
        if relu
            || m.has("satfinite")
            || dty == Ty::Pred
            || sty == Ty::Pred
            || dty == Ty::B128
            || matches!(sty, Ty::F16x2 | Ty::Bf16x2)
        {
            return Err(unsupported(ins));
        }
        let o = self.ops(ins, 2)?;
        let d = self.dst(&o[0])?;
        let a = self.val(&o[1], sty)?;
        Ok(Op::Cvt {
            d,
            a,
            dty,
            sty,
            rnd,
            sat,
            ftz,
        })
    }

    /// `cvt` to or from a pair of FP8 values in format `f` (`e4m3x2` or `e5m2x2`): from two
    /// `.f32` or an `.f16x2` (`.rn.satfinite`), or to an `.f16x2` (`.rn`).
    fn sel_cvt_fp8(
        &mut self,
        ins: &Instr,
        m: &mut Mods,
        f: &str,
        rnd: Rnd,
        relu: bool,
    ) -> DResult<Op> {
        let format = if f == "e4m3x2" {
            float::Fp8::E4M3
        } else {
            float::Fp8::E5M2
        };
        let satfinite = m.has("satfinite");
        let t = m.types();
        // Which comes first in the name, the FP8 pair or the other type, says which is the
        // destination.
        let at = |name: &str| ins.mods.iter().position(|x| x == name);
        let (Some(fp8_at), [other]) = (at(f), t.as_slice()) else {
            return Err(unsupported(ins));
        };
        let other_at = at(match other {
            Ty::F32 => "f32",
            Ty::F16x2 => "f16x2",
            _ => return Err(unsupported(ins)),
        })
        .unwrap_or(0);
        let to_fp8 = fp8_at < other_at;
        let kind = match (to_fp8, other) {
            (true, Ty::F32) => Fp8Cvt::FromF32,
            (true, _) => Fp8Cvt::FromF16x2,
            (false, Ty::F16x2) => Fp8Cvt::ToF16x2,
            _ => return Err(unsupported(ins)),
        };
        if rnd != Rnd::Rn || satfinite != to_fp8 {
            return Err(unsupported(ins));
        }
        let o = self.ops(ins, if kind == Fp8Cvt::FromF32 { 3 } else { 2 })?;
        Ok(Op::CvtFp8 {
            kind,
            format,
            relu,
            d: self.dst(&o[0])?,
            a: self.val(
                &o[1],
                if kind == Fp8Cvt::FromF32 {
                    Ty::F32
                } else {
                    Ty::B32
                },
            )?,
            b: match o.get(2) {
                Some(b) => self.val(b, Ty::F32)?,
                None => NONE,
            },
        })
    }

    pub(super) fn float_mods(&self, m: &mut Mods) -> (Rnd, bool, bool) {
        (m.rnd(), m.has("ftz"), m.has("sat"))
    }

    pub(super) fn sel_addsub(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let (rnd, ftz, sat) = self.float_mods(m);
        let cc = m.has("cc");
        let ty = self.one_type(ins, m)?;
        let o = self.ops(ins, 3)?;
        let d = self.dst(&o[0])?;
        let a = self.val(&o[1], ty)?;
        let b = self.val(&o[2], ty)?;
        let sub = ins.opcode.starts_with("sub");
        if ty.is_float() {
            if cc || ins.opcode.ends_with('c') {
                return Err(unsupported(ins));
            }
            let k = if sub { FBin::Sub } else { FBin::Add };
            return Ok(Op::FBin {
                k,
                ty,
                rnd,
                ftz,
                sat,
                d,
                a,
                b,
            });
        }
        if !ty.is_int() {
            return Err(unsupported(ins));
        }
        let cin = ins.opcode.ends_with('c');
        let k = if cc || cin {
            if ty.bytes() < 4 {
                return Err(unsupported(ins));
            }
            IBin::AddCarry { sub, cin, cout: cc }
        } else if sat {
            if ty != Ty::S32 {
                return Err(unsupported(ins));
            }
            if sub { IBin::SubSat } else { IBin::AddSat }
        } else if sub {
            IBin::Sub
        } else {
            IBin::Add
        };
        Ok(Op::IBin { k, ty, d, a, b })
    }

    pub(super) fn sel_mul(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let (rnd, ftz, sat) = self.float_mods(m);
        let mode = m.any(&["lo", "hi", "wide"]);
        let ty = self.one_type(ins, m)?;
        let o = self.ops(ins, 3)?;
        let d = self.dst(&o[0])?;
        let a = self.val(&o[1], ty)?;
        let b = self.val(&o[2], ty)?;
        if ty.is_float() {
            return Ok(Op::FBin {
                k: FBin::Mul,
                ty,
                rnd,
                ftz,
                sat,
                d,
                a,
                b,
            });
        }
        if !ty.is_int() || sat {
            return Err(unsupported(ins));
        }
        let k = if ins.opcode == "mul24" {
            if ty.bytes() != 4 {
                return Err(unsupported(ins));
            }
            if mode == Some("hi") {
                IBin::Mul24Hi
            } else {
                IBin::Mul24Lo
            }
        } else {
            match mode {
                Some("hi") => IBin::MulHi,
                Some("wide") => {
                    if ty.bytes() == 8 {
                        return Err(unsupported(ins));
                    }
                    IBin::MulWide
                }
                _ => IBin::MulLo,
            }
        };
        Ok(Op::IBin { k, ty, d, a, b })
    }

    pub(super) fn sel_mad(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let (rnd, ftz, sat) = self.float_mods(m);
        let relu = m.has("relu");
        let cc = m.has("cc");
        let mode = m.any(&["lo", "hi", "wide"]);
        let ty = self.one_type(ins, m)?;
        let o = self.ops(ins, 4)?;
        let d = self.dst(&o[0])?;
        let a = self.val(&o[1], ty)?;
        let b = self.val(&o[2], ty)?;
        if ty.is_float() {
            if ins.opcode != "fma" && ins.opcode != "mad" {
                return Err(unsupported(ins));
            }
            let c = self.val(&o[3], ty)?;
            return Ok(Op::Fma {
                ty,
                rnd,
                ftz,
                sat,
                relu,
                d,
                a,
                b,
                c,
            });
        }
        if !ty.is_int() || ins.opcode == "fma" || relu {
            return Err(unsupported(ins));
        }
        let cty = if mode == Some("wide") {
            match ty {
                Ty::U16 => Ty::U32,
                Ty::S16 => Ty::S32,
                Ty::U32 => Ty::U64,
                Ty::S32 => Ty::S64,
                _ => return Err(unsupported(ins)),
            }
        } else {
            ty
        };
        let c = self.val(&o[3], cty)?;
        let k = if ins.opcode == "mad24" {
            if ty.bytes() != 4 {
                return Err(unsupported(ins));
            }
            if mode == Some("hi") {
                ITern::Mad24Hi
            } else {
                ITern::Mad24Lo
            }
        } else if cc || ins.opcode == "madc" {
            if ty.bytes() < 4 {
                return Err(unsupported(ins));
            }
            ITern::MadCarry {
                hi: mode == Some("hi"),
                cin: ins.opcode == "madc",
                cout: cc,
            }
        } else {
            match mode {
                Some("hi") if sat => {
                    if ty != Ty::S32 {
                        return Err(unsupported(ins));
                    }
                    ITern::MadLoSat
                }
                Some("hi") => ITern::MadHi,
                Some("wide") => ITern::MadWide,
                _ => ITern::MadLo,
            }
        };
        Ok(Op::ITern { k, ty, d, a, b, c })
    }

    pub(super) fn sel_divminmax(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let (rnd, ftz, sat) = self.float_mods(m);
        let nan = m.has("NaN");
        if m.has("xorsign") {
            return Err(unsupported(ins));
        }
        let relu = m.has("relu");
        if let Some(op) = self.sel_int_minmax(ins, m, relu)? {
            return Ok(op);
        }
        let ty = self.one_type(ins, m)?;
        let o = self.ops(ins, 3)?;
        let d = self.dst(&o[0])?;
        let a = self.val(&o[1], ty)?;
        let b = self.val(&o[2], ty)?;
        if ty.is_float() {
            let k = match ins.opcode.as_str() {
                "div" => FBin::Div,
                "min" if nan => FBin::MinNaN,
                "max" if nan => FBin::MaxNaN,
                "min" => FBin::Min,
                "max" => FBin::Max,
                "copysign" => FBin::Copysign,
                _ => return Err(unsupported(ins)),
            };
            if matches!(ty, Ty::F16 | Ty::F16x2 | Ty::Bf16 | Ty::Bf16x2) && k == FBin::Div {
                return Err(unsupported(ins));
            }
            return Ok(Op::FBin {
                k,
                ty,
                rnd,
                ftz,
                sat,
                d,
                a,
                b,
            });
        }
        if !ty.is_int() || nan || sat {
            return Err(unsupported(ins));
        }
        let k = match ins.opcode.as_str() {
            "div" => IBin::Div,
            "rem" => IBin::Rem,
            "min" => IBin::Min,
            "max" => IBin::Max,
            _ => return Err(unsupported(ins)),
        };
        Ok(Op::IBin { k, ty, d, a, b })
    }

    /// `min`/`max` on two packed half-words (`.s16x2`, `.u16x2`, PTX 8.0) and `.relu` (negative
    /// results become 0; `.s16x2` and `.s32`) as the video instructions they equal: `vmin2`/
    /// `vmax2` on whole words, and `.relu` as saturation to an unsigned destination. `None` for
    /// the other forms.
    fn sel_int_minmax(&mut self, ins: &Instr, m: &mut Mods, relu: bool) -> DResult<Option<Op>> {
        let op = match ins.opcode.as_str() {
            "min" => VideoOp::Min,
            "max" => VideoOp::Max,
            _ if relu => return Err(unsupported(ins)),
            _ => return Ok(None),
        };
        let (lanes, signed) = match m.any(&["s16x2", "u16x2"]) {
            Some(t) => (2, t == "s16x2"),
            None if relu && m.has("s32") => (1, true),
            None if relu => return Err(unsupported(ins)),
            None => return Ok(None),
        };
        if relu && !signed {
            return Err(self.err(format!("`{}`: .relu needs a signed type", ins.full_name())));
        }
        let o = self.ops(ins, 3)?;
        let d = self.dst(&o[0])?;
        let a = self.val(&o[1], Ty::B32)?;
        let b = self.val(&o[2], Ty::B32)?;
        let v = Video {
            sat: relu,
            ..Video::new(op, lanes, signed, signed, signed && !relu)
        };
        Ok(Some(Op::ITern {
            k: ITern::Video(v),
            ty: Ty::B32,
            d,
            a,
            b,
            c: a,
        }))
    }

    pub(super) fn sel_unary(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let (rnd, ftz, sat) = self.float_mods(m);
        let ty = self.one_type(ins, m)?;
        let o = self.ops(ins, 2)?;
        let d = self.dst(&o[0])?;
        let a = self.val(&o[1], ty)?;
        if ty.is_float() {
            let k = match ins.opcode.as_str() {
                "abs" => FUn::Abs,
                "neg" => FUn::Neg,
                "sqrt" => FUn::Sqrt,
                "rsqrt" => FUn::Rsqrt,
                "rcp" => FUn::Rcp,
                "sin" => FUn::Sin,
                "cos" => FUn::Cos,
                "lg2" => FUn::Lg2,
                "ex2" => FUn::Ex2,
                "tanh" => FUn::Tanh,
                _ => return Err(unsupported(ins)),
            };
            return Ok(Op::FUn {
                k,
                ty,
                rnd,
                ftz,
                sat,
                d,
                a,
            });
        }
        if !ty.is_int() {
            return Err(unsupported(ins));
        }
        let k = match ins.opcode.as_str() {
            "abs" => IUn::Abs,
            "neg" => IUn::Neg,
            _ => return Err(unsupported(ins)),
        };
        Ok(Op::IUn { k, ty, d, a })
    }
}
