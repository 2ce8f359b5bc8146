//! Float conversions and arithmetic with explicit rounding modes against CPU references.
// The kernel under test negates float comparisons (`!(x < y)`); the reference mirrors it.
#![allow(clippy::neg_cmp_op_on_partial_ord)]
//!
//! Directed-rounding references are computed independently of the interpreter: operands are
//! decomposed into integer mantissas and exponents, combined exactly in i128, and rounded to the
//! target precision with plain integer logic.

use vgpu_ptx::testutils::*;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Rn,
    Rz,
    Rd,
    Ru,
}

/// x = m * 2^e exactly.
fn decompose(x: f64) -> (i128, i32) {
    if x == 0.0 {
        return (0, 0);
    }
    let b = x.to_bits();
    let exp = ((b >> 52) & 0x7ff) as i32;
    let frac = (b & ((1 << 52) - 1)) as i128;
    let (m, e) = if exp == 0 {
        (frac, -1074)
    } else {
        (frac | (1 << 52), exp - 1075)
    };
    (if x < 0.0 { -m } else { m }, e)
}

/// Rounds n * 2^e to `p` significant bits with quanta no finer than 2^qmin; returns the value.
fn round_exact(n: i128, e: i32, p: u32, qmin: i32, mode: Mode) -> f64 {
    if n == 0 {
        return 0.0;
    }
    let neg = n < 0;
    let a = n.unsigned_abs();
    let len = 128 - a.leading_zeros() as i32;
    let qexp = (e + len - p as i32).max(qmin);
    let shift = qexp - e;
    if shift <= 0 {
        let v = a as f64 * 2f64.powi(e);
        return if neg { -v } else { v };
    }
    let (q, rem_zero, above_half, is_half) = if shift >= 128 {
        (0u128, false, false, false)
    } else {
        let q = a >> shift as u32;
        let rem = a & ((1u128 << shift as u32) - 1);
        let half = 1u128 << (shift as u32 - 1);
        (q, rem == 0, rem > half, rem == half)
    };
    let up = match mode {
        Mode::Rn => above_half || (is_half && q & 1 == 1),
        Mode::Rz => false,
        Mode::Rd => neg && !rem_zero,
        Mode::Ru => !neg && !rem_zero,
    };
    let v = (q + u128::from(up)) as f64 * 2f64.powi(qexp);
    if neg { -v } else { v }
}

fn to_f32(n: i128, e: i32, mode: Mode) -> f32 {
    round_exact(n, e, 24, -149, mode) as f32
}

fn to_f64(n: i128, e: i32, mode: Mode) -> f64 {
    round_exact(n, e, 53, -1074, mode)
}

fn add_exact(a: (i128, i32), b: (i128, i32)) -> (i128, i32) {
    let e = a.1.min(b.1);
    ((a.0 << (a.1 - e)) + (b.0 << (b.1 - e)), e)
}

pub(crate) fn f16_bits(v: f64) -> u16 {
    let sign = if v.is_sign_negative() { 0x8000 } else { 0 };
    let a = v.abs();
    if a.is_nan() {
        return 0x7fff;
    }
    if a.is_infinite() || a >= 65536.0 {
        return sign | 0x7c00;
    }
    if a >= 2f64.powi(-14) {
        let e = a.log2().floor() as i32;
        let e = if 2f64.powi(e) > a {
            e - 1
        } else if 2f64.powi(e + 1) <= a {
            e + 1
        } else {
            e
        };
        let m = ((a / 2f64.powi(e) - 1.0) * 1024.0) as u16;
        sign | (((e + 15) as u16) << 10) | m
    } else {
        sign | (a / 2f64.powi(-24)) as u16
    }
}

/// Nearest-then-adjust conversion of an exact f64 to f32 (handles overflow to MAX/inf).
fn f64_to_f32_dir(x: f64, mode: Mode) -> f32 {
    let r = x as f32;
    if r.is_nan() || f64::from(r) == x {
        return r;
    }
    let up = |v: f32| {
        if v == f32::INFINITY {
            v
        } else if v == 0.0 {
            f32::from_bits(1)
        } else if v > 0.0 {
            f32::from_bits(v.to_bits() + 1)
        } else {
            f32::from_bits(v.to_bits() - 1)
        }
    };
    let down = |v: f32| -up(-v);
    let above = f64::from(r) > x;
    match mode {
        Mode::Rn => r,
        Mode::Rd => {
            if above {
                down(r)
            } else {
                r
            }
        }
        Mode::Ru => {
            if above {
                r
            } else {
                up(r)
            }
        }
        Mode::Rz => {
            if x > 0.0 && above {
                down(r)
            } else if x < 0.0 && !above {
                up(r)
            } else {
                r
            }
        }
    }
}

fn sat_i32(v: f64) -> i32 {
    if v.is_nan() { 0 } else { v as i32 }
}

fn sat_u32(v: f64) -> u32 {
    if v.is_nan() { 0 } else { v as u32 }
}

fn moderate(x: f64, lo: f64, hi: f64) -> bool {
    x == 0.0 || (x.abs() >= lo && x.abs() <= hi)
}

struct Inputs {
    f: Vec<f32>,
    d: Vec<f64>,
}

fn inputs(n: usize) -> Inputs {
    let specials_f = [
        0.0,
        -0.0,
        0.5,
        1.5,
        2.5,
        -2.5,
        -0.5,
        1.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e10,
        -1e10,
        3e38,
        1e-40,
        65504.0,
        65520.0,
        3.0e9,
        4.5e9,
        -3.0e9,
        0.1,
        1.0 / 3.0,
        16777217.0,
        2049.0,
        1e-5,
        6e-8,
    ];
    let specials_d = [
        0.0,
        -0.0,
        0.5,
        2.5,
        -2.5,
        1e20,
        -1e20,
        3.5e38,
        1e-50,
        1.0000000001,
        -7.25,
        123456.789,
        1e-7,
        4.0,
        3.0,
    ];
    let mut f: Vec<f32> = specials_f.to_vec();
    let mut d: Vec<f64> = specials_d.to_vec();
    let mut s = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    while f.len() < n {
        let r = next();
        let mant = 1.0 + (r & 0x7f_ffff) as f32 / 8_388_608.0;
        let e = ((r >> 23) % 17) as i32 - 8;
        let sign = if (r >> 40) & 1 == 1 { -1.0 } else { 1.0 };
        f.push(sign * mant * 2f32.powi(e));
    }
    while d.len() < n {
        let r = next();
        let mant = 1.0 + (r & ((1 << 52) - 1)) as f64 / 2f64.powi(52);
        let e = ((r >> 52) % 9) as i32 - 4;
        let sign = if (r >> 63) & 1 == 1 { -1.0 } else { 1.0 };
        d.push(sign * mant * 2f64.powi(e));
    }
    Inputs { f, d }
}

/// Expected outputs; `None` where the reference does not apply to these inputs.
fn reference(x: f32, y: f32, d: f64, e: f64) -> Vec<Option<u32>> {
    let fb = |v: f32| Some(v.to_bits());
    let (xd, yd) = (f64::from(x), f64::from(y));
    let mod_f =
        moderate(xd, 2f64.powi(-10), 2f64.powi(10)) && moderate(yd, 2f64.powi(-10), 2f64.powi(10));
    let mod_d =
        moderate(d, 2f64.powi(-5), 2f64.powi(5)) && moderate(e, 2f64.powi(-5), 2f64.powi(5));
    let dx = decompose(xd);
    let dy = decompose(yd);
    let prod = (dx.0 * dy.0, dx.1 + dy.1);
    // IEEE signs of exact zero results: a sum is -0 only for (-0) + (-0), or in round-down mode.
    let zero_sum = |neg_a: bool, neg_b: bool, mode: Mode| {
        if (neg_a && neg_b) || (neg_a != neg_b && mode == Mode::Rd) {
            -0.0f32
        } else {
            0.0
        }
    };
    let dir_f = |mode| {
        if !mod_f {
            return None;
        }
        let s = add_exact(dx, dy);
        if s.0 == 0 {
            return fb(zero_sum(x.is_sign_negative(), y.is_sign_negative(), mode));
        }
        fb(to_f32(s.0, s.1, mode))
    };
    let mul_f = |mode| {
        if !mod_f {
            None
        } else if prod.0 == 0 {
            fb(if x.is_sign_negative() != y.is_sign_negative() {
                -0.0
            } else {
                0.0
            })
        } else {
            fb(to_f32(prod.0, prod.1, mode))
        }
    };
    let fma_f = |c: f32, mode| {
        if mod_f {
            let s = add_exact(prod, decompose(f64::from(c)));
            if s.0 == 0 {
                return fb(zero_sum(
                    x.is_sign_negative() != y.is_sign_negative(),
                    c.is_sign_negative(),
                    mode,
                ));
            }
            fb(to_f32(s.0, s.1, mode))
        } else {
            None
        }
    };
    let dd = decompose(d);
    let de = decompose(e);
    let dprod = (dd.0 * de.0, dd.1 + de.1);
    let lo_hi = |v: f64| [v.to_bits() as u32, (v.to_bits() >> 32) as u32];
    let pick = |v: Option<f64>, i: usize| v.map(|v| lo_hi(v)[i]);
    let zero64 = |neg: bool| if neg { -0.0f64 } else { 0.0 };
    let dsum = if mod_d {
        let s = add_exact(dd, de);
        Some(if s.0 == 0 {
            zero64(d.is_sign_negative() && e.is_sign_negative())
        } else {
            to_f64(s.0, s.1, Mode::Rz)
        })
    } else {
        None
    };
    let dmul = if mod_d {
        Some(if dprod.0 == 0 {
            zero64(d.is_sign_negative() != e.is_sign_negative())
        } else {
            to_f64(dprod.0, dprod.1, Mode::Ru)
        })
    } else {
        None
    };
    let dfma = if mod_d {
        let s = add_exact(dprod, decompose(0.25));
        Some(to_f64(s.0, s.1, Mode::Rd))
    } else {
        None
    };
    let q = d / e;
    let r = d.abs().sqrt();
    let c = xd;
    let i6 = sat_i32(f64::from(x * 1e6f32).trunc());
    let ll = {
        let t = (d * 1e9).trunc();
        if t.is_nan() { 0 } else { t as i64 }
    };
    let ull = {
        let t = (d * 1e12).abs().trunc();
        if t.is_nan() { 0 } else { t as u64 }
    };
    let ll2d = to_f64(ll as i128, 0, Mode::Rz);
    let f16 = |mode| {
        if xd.is_nan() {
            Some(0x7fff)
        } else if xd.is_infinite() {
            Some(f16_bits(xd) as u32)
        } else {
            let (n, ex) = decompose(xd);
            let v = round_exact(n, ex, 11, -24, mode);
            let v = if v.abs() >= 65520.0 || (v.abs() > 65504.0) {
                match (mode, v > 0.0) {
                    (Mode::Rz, _) | (Mode::Rd, true) | (Mode::Ru, false) => 65504.0f64.copysign(v),
                    _ => f64::INFINITY.copysign(v),
                }
            } else {
                v
            };
            Some(f16_bits(if v == 0.0 { 0.0f64.copysign(xd) } else { v }) as u32)
        }
    };
    let bf16 = if xd.is_nan() {
        0x7fff
    } else {
        let v = round_exact(decompose(xd).0, decompose(xd).1, 8, -133, Mode::Rn);
        let v = if v == 0.0 { 0.0f64.copysign(xd) } else { v };
        if xd.is_infinite() || v.abs() > f64::from(f32::MAX) {
            f32::INFINITY.copysign(x).to_bits() >> 16
        } else {
            (v as f32).to_bits() >> 16
        }
    };
    let half_back = f16(Mode::Rn).map(|h| {
        let h = h as u16;
        let e = (h >> 10) & 0x1f;
        let m = f64::from(h & 0x3ff);
        let mag = if e == 0x1f {
            if m == 0.0 { f64::INFINITY } else { f64::NAN }
        } else if e == 0 {
            m * 2f64.powi(-24)
        } else {
            (1.0 + m / 1024.0) * 2f64.powi(e as i32 - 15)
        };
        (if h & 0x8000 != 0 { -mag } else { mag } as f32).to_bits()
    });
    let cmp = (x < y) as u32
        | ((x <= y) as u32) << 1
        | ((x == y) as u32) << 2
        | ((x != y) as u32) << 3
        | ((x > y) as u32) << 4
        | ((x >= y) as u32) << 5
        | ((!(x < y)) as u32) << 6
        | ((!(x >= y)) as u32) << 7;
    vec![
        Some(sat_i32(xd.round_ties_even()) as u32),
        Some(sat_i32(xd.trunc()) as u32),
        Some(sat_i32(xd.floor()) as u32),
        Some(sat_i32(xd.ceil()) as u32),
        Some(sat_u32(xd.round_ties_even())),
        Some(sat_u32(xd.trunc())),
        fb(to_f32(i6 as i128, 0, Mode::Rz)),
        fb(to_f32(x.to_bits() as i128, 0, Mode::Rd)),
        fb(to_f32(x.to_bits() as i128, 0, Mode::Ru)),
        fb(f64_to_f32_dir(d, Mode::Rn)),
        fb(f64_to_f32_dir(d, Mode::Rz)),
        fb(f64_to_f32_dir(d, Mode::Rd)),
        fb(f64_to_f32_dir(d, Mode::Ru)),
        dir_f(Mode::Rz),
        dir_f(Mode::Rd),
        dir_f(Mode::Ru),
        mul_f(Mode::Rz),
        mul_f(Mode::Ru),
        fma_f(1.5, Mode::Rd),
        fma_f(-1.5, Mode::Ru),
        fb(x / y),
        fb(x.abs().sqrt()),
        fb(1.0 / x),
        fb(x / y),
        // min/max order -0 below +0 (IEEE 754-2019 minimum/maximum; PTX min/max).
        fb(if x.is_nan() {
            y
        } else if y.is_nan() {
            x
        } else if x == y {
            if x.is_sign_negative() { x } else { y }
        } else {
            x.min(y)
        }),
        fb(if x.is_nan() {
            y
        } else if y.is_nan() {
            x
        } else if x == y {
            if x.is_sign_negative() { y } else { x }
        } else {
            x.max(y)
        }),
        fb(x.copysign(y)),
        fb(x.floor()),
        fb(x.ceil()),
        fb(x.trunc()),
        fb(x.round_ties_even()),
        Some(
            x.is_nan() as u32
                | (x.is_infinite() as u32) << 1
                | (x.is_sign_negative() as u32) << 2
                | (x.is_finite() as u32) << 3,
        ),
        f16(Mode::Rn),
        f16(Mode::Rz),
        f16(Mode::Rd),
        f16(Mode::Ru),
        half_back,
        Some(bf16),
        Some(bf16 << 16),
        fb(x.abs() + (-y)),
        Some(sat_i32(d.round_ties_even()) as u32),
        Some((if d.is_nan() { 0 } else { d.trunc() as i64 }) as u32),
        Some((if d.is_nan() { 0 } else { d.floor() as u64 }) as u32),
        pick(dsum, 0),
        pick(dsum, 1),
        pick(dmul, 0),
        pick(dmul, 1),
        pick(dfma, 0),
        pick(dfma, 1),
        Some(lo_hi(q)[0]),
        Some(lo_hi(q)[1]),
        Some(lo_hi(r)[0]),
        Some(lo_hi(r)[1]),
        Some(lo_hi(c)[0]),
        Some(lo_hi(c)[1]),
        Some(lo_hi(ll2d)[0]),
        Some(lo_hi(ll2d)[1]),
        fb(to_f32(ull as i128, 0, Mode::Ru)),
        Some(cmp),
        fb(x.mul_add(y, d as f32)),
        fb(if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) }),
        fb(if x.is_nan() || y.is_nan() {
            f32::NAN
        } else if x > y {
            x - y
        } else {
            0.0
        }),
        fb((x - y) * 0.5),
        fb(x.round()),
    ]
}

fn same_float_bits(got: u32, want: u32) -> bool {
    got == want || (f32::from_bits(got).is_nan() && f32::from_bits(want).is_nan())
}

#[test]
fn conversions_and_rounding_modes_match_cpu() {
    const NF: usize = 64;
    let n = 400;
    let inp = inputs(n);
    // Outputs that are raw integers (not float bit patterns).
    let int_ops = [
        0usize, 1, 2, 3, 4, 5, 31, 32, 33, 34, 35, 37, 40, 41, 42, 58,
    ];
    for arch in ARCHS {
        let m = load_fixture("floatops", arch);
        let mem = TestMemory::new();
        let (df, dd, dout) = (
            mem.alloc_from(&inp.f),
            mem.alloc_from(&inp.d),
            mem.alloc(n * NF * 4),
        );
        run(
            &m,
            "floatops",
            &Config::linear(4, 128),
            &[
                Arg::U64(df),
                Arg::U64(dd),
                Arg::U64(dout),
                Arg::I32(n as i32),
            ],
            &mem,
            &alloc_globals(&m, &mem),
        )
        .unwrap();
        let out: Vec<u32> = mem.read(dout, n * NF);
        let mut checked = 0;
        for i in 0..n {
            let want = reference(inp.f[i], inp.f[(i + 1) % n], inp.d[i], inp.d[(i + 1) % n]);
            for k in 0..NF {
                let Some(w) = want[k] else { continue };
                let got = out[i * NF + k];
                // 64-bit halves of NaN doubles are not produced here (inputs are finite).
                let ok = if (43..=56).contains(&k) {
                    // Doubles span two words: compare whole values, any NaN matching any NaN.
                    let base = i * NF + k - (k - 43) % 2;
                    let got64 =
                        f64::from_bits(u64::from(out[base]) | (u64::from(out[base + 1]) << 32));
                    let lo = want[k - (k - 43) % 2].unwrap_or(0);
                    let hi = want[k - (k - 43) % 2 + 1].unwrap_or(0);
                    let want64 = f64::from_bits(u64::from(lo) | (u64::from(hi) << 32));
                    got64.to_bits() == want64.to_bits() || (got64.is_nan() && want64.is_nan())
                } else if int_ops.contains(&k) {
                    got == w
                } else {
                    same_float_bits(got, w)
                };
                assert!(
                    ok,
                    "{arch}: op {k} for x={:e} ({:#x}) y={:e} d={:e} e={:e}: got {got:#x}, want {w:#x}",
                    inp.f[i],
                    inp.f[i].to_bits(),
                    inp.f[(i + 1) % n],
                    inp.d[i],
                    inp.d[(i + 1) % n]
                );
                checked += 1;
            }
        }
        assert!(checked > n * 55, "{arch}: only {checked} checks applied");
    }
}

#[test]
fn transcendentals_are_close() {
    let n = 256;
    let x: Vec<f32> = (0..n).map(|i| (i as f32 - 128.0) * 0.37).collect();
    for arch in ARCHS {
        let m = load_fixture("floatops", arch);
        let mem = TestMemory::new();
        let (dx, dout) = (mem.alloc_from(&x), mem.alloc(n * 12 * 4));
        run(
            &m,
            "mathfns",
            &Config::linear(2, 128),
            &[Arg::U64(dx), Arg::U64(dout), Arg::I32(n as i32)],
            &mem,
            &alloc_globals(&m, &mem),
        )
        .unwrap();
        let out: Vec<f32> = mem.read(dout, n * 12);
        for i in 0..n {
            let v = x[i];
            let want = [
                v.sin(),
                v.cos(),
                (v * 0.01).exp(),
                (v.abs() + 1.0).ln(),
                v.abs().sqrt(),
                1.0 / (v.abs() + 1.0).sqrt(),
                (v * 0.01).tanh(),
                v.sin(),
                (v * 0.01).exp(),
                (v.abs() + 1.0).log2(),
                (v.abs() + 1.0).sqrt(),
                (f64::from(v) * 0.01).exp() as f32,
            ];
            for k in 0..12 {
                let got = out[i * 12 + k];
                let tol = if k == 7 {
                    2e-3
                } else {
                    2e-6 * want[k].abs().max(1.0)
                };
                assert!(
                    (got - want[k]).abs() <= tol,
                    "{arch}: fn {k} of {v}: got {got}, want {}",
                    want[k]
                );
            }
        }
    }
}
