//! grid_stride.cu and grid3d.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "grid_stride_1d",
        file: "grid_stride",
        kernels: &["grid_stride_axpb"],
        run: grid_stride_1d,
    },
    Case {
        name: "grid_stride_2d",
        file: "grid_stride",
        kernels: &["grid_stride_2d"],
        run: grid_stride_2d,
    },
    Case {
        name: "grid3d_index",
        file: "grid3d",
        kernels: &["grid3d_index"],
        run: grid3d_index,
    },
];

/// 7 blocks of 128 threads cover 50 003 elements (~56 iterations each); exact u32 math.
fn grid_stride_1d(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 50_003;
    const A: u32 = 2_654_435_761;
    const B: u32 = 12_345;
    let mut rng = Rng::for_case("grid_stride_1d");
    let input: Vec<u32> = (0..N).map(|_| rng.next_u32()).collect();
    with_module(gpu, arch, "grid_stride", |c| {
        let din = c.upload(&input)?;
        let dout = c.output::<u32>(N)?;
        c.launch(
            "grid_stride_axpb",
            [7, 1, 1],
            [128, 1, 1],
            0,
            &[
                Arg::Ptr(din),
                Arg::Ptr(dout),
                Arg::U32(N as u32),
                Arg::U32(A),
                Arg::U32(B),
            ],
        )?;
        let got: Vec<u32> = c.read(dout, N)?;
        let want: Vec<u32> = input
            .iter()
            .enumerate()
            .map(|(i, &v)| v.wrapping_mul(A).wrapping_add(B) ^ i as u32)
            .collect();
        exact_hex32("out", &got, &want)
    })
}

/// A 2x2 grid of 16x8 blocks strides over a 70x45 window of an 80-wide pitched
/// array; the 10-column pitch gap must keep its poison.
fn grid_stride_2d(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const W: usize = 70;
    const H: usize = 45;
    const PITCH: usize = 80;
    with_module(gpu, arch, "grid_stride", |c| {
        let dout = c.output::<i32>(PITCH * H)?;
        c.launch(
            "grid_stride_2d",
            [2, 2, 1],
            [16, 8, 1],
            0,
            &[Arg::Ptr(dout), int(W), int(H), int(PITCH)],
        )?;
        let got: Vec<i32> = c.read(dout, PITCH * H)?;
        let want: Vec<i32> = (0..PITCH * H)
            .map(|k| {
                let (x, y) = ((k % PITCH) as i32, (k / PITCH) as i32);
                if (x as usize) < W {
                    x * 1000 - y
                } else {
                    POISON as i32
                }
            })
            .collect();
        exact("pitched out", &got, &want)
    })
}

/// 37x19x11 points, 8x4x2 blocks, 5x5x6 grid: every point records block, thread and dims.
fn grid3d_index(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: [u32; 3] = [37, 19, 11];
    const BLOCK: [u32; 3] = [8, 4, 2];
    let grid = [
        N[0].div_ceil(BLOCK[0]),
        N[1].div_ceil(BLOCK[1]),
        N[2].div_ceil(BLOCK[2]),
    ];
    let points = (N[0] * N[1] * N[2]) as usize;
    with_module(gpu, arch, "grid3d", |c| {
        let dout = c.output::<u32>(3 * points)?;
        c.launch(
            "grid3d_index",
            grid,
            BLOCK,
            0,
            &[
                Arg::Ptr(dout),
                Arg::U32(N[0]),
                Arg::U32(N[1]),
                Arg::U32(N[2]),
            ],
        )?;
        let got: Vec<u32> = c.read(dout, 3 * points)?;
        let dims = (grid[2] << 24)
            | (grid[1] << 16)
            | (grid[0] << 8)
            | (BLOCK[2] << 6)
            | (BLOCK[1] << 3)
            | BLOCK[0];
        let mut want = Vec::with_capacity(3 * points);
        for z in 0..N[2] {
            for y in 0..N[1] {
                for x in 0..N[0] {
                    want.push(((z / BLOCK[2]) << 20) | ((y / BLOCK[1]) << 10) | (x / BLOCK[0]));
                    want.push(((z % BLOCK[2]) << 20) | ((y % BLOCK[1]) << 10) | (x % BLOCK[0]));
                    want.push(dims);
                }
            }
        }
        exact_hex32("(block, thread, dims) per point", &got, &want)
    })
}
