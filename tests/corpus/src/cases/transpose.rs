//! transpose.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "transpose_naive",
        file: "transpose",
        kernels: &["transpose_naive"],
        run: naive,
    },
    Case {
        name: "transpose_tiled",
        file: "transpose",
        kernels: &["transpose_tiled"],
        run: tiled,
    },
];

const W: usize = 100;
const H: usize = 70;

fn naive(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    run(
        gpu,
        arch,
        "transpose_naive",
        [16, 16, 1],
        [blocks(W, 16), blocks(H, 16), 1],
    )
}

/// 32x32 tiles moved by 32x8 blocks; 100x70 leaves partial tiles on both edges.
fn tiled(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    run(
        gpu,
        arch,
        "transpose_tiled",
        [32, 8, 1],
        [blocks(W, 32), blocks(H, 32), 1],
    )
}

/// Data movement only: bit-exact.
fn run(
    gpu: &mut dyn Gpu,
    arch: Arch,
    kernel: &str,
    block: [u32; 3],
    grid: [u32; 3],
) -> Result<(), CaseError> {
    let mut rng = Rng::for_case(kernel);
    let input: Vec<f32> = (0..W * H).map(|_| rng.range_f32(-1e6, 1e6)).collect();
    with_module(gpu, arch, "transpose", |c| {
        let din = c.upload(&input)?;
        let dout = c.output::<f32>(W * H)?;
        c.launch(
            kernel,
            grid,
            block,
            0,
            &[Arg::Ptr(din), Arg::Ptr(dout), int(W), int(H)],
        )?;
        let got: Vec<f32> = c.read(dout, W * H)?;
        let want: Vec<f32> = (0..W * H).map(|k| input[(k % H) * W + k / H]).collect();
        bits_f32("out = in^T", &got, &want)
    })
}
