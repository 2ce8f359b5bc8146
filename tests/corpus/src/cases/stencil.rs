//! stencil.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "stencil5",
        file: "stencil",
        kernels: &["stencil5"],
        run: plain,
    },
    Case {
        name: "stencil5_shared",
        file: "stencil",
        kernels: &["stencil5_shared"],
        run: shared,
    },
];

const W: usize = 67;
const H: usize = 45;
const C: f32 = 0.2;
const BLOCK: u32 = 16;

fn plain(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    run(gpu, arch, "stencil5")
}

fn shared(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    run(gpu, arch, "stencil5_shared")
}

/// Boundary cells are copied (exact). Interior: six additions and two
/// multiplies, any of them possibly fused; each rounding is at most u times a
/// partial sum bounded by S = |centre| + |c|(sum |neighbours| + 4|centre|), so
/// |error| <= 8*u*S.
fn run(gpu: &mut dyn Gpu, arch: Arch, kernel: &str) -> Result<(), CaseError> {
    let mut rng = Rng::for_case(kernel);
    let input: Vec<f32> = (0..W * H).map(|_| rng.range_f32(-1.0, 1.0)).collect();
    let mut want = vec![0.0f64; W * H];
    let mut tol = vec![0.0f64; W * H];
    let c64 = f64::from(C);
    for y in 0..H {
        for x in 0..W {
            let i = y * W + x;
            let centre = f64::from(input[i]);
            if x == 0 || y == 0 || x == W - 1 || y == H - 1 {
                want[i] = centre;
                continue;
            }
            let nb = [input[i - 1], input[i + 1], input[i - W], input[i + W]].map(f64::from);
            want[i] = centre + c64 * (nb.iter().sum::<f64>() - 4.0 * centre);
            let s = centre.abs()
                + c64.abs() * (nb.iter().map(|v| v.abs()).sum::<f64>() + 4.0 * centre.abs());
            tol[i] = 8.0 * U32 * s;
        }
    }
    with_module(gpu, arch, "stencil", |c| {
        let din = c.upload(&input)?;
        let dout = c.output::<f32>(W * H)?;
        c.launch(
            kernel,
            [blocks(W, BLOCK), blocks(H, BLOCK), 1],
            [BLOCK, BLOCK, 1],
            0,
            &[Arg::Ptr(din), Arg::Ptr(dout), int(W), int(H), Arg::F32(C)],
        )?;
        let got: Vec<f32> = c.read(dout, W * H)?;
        within("5-point step (8*u*S)", &got, &want, &tol)
    })
}
