//! Floating-point helpers for CPU references: f16 conversion, directed rounding,
//! and the unit roundoffs tolerances are expressed in.

/// Unit roundoff of f32 (half an ulp of 1.0): 2^-24.
pub(crate) const U32: f64 = 1.0 / (1u64 << 24) as f64;
/// Unit roundoff of f64: 2^-53.
pub(crate) const U64: f64 = 1.0 / (1u64 << 53) as f64;

const F16_EXP_MASK: u16 = 0x7c00;
const F16_MAN_MASK: u16 = 0x03ff;
const F16_SIGN: u16 = 0x8000;
const F16_QUIET: u16 = 0x0200;
/// Smallest |x| that rounds to f16 infinity: 65504 + half an ulp (16).
const F16_OVERFLOW: f64 = 65520.0;
/// Smallest normal f16: 2^-14.
const F16_MIN_NORMAL: f64 = 1.0 / 16384.0;
/// f16 denormal step: 2^-24.
const F16_DENORM_STEP: f64 = 1.0 / 16_777_216.0;
const F16_BIAS: i32 = 15;
const F16_MAN_BITS: u32 = 10;

/// f32 -> f16 bits, round to nearest even (what `cvt.rn.f16.f32` and `__float2half` do).
pub(crate) fn f32_to_f16_bits(x: f32) -> u16 {
    let sign = if x.is_sign_negative() { F16_SIGN } else { 0 };
    if x.is_nan() {
        return sign | F16_EXP_MASK | F16_QUIET;
    }
    let a = f64::from(x.abs());
    if a >= F16_OVERFLOW {
        return sign | F16_EXP_MASK;
    }
    if a < F16_MIN_NORMAL {
        // Scaling by a power of two is exact; rounding may carry into the smallest normal.
        return sign | (a / F16_DENORM_STEP).round_ties_even() as u16;
    }
    let mut e = a.log2().floor() as i32;
    // log2 may be off by one right at powers of two; fix up exactly.
    while 2f64.powi(e) > a {
        e -= 1;
    }
    while 2f64.powi(e + 1) <= a {
        e += 1;
    }
    let mut man =
        ((a / 2f64.powi(e) - 1.0) * f64::from(1u32 << F16_MAN_BITS)).round_ties_even() as u32;
    if man == 1 << F16_MAN_BITS {
        man = 0;
        e += 1;
    }
    if e > F16_BIAS {
        return sign | F16_EXP_MASK;
    }
    sign | (((e + F16_BIAS) as u16) << F16_MAN_BITS) | man as u16
}

/// f16 bits -> f32 (exact).
pub(crate) fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = if h & F16_SIGN != 0 { -1.0 } else { 1.0 };
    let exp = (h & F16_EXP_MASK) >> F16_MAN_BITS;
    let man = f64::from(h & F16_MAN_MASK);
    let mag = match exp {
        0 => man * F16_DENORM_STEP,
        0x1f if man == 0.0 => f64::INFINITY,
        0x1f => f64::NAN,
        _ => (1.0 + man / 1024.0) * 2f64.powi(i32::from(exp) - F16_BIAS),
    };
    (sign * mag) as f32
}

/// Whether f16 bits encode a NaN.
pub(crate) fn f16_is_nan(h: u16) -> bool {
    h & F16_EXP_MASK == F16_EXP_MASK && h & F16_MAN_MASK != 0
}

/// IEEE rounding directions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Round {
    /// To nearest, ties to even.
    Nearest,
    /// Toward zero.
    Zero,
    /// Toward -infinity.
    Down,
    /// Toward +infinity.
    Up,
}

/// The next f32 toward +infinity.
pub(crate) fn next_up(x: f32) -> f32 {
    if x.is_nan() || x == f32::INFINITY {
        return x;
    }
    if x == 0.0 {
        return f32::from_bits(1);
    }
    let b = x.to_bits();
    f32::from_bits(if x > 0.0 { b + 1 } else { b - 1 })
}

/// The next f32 toward -infinity.
pub(crate) fn next_down(x: f32) -> f32 {
    -next_up(-x)
}

/// Rounds an f64 to f32 in the given direction (correctly: `as` rounds to
/// nearest once, and a directed result is at most one step away from it).
pub(crate) fn f64_to_f32(v: f64, mode: Round) -> f32 {
    let r = v as f32;
    if r.is_nan() || f64::from(r) == v {
        return r;
    }
    let rv = f64::from(r);
    match mode {
        Round::Nearest => r,
        Round::Zero if rv.abs() > v.abs() => {
            if r > 0.0 {
                next_down(r)
            } else {
                next_up(r)
            }
        }
        Round::Down if rv > v => next_down(r),
        Round::Up if rv < v => next_up(r),
        _ => r,
    }
}

/// f32 bit equality where any NaN equals any NaN (NaN payloads and signs are
/// not specified across implementations).
pub(crate) fn same_f32(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// f64 bit equality where any NaN equals any NaN.
pub(crate) fn same_f64(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_known_encodings() {
        let cases: &[(f32, u16)] = &[
            (0.0, 0x0000),
            (-0.0, 0x8000),
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (65504.0, 0x7bff),
            (65519.99, 0x7bff),
            (65520.0, 0x7c00),
            (1e10, 0x7c00),
            (f32::INFINITY, 0x7c00),
            (f32::NEG_INFINITY, 0xfc00),
            (6.103_515_6e-5, 0x0400), // 2^-14, smallest normal
            (5.960_464_5e-8, 0x0001), // 2^-24, smallest denormal
            (2.980_232_2e-8, 0x0000), // 2^-25: tie, rounds to even (zero)
            (2.980_233e-8, 0x0001),   // just above the tie
            (1.000_488_3, 0x3c00),    // 1 + 2^-11: tie between 1 and 1+2^-10 -> even
            (1.001_464_8, 0x3c02),    // 1 + 3*2^-11: tie -> even (0x3c02)
            (0.333_333_34, 0x3555),
        ];
        for &(x, h) in cases {
            assert_eq!(f32_to_f16_bits(x), h, "f32_to_f16({x:e})");
        }
        assert!(f16_is_nan(f32_to_f16_bits(f32::NAN)));
    }

    #[test]
    fn f16_every_value_round_trips() {
        for h in 0..=u16::MAX {
            let f = f16_bits_to_f32(h);
            if f16_is_nan(h) {
                assert!(f.is_nan());
            } else {
                assert_eq!(f32_to_f16_bits(f), h, "bits {h:#06x} -> {f:e}");
            }
        }
    }

    #[test]
    fn directed_rounding() {
        let third = 1.0f64 / 3.0;
        let rn = third as f32;
        assert_eq!(f64_to_f32(third, Round::Nearest), rn);
        assert!(f64::from(f64_to_f32(third, Round::Down)) < third);
        assert!(f64::from(f64_to_f32(third, Round::Up)) > third);
        assert_eq!(
            f64_to_f32(third, Round::Up),
            next_up(f64_to_f32(third, Round::Down))
        );
        assert_eq!(
            f64_to_f32(-third, Round::Zero),
            -f64_to_f32(third, Round::Zero)
        );
        assert_eq!(f64_to_f32(1e300, Round::Zero), f32::MAX);
        assert_eq!(f64_to_f32(1e300, Round::Up), f32::INFINITY);
        assert_eq!(f64_to_f32(-1e300, Round::Up), -f32::MAX);
        assert_eq!(f64_to_f32(1e-300, Round::Up), f32::from_bits(1));
        assert_eq!(f64_to_f32(1e-300, Round::Down).to_bits(), 0);
        assert_eq!(f64_to_f32(-1e-300, Round::Down), -f32::from_bits(1));
        assert_eq!(f64_to_f32(-1e-300, Round::Up).to_bits(), 0x8000_0000);
        assert_eq!(f64_to_f32(0.5, Round::Down), 0.5);
    }
}
