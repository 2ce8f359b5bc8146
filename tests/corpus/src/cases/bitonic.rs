//! bitonic.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[Case {
    name: "bitonic_sort_block",
    file: "bitonic",
    kernels: &["bitonic_sort_block"],
    run: bitonic,
}];

const SEG: usize = 1024;

/// Three full 1024-key segments and a partial one of 500; keys with many
/// duplicates. Each segment must come back sorted (exact).
fn bitonic(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 3 * SEG + 500;
    let mut rng = Rng::for_case("bitonic_sort_block");
    let input: Vec<u32> = (0..N)
        .map(|i| {
            if i % 3 == 0 {
                rng.below(50)
            } else {
                rng.next_u32()
            }
        })
        .collect();
    let mut want = input.clone();
    for seg in want.chunks_mut(SEG) {
        seg.sort_unstable();
    }
    with_module(gpu, arch, "bitonic", |c| {
        let din = c.upload(&input)?;
        let dout = c.output::<u32>(N)?;
        c.launch(
            "bitonic_sort_block",
            [N.div_ceil(SEG) as u32, 1, 1],
            [512, 1, 1],
            0,
            &[Arg::Ptr(din), Arg::Ptr(dout), Arg::U32(N as u32)],
        )?;
        let got: Vec<u32> = c.read(dout, N)?;
        exact("sorted segments", &got, &want)
    })
}
