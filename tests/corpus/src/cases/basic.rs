//! vector_add.cu and saxpy.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "vector_add",
        file: "vector_add",
        kernels: &["vector_add"],
        run: vector_add,
    },
    Case {
        name: "saxpy",
        file: "saxpy",
        kernels: &["saxpy"],
        run: saxpy,
    },
    Case {
        name: "daxpy",
        file: "saxpy",
        kernels: &["daxpy"],
        run: daxpy,
    },
];

/// Elements past `n` in output buffers, which must stay untouched.
const GUARD: usize = 64;

/// IEEE addition is exact to reproduce: bit-for-bit comparison. The output has
/// a guard tail that must keep its poison (the partial last block must not write).
fn vector_add(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 10_000;
    let mut rng = Rng::for_case("vector_add");
    let a: Vec<f32> = (0..N).map(|_| rng.range_f32(-100.0, 100.0)).collect();
    let b: Vec<f32> = (0..N).map(|_| rng.range_f32(-100.0, 100.0)).collect();
    with_module(gpu, arch, "vector_add", |c| {
        let da = c.upload(&a)?;
        let db = c.upload(&b)?;
        let dc = c.output::<f32>(N + GUARD)?;
        c.launch_1d(
            "vector_add",
            N,
            256,
            &[Arg::Ptr(da), Arg::Ptr(db), Arg::Ptr(dc), int(N)],
        )?;
        let got: Vec<f32> = c.read(dc, N + GUARD)?;
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        bits_f32("c = a + b", &got[..N], &want)?;
        exact_hex32(
            "guard after c",
            &got[N..].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            &[POISON; GUARD],
        )
    })
}

/// `y = a*x + y`: NVRTC contracts to fma by default, so the result must equal
/// either the fused (one rounding) or the unfused (two roundings) value exactly.
fn saxpy(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 5_000;
    const A: f32 = 1.7;
    let mut rng = Rng::for_case("saxpy");
    let x: Vec<f32> = (0..N).map(|_| rng.range_f32(-10.0, 10.0)).collect();
    let y: Vec<f32> = (0..N).map(|_| rng.range_f32(-10.0, 10.0)).collect();
    with_module(gpu, arch, "saxpy", |c| {
        let dx = c.upload(&x)?;
        let dy = c.upload(&y)?;
        c.launch_1d(
            "saxpy",
            N,
            128,
            &[int(N), Arg::F32(A), Arg::Ptr(dx), Arg::Ptr(dy)],
        )?;
        let got: Vec<f32> = c.read(dy, N)?;
        compare_by(
            "y = a*x + y (fused or unfused)",
            &got,
            &(0..N).collect::<Vec<_>>(),
            |_, g, &i| {
                g.to_bits() == A.mul_add(x[i], y[i]).to_bits()
                    || g.to_bits() == (A * x[i] + y[i]).to_bits()
            },
            |_, g, &i| {
                (
                    format!("{:e} or {:e}", A.mul_add(x[i], y[i]), A * x[i] + y[i]),
                    format!("{g:e}"),
                )
            },
        )
    })
}

/// f64 version of [`saxpy`], same rule.
fn daxpy(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 3_000;
    const A: f64 = -0.3;
    let mut rng = Rng::for_case("daxpy");
    let x: Vec<f64> = (0..N).map(|_| rng.range_f64(-1e3, 1e3)).collect();
    let y: Vec<f64> = (0..N).map(|_| rng.range_f64(-1e3, 1e3)).collect();
    with_module(gpu, arch, "saxpy", |c| {
        let dx = c.upload(&x)?;
        let dy = c.upload(&y)?;
        c.launch_1d(
            "daxpy",
            N,
            96,
            &[int(N), Arg::F64(A), Arg::Ptr(dx), Arg::Ptr(dy)],
        )?;
        let got: Vec<f64> = c.read(dy, N)?;
        compare_by(
            "y = a*x + y (fused or unfused)",
            &got,
            &(0..N).collect::<Vec<_>>(),
            |_, g, &i| {
                g.to_bits() == A.mul_add(x[i], y[i]).to_bits()
                    || g.to_bits() == (A * x[i] + y[i]).to_bits()
            },
            |_, g, &i| {
                (
                    format!("{:e} or {:e}", A.mul_add(x[i], y[i]), A * x[i] + y[i]),
                    format!("{g:e}"),
                )
            },
        )
    })
}
