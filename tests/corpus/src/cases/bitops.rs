//! bitops.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "bitops32",
        file: "bitops",
        kernels: &["bitops32"],
        run: bitops32,
    },
    Case {
        name: "bitops64",
        file: "bitops",
        kernels: &["bitops64"],
        run: bitops64,
    },
];

const OPS32: usize = 14;

/// `prmt.b32` default mode (PTX ISA): each selector nibble picks one of the 8
/// bytes of {b, a}; its top bit replicates that byte's sign bit instead.
fn prmt(a: u32, b: u32, sel: u32, sign_mode: bool) -> u32 {
    let bytes = (u64::from(b) << 32 | u64::from(a)).to_le_bytes();
    (0..4).fold(0u32, |acc, n| {
        let nib = (sel >> (4 * n)) & 0xf;
        let mut byte = bytes[(nib & 7) as usize];
        if sign_mode && nib & 8 != 0 {
            byte = if byte & 0x80 != 0 { 0xff } else { 0 };
        }
        acc | u32::from(byte) << (8 * n)
    })
}

fn reference32(x: u32, y: u32) -> [u32; OPS32] {
    let s = y & 31;
    let wide = u64::from(y) << 32 | u64::from(x);
    let clamp = (y & 63).min(32);
    [
        x.count_ones(),
        x.leading_zeros(),
        x.reverse_bits(),
        if x == 0 { 0 } else { x.trailing_zeros() + 1 },
        prmt(x, y, y & 0x7777, false),
        ((wide << s) >> 32) as u32,
        (wide >> s) as u32,
        ((wide << clamp) >> 32) as u32,
        (wide >> clamp) as u32,
        x.rotate_left(s),
        ((u64::from(x) * u64::from(y)) >> 32) as u32,
        ((i64::from(x as i32) * i64::from(y as i32)) >> 32) as u32,
        prmt(x, y, y >> 16, true),
        ((x as i32) >> s) as u32,
    ]
}

const SPECIAL32: &[u32] = &[
    0,
    1,
    u32::MAX,
    0x8000_0000,
    0x7fff_ffff,
    0x0000_ffff,
    0x8080_8080,
    32,
    33,
    63,
    64,
];

/// popc, clz, brev, ffs, byte_perm, funnel shifts (wrap and clamp), rotate,
/// mulhi, raw prmt with sign replication, arithmetic shift. Exact.
fn bitops32(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    let mut rng = Rng::for_case("bitops32");
    let mut pairs: Vec<(u32, u32)> = SPECIAL32
        .iter()
        .flat_map(|&a| SPECIAL32.iter().map(move |&b| (a, b)))
        .collect();
    pairs.extend((0..500).map(|_| (rng.next_u32(), rng.next_u32())));
    let (a, b): (Vec<u32>, Vec<u32>) = pairs.iter().copied().unzip();
    let want: Vec<u32> = pairs.iter().flat_map(|&(x, y)| reference32(x, y)).collect();
    let n = pairs.len();
    with_module(gpu, arch, "bitops", |c| {
        let da = c.upload(&a)?;
        let db = c.upload(&b)?;
        let dout = c.output::<u32>(OPS32 * n)?;
        c.launch_1d(
            "bitops32",
            n,
            128,
            &[Arg::Ptr(da), Arg::Ptr(db), Arg::Ptr(dout), int(n)],
        )?;
        let got: Vec<u32> = c.read(dout, OPS32 * n)?;
        exact_hex32(
            "[popc, clz, brev, ffs, byte_perm, fshl, fshr, fshl_c, fshr_c, rotl, umulhi, mulhi, prmt, sar] per pair",
            &got,
            &want,
        )
    })
}

/// The 64-bit forms: popcll, clzll, brevll, ffsll. Exact.
fn bitops64(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    let mut rng = Rng::for_case("bitops64");
    let mut a: Vec<u64> = vec![
        0,
        1,
        u64::MAX,
        1 << 63,
        1 << 32,
        u64::from(u32::MAX),
        0x8000_0000,
    ];
    a.extend((0..400).map(|i| rng.next_u64() >> (i % 64)));
    let want: Vec<u64> = a
        .iter()
        .flat_map(|&x| {
            [
                u64::from(x.count_ones()),
                u64::from(x.leading_zeros()),
                x.reverse_bits(),
                if x == 0 {
                    0
                } else {
                    u64::from(x.trailing_zeros()) + 1
                },
            ]
        })
        .collect();
    let n = a.len();
    with_module(gpu, arch, "bitops", |c| {
        let da = c.upload(&a)?;
        let dout = c.output::<u64>(4 * n)?;
        c.launch_1d("bitops64", n, 64, &[Arg::Ptr(da), Arg::Ptr(dout), int(n)])?;
        let got: Vec<u64> = c.read(dout, 4 * n)?;
        exact_hex64("[popcll, clzll, brevll, ffsll] per element", &got, &want)
    })
}
