//! warp_vote.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "warp_votes",
        file: "warp_vote",
        kernels: &["warp_votes"],
        run: votes,
    },
    Case {
        name: "warp_vote_divergent",
        file: "warp_vote",
        kernels: &["warp_vote_divergent"],
        run: divergent,
    },
    Case {
        name: "syncwarp_exchange",
        file: "warp_vote",
        kernels: &["syncwarp_exchange"],
        run: syncwarp,
    },
];

const WARP: usize = 32;

/// Ballot of `pred` over the lanes of `warp` (values of one warp) named in `mask`.
fn ballot(warp: &[i32], mask: u32, pred: impl Fn(i32) -> bool) -> u32 {
    (0..WARP)
        .filter(|&l| mask & (1 << l) != 0 && pred(warp[l]))
        .fold(0, |b, l| b | (1 << l))
}

/// Warps of different kinds (all even, containing a 7, mixed signs) so that
/// any/all take both values; the partial last warp votes with zeros. Exact.
fn votes(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 1_000;
    let mut rng = Rng::for_case("warp_votes");
    let input: Vec<i32> = (0..N)
        .map(|i| match (i / WARP) % 4 {
            0 => 2 * rng.range_i32(-50, 50),
            1 => {
                if rng.below(16) == 0 {
                    7
                } else {
                    rng.range_i32(-9, 9)
                }
            }
            2 => rng.range_i32(-1000, 1000),
            _ => -2 * rng.range_i32(1, 50),
        })
        .collect();
    let padded: Vec<i32> = (0..N.div_ceil(WARP) * WARP)
        .map(|i| input.get(i).copied().unwrap_or(0))
        .collect();
    let mut want = Vec::with_capacity(4 * N);
    for i in 0..N {
        let w = &padded[i / WARP * WARP..][..WARP];
        let lane = i % WARP;
        let b = ballot(w, u32::MAX, |v| v > 0);
        want.extend([
            b,
            u32::from(w.contains(&7)),
            u32::from(w.iter().all(|v| v & 1 == 0)),
            (b & ((1u32 << lane) - 1)).count_ones(),
        ]);
    }
    with_module(gpu, arch, "warp_vote", |c| {
        let din = c.upload(&input)?;
        let dout = c.output::<u32>(4 * N)?;
        c.launch_1d(
            "warp_votes",
            N,
            128,
            &[Arg::Ptr(din), Arg::Ptr(dout), int(N)],
        )?;
        let got: Vec<u32> = c.read(dout, 4 * N)?;
        exact_hex32(
            "[ballot(v>0), any(v==7), all(even), rank] per lane",
            &got,
            &want,
        )
    })
}

/// Votes inside three divergent branches with masks naming exactly each
/// branch's lanes, then a data-dependent loop and a full-warp ballot. Exact.
fn divergent(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 256;
    const ODD: u32 = 0xaaaa_aaaa;
    const EVEN_LOW: u32 = 0x0000_5555;
    const EVEN_HIGH: u32 = 0x5555_0000;
    let mut rng = Rng::for_case("warp_vote_divergent");
    let input: Vec<i32> = (0..N)
        .map(|i| match (i / WARP) % 3 {
            0 => rng.range_i32(-120, 120),
            1 => rng.range_i32(1, 40),
            _ => {
                if rng.below(4) == 0 {
                    0
                } else {
                    rng.range_i32(-60, 60)
                }
            }
        })
        .collect();
    let mut want = Vec::with_capacity(3 * N);
    for i in 0..N {
        let w = &input[i / WARP * WARP..][..WARP];
        let lane = i % WARP;
        let (r0, r1) = if lane & 1 == 1 {
            (
                ballot(w, ODD, |v| v > 0),
                u32::from(ballot(w, ODD, |v| v > 100) != 0),
            )
        } else if lane < 16 {
            (
                ballot(w, EVEN_LOW, |v| v < 0),
                u32::from(ballot(w, EVEN_LOW, |v| v != 0) == EVEN_LOW),
            )
        } else {
            (
                ballot(w, EVEN_HIGH, |v| v & 3 == 0),
                u32::from(ballot(w, EVEN_HIGH, |v| v > -50) == EVEN_HIGH),
            )
        };
        let acc = |v: i32| (0..(v & 15)).map(|k| k * v).sum::<i32>();
        want.extend([r0, r1, ballot(w, u32::MAX, |v| acc(v) > 50)]);
    }
    with_module(gpu, arch, "warp_vote", |c| {
        let din = c.upload(&input)?;
        let dout = c.output::<u32>(3 * N)?;
        c.launch(
            "warp_vote_divergent",
            [4, 1, 1],
            [64, 1, 1],
            0,
            &[Arg::Ptr(din), Arg::Ptr(dout)],
        )?;
        let got: Vec<u32> = c.read(dout, 3 * N)?;
        exact_hex32(
            "[branch ballot, branch any/all, post-loop ballot] per lane",
            &got,
            &want,
        )
    })
}

/// Shared-memory exchange between lanes ordered only by __syncwarp. Exact.
fn syncwarp(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 256;
    let mut rng = Rng::for_case("syncwarp_exchange");
    let input: Vec<i32> = (0..N)
        .map(|_| rng.range_i32(-1_000_000, 1_000_000))
        .collect();
    let want: Vec<i32> = (0..N)
        .map(|i| {
            let base = i / WARP * WARP;
            let t = WARP - 1 - i % WARP;
            input[base + ((t + 5) & 31)] * 2 + t as i32
        })
        .collect();
    with_module(gpu, arch, "warp_vote", |c| {
        let din = c.upload(&input)?;
        let dout = c.output::<i32>(N)?;
        c.launch(
            "syncwarp_exchange",
            [4, 1, 1],
            [64, 1, 1],
            0,
            &[Arg::Ptr(din), Arg::Ptr(dout)],
        )?;
        let got: Vec<i32> = c.read(dout, N)?;
        exact("exchanged", &got, &want)
    })
}
