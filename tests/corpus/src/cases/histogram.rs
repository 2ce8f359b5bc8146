//! histogram.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "histogram_global",
        file: "histogram",
        kernels: &["histogram_global"],
        run: global,
    },
    Case {
        name: "histogram_shared",
        file: "histogram",
        kernels: &["histogram_shared"],
        run: shared,
    },
];

const BINS: usize = 256;
const N: usize = 100_000;
/// Half of all bytes hit this bin, so many atomics contend on one address.
const HOT: u8 = 0x2a;

fn global(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    run(gpu, arch, "histogram_global", 64)
}

fn shared(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    run(gpu, arch, "histogram_shared", 32)
}

/// Counts are exact whatever order the atomics land in.
fn run(gpu: &mut dyn Gpu, arch: Arch, kernel: &str, grid: u32) -> Result<(), CaseError> {
    let mut rng = Rng::for_case(kernel);
    let data: Vec<u8> = (0..N)
        .map(|_| {
            if rng.below(2) == 0 {
                HOT
            } else {
                rng.next_u32() as u8
            }
        })
        .collect();
    with_module(gpu, arch, "histogram", |c| {
        let ddata = c.upload(&data)?;
        let dbins = c.zeros::<u32>(BINS)?;
        c.launch(
            kernel,
            [grid, 1, 1],
            [256, 1, 1],
            0,
            &[Arg::Ptr(ddata), Arg::U32(N as u32), Arg::Ptr(dbins)],
        )?;
        let got: Vec<u32> = c.read(dbins, BINS)?;
        let mut want = vec![0u32; BINS];
        for &b in &data {
            want[usize::from(b)] += 1;
        }
        exact("bins", &got, &want)
    })
}
