//! dynamic_shared.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "dyn_shared_reverse",
        file: "dynamic_shared",
        kernels: &["dyn_shared_reverse"],
        run: reverse,
    },
    Case {
        name: "dyn_shared_mixed",
        file: "dynamic_shared",
        kernels: &["dyn_shared_mixed"],
        run: mixed,
    },
    Case {
        name: "dyn_shared_with_static",
        file: "dynamic_shared",
        kernels: &["dyn_shared_with_static"],
        run: with_static,
    },
];

/// Per-block view of `input` padded with `pad` past its end.
fn block_values<T: Copy>(input: &[T], block: usize, b: usize, pad: T) -> Vec<T> {
    (0..block)
        .map(|t| input.get(b * block + t).copied().unwrap_or(pad))
        .collect()
}

/// 128-thread blocks reverse their segment through 512 bytes of dynamic shared
/// memory; slots of the partial last block read -1 padding. Exact.
fn reverse(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 1_000;
    const BLOCK: usize = 128;
    let mut rng = Rng::for_case("dyn_shared_reverse");
    let input: Vec<i32> = (0..N).map(|_| rng.next_u32() as i32).collect();
    let want: Vec<i32> = (0..N)
        .map(|i| block_values(&input, BLOCK, i / BLOCK, -1)[BLOCK - 1 - i % BLOCK])
        .collect();
    with_module(gpu, arch, "dynamic_shared", |c| {
        let din = c.upload(&input)?;
        let dout = c.output::<i32>(N)?;
        c.launch(
            "dyn_shared_reverse",
            [blocks(N, BLOCK as u32), 1, 1],
            [BLOCK as u32, 1, 1],
            (BLOCK * 4) as u32,
            &[Arg::Ptr(din), Arg::Ptr(dout), int(N)],
        )?;
        let got: Vec<i32> = c.read(dout, N)?;
        exact("block-reversed", &got, &want)
    })
}

/// Doubles and ints carved from one dynamic allocation of blockDim*12 bytes. Exact.
fn mixed(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 300;
    const BLOCK: usize = 64;
    let mut rng = Rng::for_case("dyn_shared_mixed");
    let input: Vec<f64> = (0..N).map(|_| rng.range_f64(-1e6, 1e6)).collect();
    let want: Vec<f64> = (0..N)
        .map(|i| {
            let t = i % BLOCK;
            let d = block_values(&input, BLOCK, i / BLOCK, 0.0);
            d[(t + 1) % BLOCK] + f64::from(((BLOCK - 1 - t) * 3 + 1) as i32)
        })
        .collect();
    with_module(gpu, arch, "dynamic_shared", |c| {
        let din = c.upload(&input)?;
        let dout = c.output::<f64>(N)?;
        c.launch(
            "dyn_shared_mixed",
            [blocks(N, BLOCK as u32), 1, 1],
            [BLOCK as u32, 1, 1],
            (BLOCK * 12) as u32,
            &[Arg::Ptr(din), Arg::Ptr(dout), int(N)],
        )?;
        let got: Vec<f64> = c.read(dout, N)?;
        bits_f64("d[t+1] + counts[bd-1-t]", &got, &want)
    })
}

/// A static __shared__ array and a dynamic one in the same kernel must not
/// overlap. Exact.
fn with_static(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 300;
    const BLOCK: usize = 64;
    let mut rng = Rng::for_case("dyn_shared_with_static");
    let input: Vec<i32> = (0..N)
        .map(|_| rng.range_i32(-1_000_000, 1_000_000))
        .collect();
    let want: Vec<i32> = (0..N)
        .map(|i| {
            let t = i % BLOCK;
            let v = block_values(&input, BLOCK, i / BLOCK, 0);
            let j = BLOCK - 1 - t;
            v[j] * 2 - (v[j] + 7) + v[t] * 2
        })
        .collect();
    with_module(gpu, arch, "dynamic_shared", |c| {
        let din = c.upload(&input)?;
        let dout = c.output::<i32>(N)?;
        c.launch(
            "dyn_shared_with_static",
            [blocks(N, BLOCK as u32), 1, 1],
            [BLOCK as u32, 1, 1],
            (BLOCK * 4) as u32,
            &[Arg::Ptr(din), Arg::Ptr(dout), int(N)],
        )?;
        let got: Vec<i32> = c.read(dout, N)?;
        exact("stat[j] - dyn[j] + stat[t]", &got, &want)
    })
}
