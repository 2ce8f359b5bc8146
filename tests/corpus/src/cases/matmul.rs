//! matmul.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "matmul_naive",
        file: "matmul",
        kernels: &["matmul_naive"],
        run: naive,
    },
    Case {
        name: "matmul_tiled",
        file: "matmul",
        kernels: &["matmul_tiled"],
        run: tiled,
    },
];

const M: usize = 61;
const N: usize = 47;
const K: usize = 64;
const TILE: u32 = 16;

fn naive(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    run(gpu, arch, "matmul_naive")
}

fn tiled(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    run(gpu, arch, "matmul_tiled")
}

/// 61x64 times 64x47 (neither a multiple of the 16x16 tile). Tolerance: the
/// standard dot-product bound |fl(sum) - sum| <= gamma_K * sum |a||b| with
/// gamma_K ~ K*u, doubled for slack; any summation order or fma use fits.
fn run(gpu: &mut dyn Gpu, arch: Arch, kernel: &str) -> Result<(), CaseError> {
    let mut rng = Rng::for_case(kernel);
    let a: Vec<f32> = (0..M * K).map(|_| rng.range_f32(-1.0, 1.0)).collect();
    let b: Vec<f32> = (0..K * N).map(|_| rng.range_f32(-1.0, 1.0)).collect();
    let mut want = vec![0.0f64; M * N];
    let mut tol = vec![0.0f64; M * N];
    for r in 0..M {
        for col in 0..N {
            let (mut s, mut abs) = (0.0f64, 0.0f64);
            for k in 0..K {
                let p = f64::from(a[r * K + k]) * f64::from(b[k * N + col]);
                s += p;
                abs += p.abs();
            }
            want[r * N + col] = s;
            tol[r * N + col] = 2.0 * K as f64 * U32 * abs;
        }
    }
    with_module(gpu, arch, "matmul", |c| {
        let da = c.upload(&a)?;
        let db = c.upload(&b)?;
        let dc = c.output::<f32>(M * N)?;
        let grid = [blocks(N, TILE), blocks(M, TILE), 1];
        c.launch(
            kernel,
            grid,
            [TILE, TILE, 1],
            0,
            &[
                Arg::Ptr(da),
                Arg::Ptr(db),
                Arg::Ptr(dc),
                int(M),
                int(N),
                int(K),
            ],
        )?;
        let got: Vec<f32> = c.read(dc, M * N)?;
        within("C = A*B (2*K*u*sum|a||b|)", &got, &want, &tol)
    })
}
