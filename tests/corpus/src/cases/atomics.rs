//! atomics.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "atomic_cas_float_max",
        file: "atomics",
        kernels: &["atomic_cas_float_max"],
        run: cas_float_max,
    },
    Case {
        name: "atomic_cas_double_add",
        file: "atomics",
        kernels: &["atomic_cas_double_add"],
        run: cas_double_add,
    },
    Case {
        name: "atomic_inc_dec",
        file: "atomics",
        kernels: &["atomic_inc_dec"],
        run: inc_dec,
    },
    Case {
        name: "atomic_int_ops",
        file: "atomics",
        kernels: &["atomic_int_ops"],
        run: int_ops,
    },
];

/// atomicCAS loop implementing float max from -inf. Exact (max is order-free).
fn cas_float_max(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 5_000;
    let mut rng = Rng::for_case("atomic_cas_float_max");
    let input: Vec<f32> = (0..N).map(|_| rng.range_f32(-1000.0, 1000.0)).collect();
    let want = input.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    with_module(gpu, arch, "atomics", |c| {
        let din = c.upload(&input)?;
        let dres = c.upload(&[f32::NEG_INFINITY])?;
        c.launch_1d(
            "atomic_cas_float_max",
            N,
            256,
            &[Arg::Ptr(din), Arg::Ptr(dres), int(N)],
        )?;
        let got: Vec<f32> = c.read(dres, 1)?;
        bits_f32("max", &got, &[want])
    })
}

/// 64-bit atomicCAS loop implementing double add. Inputs are multiples of 2^-10
/// below 64 in magnitude, so every partial sum of 4 000 of them is exact in f64
/// and the total is the same in any order: exact.
fn cas_double_add(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 4_000;
    let mut rng = Rng::for_case("atomic_cas_double_add");
    let input: Vec<f64> = (0..N)
        .map(|_| f64::from(rng.range_i32(-65_536, 65_535)) / 1024.0)
        .collect();
    let want: f64 = input.iter().sum();
    with_module(gpu, arch, "atomics", |c| {
        let din = c.upload(&input)?;
        let dres = c.zeros::<f64>(1)?;
        c.launch_1d(
            "atomic_cas_double_add",
            N,
            128,
            &[Arg::Ptr(din), Arg::Ptr(dres), int(N)],
        )?;
        let got: Vec<f64> = c.read(dres, 1)?;
        bits_f64("sum", &got, &[want])
    })
}

/// atomicInc wraps to 0 past its limit, atomicDec wraps to its limit at 0 (and
/// above it). All operations are identical, so the multiset of returned old
/// values and the final counters do not depend on order: sorted, exact.
fn inc_dec(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 3_000;
    const INC_LIMIT: u32 = 99;
    const DEC_LIMIT: u32 = 37;
    const DEC_START: u32 = 5;
    let (mut inc, mut dec) = (0u32, DEC_START);
    let (mut want_inc, mut want_dec) = (Vec::with_capacity(N), Vec::with_capacity(N));
    for _ in 0..N {
        want_inc.push(inc);
        inc = if inc >= INC_LIMIT { 0 } else { inc + 1 };
        want_dec.push(dec);
        dec = if dec == 0 || dec > DEC_LIMIT {
            DEC_LIMIT
        } else {
            dec - 1
        };
    }
    want_inc.sort_unstable();
    want_dec.sort_unstable();
    with_module(gpu, arch, "atomics", |c| {
        let dctr = c.upload(&[0u32, DEC_START])?;
        let dinc = c.output::<u32>(N)?;
        let ddec = c.output::<u32>(N)?;
        c.launch_1d(
            "atomic_inc_dec",
            N,
            256,
            &[
                Arg::Ptr(dctr),
                Arg::Ptr(dinc),
                Arg::Ptr(ddec),
                Arg::U32(INC_LIMIT),
                Arg::U32(DEC_LIMIT),
                int(N),
            ],
        )?;
        let counters: Vec<u32> = c.read(dctr, 2)?;
        let mut got_inc: Vec<u32> = c.read(dinc, N)?;
        let mut got_dec: Vec<u32> = c.read(ddec, N)?;
        got_inc.sort_unstable();
        got_dec.sort_unstable();
        exact("final [inc, dec] counters", &counters, &[inc, dec])?;
        exact("sorted atomicInc old values", &got_inc, &want_inc)?;
        exact("sorted atomicDec old values", &got_dec, &want_dec)
    })
}

/// add/sub/min/max/and/or/xor/unsigned min on i32 and add/max on u64: results
/// are order-independent. Exact.
fn int_ops(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 2_048;
    let mut rng = Rng::for_case("atomic_int_ops");
    let input: Vec<i32> = (0..N).map(|_| rng.next_u32() as i32).collect();
    let init: [i32; 8] = [0, 0, i32::MAX, i32::MIN, -1, 0, 0x1234_5678, -1];
    let mut r = init;
    let mut r64 = [0u64; 2];
    for (i, &v) in input.iter().enumerate() {
        r[0] = r[0].wrapping_add(v);
        r[1] = r[1].wrapping_sub(v);
        r[2] = r[2].min(v);
        r[3] = r[3].max(v);
        r[4] &= v | (1u32 << (i & 31)) as i32;
        r[5] |= v & 0x0f0f_0f0f;
        r[6] ^= v;
        r[7] = (r[7] as u32).min(v as u32) as i32;
        r64[0] = r64[0].wrapping_add((i64::from(v) as u64).wrapping_mul(0x10001));
        r64[1] = r64[1].max(u64::from(v as u32) << 20);
    }
    with_module(gpu, arch, "atomics", |c| {
        let din = c.upload(&input)?;
        let dr = c.upload(&init)?;
        let dr64 = c.zeros::<u64>(2)?;
        c.launch_1d(
            "atomic_int_ops",
            N,
            256,
            &[Arg::Ptr(din), Arg::Ptr(dr), Arg::Ptr(dr64), int(N)],
        )?;
        let got: Vec<i32> = c.read(dr, 8)?;
        let got64: Vec<u64> = c.read(dr64, 2)?;
        exact("[add, sub, min, max, and, or, xor, umin]", &got, &r)?;
        exact_hex64("[u64 add, u64 max]", &got64, &r64)
    })
}
