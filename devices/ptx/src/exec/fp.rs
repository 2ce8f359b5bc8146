//! Comparisons, floating-point arithmetic (f16, bf16, f32, f64) and conversions on a warp's lanes.

use super::*;

/// Per-lane comparison results as a lane mask.
pub(super) fn compare(regs: &[[u64; 32]], cmp: Cmp, ty: Ty, ftz: bool, a: Reg, b: Reg) -> u32 {
    let (av, bv) = (&regs[a as usize], &regs[b as usize]);
    let mut bits = 0u32;
    if ty.is_float() {
        for l in 0..32 {
            let (x, y) = match ty {
                Ty::F64 => (f64::from_bits(av[l]), f64::from_bits(bv[l])),
                Ty::F16 => (
                    float::f16_to_f64(av[l] as u16),
                    float::f16_to_f64(bv[l] as u16),
                ),
                Ty::Bf16 => (
                    float::bf16_to_f64(av[l] as u16),
                    float::bf16_to_f64(bv[l] as u16),
                ),
                _ => {
                    let (mut x, mut y) =
                        (f32::from_bits(av[l] as u32), f32::from_bits(bv[l] as u32));
                    if ftz {
                        x = ftz32(x);
                        y = ftz32(y);
                    }
                    (f64::from(x), f64::from(y))
                }
            };
            bits |= u32::from(float_cmp(cmp, x, y)) << l;
        }
        return bits;
    }
    let nbits = ty.bits();
    let signed = ty.is_signed();
    for l in 0..32 {
        let (x, y) = (av[l] & lowmask(nbits), bv[l] & lowmask(nbits));
        let (sx, sy) = (sext_bits(x, nbits) as i64, sext_bits(y, nbits) as i64);
        let r = match cmp {
            Cmp::Eq => x == y,
            Cmp::Ne => x != y,
            Cmp::Lt => {
                if signed {
                    sx < sy
                } else {
                    x < y
                }
            }
            Cmp::Le => {
                if signed {
                    sx <= sy
                } else {
                    x <= y
                }
            }
            Cmp::Gt => {
                if signed {
                    sx > sy
                } else {
                    x > y
                }
            }
            Cmp::Ge => {
                if signed {
                    sx >= sy
                } else {
                    x >= y
                }
            }
            Cmp::Lo => x < y,
            Cmp::Ls => x <= y,
            Cmp::Hi => x > y,
            Cmp::Hs => x >= y,
            _ => false,
        };
        bits |= u32::from(r) << l;
    }
    bits
}

/// A floating-point comparison (ordered or unordered).
fn float_cmp(cmp: Cmp, x: f64, y: f64) -> bool {
    let unord = x.is_nan() || y.is_nan();
    match cmp {
        Cmp::Eq => !unord && x == y,
        Cmp::Ne => !unord && x != y,
        Cmp::Lt | Cmp::Lo => !unord && x < y,
        Cmp::Le | Cmp::Ls => !unord && x <= y,
        Cmp::Gt | Cmp::Hi => !unord && x > y,
        Cmp::Ge | Cmp::Hs => !unord && x >= y,
        Cmp::Equ => unord || x == y,
        Cmp::Neu => unord || x != y,
        Cmp::Ltu => unord || x < y,
        Cmp::Leu => unord || x <= y,
        Cmp::Gtu => unord || x > y,
        Cmp::Geu => unord || x >= y,
        Cmp::Num => !unord,
        Cmp::Nan => unord,
    }
}

/// What `set` writes where the comparison holds (per half for packed destinations): 1.0 of a
/// floating-point destination, else all ones.
pub(super) fn set_true(dty: Ty) -> u64 {
    match dty {
        Ty::F32 => u64::from(1.0f32.to_bits()),
        Ty::F16 | Ty::F16x2 => u64::from(float::F16_ONE),
        Ty::Bf16 | Ty::Bf16x2 => u64::from(float::BF16_ONE),
        Ty::U16 | Ty::S16 | Ty::B16 => 0xffff,
        _ => 0xffff_ffff,
    }
}

/// `setp`/`set` on `.f16x2` or `.bf16x2` operands: the lanes where the low halves compare true,
/// and those where the high halves do.
pub(super) fn compare_halves(regs: &[[u64; 32]], cmp: Cmp, ty: Ty, a: Reg, b: Reg) -> (u32, u32) {
    let (av, bv) = (&regs[a as usize], &regs[b as usize]);
    let dec = |v: u64| {
        if ty == Ty::Bf16x2 {
            float::bf16_to_f64(v as u16)
        } else {
            float::f16_to_f64(v as u16)
        }
    };
    let (mut lo, mut hi) = (0u32, 0u32);
    for l in 0..32 {
        lo |= u32::from(float_cmp(cmp, dec(av[l]), dec(bv[l]))) << l;
        hi |= u32::from(float_cmp(cmp, dec(av[l] >> 16), dec(bv[l] >> 16))) << l;
    }
    (lo, hi)
}

/// Applies a binary f32 operation lane-wise to 16-bit halves (f16 / bf16), computing in f64.
pub(super) fn half_op(x: u64, y: u64, bf: bool, rnd: Rnd, f: impl Fn(f64, f64) -> f64) -> u64 {
    let dec = |v: u16| {
        if bf {
            float::bf16_to_f64(v)
        } else {
            float::f16_to_f64(v)
        }
    };
    let r = f(dec(x as u16), dec(y as u16));
    let rnd = if rnd == Rnd::Default { Rnd::Rn } else { rnd };
    u64::from(if bf {
        float::f64_to_bf16(r, 0, rnd)
    } else {
        float::f64_to_f16(r, 0, rnd)
    })
}

pub(super) fn f64_op(k: FBin, x: f64, y: f64, rnd: Rnd) -> f64 {
    match k {
        FBin::Add => float::add_f64(x, y, rnd),
        FBin::Sub => float::add_f64(x, -y, rnd),
        FBin::Mul => float::mul_f64(x, y, rnd),
        FBin::Div => float::div_f64(x, y, rnd),
        FBin::Min => float::fmin(x, y, x.is_nan(), y.is_nan(), x.is_sign_negative()),
        FBin::Max => float::fmax(x, y, x.is_nan(), y.is_nan(), x.is_sign_negative()),
        FBin::MinNaN => {
            if x.is_nan() || y.is_nan() {
                f64::NAN
            } else {
                float::fmin(x, y, false, false, x.is_sign_negative())
            }
        }
        FBin::MaxNaN => {
            if x.is_nan() || y.is_nan() {
                f64::NAN
            } else {
                float::fmax(x, y, false, false, x.is_sign_negative())
            }
        }
        FBin::Copysign => y.copysign(x),
    }
}

pub(super) fn f32_op(k: FBin, x: f32, y: f32, rnd: Rnd) -> f32 {
    match k {
        FBin::Add => float::add_f32(x, y, rnd),
        FBin::Sub => float::add_f32(x, -y, rnd),
        FBin::Mul => float::mul_f32(x, y, rnd),
        FBin::Div => float::div_f32(x, y, rnd),
        FBin::Min => float::fmin(x, y, x.is_nan(), y.is_nan(), x.is_sign_negative()),
        FBin::Max => float::fmax(x, y, x.is_nan(), y.is_nan(), x.is_sign_negative()),
        FBin::MinNaN => {
            if x.is_nan() || y.is_nan() {
                f32::NAN
            } else {
                float::fmin(x, y, false, false, x.is_sign_negative())
            }
        }
        FBin::MaxNaN => {
            if x.is_nan() || y.is_nan() {
                f32::NAN
            } else {
                float::fmax(x, y, false, false, x.is_sign_negative())
            }
        }
        FBin::Copysign => y.copysign(x),
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn exec_fbin(
    regs: &mut [[u64; 32]],
    m: u32,
    k: FBin,
    ty: Ty,
    rnd: Rnd,
    ftz: bool,
    sat: bool,
    d: Reg,
    a: Reg,
    b: Reg,
) {
    match ty {
        Ty::F32 => {
            if !ftz && !sat && float::is_nearest(rnd) {
                match k {
                    FBin::Add => {
                        return map2(regs, m, d, a, b, |x, y| {
                            bits32(f32::from_bits(x as u32) + f32::from_bits(y as u32))
                        });
                    }
                    FBin::Sub => {
                        return map2(regs, m, d, a, b, |x, y| {
                            bits32(f32::from_bits(x as u32) - f32::from_bits(y as u32))
                        });
                    }
                    FBin::Mul => {
                        return map2(regs, m, d, a, b, |x, y| {
                            bits32(f32::from_bits(x as u32) * f32::from_bits(y as u32))
                        });
                    }
                    _ => {}
                }
            }
            map2(regs, m, d, a, b, |x, y| {
                let (mut x, mut y) = (f32::from_bits(x as u32), f32::from_bits(y as u32));
                if ftz {
                    x = ftz32(x);
                    y = ftz32(y);
                }
                let mut r = f32_op(k, x, y, rnd);
                if ftz {
                    r = ftz32(r);
                }
                if sat {
                    r = float::sat32(r);
                }
                if k == FBin::Copysign {
                    u64::from(r.to_bits())
                } else {
                    bits32(r)
                }
            })
        }
        Ty::F64 => map2(regs, m, d, a, b, |x, y| {
            let mut r = f64_op(k, f64::from_bits(x), f64::from_bits(y), rnd);
            if sat {
                r = float::sat64(r);
            }
            if k == FBin::Copysign {
                r.to_bits()
            } else {
                bits64(r)
            }
        }),
        Ty::F16 | Ty::Bf16 => {
            let bf = ty == Ty::Bf16;
            map2(regs, m, d, a, b, |x, y| {
                let r = half_op(x, y, bf, rnd, |p, q| f64_op(k, p, q, Rnd::Rn));
                if sat { half_sat(r, bf) } else { r }
            })
        }
        Ty::F16x2 | Ty::Bf16x2 => {
            let bf = ty == Ty::Bf16x2;
            map2(regs, m, d, a, b, |x, y| {
                let lo = half_op(x & 0xffff, y & 0xffff, bf, rnd, |p, q| {
                    f64_op(k, p, q, Rnd::Rn)
                });
                let hi = half_op((x >> 16) & 0xffff, (y >> 16) & 0xffff, bf, rnd, |p, q| {
                    f64_op(k, p, q, Rnd::Rn)
                });
                let (lo, hi) = if sat {
                    (half_sat(lo, bf), half_sat(hi, bf))
                } else {
                    (lo, hi)
                };
                (hi << 16) | lo
            })
        }
        _ => {}
    }
}

pub(super) fn half_sat(v: u64, bf: bool) -> u64 {
    let f = if bf {
        float::bf16_to_f64(v as u16)
    } else {
        float::f16_to_f64(v as u16)
    };
    let s = float::sat64(f);
    u64::from(if bf {
        float::f64_to_bf16(s, 0, Rnd::Rn)
    } else {
        float::f64_to_f16(s, 0, Rnd::Rn)
    })
}

pub(super) fn fun_f64(k: FUn, x: f64, rnd: Rnd) -> f64 {
    match k {
        FUn::Abs => x.abs(),
        FUn::Neg => -x,
        FUn::Sqrt => float::sqrt_f64(x, rnd),
        FUn::Rsqrt => 1.0 / x.sqrt(),
        FUn::Rcp => float::div_f64(1.0, x, rnd),
        FUn::Sin => x.sin(),
        FUn::Cos => x.cos(),
        FUn::Lg2 => x.log2(),
        FUn::Ex2 => x.exp2(),
        FUn::Tanh => x.tanh(),
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn exec_fun(
    regs: &mut [[u64; 32]],
    m: u32,
    k: FUn,
    ty: Ty,
    rnd: Rnd,
    ftz: bool,
    sat: bool,
    d: Reg,
    a: Reg,
) {
    match ty {
        Ty::F32 => map1(regs, m, d, a, |x| {
            let mut x = f32::from_bits(x as u32);
            if ftz {
                x = ftz32(x);
            }
            let mut r = match k {
                FUn::Abs => return u64::from(if ftz { ftz32(x.abs()) } else { x.abs() }.to_bits()),
                FUn::Neg => return u64::from(if ftz { ftz32(-x) } else { -x }.to_bits()),
                FUn::Sqrt => float::sqrt_f32(x, rnd),
                FUn::Rsqrt => 1.0 / x.sqrt(),
                FUn::Rcp => float::div_f32(1.0, x, rnd),
                FUn::Sin => x.sin(),
                FUn::Cos => x.cos(),
                FUn::Lg2 => x.log2(),
                FUn::Ex2 => x.exp2(),
                FUn::Tanh => x.tanh(),
            };
            if ftz {
                r = ftz32(r);
            }
            if sat {
                r = float::sat32(r);
            }
            bits32(r)
        }),
        Ty::F64 => map1(regs, m, d, a, |x| {
            let x = f64::from_bits(x);
            match k {
                FUn::Abs => x.abs().to_bits(),
                FUn::Neg => (-x).to_bits(),
                _ => {
                    let r = fun_f64(k, x, rnd);
                    bits64(if sat { float::sat64(r) } else { r })
                }
            }
        }),
        Ty::F16 | Ty::Bf16 | Ty::F16x2 | Ty::Bf16x2 => {
            let bf = matches!(ty, Ty::Bf16 | Ty::Bf16x2);
            let pair = matches!(ty, Ty::F16x2 | Ty::Bf16x2);
            let one = move |h: u64| -> u64 {
                match k {
                    FUn::Abs => h & 0x7fff,
                    FUn::Neg => h ^ 0x8000,
                    _ => half_op(h, 0, bf, rnd, |p, _| fun_f64(k, p, Rnd::Rn)),
                }
            };
            map1(regs, m, d, a, |x| {
                if pair {
                    (one((x >> 16) & 0xffff) << 16) | one(x & 0xffff)
                } else {
                    one(x & 0xffff)
                }
            })
        }
        _ => {}
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn exec_fma(
    regs: &mut [[u64; 32]],
    m: u32,
    ty: Ty,
    rnd: Rnd,
    ftz: bool,
    sat: bool,
    relu: bool,
    d: Reg,
    a: Reg,
    b: Reg,
    c: Reg,
) {
    match ty {
        Ty::F32 => {
            if !ftz && !sat && float::is_nearest(rnd) {
                return map3(regs, m, d, a, b, c, |x, y, z| {
                    bits32(float::fma32(
                        f32::from_bits(x as u32),
                        f32::from_bits(y as u32),
                        f32::from_bits(z as u32),
                    ))
                });
            }
            map3(regs, m, d, a, b, c, |x, y, z| {
                let (mut x, mut y, mut z) = (
                    f32::from_bits(x as u32),
                    f32::from_bits(y as u32),
                    f32::from_bits(z as u32),
                );
                if ftz {
                    x = ftz32(x);
                    y = ftz32(y);
                    z = ftz32(z);
                }
                let mut r = float::fma_f32(x, y, z, rnd);
                if ftz {
                    r = ftz32(r);
                }
                if sat {
                    r = float::sat32(r);
                }
                bits32(r)
            })
        }
        Ty::F64 => map3(regs, m, d, a, b, c, |x, y, z| {
            let r = float::fma_f64(f64::from_bits(x), f64::from_bits(y), f64::from_bits(z), rnd);
            bits64(if sat { float::sat64(r) } else { r })
        }),
        Ty::F16 | Ty::Bf16 | Ty::F16x2 | Ty::Bf16x2 => {
            let bf = matches!(ty, Ty::Bf16 | Ty::Bf16x2);
            let pair = matches!(ty, Ty::F16x2 | Ty::Bf16x2);
            let rnd = if rnd == Rnd::Default { Rnd::Rn } else { rnd };
            let one = move |x: u64, y: u64, z: u64| -> u64 {
                let dec = |v: u64| {
                    if bf {
                        float::bf16_to_f64(v as u16)
                    } else {
                        float::f16_to_f64(v as u16)
                    }
                };
                let p = dec(x) * dec(y);
                let (s, e) = float::two_sum(p, dec(z));
                let mut s = s;
                let mut err = if e.is_finite() { float::sign(e) } else { 0 };
                if relu && (s < 0.0 || s.is_nan()) {
                    s = if s.is_nan() { s } else { 0.0 };
                    err = 0;
                }
                if sat {
                    s = float::sat64(s);
                    err = 0;
                }
                u64::from(if bf {
                    float::f64_to_bf16(s, err, rnd)
                } else {
                    float::f64_to_f16(s, err, rnd)
                })
            };
            map3(regs, m, d, a, b, c, |x, y, z| {
                if pair {
                    (one((x >> 16) & 0xffff, (y >> 16) & 0xffff, (z >> 16) & 0xffff) << 16)
                        | one(x & 0xffff, y & 0xffff, z & 0xffff)
                } else {
                    one(x & 0xffff, y & 0xffff, z & 0xffff)
                }
            })
        }
        _ => {}
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn exec_cvt(
    regs: &mut [[u64; 32]],
    m: u32,
    d: Reg,
    a: Reg,
    dty: Ty,
    sty: Ty,
    rnd: Rnd,
    sat: bool,
    ftz: bool,
) {
    if dty.is_int() && sty.is_int() && !sat {
        let (sb, ss, db, ds) = (sty.bits(), sty.is_signed(), dty.bits(), dty.is_signed());
        return map1(regs, m, d, a, |x| {
            let v = if ss {
                sext_bits(x, sb)
            } else {
                x & lowmask(sb)
            };
            if ds {
                sext_bits(v, db)
            } else {
                v & lowmask(db)
            }
        });
    }
    if dty == Ty::F32 && sty == Ty::F32 && !sat && !ftz && rnd == Rnd::Default {
        return map1(regs, m, d, a, |x| x & 0xffff_ffff);
    }
    map1(regs, m, d, a, |x| cvt_one(x, dty, sty, rnd, sat, ftz));
}

pub(super) fn int_range(ty: Ty) -> (i128, i128) {
    let bits = ty.bits();
    if ty.is_signed() {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    }
}

pub(super) fn cvt_one(x: u64, dty: Ty, sty: Ty, rnd: Rnd, sat: bool, ftz: bool) -> u64 {
    if sty.is_int() {
        let sb = sty.bits();
        let v: i128 = if sty.is_signed() {
            sext_bits(x, sb) as i64 as i128
        } else {
            i128::from(x & lowmask(sb))
        };
        if dty.is_int() {
            let (lo, hi) = int_range(dty);
            let v = if sat { v.clamp(lo, hi) } else { v };
            let r = v as u64;
            return if dty.is_signed() {
                sext_bits(r, dty.bits())
            } else {
                r & lowmask(dty.bits())
            };
        }
        let rnd = if rnd == Rnd::Default { Rnd::Rn } else { rnd };
        return match dty {
            Ty::F32 => {
                let mut f = float::int_to_f32(v, rnd);
                if sat {
                    f = float::sat32(f);
                }
                u64::from(f.to_bits())
            }
            Ty::F64 => {
                let mut f = float::int_to_f64(v, rnd);
                if sat {
                    f = float::sat64(f);
                }
                f.to_bits()
            }
            Ty::F16 => u64::from(float::int_to_16(v, false, rnd)),
            Ty::Bf16 => u64::from(float::int_to_16(v, true, rnd)),
            _ => 0,
        };
    }
    // Widening a half NaN keeps its payload, like the hardware conversion.
    if dty == Ty::F32 && matches!(sty, Ty::F16 | Ty::Bf16) {
        let h = x as u16;
        if sty == Ty::Bf16 && float::bf16_to_f64(h).is_nan() {
            return u64::from(h) << 16;
        }
        if sty == Ty::F16 && float::f16_to_f64(h).is_nan() {
            return u64::from(
                (u32::from(h & 0x8000) << 16) | 0x7f80_0000 | (u32::from(h & 0x3ff) << 13),
            );
        }
    }
    // Float source, as an exact f64.
    let f: f64 = match sty {
        Ty::F32 => {
            let v = f32::from_bits(x as u32);
            f64::from(if ftz { ftz32(v) } else { v })
        }
        Ty::F64 => f64::from_bits(x),
        Ty::F16 => float::f16_to_f64(x as u16),
        Ty::Bf16 => float::bf16_to_f64(x as u16),
        _ => 0.0,
    };
    if dty.is_int() {
        if f.is_nan() {
            return 0;
        }
        let r = float::round_integral(f, rnd);
        let (lo, hi) = int_range(dty);
        let v = (r as i128).clamp(lo, hi);
        let bits = v as u64;
        return if dty.is_signed() {
            sext_bits(bits, dty.bits())
        } else {
            bits & lowmask(dty.bits())
        };
    }
    let int_round = matches!(rnd, Rnd::Rni | Rnd::Rzi | Rnd::Rmi | Rnd::Rpi);
    let f = if int_round && !f.is_nan() {
        float::round_integral(f, rnd)
    } else {
        f
    };
    let rnd = if int_round || rnd == Rnd::Default {
        Rnd::Rn
    } else {
        rnd
    };
    match dty {
        Ty::F32 => {
            let mut r = float::f64_to_f32(f, 0, rnd);
            if ftz {
                r = ftz32(r);
            }
            if sat {
                r = float::sat32(r);
            }
            bits32(r)
        }
        Ty::F64 => {
            let r = if sat { float::sat64(f) } else { f };
            bits64(r)
        }
        Ty::F16 => {
            let v = if sat { float::sat64(f) } else { f };
            u64::from(float::f64_to_f16(v, 0, rnd))
        }
        Ty::Bf16 => {
            let v = if sat { float::sat64(f) } else { f };
            u64::from(float::f64_to_bf16(v, 0, rnd))
        }
        _ => 0,
    }
}

/// An FP8 conversion (`cvt` with `.e4m3x2`/`.e5m2x2`) for the lanes in `m`; `[d, a, b]` its
/// registers (`b` only for [`Fp8Cvt::FromF32`]). Out of line: it is rare.
#[inline(never)]
pub(super) fn cvt_fp8(
    regs: &mut [[u64; 32]],
    m: u32,
    kind: Fp8Cvt,
    format: float::Fp8,
    relu: bool,
    [d, a, b]: [Reg; 3],
) {
    for l in (0..32).filter(|l| m >> l & 1 != 0) {
        let av = regs[a as usize][l];
        let enc = |x: f32| u64::from(format.encode_satfinite(x, relu));
        let v = match kind {
            Fp8Cvt::FromF32 => {
                let bv = regs[b as usize][l];
                (enc(f32::from_bits(av as u32)) << 8) | enc(f32::from_bits(bv as u32))
            }
            Fp8Cvt::FromF16x2 => {
                let half = |h: u64| enc(float::f16_to_f32(h as u16));
                (half(av >> 16) << 8) | half(av & 0xffff)
            }
            Fp8Cvt::ToF16x2 => {
                let dec = |c: u64| {
                    let x = format.decode(c as u8);
                    let x = if relu && x < 0.0 { 0.0 } else { x };
                    u64::from(float::f32_to_f16(x, Rnd::Rn))
                };
                (dec((av >> 8) & 0xff) << 16) | dec(av & 0xff)
            }
        };
        regs[d as usize][l] = v;
    }
}
