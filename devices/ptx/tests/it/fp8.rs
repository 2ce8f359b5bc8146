//! FP8 conversions (`cvt` with `.e4m3x2`/`.e5m2x2`, sm_89) as `cuda_fp8.h` writes them, in a
//! kernel compiled by NVRTC for compute_90 (`fixtures/fp8.cu`): every value below against the
//! formats' definitions, computed here independently of the interpreter.

use vgpu_ptx::testutils::*;
use vgpu_ptx::*;

/// The value of an FP8 `code` with `m` mantissa bits and exponent bias `bias` (`inf`: whether
/// the top exponent holds infinities, as in E5M2; E4M3's top code is NaN).
fn value(code: u8, m: u32, bias: i32, inf: bool) -> f32 {
    let mag = code & 0x7f;
    let exp = i32::from(mag >> m);
    let mant = f64::from(mag & ((1 << m) - 1)) / f64::from(1u32 << m);
    let top = 0x7f >> m;
    let v = if inf && exp == top {
        if mant == 0.0 { f32::INFINITY } else { f32::NAN }
    } else if !inf && mag == 0x7f {
        f32::NAN
    } else if exp == 0 {
        (mant * 2f64.powi(1 - bias)) as f32
    } else {
        ((1.0 + mant) * 2f64.powi(exp - bias)) as f32
    };
    if code & 0x80 != 0 { -v } else { v }
}

/// The code nearest `x` (ties to even), saturating at the largest finite `max`.
fn nearest(x: f32, m: u32, bias: i32, inf: bool, max: u8) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = f64::from(x.abs());
    // .satfinite: past the largest finite value (infinities too) is the largest finite value.
    if a >= f64::from(value(max, m, bias, inf)) {
        return sign | max;
    }
    let mut best = 0u8;
    for c in 0..=max {
        let (v, b) = (
            f64::from(value(c, m, bias, inf)),
            f64::from(value(best, m, bias, inf)),
        );
        if (v - a).abs() < (b - a).abs() || ((v - a).abs() == (b - a).abs() && c % 2 == 0) {
            best = c;
        }
    }
    sign | best
}

#[test]
fn floats_round_to_e4m3_and_e5m2_and_back() {
    let mut x: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.1,
        1.0625,
        1.1875,
        std::f32::consts::PI,
        447.0,
        448.0,
        460.0,
        1000.0,
        57344.0,
        60000.0,
        1e9,
        -1e9,
        2f32.powi(-9),
        2f32.powi(-10),
        2f32.powi(-16),
        1e-30,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    x.extend((0..200).map(|i| (i as f32 - 100.0) * 0.37 + (i % 7) as f32 * 0.013));
    let n = x.len();
    let m = load_fixture("fp8", "compute_90");
    let mem = TestMemory::new();
    let (dx, codes, back) = (mem.alloc_from(&x), mem.alloc(2 * n), mem.alloc(8 * n));
    let g = alloc_globals(&m, &mem);
    let args = [
        Arg::U64(dx),
        Arg::U64(codes),
        Arg::U64(back),
        Arg::I32(n as i32),
    ];
    run(
        &m,
        "round_trip",
        &Config::linear(n.div_ceil(64) as u32, 64),
        &args,
        &mem,
        &g,
    )
    .unwrap_or_else(|f| panic!("{f}"));
    let (codes, back) = (mem.read::<u8>(codes, 2 * n), mem.read::<f32>(back, 2 * n));
    for (i, &v) in x.iter().enumerate() {
        let e4 = nearest(v, 3, 7, false, 0x7e);
        let e5 = nearest(v, 2, 15, true, 0x7b);
        assert_eq!(codes[2 * i], e4, "E4M3 of {v}");
        assert_eq!(codes[2 * i + 1], e5, "E5M2 of {v}");
        let (b4, b5) = (value(e4, 3, 7, false), value(e5, 2, 15, true));
        assert!(
            back[2 * i] == b4 || (b4.is_nan() && back[2 * i].is_nan()),
            "E4M3 {v} back {}",
            back[2 * i]
        );
        assert!(
            back[2 * i + 1] == b5 || (b5.is_nan() && back[2 * i + 1].is_nan()),
            "E5M2 {v} back {}",
            back[2 * i + 1]
        );
    }
}

#[test]
fn half_pairs_round_to_e4m3_pairs_and_back() {
    let vals: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) * 3.3).collect();
    let h: Vec<u16> = vals
        .iter()
        .map(|&v| super::floatops::f16_bits(f64::from(v)))
        .collect();
    let n = vals.len() / 2;
    let m = load_fixture("fp8", "compute_90");
    let mem = TestMemory::new();
    let (dh, codes, back) = (mem.alloc_from(&h), mem.alloc(2 * n), mem.alloc(4 * n));
    let g = alloc_globals(&m, &mem);
    let args = [
        Arg::U64(dh),
        Arg::U64(codes),
        Arg::U64(back),
        Arg::I32(n as i32),
    ];
    run(&m, "pairs", &Config::linear(1, 32), &args, &mem, &g).unwrap_or_else(|f| panic!("{f}"));
    let (codes, back) = (mem.read::<u16>(codes, n), mem.read::<u16>(back, 2 * n));
    for i in 0..n {
        // A half2's first element (its low half) goes to the pair's low byte.
        let (lo, hi) = (
            super::half::f16_to_f64(h[2 * i]) as f32,
            super::half::f16_to_f64(h[2 * i + 1]) as f32,
        );
        let want = u16::from(nearest(lo, 3, 7, false, 0x7e))
            | (u16::from(nearest(hi, 3, 7, false, 0x7e)) << 8);
        assert_eq!(codes[i], want, "pair {i}: {lo}, {hi}");
        for (k, c) in [(0, want & 0xff), (1, want >> 8)] {
            let v = f64::from(value(c as u8, 3, 7, false));
            assert_eq!(
                super::half::f16_to_f64(back[2 * i + k]),
                v,
                "pair {i} element {k}"
            );
        }
    }
}

#[test]
fn fp8_conversions_without_satfinite_or_with_another_rounding_are_refused() {
    let body = |inst: &str| {
        format!(
            ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{{\n.reg .b16 %h<2>;\n.reg .b32 %r<3>;\n.reg .f32 %f<3>;\n{inst}\nret;\n}}\n"
        )
    };
    for inst in [
        "cvt.rn.e4m3x2.f32 %h1, %f1, %f2;",
        "cvt.rz.satfinite.e4m3x2.f32 %h1, %f1, %f2;",
        "cvt.rn.satfinite.e4m3x2.f64 %h1, %f1, %f2;",
    ] {
        let e = Module::load(&body(inst)).unwrap_err();
        assert_eq!(e.kind, LoadErrorKind::NotSupported, "{inst}: {e}");
    }
}
