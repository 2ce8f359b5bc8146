//! Video instructions: scalar (`vadd`, `vsub`, `vabsdiff`, `vmin`, `vmax`, `vshl`, `vshr`,
//! `vmad`, `vset`) and SIMD (`vadd2`, `vabsdiff4`, … `vset4`); their arithmetic is
//! [`crate::video`]'s.

use super::*;
use crate::video::{Mad, Part, Secondary, Video, VideoOp};

/// A source or destination operand of a video instruction: the register (or immediate), its
/// part selector and whether it is negated.
struct VideoOperand<'o> {
    value: &'o Operand,
    part: Option<&'o str>,
    negated: bool,
}

fn video_operand(op: &Operand) -> VideoOperand<'_> {
    match op {
        Operand::Neg(inner) => VideoOperand {
            negated: true,
            ..video_operand(inner)
        },
        Operand::Part(_, part) => VideoOperand {
            value: op,
            part: Some(part),
            negated: false,
        },
        _ => VideoOperand {
            value: op,
            part: None,
            negated: false,
        },
    }
}

/// Whether an opcode is a video instruction's.
pub(super) fn is_video(opcode: &str) -> bool {
    matches!(
        opcode,
        "vadd" | "vsub" | "vabsdiff" | "vmin" | "vmax" | "vshl" | "vshr" | "vmad" | "vset"
    ) || opcode.strip_suffix(['2', '4']).is_some_and(|base| {
        matches!(
            base,
            "vadd" | "vsub" | "vavrg" | "vabsdiff" | "vmin" | "vmax" | "vset"
        )
    })
}

impl FnCtx<'_> {
    /// A video operand's register: the register a part selector is on, or the operand itself.
    fn video_reg(&mut self, o: &VideoOperand, dst: bool) -> DResult<Reg> {
        let plain;
        let op = match o.value {
            Operand::Part(name, _) => {
                plain = Operand::Name(name.clone());
                &plain
            }
            other => other,
        };
        if dst {
            self.dst(op)
        } else {
            self.val(op, Ty::B32)
        }
    }

    /// A scalar instruction's source part (`.b0`…`.b3`, `.h0`, `.h1`, or the word).
    fn scalar_part(&self, o: &VideoOperand) -> DResult<Part> {
        match o.part {
            None => Ok(Part::Word),
            Some(p) => Part::parse(p)
                .ok_or_else(|| self.err(format!("`.{p}` is not a scalar video selector"))),
        }
    }

    pub(super) fn sel_video(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let name = ins.opcode.as_str();
        let (base, lanes) = match name.strip_suffix(['2', '4']) {
            Some(b) => (b, if name.ends_with('2') { 2 } else { 4 }),
            None => (name, 1),
        };
        let set = base == "vset";
        let cmp = if set {
            Some(
                m.comparison(true)
                    .ok_or_else(|| self.err(format!("`{name}` needs a comparison")))?,
            )
        } else {
            None
        };
        let shift_mode = if matches!(base, "vshl" | "vshr") {
            match m.any(&["clamp", "wrap"]) {
                Some(mode) => Some(mode == "clamp"),
                None => return Err(self.err(format!("`{name}` needs .clamp or .wrap"))),
            }
        } else {
            None
        };
        let types = m.types();
        let want_types = if set { 2 } else { 3 };
        if types.len() != want_types || !types.iter().all(|t| matches!(t, Ty::U32 | Ty::S32)) {
            return Err(self.err(format!(
                "`{}` needs {want_types} types, each .u32 or .s32",
                ins.full_name()
            )));
        }
        let (signed_d, signed_a, signed_b) = if set {
            (false, types[0].is_signed(), types[1].is_signed())
        } else {
            (
                types[0].is_signed(),
                types[1].is_signed(),
                types[2].is_signed(),
            )
        };
        if shift_mode.is_some() && signed_b {
            return Err(self.err(format!("`{name}`'s shift count is .u32")));
        }
        let sat = m.has("sat");
        let mad = (base == "vmad").then(|| Mad {
            neg_product: false,
            neg_c: false,
            plus_one: m.has("po"),
            shift: match m.any(&["shr7", "shr15"]) {
                Some("shr7") => 7,
                Some("shr15") => 15,
                _ => 0,
            },
        });
        let op = match (base, cmp, shift_mode, mad) {
            (_, Some(c), _, _) => VideoOp::Set(c),
            ("vshl", _, Some(clamp), _) => VideoOp::Shl { clamp },
            ("vshr", _, Some(clamp), _) => VideoOp::Shr { clamp },
            (_, _, _, Some(mad)) if lanes == 1 => VideoOp::Mad(mad),
            ("vadd", ..) => VideoOp::Add,
            ("vsub", ..) => VideoOp::Sub,
            ("vabsdiff", ..) => VideoOp::Absdiff,
            ("vmin", ..) => VideoOp::Min,
            ("vmax", ..) => VideoOp::Max,
            ("vavrg", ..) if lanes > 1 => VideoOp::Avrg,
            _ => return Err(unsupported(ins)),
        };
        let scalar_only = matches!(
            op,
            VideoOp::Shl { .. } | VideoOp::Shr { .. } | VideoOp::Mad(_)
        );
        if scalar_only && lanes > 1 {
            return Err(unsupported(ins));
        }
        let mut v = Video {
            sat,
            ..Video::new(op, lanes, signed_a, signed_b, signed_d)
        };
        let operands = &ins.operands;
        let (d, a, b) = match operands.as_slice() {
            [d, a, b] | [d, a, b, _] => (video_operand(d), video_operand(a), video_operand(b)),
            _ => {
                return Err(self.err(format!(
                    "`{}` expects 3 or 4 operands, found {}",
                    ins.full_name(),
                    operands.len()
                )));
            }
        };
        let c = operands.get(3).map(video_operand);
        if d.negated || (!matches!(op, VideoOp::Mad(_)) && (a.negated || b.negated)) {
            return Err(self.err(format!("`{name}` takes no negated operands")));
        }
        if lanes > 1 {
            let Some(c) = &c else {
                return Err(self.err(format!("`{name}` needs a fourth operand")));
            };
            if c.part.is_some() || c.negated {
                return Err(self.err(format!("`{name}`'s fourth operand takes no selector")));
            }
            v.accumulate = m.has("add");
            if let Some(p) = d.part {
                v.mask = Video::parse_mask(lanes, p)
                    .ok_or_else(|| self.err(format!("`.{p}` is not a mask of `{name}`")))?;
            }
            for (o, sel) in [(&a, &mut v.select_a), (&b, &mut v.select_b)] {
                if let Some(p) = o.part {
                    *sel = Video::parse_select(lanes, p)
                        .ok_or_else(|| self.err(format!("`.{p}` is not a selector of `{name}`")))?;
                }
            }
        } else {
            v.part_a = self.scalar_part(&a)?;
            v.part_b = self.scalar_part(&b)?;
            let secondary = match m.any(&["add", "min", "max"]) {
                Some("add") => Secondary::Add,
                Some("min") => Secondary::Min,
                Some("max") => Secondary::Max,
                _ => Secondary::None,
            };
            let is_mad = matches!(op, VideoOp::Mad(_));
            v.secondary = match (d.part, secondary, c.is_some()) {
                // `d.b1, a, b, c`: the result merged into c.
                (Some(p), Secondary::None, true) if !is_mad => {
                    Secondary::Merge(Part::parse(p).ok_or_else(|| {
                        self.err(format!("`.{p}` is not a scalar video selector"))
                    })?)
                }
                (None, s, true) if s != Secondary::None => s,
                (None, Secondary::None, has_c) if has_c == is_mad => Secondary::None,
                _ => {
                    return Err(self.err(format!(
                        "`{}`: a fourth operand goes with a secondary operation, a destination \
                         selector or vmad",
                        ins.full_name()
                    )));
                }
            };
            if let (VideoOp::Mad(mut mad), Some(c)) = (op, &c) {
                if c.part.is_some() {
                    return Err(self.err("vmad's third source takes no selector"));
                }
                mad.neg_product = a.negated != b.negated;
                mad.neg_c = c.negated;
                if (mad.neg_product && mad.neg_c)
                    || (mad.plus_one && (a.negated || b.negated || c.negated))
                {
                    return Err(self.err("vmad negates either the product or c, and .po neither"));
                }
                v.op = VideoOp::Mad(mad);
            }
        }
        let d = self.video_reg(&d, true)?;
        let a = self.video_reg(&a, false)?;
        let b = self.video_reg(&b, false)?;
        let c = match &c {
            Some(c) => self.video_reg(c, false)?,
            None => a,
        };
        Ok(Op::ITern {
            k: ITern::Video(v),
            ty: Ty::B32,
            d,
            a,
            b,
            c,
        })
    }
}
