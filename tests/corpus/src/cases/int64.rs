//! int64.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[Case {
    name: "int64_ops",
    file: "int64",
    kernels: &["int64_ops"],
    run: int64_ops,
}];

const OPS: usize = 12;

/// A 64-bit operand drawn from a mix of full-width, small, power-of-two and extreme values.
fn operand(rng: &mut Rng) -> i64 {
    match rng.below(5) {
        0 => rng.next_u64() as i64,
        1 => i64::from(rng.range_i32(-1000, 1000)),
        2 => (1i64 << rng.below(63)) * if rng.below(2) == 0 { 1 } else { -1 },
        3 => rng.pick(&[i64::MIN, i64::MAX, -1, 1, 0, i64::MIN + 1, u32::MAX as i64]),
        _ => i64::from(rng.next_u32() as i32),
    }
}

/// The kernel's twelve results, computed with Rust's wrapping 64-bit arithmetic.
fn reference(x: i64, y: i64, sh: u32) -> [i64; OPS] {
    let (ux, uy) = (x as u64, y as u64);
    let s = sh & 63;
    [
        ux.wrapping_mul(uy) as i64,
        x.wrapping_div(y),
        x.wrapping_rem(y),
        (ux / uy) as i64,
        (ux % uy) as i64,
        (ux << s) as i64,
        x >> s,
        (ux >> s) as i64,
        ((u128::from(ux) * u128::from(uy)) >> 64) as i64,
        ((i128::from(x) * i128::from(y)) >> 64) as i64,
        ux.wrapping_sub(uy.wrapping_mul(3)) as i64,
        i64::from(x as i32) * i64::from(y as i32),
    ]
}

/// mul, signed/unsigned div and rem, shifts, __umul64hi/__mul64hi. Divisors are
/// never 0 and never -1 with i64::MIN (intdiv covers that). Exact.
fn int64_ops(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 1_000;
    let mut rng = Rng::for_case("int64_ops");
    let a: Vec<i64> = (0..N).map(|_| operand(&mut rng)).collect();
    let b: Vec<i64> = a
        .iter()
        .map(|&x| {
            loop {
                let y = operand(&mut rng);
                if y != 0 && !(x == i64::MIN && y == -1) {
                    break y;
                }
            }
        })
        .collect();
    let sh: Vec<u32> = (0..N).map(|_| rng.next_u32()).collect();
    let want: Vec<u64> = (0..N)
        .flat_map(|i| reference(a[i], b[i], sh[i]))
        .map(|v| v as u64)
        .collect();
    with_module(gpu, arch, "int64", |c| {
        let da = c.upload(&a)?;
        let db = c.upload(&b)?;
        let dsh = c.upload(&sh)?;
        let dout = c.output::<i64>(N * OPS)?;
        c.launch_1d(
            "int64_ops",
            N,
            128,
            &[
                Arg::Ptr(da),
                Arg::Ptr(db),
                Arg::Ptr(dsh),
                Arg::Ptr(dout),
                int(N),
            ],
        )?;
        let got: Vec<u64> = c.read(dout, N * OPS)?;
        exact_hex64(
            "[mul, sdiv, srem, udiv, urem, shl, sar, shr, umulhi, mulhi, sub, mul.wide.s32] per element",
            &got,
            &want,
        )
    })
}
