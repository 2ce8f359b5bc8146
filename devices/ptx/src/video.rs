//! PTX's video instructions: the scalar ones (`vadd`, `vsub`, `vabsdiff`, `vmin`, `vmax`,
//! `vshl`, `vshr`, `vmad`, `vset`) and the SIMD ones on two half-words or four bytes
//! (`vadd2`/`4`, `vsub2`/`4`, `vavrg2`/`4`, `vabsdiff2`/`4`, `vmin2`/`4`, `vmax2`/`4`,
//! `vset2`/`4`), as the PTX ISA defines them. nvcc and NVRTC write `vabsdiff4` for CUDA's
//! `__vabsdiffu4` and `__vsadu4`; image code writes the others in inline assembly.

use crate::ir::Cmp;

/// The arithmetic of a video instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VideoOp {
    Add,
    Sub,
    Absdiff,
    Min,
    Max,
    /// SIMD only: the rounded average.
    Avrg,
    /// Scalar only; `clamp`: shift counts above 32 are 32 (else taken modulo 32).
    Shl {
        clamp: bool,
    },
    Shr {
        clamp: bool,
    },
    /// Scalar only.
    Mad(Mad),
    /// 1 where the comparison (`eq`, `ne`, `lt`, `le`, `gt`, `ge`) holds, else 0.
    Set(Cmp),
}

/// `vmad`'s options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mad {
    /// The product is negated (exactly one of `-a`, `-b`).
    pub neg_product: bool,
    /// `-c`.
    pub neg_c: bool,
    /// `.po`: plus one.
    pub plus_one: bool,
    /// `.shr7` / `.shr15`: the result shifted right.
    pub shift: u8,
}

/// What a scalar instruction does with its result and `c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Secondary {
    None,
    Add,
    Min,
    Max,
    /// `d.dsel`: the result's low byte or half-word written into that part of `c`.
    Merge(Part),
}

/// A part of a 32-bit operand a scalar instruction reads (`.b0`…`.b3`, `.h0`, `.h1`) or,
/// without a selector, the whole word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    Word,
    Byte(u8),
    Half(u8),
}

impl Part {
    /// Parses a selector (`b0`…`b3`, `h0`, `h1`).
    pub(crate) fn parse(s: &str) -> Option<Part> {
        match s {
            "b0" | "b1" | "b2" | "b3" => Some(Part::Byte(s.as_bytes()[1] - b'0')),
            "h0" | "h1" => Some(Part::Half(s.as_bytes()[1] - b'0')),
            _ => None,
        }
    }

    /// The part of `x`, sign- or zero-extended.
    fn extract(self, x: u32, signed: bool) -> i64 {
        let (bits, shift) = match self {
            Part::Word => (32, 0),
            Part::Byte(k) => (8, 8 * u32::from(k)),
            Part::Half(k) => (16, 16 * u32::from(k)),
        };
        extend(x >> shift, bits, signed)
    }

    /// The range of values the part holds.
    fn range(self, signed: bool) -> (i64, i64) {
        let bits = match self {
            Part::Word => 32,
            Part::Byte(_) => 8,
            Part::Half(_) => 16,
        };
        range(bits, signed)
    }
}

/// The low `bits` of `x`, sign- or zero-extended.
fn extend(x: u32, bits: u32, signed: bool) -> i64 {
    let v = u64::from(x) & ((1u64 << bits) - 1);
    if signed && v >> (bits - 1) & 1 == 1 {
        v as i64 - (1i64 << bits)
    } else {
        v as i64
    }
}

/// The smallest and largest value of a `bits`-wide integer.
fn range(bits: u32, signed: bool) -> (i64, i64) {
    if signed {
        (-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1)
    } else {
        (0, (1i64 << bits) - 1)
    }
}

/// A decoded video instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Video {
    pub op: VideoOp,
    /// 1 (scalar), 2 (half-words) or 4 (bytes).
    pub lanes: u8,
    /// Whether `a`, `b` and `d` are signed (`.s32`).
    pub signed_a: bool,
    pub signed_b: bool,
    pub signed_d: bool,
    /// `.sat`: results clamped to the destination's range.
    pub sat: bool,
    /// Scalar: what is done with `c`.
    pub secondary: Secondary,
    /// Scalar: the parts of `a` and `b` read.
    pub part_a: Part,
    pub part_b: Part,
    /// SIMD: for each lane, the half-word (0–3) or byte (0–7) of `{b, a}` it reads, three bits
    /// a lane, lane 0 lowest.
    pub select_a: u16,
    pub select_b: u16,
    /// SIMD: the lanes written (bit per lane); `.add`: the written lanes' sum added to `c`
    /// instead.
    pub mask: u8,
    pub accumulate: bool,
}

/// Three bits per lane of a SIMD selector.
const SELECT_BITS: u32 = 3;

impl Video {
    /// `op` on `lanes` lanes with operands of the given signedness: whole words, every lane
    /// in order, nothing done with `c` (the instruction's modifiers and operands add the rest).
    pub(crate) fn new(
        op: VideoOp,
        lanes: u8,
        signed_a: bool,
        signed_b: bool,
        signed_d: bool,
    ) -> Video {
        Video {
            op,
            lanes,
            signed_a,
            signed_b,
            signed_d,
            sat: false,
            secondary: Secondary::None,
            part_a: Part::Word,
            part_b: Part::Word,
            select_a: Video::in_order(lanes, 0),
            select_b: Video::in_order(lanes, lanes),
            mask: ((1u16 << lanes) - 1) as u8,
            accumulate: false,
        }
    }

    /// The selector of a SIMD instruction that reads lanes `first`, `first + 1`, … in order
    /// (`.h10`/`.b3210` of `a`, `.h32`/`.b7654` of `b`).
    pub(crate) fn in_order(lanes: u8, first: u8) -> u16 {
        (0..lanes).fold(0, |s, i| {
            s | u16::from(first + i) << (SELECT_BITS * u32::from(i))
        })
    }

    /// Parses a SIMD selector: `hxy` (two lanes, digits 0–3) or `bxyzw` (four lanes, digits
    /// 0–7), the highest lane's source first.
    pub(crate) fn parse_select(lanes: u8, s: &str) -> Option<u16> {
        let (kind, max) = if lanes == 2 {
            (b'h', b'3')
        } else {
            (b'b', b'7')
        };
        let digits = s.as_bytes().strip_prefix(&[kind])?;
        if digits.len() != usize::from(lanes) || !digits.iter().all(|d| (b'0'..=max).contains(d)) {
            return None;
        }
        Some(digits.iter().rev().enumerate().fold(0, |sel, (i, d)| {
            sel | u16::from(d - b'0') << (SELECT_BITS * i as u32)
        }))
    }

    /// Parses a SIMD mask: `h0`, `h1`, `h10` or the bytes written (`b0` … `b3210`), digits
    /// descending.
    pub(crate) fn parse_mask(lanes: u8, s: &str) -> Option<u8> {
        let (kind, max) = if lanes == 2 {
            (b'h', b'1')
        } else {
            (b'b', b'3')
        };
        let digits = s.as_bytes().strip_prefix(&[kind])?;
        if digits.is_empty() || digits.len() > usize::from(lanes) {
            return None;
        }
        let mut mask = 0u8;
        let mut last = u8::MAX;
        for &d in digits {
            if !(b'0'..=max).contains(&d) || d >= last {
                return None;
            }
            last = d;
            mask |= 1 << (d - b'0');
        }
        Some(mask)
    }

    /// The instruction's result for sources `a`, `b` and `c`.
    pub(crate) fn eval(&self, a: u32, b: u32, c: u32) -> u32 {
        if self.lanes == 1 {
            self.scalar(a, b, c)
        } else {
            self.simd(a, b, c)
        }
    }

    fn scalar(&self, a: u32, b: u32, c: u32) -> u32 {
        let ta = self.part_a.extract(a, self.signed_a);
        let tb = self.part_b.extract(b, self.signed_b);
        let tmp: i128 = match self.op {
            VideoOp::Mad(m) => return self.mad(m, ta, tb, c),
            VideoOp::Shl { clamp } => i128::from(ta) << shift_count(tb, clamp),
            VideoOp::Shr { clamp } => i128::from(ta) >> shift_count(tb, clamp),
            op => i128::from(lane_op(op, ta, tb)),
        };
        let tmp = if self.sat {
            let part = match self.secondary {
                Secondary::Merge(p) => p,
                _ => Part::Word,
            };
            let (lo, hi) = part.range(self.signed_d);
            tmp.clamp(i128::from(lo), i128::from(hi))
        } else {
            tmp
        };
        let tc = i128::from(extend(c, 32, self.signed_d));
        match self.secondary {
            Secondary::None => tmp as u32,
            Secondary::Add => (tmp + tc) as u32,
            Secondary::Min => tmp.min(tc) as u32,
            Secondary::Max => tmp.max(tc) as u32,
            Secondary::Merge(part) => {
                let (mask, shift) = match part {
                    Part::Word => (u32::MAX, 0),
                    Part::Byte(k) => (0xff, 8 * u32::from(k)),
                    Part::Half(k) => (0xffff, 16 * u32::from(k)),
                };
                (c & !(mask << shift)) | ((tmp as u32 & mask) << shift)
            }
        }
    }

    /// `vmad`: `a * b + c` in full precision, with its negations, plus-one and shift.
    fn mad(&self, m: Mad, ta: i64, tb: i64, c: u32) -> u32 {
        let signed = self.signed_a || self.signed_b || m.neg_product || m.neg_c;
        let mut product = i128::from(ta) * i128::from(tb);
        let mut c = c;
        let mut lsb = 0;
        if m.plus_one {
            lsb = 1;
        } else if m.neg_product {
            product = !product;
            lsb = 1;
        } else if m.neg_c {
            c = !c;
            lsb = 1;
        }
        let tc = i128::from(extend(c, 32, signed));
        let sum = (product + tc + lsb) >> m.shift;
        let result = sum as u64 as i64;
        if self.sat {
            let (lo, hi) = range(32, signed);
            result.clamp(lo, hi) as u32
        } else {
            result as u32
        }
    }

    fn simd(&self, a: u32, b: u32, c: u32) -> u32 {
        let lanes = u32::from(self.lanes);
        let bits = 32 / lanes;
        let pair = u64::from(b) << 32 | u64::from(a);
        let element = |select: u16, i: u32, signed: bool| {
            let k = u32::from(select >> (SELECT_BITS * i)) & 0b111;
            extend((pair >> (bits * k)) as u32, bits, signed)
        };
        let (lo, hi) = range(bits, self.signed_d);
        let lane_mask = (1u32 << bits) - 1;
        let mut d = c;
        for i in 0..lanes {
            if self.mask >> i & 1 == 0 {
                continue;
            }
            let va = element(self.select_a, i, self.signed_a);
            let vb = element(self.select_b, i, self.signed_b);
            let mut t = lane_op(self.op, va, vb);
            if self.sat {
                t = t.clamp(lo, hi);
            }
            if self.accumulate {
                d = d.wrapping_add(t as u32);
            } else {
                d = (d & !(lane_mask << (bits * i))) | ((t as u32 & lane_mask) << (bits * i));
            }
        }
        d
    }
}

/// The shift count of `vshl`/`vshr`: clamped to 32, or modulo 32.
fn shift_count(tb: i64, clamp: bool) -> u32 {
    let tb = tb as u32;
    if clamp { tb.min(32) } else { tb & 31 }
}

/// One lane's arithmetic (or a scalar instruction's, shifts and `vmad` aside).
fn lane_op(op: VideoOp, a: i64, b: i64) -> i64 {
    match op {
        VideoOp::Add => a + b,
        VideoOp::Sub => a - b,
        VideoOp::Absdiff => (a - b).abs(),
        VideoOp::Min => a.min(b),
        VideoOp::Max => a.max(b),
        VideoOp::Avrg => {
            let s = a + b;
            if s >= 0 { (s + 1) >> 1 } else { s >> 1 }
        }
        VideoOp::Set(cmp) => i64::from(match cmp {
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
            Cmp::Lt => a < b,
            Cmp::Le => a <= b,
            Cmp::Gt => a > b,
            Cmp::Ge => a >= b,
            // The decoder accepts only the six above.
            _ => false,
        }),
        // Decoded only as scalar instructions, which handle them themselves.
        VideoOp::Shl { .. } | VideoOp::Shr { .. } | VideoOp::Mad(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn simd(op: VideoOp, lanes: u8, signed: bool) -> Video {
        Video::new(op, lanes, signed, signed, signed)
    }

    fn scalar(op: VideoOp, signed: bool) -> Video {
        simd(op, 1, signed)
    }

    fn bytes(x: u32) -> [i64; 4] {
        x.to_le_bytes().map(i64::from)
    }

    #[test]
    fn selectors_and_masks_parse_as_the_isa_writes_them() {
        assert_eq!(Video::parse_select(4, "b3210"), Some(Video::in_order(4, 0)));
        assert_eq!(Video::parse_select(4, "b7654"), Some(Video::in_order(4, 4)));
        assert_eq!(Video::parse_select(2, "h32"), Some(Video::in_order(2, 2)));
        // `.b0123`: lane 0 reads byte 3.
        assert_eq!(Video::parse_select(4, "b0123"), Some(0b000_001_010_011));
        assert_eq!(Video::parse_select(4, "b8000"), None);
        assert_eq!(Video::parse_select(2, "h4"), None);
        assert_eq!(Video::parse_mask(4, "b3210"), Some(0b1111));
        assert_eq!(Video::parse_mask(4, "b31"), Some(0b1010));
        assert_eq!(Video::parse_mask(4, "b13"), None, "digits descend");
        assert_eq!(Video::parse_mask(2, "h1"), Some(0b10));
        assert_eq!(Video::parse_mask(2, "h2"), None);
        assert_eq!(Part::parse("b2"), Some(Part::Byte(2)));
        assert_eq!(Part::parse("h1"), Some(Part::Half(1)));
        assert_eq!(Part::parse("h2"), None);
    }

    #[test]
    fn sum_of_absolute_differences_is_cudas_vsadu4() {
        let v = Video {
            accumulate: true,
            ..simd(VideoOp::Absdiff, 4, false)
        };
        let mut seed = 0x1234_5678u32;
        for _ in 0..1000 {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let (a, b, c) = (seed, seed.rotate_left(13) ^ 0x5a5a_a5a5, seed >> 20);
            let want = (0..4)
                .map(|i| (bytes(a)[i] - bytes(b)[i]).abs())
                .sum::<i64>() as u32
                + c;
            assert_eq!(v.eval(a, b, c), want, "{a:08x} {b:08x}");
            // Without `.add`: each byte's difference (`__vabsdiffu4`).
            let per_byte = simd(VideoOp::Absdiff, 4, false).eval(a, b, c);
            let want: Vec<u8> = (0..4)
                .map(|i| (bytes(a)[i] - bytes(b)[i]).unsigned_abs() as u8)
                .collect();
            assert_eq!(per_byte.to_le_bytes().to_vec(), want);
        }
    }

    #[test]
    fn simd_lanes_saturate_average_select_and_merge() {
        // Signed bytes: 0x7f + 0x01 saturates to 0x7f; 0x80 - 0x01 to 0x80.
        let add = Video {
            sat: true,
            ..simd(VideoOp::Add, 4, true)
        };
        assert_eq!(add.eval(0x807f_0102, 0x0101_0304, 0), 0x817f_0406);
        let sub = Video {
            sat: true,
            ..simd(VideoOp::Sub, 4, true)
        };
        assert_eq!(sub.eval(0x8000_0000, 0x0100_0000, 0) >> 24, 0x80);
        // Unsigned half-words: wrapping without `.sat`, clamping with it.
        let add2 = simd(VideoOp::Add, 2, false);
        assert_eq!(add2.eval(0xffff_0001, 0x0002_0002, 0), 0x0001_0003);
        assert_eq!(
            Video { sat: true, ..add2 }.eval(0xffff_0001, 0x0002_0002, 0),
            0xffff_0003
        );
        // The average rounds half up for non-negative sums and down for negative ones.
        let avg = simd(VideoOp::Avrg, 4, true);
        assert_eq!(avg.eval(0x01ff_03fd, 0x02fe_0000, 0), 0x02fe_02fe);
        // Masked lanes keep `c`'s bytes; selectors read `{b, a}` in any order.
        let merged = Video {
            mask: 0b0101,
            select_a: Video::parse_select(4, "b4567").unwrap(),
            ..simd(VideoOp::Max, 4, false)
        };
        // Lane 0 reads byte 7 (b's top), lane 2 byte 5; b's bytes are compared with themselves.
        assert_eq!(merged.eval(0, 0x4433_2211, 0xaabb_ccdd), 0xaa33_cc44);
        // vset4: 1 per lane where a > b.
        let gt = simd(VideoOp::Set(Cmp::Gt), 4, false);
        assert_eq!(gt.eval(0x0502_0900, 0x0403_0800, 0), 0x0100_0100);
    }

    #[test]
    fn scalar_parts_saturation_secondary_ops_and_merge() {
        let add = scalar(VideoOp::Add, false);
        assert_eq!(add.eval(0xffff_ffff, 2, 0), 1, "wraps");
        assert_eq!(Video { sat: true, ..add }.eval(0xffff_ffff, 2, 0), u32::MAX);
        // Bytes and half-words, sign-extended for .s32.
        let sub = Video {
            part_a: Part::Byte(1),
            part_b: Part::Half(1),
            ..scalar(VideoOp::Sub, true)
        };
        assert_eq!(sub.eval(0x0000_ff00, 0x0002_0000, 0) as i32, -3);
        // Absolute difference then the smaller of it and c.
        let absmin = Video {
            secondary: Secondary::Min,
            ..scalar(VideoOp::Absdiff, true)
        };
        assert_eq!(absmin.eval(5, (-7i32) as u32, 100), 12);
        assert_eq!(absmin.eval(5, (-7i32) as u32, 10), 10);
        // Merged into c's byte 2, saturated to a byte.
        let merge = Video {
            sat: true,
            secondary: Secondary::Merge(Part::Byte(2)),
            ..scalar(VideoOp::Add, false)
        };
        assert_eq!(merge.eval(200, 100, 0x1122_3344), 0x11ff_3344);
        // Shifts: clamped counts reach 32, wrapped ones are taken modulo 32.
        let shl = scalar(VideoOp::Shl { clamp: true }, false);
        assert_eq!(Video { sat: true, ..shl }.eval(1, 40, 0), u32::MAX);
        assert_eq!(
            scalar(VideoOp::Shl { clamp: false }, false).eval(1, 33, 0),
            2
        );
        assert_eq!(
            scalar(VideoOp::Shr { clamp: true }, true).eval(0x8000_0000, 40, 0),
            u32::MAX
        );
        // vset with an added c.
        let set = Video {
            secondary: Secondary::Add,
            ..scalar(VideoOp::Set(Cmp::Le), true)
        };
        assert_eq!(set.eval((-1i32) as u32, 0, 41), 42);
    }

    #[test]
    fn mad_negates_adds_one_and_shifts() {
        let mad = |m: Mad, signed: bool| scalar(VideoOp::Mad(m), signed);
        let plain = Mad {
            neg_product: false,
            neg_c: false,
            plus_one: false,
            shift: 0,
        };
        assert_eq!(mad(plain, false).eval(7, 6, 100), 142);
        let neg = Mad {
            neg_product: true,
            ..plain
        };
        assert_eq!(mad(neg, false).eval(7, 6, 100), 58);
        let neg_c = Mad {
            neg_c: true,
            ..plain
        };
        assert_eq!(mad(neg_c, false).eval(7, 6, 100) as i32, -58);
        let po = Mad {
            plus_one: true,
            shift: 7,
            ..plain
        };
        assert_eq!(mad(po, false).eval(200, 200, 127), (40000 + 127 + 1) >> 7);
        let sat = Video {
            sat: true,
            ..mad(plain, true)
        };
        assert_eq!(sat.eval(0x7fff_ffff, 4, 0), 0x7fff_ffff);
    }
}
