//! Floating-point helpers: half/bfloat16 formats, IEEE rounding modes other than
//! round-to-nearest, and GPU NaN conventions.
//!
//! Directed rounding works by computing the round-to-nearest result `r` together with the sign of
//! the exact error (`exact - r`, obtained with error-free transformations: TwoSum, FMA residuals),
//! then nudging `r` to the neighbouring representable value when the mode requires it. For results
//! in narrower formats (f32, f16, bf16) the exact value is first held as `f64 + error sign`, which
//! is enough to round correctly in every mode.

use crate::ir::Rnd;
use std::cmp::Ordering;

/// CUDA's canonical single-precision NaN.
pub(crate) const NAN_F32: u32 = 0x7fff_ffff;
/// CUDA's canonical double-precision NaN.
pub(crate) const NAN_F64: u64 = 0x7fff_ffff_ffff_ffff;
/// CUDA's canonical half / bfloat16 NaN.
pub(crate) const NAN_16: u16 = 0x7fff;
/// 1.0 in half precision.
pub(crate) const F16_ONE: u16 = 0x3c00;
/// 1.0 in bfloat16.
pub(crate) const BF16_ONE: u16 = 0x3f80;

/// A binary floating-point format narrower than f64.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fmt {
    /// Precision in bits, including the implicit bit.
    p: i32,
    /// Smallest normal exponent.
    emin: i32,
    /// Largest exponent.
    emax: i32,
    /// Exponent field width (for encoding).
    ebits: u32,
}

pub(crate) const F32: Fmt = Fmt {
    p: 24,
    emin: -126,
    emax: 127,
    ebits: 8,
};
pub(crate) const F16: Fmt = Fmt {
    p: 11,
    emin: -14,
    emax: 15,
    ebits: 5,
};
pub(crate) const BF16: Fmt = Fmt {
    p: 8,
    emin: -126,
    emax: 127,
    ebits: 8,
};

fn pow2(e: i32) -> f64 {
    // Exact for the exponents used here (|e| < 1000).
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// Sign of `x` as -1, 0, 1 (0 for zero and NaN).
pub(crate) fn sign(x: f64) -> i8 {
    if x > 0.0 {
        1
    } else if x < 0.0 {
        -1
    } else {
        0
    }
}

/// Magnitude rounding directions.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Nearest,
    TowardZero,
    AwayFromZero,
}

fn dir_for(rnd: Rnd, negative: bool) -> Dir {
    match rnd {
        Rnd::Rz | Rnd::Rzi => Dir::TowardZero,
        Rnd::Rm | Rnd::Rmi => {
            if negative {
                Dir::AwayFromZero
            } else {
                Dir::TowardZero
            }
        }
        Rnd::Rp | Rnd::Rpi => {
            if negative {
                Dir::TowardZero
            } else {
                Dir::AwayFromZero
            }
        }
        _ => Dir::Nearest,
    }
}

/// Rounds the exact value `x + ε` (where `err` is the sign of ε, which is tiny relative to an
/// ulp of `x` in f64) to `fmt` with `rnd`. Returns the result as f64 (exactly representable in
/// `fmt`, or ±inf on overflow).
pub(crate) fn round_fmt(x: f64, err: i8, fmt: Fmt, rnd: Rnd) -> f64 {
    if !x.is_finite() {
        return x;
    }
    if x == 0.0 {
        if err == 0 {
            return x;
        }
        // A value below every representable magnitude.
        let neg = err < 0;
        let tiny = pow2(fmt.emin - (fmt.p - 1));
        return match dir_for(rnd, neg) {
            Dir::AwayFromZero => {
                if neg {
                    -tiny
                } else {
                    tiny
                }
            }
            _ => {
                if neg {
                    -0.0
                } else {
                    0.0
                }
            }
        };
    }
    let neg = x < 0.0;
    let a = x.abs();
    let emag = if neg { -err } else { err };
    let dir = dir_for(rnd, neg);
    let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    let qexp = e.max(fmt.emin) - (fmt.p - 1);
    let q = pow2(qexp);
    let n = a / q;
    let fl = n.floor();
    let frac = n - fl;
    let mag = match dir {
        Dir::TowardZero => {
            if frac == 0.0 && emag < 0 {
                // Exact value lies just below fl*q.
                if fl == pow2(fmt.p - 1) && e > fmt.emin {
                    (fl - 0.5) * q
                } else {
                    (fl - 1.0) * q
                }
            } else {
                fl * q
            }
        }
        Dir::AwayFromZero => {
            if frac > 0.0 || emag > 0 {
                (fl + 1.0) * q
            } else {
                fl * q
            }
        }
        Dir::Nearest => {
            let up = match frac.partial_cmp(&0.5) {
                Some(Ordering::Greater) => true,
                Some(Ordering::Less) => false,
                _ => {
                    if emag != 0 {
                        emag > 0
                    } else {
                        fl % 2.0 != 0.0
                    }
                }
            };
            if up { (fl + 1.0) * q } else { fl * q }
        }
    };
    let max = (2.0 - pow2(1 - fmt.p)) * pow2(fmt.emax);
    let mag = if mag > max {
        match dir {
            Dir::TowardZero => max,
            _ => f64::INFINITY,
        }
    } else {
        mag
    };
    if neg { -mag } else { mag }
}

/// Encodes a value that is representable in `fmt` (or ±inf/NaN) as 16-bit bits.
fn encode16(v: f64, fmt: Fmt) -> u16 {
    let mbits = (fmt.p - 1) as u32;
    let sign = if v.is_sign_negative() { 0x8000u16 } else { 0 };
    if v.is_nan() {
        return NAN_16;
    }
    let a = v.abs();
    let emask = (1u16 << fmt.ebits) - 1;
    if a.is_infinite() {
        return sign | (emask << mbits);
    }
    if a == 0.0 {
        return sign;
    }
    let bias = (1i32 << (fmt.ebits - 1)) - 1;
    if a >= pow2(fmt.emin) {
        let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        let m = ((a / pow2(e) - 1.0) * pow2(mbits as i32)) as u16;
        sign | (((e + bias) as u16) << mbits) | m
    } else {
        let m = (a / pow2(fmt.emin - mbits as i32)) as u16;
        sign | m
    }
}

fn decode16(b: u16, fmt: Fmt) -> f64 {
    let mbits = (fmt.p - 1) as u32;
    let emask = (1u32 << fmt.ebits) - 1;
    let bias = (1i32 << (fmt.ebits - 1)) - 1;
    let neg = b & 0x8000 != 0;
    let e = (u32::from(b) >> mbits) & emask;
    let m = u32::from(b) & ((1 << mbits) - 1);
    let mag = if e == emask {
        if m == 0 { f64::INFINITY } else { f64::NAN }
    } else if e == 0 {
        f64::from(m) * pow2(fmt.emin - mbits as i32)
    } else {
        (1.0 + f64::from(m) / pow2(mbits as i32)) * pow2(e as i32 - bias)
    };
    if neg { -mag } else { mag }
}

/// Half bits to f32 (exact).
pub(crate) fn f16_to_f32(b: u16) -> f32 {
    decode16(b, F16) as f32
}

/// bfloat16 bits to f32 (exact).
pub(crate) fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// Half bits to f64.
pub(crate) fn f16_to_f64(b: u16) -> f64 {
    decode16(b, F16)
}

/// bfloat16 bits to f64.
pub(crate) fn bf16_to_f64(b: u16) -> f64 {
    f64::from(bf16_to_f32(b))
}

/// Rounds `x + ε` to half precision.
pub(crate) fn f64_to_f16(x: f64, err: i8, rnd: Rnd) -> u16 {
    encode16(round_fmt(x, err, F16, rnd), F16)
}

/// Rounds `x + ε` to bfloat16.
pub(crate) fn f64_to_bf16(x: f64, err: i8, rnd: Rnd) -> u16 {
    encode16(round_fmt(x, err, BF16, rnd), BF16)
}

/// f32 to half with a rounding mode.
pub(crate) fn f32_to_f16(x: f32, rnd: Rnd) -> u16 {
    f64_to_f16(f64::from(x), 0, rnd)
}

/// Rounds `x + ε` to f32.
pub(crate) fn f64_to_f32(x: f64, err: i8, rnd: Rnd) -> f32 {
    if x.is_nan() {
        return f32::from_bits(NAN_F32);
    }
    if matches!(rnd, Rnd::Default | Rnd::Rn | Rnd::Rni) && err == 0 {
        return x as f32;
    }
    round_fmt(x, err, F32, rnd) as f32
}

fn next_up(x: f64) -> f64 {
    if x.is_nan() || x == f64::INFINITY {
        return x;
    }
    if x == 0.0 {
        return f64::from_bits(1);
    }
    let b = x.to_bits();
    f64::from_bits(if x > 0.0 { b + 1 } else { b - 1 })
}

fn next_down(x: f64) -> f64 {
    -next_up(-x)
}

/// Adjusts the round-to-nearest f64 result `r` (exact value `r + ε`, `err` = sign of ε) to `rnd`.
pub(crate) fn directed_f64(r: f64, err: i8, rnd: Rnd) -> f64 {
    if err == 0 || !r.is_finite() {
        // Overflowed nearest results of directed modes round back to the largest finite value.
        if r.is_infinite() && err == 0 {
            return r;
        }
        if !r.is_finite() {
            return match (rnd, r > 0.0) {
                (Rnd::Rz, true) | (Rnd::Rm, true) => f64::MAX,
                (Rnd::Rz, false) | (Rnd::Rp, false) => f64::MIN,
                _ => r,
            };
        }
        return r;
    }
    match rnd {
        Rnd::Rz => {
            if r > 0.0 && err < 0 {
                next_down(r)
            } else if r < 0.0 && err > 0 {
                next_up(r)
            } else {
                r
            }
        }
        Rnd::Rm => {
            if err < 0 {
                next_down(r)
            } else {
                r
            }
        }
        Rnd::Rp => {
            if err > 0 {
                next_up(r)
            } else {
                r
            }
        }
        _ => r,
    }
}

/// Error-free sum: `a + b == s + e` exactly.
pub(crate) fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    let e = (a - (s - bb)) + (b - bb);
    (s, e)
}

fn err_sign_of(e: f64) -> i8 {
    if e.is_finite() { sign(e) } else { 0 }
}

/// True for the round-to-nearest modes that native arithmetic implements.
pub(crate) fn is_nearest(rnd: Rnd) -> bool {
    matches!(rnd, Rnd::Default | Rnd::Rn)
}

/// IEEE sign of an exact zero sum `a + b`: -0 only for (-0) + (-0), except that rounding toward
/// -inf makes every exact zero sum of unlike-signed operands -0.
fn zero_sum(a: f64, b: f64, rnd: Rnd) -> f64 {
    let (na, nb) = (a.is_sign_negative(), b.is_sign_negative());
    if (na && nb) || (na != nb && rnd == Rnd::Rm) {
        -0.0
    } else {
        0.0
    }
}

/// Correctly rounded f32 fused multiply-add without a libm call: the f64 product is exact, so the
/// f64 sum is the exact result rounded once; rounding that to f32 is correct unless the f64 sum
/// landed exactly on an f32 halfway point (or the result is tiny or not finite), where the exact
/// `mul_add` decides.
#[inline]
pub(crate) fn fma32(a: f32, b: f32, c: f32) -> f32 {
    let s = f64::from(a) * f64::from(b) + f64::from(c);
    let halfway = s.to_bits() & 0x1fff_ffff == 0x1000_0000;
    if halfway || !s.is_finite() || s.abs() < 1.0e-37 {
        return a.mul_add(b, c);
    }
    s as f32
}

/// f32 a + b with a rounding mode.
pub(crate) fn add_f32(a: f32, b: f32, rnd: Rnd) -> f32 {
    if is_nearest(rnd) {
        return a + b;
    }
    let (s, e) = two_sum(f64::from(a), f64::from(b));
    if s == 0.0 && e == 0.0 {
        return zero_sum(f64::from(a), f64::from(b), rnd) as f32;
    }
    if !s.is_finite() {
        return s as f32;
    }
    f64_to_f32(s, err_sign_of(e), rnd)
}

/// f32 a * b with a rounding mode (the f64 product is exact).
pub(crate) fn mul_f32(a: f32, b: f32, rnd: Rnd) -> f32 {
    if is_nearest(rnd) {
        return a * b;
    }
    f64_to_f32(f64::from(a) * f64::from(b), 0, rnd)
}

/// f32 fused multiply-add with a rounding mode.
pub(crate) fn fma_f32(a: f32, b: f32, c: f32, rnd: Rnd) -> f32 {
    if is_nearest(rnd) {
        return a.mul_add(b, c);
    }
    let p = f64::from(a) * f64::from(b);
    let (s, e) = two_sum(p, f64::from(c));
    if s == 0.0 && e == 0.0 {
        return zero_sum(p, f64::from(c), rnd) as f32;
    }
    if !s.is_finite() {
        return s as f32;
    }
    f64_to_f32(s, err_sign_of(e), rnd)
}

/// f32 division with a rounding mode.
pub(crate) fn div_f32(a: f32, b: f32, rnd: Rnd) -> f32 {
    if is_nearest(rnd) {
        return a / b;
    }
    let (x, y) = (f64::from(a), f64::from(b));
    let q = x / y;
    if !q.is_finite() || q == 0.0 {
        return f64_to_f32(
            q,
            if q == 0.0 && x != 0.0 {
                sign(x) * sign(y)
            } else {
                0
            },
            rnd,
        );
    }
    let r = (-q).mul_add(y, x);
    f64_to_f32(q, err_sign_of(r) * sign(y), rnd)
}

/// f32 square root with a rounding mode.
pub(crate) fn sqrt_f32(a: f32, rnd: Rnd) -> f32 {
    if is_nearest(rnd) {
        return a.sqrt();
    }
    let x = f64::from(a);
    let s = x.sqrt();
    if !s.is_finite() || s == 0.0 {
        return s as f32;
    }
    let r = (-s).mul_add(s, x);
    f64_to_f32(s, err_sign_of(r), rnd)
}

/// f64 a + b with a rounding mode.
pub(crate) fn add_f64(a: f64, b: f64, rnd: Rnd) -> f64 {
    let (s, e) = two_sum(a, b);
    if is_nearest(rnd) {
        return s;
    }
    if s == 0.0 && e == 0.0 {
        return zero_sum(a, b, rnd);
    }
    directed_f64(s, err_sign_of(e), rnd)
}

/// f64 a * b with a rounding mode.
pub(crate) fn mul_f64(a: f64, b: f64, rnd: Rnd) -> f64 {
    let p = a * b;
    if is_nearest(rnd) {
        return p;
    }
    let e = a.mul_add(b, -p);
    directed_f64(p, err_sign_of(e), rnd)
}

/// f64 fused multiply-add with a rounding mode.
pub(crate) fn fma_f64(a: f64, b: f64, c: f64, rnd: Rnd) -> f64 {
    let r = a.mul_add(b, c);
    if is_nearest(rnd) || !r.is_finite() {
        return directed_f64(r, 0, rnd);
    }
    if r == 0.0 && a.mul_add(b, -r) == 0.0 && (a * b) == -c {
        return zero_sum(a * b, c, rnd);
    }
    // exact = ph + pl + c; error = (ph + c - r) + pl.
    let ph = a * b;
    let pl = a.mul_add(b, -ph);
    let (s, se) = two_sum(ph, c);
    let e = (s - r) + se + pl;
    directed_f64(r, err_sign_of(e), rnd)
}

/// f64 division with a rounding mode.
pub(crate) fn div_f64(a: f64, b: f64, rnd: Rnd) -> f64 {
    let q = a / b;
    if is_nearest(rnd) || !q.is_finite() {
        return directed_f64(q, 0, rnd);
    }
    let r = (-q).mul_add(b, a);
    directed_f64(q, err_sign_of(r) * sign(b), rnd)
}

/// f64 square root with a rounding mode.
pub(crate) fn sqrt_f64(a: f64, rnd: Rnd) -> f64 {
    let s = a.sqrt();
    if is_nearest(rnd) || !s.is_finite() {
        return s;
    }
    let r = (-s).mul_add(s, a);
    directed_f64(s, err_sign_of(r), rnd)
}

/// Integer to f64 with a rounding mode.
pub(crate) fn int_to_f64(v: i128, rnd: Rnd) -> f64 {
    let r = v as f64;
    let back = r as i128;
    let err = match v.cmp(&back) {
        Ordering::Greater => 1,
        Ordering::Less => -1,
        Ordering::Equal => 0,
    };
    directed_f64(r, err, rnd)
}

/// Integer to f32 with a rounding mode.
pub(crate) fn int_to_f32(v: i128, rnd: Rnd) -> f32 {
    let r = v as f64;
    let back = r as i128;
    let err = match v.cmp(&back) {
        Ordering::Greater => 1,
        Ordering::Less => -1,
        Ordering::Equal => 0,
    };
    f64_to_f32(r, err, rnd)
}

/// Integer to half or bfloat16 bits with a rounding mode.
pub(crate) fn int_to_16(v: i128, bf: bool, rnd: Rnd) -> u16 {
    let r = v as f64;
    let back = r as i128;
    let err = match v.cmp(&back) {
        Ordering::Greater => 1,
        Ordering::Less => -1,
        Ordering::Equal => 0,
    };
    if bf {
        f64_to_bf16(r, err, rnd)
    } else {
        f64_to_f16(r, err, rnd)
    }
}

/// Rounds to an integral value in the given integer rounding mode (`Default` truncates).
pub(crate) fn round_integral(x: f64, rnd: Rnd) -> f64 {
    match rnd {
        Rnd::Rni | Rnd::Rn => x.round_ties_even(),
        Rnd::Rmi | Rnd::Rm => x.floor(),
        Rnd::Rpi | Rnd::Rp => x.ceil(),
        _ => x.trunc(),
    }
}

/// Flushes an f32 subnormal to a signed zero.
#[inline]
pub(crate) fn ftz32(x: f32) -> f32 {
    if x.is_subnormal() {
        f32::from_bits(x.to_bits() & 0x8000_0000)
    } else {
        x
    }
}

/// Saturates to [0, 1] (NaN becomes 0).
#[inline]
pub(crate) fn sat32(x: f32) -> f32 {
    if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) }
}

/// Saturates to [0, 1] (NaN becomes 0).
#[inline]
pub(crate) fn sat64(x: f64) -> f64 {
    if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) }
}

/// f32 bits with NaN canonicalised.
#[inline]
pub(crate) fn bits32(x: f32) -> u64 {
    if x.is_nan() {
        u64::from(NAN_F32)
    } else {
        u64::from(x.to_bits())
    }
}

/// f64 bits with NaN canonicalised.
#[inline]
pub(crate) fn bits64(x: f64) -> u64 {
    if x.is_nan() { NAN_F64 } else { x.to_bits() }
}

/// PTX min: NaN operands are ignored, -0 < +0.
#[inline]
pub(crate) fn fmin<T: PartialOrd + Copy>(a: T, b: T, a_nan: bool, b_nan: bool, a_neg: bool) -> T {
    if a_nan {
        b
    } else if b_nan || a < b || (a == b && a_neg) {
        a
    } else {
        b
    }
}

/// PTX max: NaN operands are ignored, +0 > -0.
#[inline]
pub(crate) fn fmax<T: PartialOrd + Copy>(a: T, b: T, a_nan: bool, b_nan: bool, a_neg: bool) -> T {
    if a_nan {
        b
    } else if b_nan || a > b || (a == b && !a_neg) {
        a
    } else {
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_round_trip_and_modes() {
        for bits in [
            0u16, 0x3c00, 0xbc00, 0x7bff, 0x0001, 0x03ff, 0x0400, 0x7c00, 0xfc00, 0x3555,
        ] {
            assert_eq!(f32_to_f16(f16_to_f32(bits), Rnd::Rn), bits, "{bits:#x}");
        }
        assert_eq!(f32_to_f16(65520.0, Rnd::Rn), 0x7c00);
        assert_eq!(f32_to_f16(65520.0, Rnd::Rz), 0x7bff);
        assert_eq!(f32_to_f16(1.0 + 1.0 / 4096.0, Rnd::Rp), 0x3c01);
        assert_eq!(f32_to_f16(1.0 + 1.0 / 4096.0, Rnd::Rn), 0x3c00);
        assert_eq!(f32_to_f16(-(1.0 + 1.0 / 4096.0), Rnd::Rm), 0xbc01);
        assert_eq!(f32_to_f16(f32::NAN, Rnd::Rn), NAN_16);
        // Ties to even.
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0, Rnd::Rn), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 / 2048.0, Rnd::Rn), 0x3c02);
        assert_eq!(f64_to_bf16(1.0 + 1.0 / 256.0, 1, Rnd::Rn), 0x3f81);
    }

    #[test]
    fn directed_f32_arithmetic() {
        let (a, b) = (1.0f32, 1e-10f32);
        assert_eq!(add_f32(a, b, Rnd::Rz), 1.0);
        assert_eq!(add_f32(a, b, Rnd::Rp), f32::from_bits(0x3f80_0001));
        assert_eq!(add_f32(a, -b, Rnd::Rz), f32::from_bits(0x3f7f_ffff));
        assert_eq!(add_f32(a, -b, Rnd::Rn), 1.0);
        assert_eq!(mul_f32(3.0, 1.0 / 3.0, Rnd::Rz), 1.0);
        assert_eq!(
            mul_f32(3.0, 1.0 / 3.0, Rnd::Rp),
            f32::from_bits(0x3f80_0001)
        );
        assert_eq!(div_f32(1.0, 3.0, Rnd::Rp), f32::from_bits(0x3eaa_aaab));
        assert_eq!(div_f32(1.0, 3.0, Rnd::Rz), f32::from_bits(0x3eaa_aaaa));
        assert_eq!(div_f32(-1.0, 3.0, Rnd::Rm), -f32::from_bits(0x3eaa_aaab));
        assert_eq!(f64_to_f32(1e300, 0, Rnd::Rz), f32::MAX);
        assert_eq!(f64_to_f32(1e300, 0, Rnd::Rn), f32::INFINITY);
        assert_eq!(int_to_f32(16_777_217, Rnd::Rp), 16_777_218.0);
        assert_eq!(int_to_f32(16_777_217, Rnd::Rz), 16_777_216.0);
        assert_eq!(int_to_f32(-16_777_217, Rnd::Rm), -16_777_218.0);
        assert_eq!(add_f64(1.0, 1e-30, Rnd::Rp), next_up(1.0));
        assert_eq!(mul_f64(1.0 / 3.0, 3.0, Rnd::Rn), 1.0);
        assert_eq!(sqrt_f32(2.0, Rnd::Rp), f32::from_bits(0x3fb5_04f4));
        assert_eq!(sqrt_f32(2.0, Rnd::Rz), f32::from_bits(0x3fb5_04f3));
    }

    #[test]
    fn fast_fma_matches_fused() {
        let mut s = 0x1234_5678u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            f32::from_bits((s >> 16) as u32)
        };
        for _ in 0..200_000 {
            let (a, b, c) = (next(), next(), next());
            let (x, y) = (fma32(a, b, c), a.mul_add(b, c));
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "{a:e} {b:e} {c:e}"
            );
        }
        // Exact halfway sums take the fused path.
        let (a, b, c) = (1.0 + f32::EPSILON, 1.0 + f32::EPSILON, -1.0);
        assert_eq!(fma32(a, b, c), a.mul_add(b, c));
        assert_eq!(fma32(16_777_216.0, 1.0, 1.0), 16_777_216.0);
    }

    #[test]
    fn min_max_conventions() {
        assert_eq!(fmin(f32::NAN, 1.0, true, false, false), 1.0);
        assert!(fmin(-0.0f32, 0.0, false, false, true).is_sign_negative());
        assert!(fmax(-0.0f32, 0.0, false, false, true).is_sign_positive());
    }
}

/// The 8-bit floating-point formats of `cvt` (sm_89): E4M3 (bias 7, three mantissa bits, no
/// infinities: its largest code is NaN, its largest finite value 448) and E5M2 (bias 15, two
/// mantissa bits, IEEE-like: infinities and NaNs above 57 344).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fp8 {
    E4M3,
    E5M2,
}

/// The code PTX gives a NaN result in either format.
const FP8_NAN: u8 = 0x7f;
const FP8_SIGN: u8 = 0x80;

impl Fp8 {
    fn mantissa_bits(self) -> u32 {
        match self {
            Fp8::E4M3 => 3,
            Fp8::E5M2 => 2,
        }
    }

    fn bias(self) -> i32 {
        match self {
            Fp8::E4M3 => 7,
            Fp8::E5M2 => 15,
        }
    }

    /// The largest finite magnitude's code.
    fn max_finite(self) -> u8 {
        match self {
            Fp8::E4M3 => 0x7e,
            Fp8::E5M2 => 0x7b,
        }
    }

    /// The value of `code`.
    pub(crate) fn decode(self, code: u8) -> f32 {
        let mag = code & !FP8_SIGN;
        let v = if mag > self.max_finite() {
            if self == Fp8::E5M2 && mag == 0x7c {
                f32::INFINITY
            } else {
                f32::NAN
            }
        } else {
            let m = self.mantissa_bits();
            let (exp, mant) = (i32::from(mag >> m), f64::from(mag & ((1 << m) - 1)));
            let scale = f64::from(1u32 << m);
            if exp == 0 {
                (mant / scale * 2f64.powi(1 - self.bias())) as f32
            } else {
                ((1.0 + mant / scale) * 2f64.powi(exp - self.bias())) as f32
            }
        };
        if code & FP8_SIGN != 0 { -v } else { v }
    }

    /// `x` rounded to the nearest code (ties to the even one), magnitudes past the largest
    /// finite one saturated to it (`.satfinite`, infinities too), NaN to the canonical NaN;
    /// with `relu` negative values become +0.
    pub(crate) fn encode_satfinite(self, x: f32, relu: bool) -> u8 {
        if x.is_nan() {
            return FP8_NAN;
        }
        if relu && x.is_sign_negative() {
            return 0;
        }
        let sign = if x.is_sign_negative() { FP8_SIGN } else { 0 };
        let a = x.abs();
        let max = self.max_finite();
        if a >= self.decode(max) {
            return sign | max;
        }
        // The largest code not above `a`, then the nearer of it and the next.
        let (mut lo, mut hi) = (0u8, max);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if self.decode(mid) <= a {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let (below, above) = (f64::from(self.decode(lo)), f64::from(self.decode(hi)));
        let a = f64::from(a);
        let code = if a - below < above - a || (a - below == above - a && lo % 2 == 0) {
            lo
        } else {
            hi
        };
        sign | code
    }
}

#[cfg(test)]
mod fp8_tests {
    use super::Fp8;

    #[test]
    fn known_values_round_trip_and_saturate() {
        for (f, x, code) in [
            (Fp8::E4M3, 1.0f32, 0x38u8),
            (Fp8::E4M3, 448.0, 0x7e),
            (Fp8::E4M3, -2.0, 0xc0),
            (Fp8::E4M3, 2f32.powi(-9), 0x01),
            (Fp8::E4M3, 0.0, 0x00),
            (Fp8::E5M2, 1.0, 0x3c),
            (Fp8::E5M2, 57344.0, 0x7b),
            (Fp8::E5M2, 2f32.powi(-16), 0x01),
            (Fp8::E5M2, -0.5, 0xb8),
        ] {
            assert_eq!(f.encode_satfinite(x, false), code, "{f:?} {x}");
            assert_eq!(f.decode(code), x, "{f:?} {code:#x}");
        }
        // Past the largest finite value, infinities and NaN.
        assert_eq!(Fp8::E4M3.encode_satfinite(1000.0, false), 0x7e);
        assert_eq!(Fp8::E4M3.encode_satfinite(f32::NEG_INFINITY, false), 0xfe);
        assert_eq!(Fp8::E5M2.encode_satfinite(f32::INFINITY, false), 0x7b);
        assert_eq!(Fp8::E5M2.encode_satfinite(f32::NAN, false), 0x7f);
        assert!(Fp8::E4M3.decode(0x7f).is_nan());
        assert_eq!(Fp8::E5M2.decode(0x7c), f32::INFINITY);
        // Ties to even: 1.0625 lies halfway between 1.0 (0x38) and 1.125 (0x39) in E4M3.
        assert_eq!(Fp8::E4M3.encode_satfinite(1.0625, false), 0x38);
        assert_eq!(Fp8::E4M3.encode_satfinite(1.1875, false), 0x3a);
        // relu.
        assert_eq!(Fp8::E4M3.encode_satfinite(-3.0, true), 0x00);
        assert_eq!(Fp8::E4M3.encode_satfinite(3.0, true), 0x44);
        // Every code's value encodes back to it.
        for f in [Fp8::E4M3, Fp8::E5M2] {
            for c in 0..=f.max_finite() {
                assert_eq!(f.encode_satfinite(f.decode(c), false), c, "{f:?} {c:#x}");
            }
        }
    }
}
