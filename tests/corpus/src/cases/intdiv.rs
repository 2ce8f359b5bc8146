//! intdiv.cu.
//!
//! C++ leaves INT_MIN / -1 undefined, but the kernels divide runtime values, so
//! NVRTC emits plain div.s32 / rem.s32, and the GPU's division sequence wraps:
//! INT_MIN / -1 = INT_MIN and INT_MIN % -1 = 0 (Rust's wrapping_div / wrapping_rem).

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "intdiv32",
        file: "intdiv",
        kernels: &["intdiv32"],
        run: intdiv32,
    },
    Case {
        name: "intdiv64",
        file: "intdiv",
        kernels: &["intdiv64"],
        run: intdiv64,
    },
    Case {
        name: "intdiv_const",
        file: "intdiv",
        kernels: &["intdiv_const"],
        run: intdiv_const,
    },
];

const RANDOM: usize = 500;

const CORNERS32: &[(i32, i32)] = &[
    (i32::MIN, -1),
    (i32::MIN, 1),
    (i32::MIN, i32::MIN),
    (i32::MIN, 2),
    (i32::MIN, -2),
    (i32::MIN, 3),
    (i32::MAX, -1),
    (i32::MAX, i32::MIN),
    (-1, i32::MIN),
    (-7, 2),
    (7, -2),
    (-7, -2),
    (0, -5),
    (5, 7),
    (-5, 7),
    (-1, -1),
    (-1, 1),
    (1, -1),
    (i32::MAX, i32::MAX),
    (-65536, 65536),
    (123_456_789, -10),
];

const CORNERS64: &[(i64, i64)] = &[
    (i64::MIN, -1),
    (i64::MIN, 1),
    (i64::MIN, i64::MIN),
    (i64::MIN, -2),
    (i64::MIN, 3),
    (i64::MAX, -1),
    (-1, i64::MIN),
    (-7, 2),
    (7, -2),
    (-7, -2),
    (0, -5),
    (-1, -1),
    (i64::MAX, i64::MAX),
    (-(1i64 << 32), 1i64 << 32),
    (-(1i64 << 40), 3),
    (u32::MAX as i64, -(u32::MAX as i64)),
];

fn nonzero32(rng: &mut Rng) -> i32 {
    loop {
        let v = if rng.below(2) == 0 {
            rng.range_i32(-20, 20)
        } else {
            rng.next_u32() as i32
        };
        if v != 0 {
            return v;
        }
    }
}

/// Corner pairs plus random ones: signed and unsigned quotient and remainder. Exact.
fn intdiv32(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    let mut rng = Rng::for_case("intdiv32");
    let mut pairs = CORNERS32.to_vec();
    pairs.extend((0..RANDOM).map(|_| (rng.next_u32() as i32, nonzero32(&mut rng))));
    let (a, b): (Vec<i32>, Vec<i32>) = pairs.iter().copied().unzip();
    let want: Vec<i32> = pairs
        .iter()
        .flat_map(|&(x, y)| {
            let (ux, uy) = (x as u32, y as u32);
            [
                x.wrapping_div(y),
                x.wrapping_rem(y),
                (ux / uy) as i32,
                (ux % uy) as i32,
            ]
        })
        .collect();
    let n = pairs.len();
    with_module(gpu, arch, "intdiv", |c| {
        let da = c.upload(&a)?;
        let db = c.upload(&b)?;
        let dout = c.output::<i32>(4 * n)?;
        c.launch_1d(
            "intdiv32",
            n,
            128,
            &[Arg::Ptr(da), Arg::Ptr(db), Arg::Ptr(dout), int(n)],
        )?;
        let got: Vec<i32> = c.read(dout, 4 * n)?;
        exact("[a/b, a%b, (u)a/(u)b, (u)a%(u)b] per pair", &got, &want)
    })
}

/// The same for 64-bit operands. Exact.
fn intdiv64(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    let mut rng = Rng::for_case("intdiv64");
    let mut pairs = CORNERS64.to_vec();
    pairs.extend((0..RANDOM).map(|_| {
        let x = rng.next_u64() as i64;
        let y = match rng.below(3) {
            0 => i64::from(nonzero32(&mut rng)),
            1 => (rng.next_u64() >> rng.below(63)) as i64 | 1,
            _ => rng.next_u64() as i64 | 1,
        };
        (x, y)
    }));
    let (a, b): (Vec<i64>, Vec<i64>) = pairs.iter().copied().unzip();
    let want: Vec<i64> = pairs
        .iter()
        .flat_map(|&(x, y)| {
            let (ux, uy) = (x as u64, y as u64);
            [
                x.wrapping_div(y),
                x.wrapping_rem(y),
                (ux / uy) as i64,
                (ux % uy) as i64,
            ]
        })
        .collect();
    let n = pairs.len();
    with_module(gpu, arch, "intdiv", |c| {
        let da = c.upload(&a)?;
        let db = c.upload(&b)?;
        let dout = c.output::<i64>(4 * n)?;
        c.launch_1d(
            "intdiv64",
            n,
            128,
            &[Arg::Ptr(da), Arg::Ptr(db), Arg::Ptr(dout), int(n)],
        )?;
        let got: Vec<i64> = c.read(dout, 4 * n)?;
        exact("[a/b, a%b, (u)a/(u)b, (u)a%(u)b] per pair", &got, &want)
    })
}

/// Division by constants (powers of two, negative, odd) that the compiler
/// strength-reduces to shifts with sign fix-ups and multiply-high. Exact.
fn intdiv_const(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    let mut rng = Rng::for_case("intdiv_const");
    let mut a: Vec<i32> = vec![
        i32::MIN,
        i32::MIN + 1,
        i32::MAX,
        -1,
        0,
        1,
        -7,
        7,
        -8,
        8,
        -9,
        -15,
        -16,
        -17,
        999,
        -1001,
    ];
    a.extend((0..RANDOM).map(|i| {
        if i % 2 == 0 {
            rng.next_u32() as i32
        } else {
            rng.range_i32(-100, 100)
        }
    }));
    let want: Vec<i32> = a
        .iter()
        .flat_map(|&x| {
            let u = x as u32;
            [
                x / 8,
                x % 8,
                x / -4,
                x / 7,
                x % 7,
                x / -1000,
                (u / 16) as i32,
                (u % 16) as i32,
                (u / 10) as i32,
                (u % 3) as i32,
            ]
        })
        .collect();
    let n = a.len();
    with_module(gpu, arch, "intdiv", |c| {
        let da = c.upload(&a)?;
        let dout = c.output::<i32>(10 * n)?;
        c.launch_1d(
            "intdiv_const",
            n,
            64,
            &[Arg::Ptr(da), Arg::Ptr(dout), int(n)],
        )?;
        let got: Vec<i32> = c.read(dout, 10 * n)?;
        exact(
            "[x/8, x%8, x/-4, x/7, x%7, x/-1000, u/16, u%16, u/10, u%3] per element",
            &got,
            &want,
        )
    })
}
