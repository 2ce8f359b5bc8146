//! mandelbrot.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[Case {
    name: "mandelbrot",
    file: "mandelbrot",
    kernels: &["mandelbrot"],
    run: mandelbrot,
}];

const W: usize = 64;
const H: usize = 48;
const MAX_ITER: i32 = 128;

/// The kernel uses __fmul_rn/__fadd_rn (never contracted), so the same f32
/// operations on the CPU give identical escape counts: exact comparison, even
/// for points on the chaotic boundary.
fn mandelbrot(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    let (x0, y0) = (-2.0f32, -1.2f32);
    let (dx, dy) = (2.6f32 / W as f32, 2.4f32 / H as f32);
    let mut want = Vec::with_capacity(W * H);
    for py in 0..H {
        for px in 0..W {
            let cx = x0 + px as f32 * dx;
            let cy = y0 + py as f32 * dy;
            let (mut x, mut y, mut i) = (0.0f32, 0.0f32, 0);
            while i < MAX_ITER {
                let (xx, yy) = (x * x, y * y);
                if xx + yy > 4.0 {
                    break;
                }
                let xy = x * y;
                y = (xy + xy) + cy;
                x = (xx - yy) + cx;
                i += 1;
            }
            want.push(i as u32);
        }
    }
    with_module(gpu, arch, "mandelbrot", |c| {
        let dout = c.output::<u32>(W * H)?;
        c.launch(
            "mandelbrot",
            [blocks(W, 16), blocks(H, 16), 1],
            [16, 16, 1],
            0,
            &[
                Arg::Ptr(dout),
                int(W),
                int(H),
                Arg::F32(x0),
                Arg::F32(y0),
                Arg::F32(dx),
                Arg::F32(dy),
                Arg::I32(MAX_ITER),
            ],
        )?;
        let got: Vec<u32> = c.read(dout, W * H)?;
        exact("escape counts", &got, &want)
    })
}
