//! float_special.cu.

use super::prelude::*;
use crate::float::same_f32;

pub(crate) const CASES: &[Case] = &[Case {
    name: "float_special",
    file: "float_special",
    kernels: &["float_special"],
    run: float_special,
}];

const OPS: usize = 10;

const SPECIALS: &[f32] = &[
    0.0,
    -0.0,
    1.0,
    -1.0,
    1.5,
    -2.25,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    f32::MIN_POSITIVE,
    -f32::MIN_POSITIVE,
    1.0e-45,  // smallest denormal
    -1.1e-38, // large denormal
    3.0e-39,
    f32::MAX,
    -f32::MAX,
    1.0e-20,
    4.0,
    0.1,
];

fn bool_f(b: bool) -> f32 {
    if b { 1.0 } else { 0.0 }
}

/// IEEE-754 results computed by Rust (no flush-to-zero; NVRTC's default is -ftz=false).
fn reference(x: f32, y: f32) -> [f32; OPS] {
    [
        x.min(y),
        x.max(y),
        x.copysign(y),
        x + y,
        x * y,
        x.abs() - y,
        x / y,
        x.sqrt(),
        bool_f(x.is_nan())
            + 2.0 * bool_f(x.is_infinite())
            + 4.0 * bool_f(x.is_sign_negative())
            + 8.0 * bool_f(y.is_finite()),
        bool_f(x < y) + 2.0 * bool_f(x == y) + 4.0 * bool_f(x >= y) + 8.0 * bool_f(x != y),
    ]
}

/// Every pair of special values plus random pairs including denormals. Exact
/// bits, with two documented freedoms: any NaN matches any NaN (payloads and
/// signs of generated NaNs differ between implementations), except that
/// copysign must keep the NaN's sign; and fminf/fmaxf of +0 and -0 may return
/// either zero (IEEE minNum/maxNum leave it open).
fn float_special(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    let mut rng = Rng::for_case("float_special");
    let mut pairs: Vec<(f32, f32)> = SPECIALS
        .iter()
        .flat_map(|&a| SPECIALS.iter().map(move |&b| (a, b)))
        .collect();
    pairs.extend((0..300).map(|_| (rng.f32_exp_range(-140, 30), rng.f32_exp_range(-140, 30))));
    let (a, b): (Vec<f32>, Vec<f32>) = pairs.iter().copied().unzip();
    let want: Vec<f32> = pairs.iter().flat_map(|&(x, y)| reference(x, y)).collect();
    let n = pairs.len();
    with_module(gpu, arch, "float_special", |c| {
        let da = c.upload(&a)?;
        let db = c.upload(&b)?;
        let dout = c.output::<f32>(OPS * n)?;
        c.launch_1d(
            "float_special",
            n,
            128,
            &[Arg::Ptr(da), Arg::Ptr(db), Arg::Ptr(dout), int(n)],
        )?;
        let got: Vec<f32> = c.read(dout, OPS * n)?;
        compare_by(
            "[fminf, fmaxf, copysignf, +, *, |x|-y, /, sqrtf, class bits, compare bits] per pair",
            &got,
            &want,
            |i, &g, &w| match i % OPS {
                0 | 1 if g == 0.0 && w == 0.0 => true,
                2 if w.is_nan() => g.is_nan() && g.is_sign_negative() == w.is_sign_negative(),
                _ => same_f32(g, w),
            },
            |i, g, w| {
                let (x, y) = pairs[i / OPS];
                (
                    format!(
                        "{w:e} ({:#010x}) for op {} of ({x:e}, {y:e})",
                        w.to_bits(),
                        i % OPS
                    ),
                    format!("{g:e} ({:#010x})", g.to_bits()),
                )
            },
        )
    })
}
