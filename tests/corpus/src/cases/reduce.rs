//! reduce.cu and shuffle.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "reduce_block_sum",
        file: "reduce",
        kernels: &["reduce_block_sum"],
        run: block_sum,
    },
    Case {
        name: "reduce_warp_shfl_down",
        file: "reduce",
        kernels: &["reduce_warp_shfl_down"],
        run: shfl_down,
    },
    Case {
        name: "reduce_warp_shfl_xor",
        file: "reduce",
        kernels: &["reduce_warp_shfl_xor"],
        run: shfl_xor,
    },
    Case {
        name: "shfl_variants",
        file: "shuffle",
        kernels: &["shfl_variants"],
        run: shfl_variants,
    },
];

const WARP: usize = 32;

/// Shared-memory tree with __syncthreads; 256 threads sum 512 ints per block. Exact.
fn block_sum(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 100_000;
    const BLOCK: usize = 256;
    let mut rng = Rng::for_case("reduce_block_sum");
    let input: Vec<i32> = (0..N).map(|_| rng.range_i32(-1000, 1000)).collect();
    let nblocks = N.div_ceil(2 * BLOCK);
    with_module(gpu, arch, "reduce", |c| {
        let din = c.upload(&input)?;
        let dout = c.output::<i32>(nblocks)?;
        c.launch(
            "reduce_block_sum",
            [nblocks as u32, 1, 1],
            [BLOCK as u32, 1, 1],
            0,
            &[Arg::Ptr(din), Arg::Ptr(dout), int(N)],
        )?;
        let got: Vec<i32> = c.read(dout, nblocks)?;
        let want: Vec<i32> = input.chunks(2 * BLOCK).map(|ch| ch.iter().sum()).collect();
        exact("block sums", &got, &want)
    })
}

/// Grid-stride accumulation then two levels of __shfl_down_sync; wrapping u32 sums. Exact.
fn shfl_down(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 70_001;
    const BLOCK: usize = 128;
    const GRID: usize = 20;
    let mut rng = Rng::for_case("reduce_warp_shfl_down");
    let input: Vec<u32> = (0..N).map(|_| rng.next_u32()).collect();
    with_module(gpu, arch, "reduce", |c| {
        let din = c.upload(&input)?;
        let dout = c.output::<u32>(GRID)?;
        c.launch(
            "reduce_warp_shfl_down",
            [GRID as u32, 1, 1],
            [BLOCK as u32, 1, 1],
            0,
            &[Arg::Ptr(din), Arg::Ptr(dout), Arg::U32(N as u32)],
        )?;
        let got: Vec<u32> = c.read(dout, GRID)?;
        let mut want = vec![0u32; GRID];
        for (i, &v) in input.iter().enumerate() {
            let b = (i % (BLOCK * GRID)) / BLOCK;
            want[b] = want[b].wrapping_add(v);
        }
        exact_hex32("block sums", &got, &want)
    })
}

/// __shfl_xor_sync butterfly max; every lane must hold its warp's maximum. The
/// last warp is partial (lanes past n contribute -inf). Exact.
fn shfl_xor(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 1_000;
    let mut rng = Rng::for_case("reduce_warp_shfl_xor");
    let input: Vec<f32> = (0..N).map(|_| rng.range_f32(-1e3, 1e3)).collect();
    with_module(gpu, arch, "reduce", |c| {
        let din = c.upload(&input)?;
        let dout = c.output::<f32>(N)?;
        c.launch_1d(
            "reduce_warp_shfl_xor",
            N,
            128,
            &[Arg::Ptr(din), Arg::Ptr(dout), int(N)],
        )?;
        let got: Vec<f32> = c.read(dout, N)?;
        let want: Vec<f32> = (0..N)
            .map(|i| {
                input[i / WARP * WARP..((i / WARP + 1) * WARP).min(N)]
                    .iter()
                    .copied()
                    .fold(f32::MIN, f32::max)
            })
            .collect();
        bits_f32("warp max", &got, &want)
    })
}

/// Indexed, up, down-with-width, xor and width-4 broadcast shuffles. Exact.
fn shfl_variants(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 256;
    const OUTS: usize = 5;
    let mut rng = Rng::for_case("shfl_variants");
    let input: Vec<i32> = (0..N).map(|_| rng.next_u32() as i32).collect();
    with_module(gpu, arch, "shuffle", |c| {
        let din = c.upload(&input)?;
        let dout = c.output::<i32>(N * OUTS)?;
        c.launch(
            "shfl_variants",
            [4, 1, 1],
            [64, 1, 1],
            0,
            &[Arg::Ptr(din), Arg::Ptr(dout)],
        )?;
        let got: Vec<i32> = c.read(dout, N * OUTS)?;
        let mut want = Vec::with_capacity(N * OUTS);
        for i in 0..N {
            let base = i / WARP * WARP;
            let lane = i % WARP;
            let v = |l: usize| input[base + l];
            let seg8 = lane & !7;
            want.push(v((lane * 7 + 3) & 31));
            want.push(if lane >= 3 { v(lane - 3) } else { v(lane) });
            want.push(if (lane & 7) + 2 < 8 {
                v(seg8 + (lane & 7) + 2)
            } else {
                v(lane)
            });
            want.push(v(lane ^ 5));
            want.push(v((lane & !3) + 1));
        }
        exact(
            "[idx, up 3, down 2 width 8, xor 5, idx 1 width 4] per lane",
            &got,
            &want,
        )
    })
}
