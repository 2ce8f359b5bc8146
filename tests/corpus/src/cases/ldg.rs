//! ldg.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "ldg_gather",
        file: "ldg",
        kernels: &["ldg_gather"],
        run: gather,
    },
    Case {
        name: "ldg_vec4",
        file: "ldg",
        kernels: &["ldg_vec4"],
        run: vec4,
    },
];

/// Gather through ld.global.nc. `a*2 + b` is exact whether or not it is fused
/// (a*2 is exact), so the comparison is bit for bit.
fn gather(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const SRC: usize = 1024;
    const N: usize = 3_000;
    let mut rng = Rng::for_case("ldg_gather");
    let src: Vec<f32> = (0..SRC).map(|_| rng.range_f32(-1e4, 1e4)).collect();
    let idx: Vec<i32> = (0..N).map(|_| rng.below(SRC as u32) as i32).collect();
    let want: Vec<f32> = (0..N)
        .map(|i| src[idx[i] as usize] * 2.0 + src[i & 63])
        .collect();
    with_module(gpu, arch, "ldg", |c| {
        let dsrc = c.upload(&src)?;
        let didx = c.upload(&idx)?;
        let dout = c.output::<f32>(N)?;
        c.launch_1d(
            "ldg_gather",
            N,
            256,
            &[Arg::Ptr(dsrc), Arg::Ptr(didx), Arg::Ptr(dout), int(N)],
        )?;
        let got: Vec<f32> = c.read(dout, N)?;
        bits_f32("src[idx]*2 + src[i&63]", &got, &want)
    })
}

/// 16-byte vector loads (__ldg on float4) and stores, components reversed. Exact.
fn vec4(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 777;
    let mut rng = Rng::for_case("ldg_vec4");
    let input: Vec<f32> = (0..4 * N).map(|_| rng.range_f32(-1e4, 1e4)).collect();
    let want: Vec<f32> = input
        .chunks(4)
        .flat_map(|v| [v[3], v[2], v[1], v[0]])
        .collect();
    with_module(gpu, arch, "ldg", |c| {
        let din = c.upload(&input)?;
        let dout = c.output::<f32>(4 * N)?;
        c.launch_1d("ldg_vec4", N, 128, &[Arg::Ptr(din), Arg::Ptr(dout), int(N)])?;
        let got: Vec<f32> = c.read(dout, 4 * N)?;
        bits_f32("reversed float4", &got, &want)
    })
}
