//! softmax.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "softmax_rows",
        file: "softmax",
        kernels: &["softmax_rows"],
        run: accurate,
    },
    Case {
        name: "softmax_rows_fast",
        file: "softmax",
        kernels: &["softmax_rows_fast"],
        run: fast,
    },
];

const ROWS: usize = 33;
const COLS: usize = 300;
const THREADS: u32 = 128;
/// Inputs lie in [-RANGE, RANGE), so x - max lies in [-2*RANGE, 0].
const RANGE: f32 = 8.0;
/// CUDA documents expf as accurate to 2 ulp.
const EXPF_ULPS: f64 = 2.0;
/// CUDA documents __expf as 2 + floor(|1.173 x|) ulp; |x| <= 16 here.
const FAST_EXPF_ULPS: f64 = 2.0 + 19.0;

/// Relative bound per output: each exponential is off by `exp_ulps` ulp (an ulp
/// is at most 2u relative), the f32 sum of COLS positive terms in any order adds
/// at most COLS*u, the final division u; doubled for slack. x - max is rounded
/// in f32 exactly as the kernel does, so only the exponential and the sums differ.
fn run(gpu: &mut dyn Gpu, arch: Arch, kernel: &str, exp_ulps: f64) -> Result<(), CaseError> {
    let mut rng = Rng::for_case(kernel);
    let input: Vec<f32> = (0..ROWS * COLS)
        .map(|_| rng.range_f32(-RANGE, RANGE))
        .collect();
    let rel = 2.0 * (2.0 * 2.0 * exp_ulps + COLS as f64 + 1.0) * U32;
    let mut want = Vec::with_capacity(ROWS * COLS);
    for row in input.chunks(COLS) {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = row.iter().map(|&x| f64::from(x - m).exp()).collect();
        let total: f64 = e.iter().sum();
        want.extend(e.iter().map(|v| v / total));
    }
    let tol: Vec<f64> = want.iter().map(|w| w * rel).collect();
    with_module(gpu, arch, "softmax", |c| {
        let din = c.upload(&input)?;
        let dout = c.output::<f32>(ROWS * COLS)?;
        c.launch(
            kernel,
            [ROWS as u32, 1, 1],
            [THREADS, 1, 1],
            0,
            &[Arg::Ptr(din), Arg::Ptr(dout), int(COLS)],
        )?;
        let got: Vec<f32> = c.read(dout, ROWS * COLS)?;
        within(&format!("softmax (relative {rel:.1e})"), &got, &want, &tol)
    })
}

fn accurate(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    run(gpu, arch, "softmax_rows", EXPF_ULPS)
}

fn fast(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    run(gpu, arch, "softmax_rows_fast", FAST_EXPF_ULPS)
}
