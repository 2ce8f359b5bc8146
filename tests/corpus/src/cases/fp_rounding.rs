//! fp_rounding.cu.

use super::prelude::*;
use crate::float::{Round, f64_to_f32};

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "fp_directed",
        file: "fp_rounding",
        kernels: &["fp_directed"],
        run: directed,
    },
    Case {
        name: "fp_convert",
        file: "fp_rounding",
        kernels: &["fp_convert"],
        run: convert,
    },
];

const FOPS: usize = 12;
const IOPS: usize = 10;

/// The exact product of two f32 (it fits in f64: 48-bit significand, no
/// overflow or underflow), rounded once in the given direction.
fn mul(x: f32, y: f32, mode: Round) -> f32 {
    f64_to_f32(f64::from(x) * f64::from(y), mode)
}

fn directed_reference(x: f32, y: f32, z: f64) -> [f32; FOPS] {
    [
        mul(x, y, Round::Nearest),
        mul(x, y, Round::Zero),
        mul(x, y, Round::Down),
        mul(x, y, Round::Up),
        x.mul_add(y, x),
        x / y,
        x.abs().sqrt(),
        1.0 / y,
        f64_to_f32(z, Round::Nearest),
        f64_to_f32(z, Round::Zero),
        f64_to_f32(z, Round::Down),
        f64_to_f32(z, Round::Up),
    ]
}

/// Directed-rounding multiplies, fma, correctly rounded div/sqrt/rcp, and f64->f32
/// in four modes, over operands whose products overflow, underflow into
/// denormals, and hit specials. All IEEE-specified: exact bits (any NaN matches).
fn directed(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    let mut rng = Rng::for_case("fp_directed");
    let mut x: Vec<f32> = vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NAN,
        1.0,
        3.0,
        f32::MAX,
        f32::from_bits(1),
    ];
    let mut y: Vec<f32> = vec![5.0, -3.0, 0.0, 1.0, 1.0 / 3.0, 1.0 / 3.0, 2.0, 0.5];
    let mut z: Vec<f64> = vec![
        0.1,
        -0.1,
        1e39,
        -1e39,
        1e-46,
        -1e-46,
        f64::INFINITY,
        f64::NAN,
    ];
    for _ in 0..800 {
        x.push(rng.f32_exp_range(-80, 70));
        y.push(rng.f32_exp_range(-80, 70));
        let mag = rng.range_f64(-160.0, 140.0);
        z.push(2f64.powf(mag) * if rng.below(2) == 0 { 1.0 } else { -1.0 });
    }
    let n = x.len();
    let want: Vec<f32> = (0..n)
        .flat_map(|i| directed_reference(x[i], y[i], z[i]))
        .collect();
    with_module(gpu, arch, "fp_rounding", |c| {
        let dx = c.upload(&x)?;
        let dy = c.upload(&y)?;
        let dz = c.upload(&z)?;
        let dout = c.output::<f32>(FOPS * n)?;
        c.launch_1d(
            "fp_directed",
            n,
            128,
            &[
                Arg::Ptr(dx),
                Arg::Ptr(dy),
                Arg::Ptr(dz),
                Arg::Ptr(dout),
                int(n),
            ],
        )?;
        let got: Vec<f32> = c.read(dout, FOPS * n)?;
        bits_f32(
            "[mul rn/rz/rd/ru, fma, div, sqrt, rcp, d2f rn/rz/rd/ru] per element",
            &got,
            &want,
        )
    })
}

fn convert_reference(x: f32, z: f64) -> [i32; IOPS] {
    // Rust's float->int `as` saturates and maps NaN to 0, exactly like PTX cvt.
    let rz = x as i32;
    let ll = z as i64;
    [
        x.round_ties_even() as i32,
        rz,
        x.floor() as i32,
        x.ceil() as i32,
        x as u32 as i32,
        z.round_ties_even() as i32,
        ll as u32 as i32,
        ((ll as u64) >> 32) as u32 as i32,
        ((rz as u32).wrapping_mul(3).wrapping_add(1) as i32 as f32).to_bits() as i32,
        f64_to_f32(f64::from(ll as u32), Round::Zero).to_bits() as i32,
    ]
}

/// float/double -> int in every rounding mode, with ties, saturation past the
/// integer range and NaN -> 0 (PTX cvt semantics), and int -> float rounding. Exact.
/// The double input has no NaN: it also feeds a 64-bit conversion, and what NaN
/// becomes there is not pinned down by the PTX ISA text.
fn convert(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    let mut rng = Rng::for_case("fp_convert");
    let mut x: Vec<f32> = vec![
        0.5,
        1.5,
        2.5,
        -0.5,
        -1.5,
        -2.5,
        3e9,
        -3e9,
        5e9,
        f32::NAN,
        f32::INFINITY,
        -0.0,
        2147483520.0,
    ];
    let mut z: Vec<f64> = vec![
        0.5,
        1.5,
        -2.5,
        2.5,
        3e9,
        -3e9,
        1e19,
        -1e19,
        0.499_999_999_999_999_94, // largest double below 0.5
        f64::NEG_INFINITY,
        4294967295.5,
        -0.99,
    ];
    z.push(9_007_199_254_740_993.0);
    while x.len() < z.len() {
        x.push(rng.range_f32(-100.0, 100.0));
    }
    for i in 0..700 {
        let scale = [1.0, 1e3, 1e6, 3e9][i % 4];
        x.push(if i % 5 == 0 {
            rng.range_i32(-50, 50) as f32 + 0.5
        } else {
            rng.range_f32(-1.0, 1.0) * scale
        });
        z.push(if i % 7 == 0 {
            f64::from(rng.range_i32(-50, 50)) - 0.5
        } else {
            rng.range_f64(-1.0, 1.0) * f64::from(scale) * 1e3
        });
    }
    let n = x.len();
    let want: Vec<i32> = (0..n).flat_map(|i| convert_reference(x[i], z[i])).collect();
    with_module(gpu, arch, "fp_rounding", |c| {
        let dx = c.upload(&x)?;
        let dz = c.upload(&z)?;
        let dout = c.output::<i32>(IOPS * n)?;
        c.launch_1d(
            "fp_convert",
            n,
            128,
            &[Arg::Ptr(dx), Arg::Ptr(dz), Arg::Ptr(dout), int(n)],
        )?;
        let got: Vec<i32> = c.read(dout, IOPS * n)?;
        exact(
            "[f2i rn/rz/rd/ru, f2u rz, d2i rn, d2ll rz lo/hi, i2f rn bits, u2f rz bits] per element",
            &got,
            &want,
        )
    })
}
