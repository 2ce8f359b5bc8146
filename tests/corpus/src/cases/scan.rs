//! scan.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "scan_hillis_steele",
        file: "scan",
        kernels: &["scan_hillis_steele"],
        run: hillis_steele,
    },
    Case {
        name: "scan_blelloch",
        file: "scan",
        kernels: &["scan_blelloch"],
        run: blelloch,
    },
];

/// Inclusive scan of each `segment`-sized chunk.
fn segmented_scan(input: &[i32], segment: usize) -> Vec<i32> {
    input
        .chunks(segment)
        .flat_map(|ch| {
            ch.iter().scan(0i32, |acc, &v| {
                *acc += v;
                Some(*acc)
            })
        })
        .collect()
}

/// 512-thread blocks, 2 000 elements (last block partial). Exact.
fn hillis_steele(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    run(gpu, arch, "scan_hillis_steele", 2_000, 512, 512)
}

/// 256-thread blocks scanning 512 elements each, 1 800 elements. Exact.
fn blelloch(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    run(gpu, arch, "scan_blelloch", 1_800, 256, 512)
}

fn run(
    gpu: &mut dyn Gpu,
    arch: Arch,
    kernel: &str,
    n: usize,
    block: u32,
    segment: usize,
) -> Result<(), CaseError> {
    let mut rng = Rng::for_case(kernel);
    let input: Vec<i32> = (0..n).map(|_| rng.range_i32(-100, 100)).collect();
    with_module(gpu, arch, "scan", |c| {
        let din = c.upload(&input)?;
        let dout = c.output::<i32>(n)?;
        c.launch(
            kernel,
            [n.div_ceil(segment) as u32, 1, 1],
            [block, 1, 1],
            0,
            &[Arg::Ptr(din), Arg::Ptr(dout), int(n)],
        )?;
        let got: Vec<i32> = c.read(dout, n)?;
        exact(
            "per-block inclusive scan",
            &got,
            &segmented_scan(&input, segment),
        )
    })
}
