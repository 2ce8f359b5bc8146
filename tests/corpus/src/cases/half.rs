//! half.cu.

use super::prelude::*;
use crate::float::{f16_bits_to_f32, f16_is_nan, f32_to_f16_bits};

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "half_roundtrip",
        file: "half",
        kernels: &["half_roundtrip"],
        run: roundtrip,
    },
    Case {
        name: "half_arith",
        file: "half",
        kernels: &["half_arith"],
        run: arith,
    },
];

/// f16 bit equality where any NaN matches any NaN.
fn same_f16(a: u16, b: u16) -> bool {
    (f16_is_nan(a) && f16_is_nan(b)) || a == b
}

fn compare_f16(what: &str, got: &[u16], want: &[u16]) -> Result<(), CaseError> {
    compare_by(
        what,
        got,
        want,
        |_, g, w| same_f16(*g, *w),
        |_, g, w| {
            (
                format!("{w:#06x} ({:e})", f16_bits_to_f32(*w)),
                format!("{g:#06x} ({:e})", f16_bits_to_f32(*g)),
            )
        },
    )
}

/// __float2half rounds to nearest even (ties, denormals, overflow to inf,
/// underflow to zero); __half2float is exact. Both compared bit for bit.
fn roundtrip(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    let mut rng = Rng::for_case("half_roundtrip");
    let mut input: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.5,
        65504.0,
        65519.0,
        65520.0,
        -70000.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MAX,
        2f32.powi(-14),             // smallest normal f16
        2f32.powi(-24),             // smallest denormal f16
        2f32.powi(-25),             // tie: rounds to zero
        -1.5 * 2f32.powi(-24),      // tie: rounds to even (2 * 2^-24)
        1.0 + 2f32.powi(-11),       // tie: rounds to even (1.0)
        1.0 + 3.0 * 2f32.powi(-11), // tie: rounds to even (1 + 2^-9)
        65504.0 + 16.0 - 2f32.powi(-8),
        f32::from_bits(1),
        0.1,
    ];
    input.extend((0..2_000).map(|_| rng.f32_exp_range(-27, 17)));
    let n = input.len();
    let want_h: Vec<u16> = input.iter().map(|&x| f32_to_f16_bits(x)).collect();
    let want_f: Vec<f32> = want_h.iter().map(|&h| f16_bits_to_f32(h)).collect();
    with_module(gpu, arch, "half", |c| {
        let din = c.upload(&input)?;
        let dh = c.output::<u16>(n)?;
        let df = c.output::<f32>(n)?;
        c.launch_1d(
            "half_roundtrip",
            n,
            128,
            &[Arg::Ptr(din), Arg::Ptr(dh), Arg::Ptr(df), int(n)],
        )?;
        let got_h: Vec<u16> = c.read(dh, n)?;
        let got_f: Vec<f32> = c.read(df, n)?;
        compare_f16("__float2half", &got_h, &want_h)?;
        bits_f32("__half2float(__float2half(x))", &got_f, &want_f)
    })
}

/// A random f16: mostly normals, some denormals, a few specials.
fn random_half(rng: &mut Rng) -> u16 {
    match rng.below(16) {
        0 => rng.pick(&[
            0x0000, 0x8000, 0x7c00, 0xfc00, 0x7bff, 0x0001, 0x03ff, 0x3c00,
        ]),
        1 => (rng.next_u32() as u16) & 0x83ff,
        _ => {
            let exp = 1 + rng.below(30) as u16;
            (rng.next_u32() as u16 & 0x83ff) | (exp << 10)
        }
    }
}

/// __hadd/__hsub/__hmul and __hlt. On sm_53+ these are native f16 instructions
/// (one rounding); on sm_52 cuda_fp16.h computes in f32 and rounds to f16. Both
/// give the correctly rounded result: f16 operands are exact in f32 and double
/// rounding through a 24-bit format is innocuous for +, -, * of 11-bit operands
/// (24 >= 2*11 + 2). So the reference rounds the f32 result once more: exact.
fn arith(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 1_500;
    let mut rng = Rng::for_case("half_arith");
    let a: Vec<u16> = (0..N).map(|_| random_half(&mut rng)).collect();
    let b: Vec<u16> = (0..N).map(|_| random_half(&mut rng)).collect();
    let want: Vec<u16> = a
        .iter()
        .zip(&b)
        .flat_map(|(&x, &y)| {
            let (fx, fy) = (f16_bits_to_f32(x), f16_bits_to_f32(y));
            [
                f32_to_f16_bits(fx + fy),
                f32_to_f16_bits(fx - fy),
                f32_to_f16_bits(fx * fy),
                u16::from(fx < fy),
            ]
        })
        .collect();
    with_module(gpu, arch, "half", |c| {
        let da = c.upload(&a)?;
        let db = c.upload(&b)?;
        let dout = c.output::<u16>(4 * N)?;
        c.launch_1d(
            "half_arith",
            N,
            128,
            &[Arg::Ptr(da), Arg::Ptr(db), Arg::Ptr(dout), int(N)],
        )?;
        let got: Vec<u16> = c.read(dout, 4 * N)?;
        compare_f16("[hadd, hsub, hmul, hlt] per pair", &got, &want)
    })
}
