//! device_funcs.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[Case {
    name: "device_calls",
    file: "device_funcs",
    kernels: &["device_calls"],
    run: device_calls,
}];

fn fib(n: i32) -> i32 {
    if n < 2 { n } else { fib(n - 1) + fib(n - 2) }
}

/// Scalar, pointer and struct parameters, a struct return value and recursive
/// fib through .func/call. Integer results exact; the float lerp uses explicit
/// round-to-nearest intrinsics, so it is exact too.
fn device_calls(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 500;
    let mut rng = Rng::for_case("device_calls");
    let a: Vec<i32> = (0..N).map(|_| rng.range_i32(-1000, 1000)).collect();
    let b: Vec<i32> = (0..N).map(|_| rng.range_i32(-100_000, 100_000)).collect();
    let f: Vec<f32> = (0..N).map(|_| rng.range_f32(-100.0, 100.0)).collect();
    let mut want_i = Vec::with_capacity(5 * N);
    let mut want_f = Vec::with_capacity(N);
    for i in 0..N {
        let (x, y) = (a[i], b[i]);
        want_i.push(x * 31 + (y ^ i as i32) - (x >> 2));
        want_i.extend([y, x]);
        want_i.push(x * 3 + (f[i] * 0.5) as i32);
        want_i.push(fib((x & 7) + 4));
        want_f.push(f[i] + 0.25 * (y as f32 - f[i]));
    }
    with_module(gpu, arch, "device_funcs", |c| {
        let da = c.upload(&a)?;
        let db = c.upload(&b)?;
        let df = c.upload(&f)?;
        let dout_i = c.output::<i32>(5 * N)?;
        let dout_f = c.output::<f32>(N)?;
        c.launch_1d(
            "device_calls",
            N,
            128,
            &[
                Arg::Ptr(da),
                Arg::Ptr(db),
                Arg::Ptr(df),
                Arg::Ptr(dout_i),
                Arg::Ptr(dout_f),
                int(N),
            ],
        )?;
        let got_i: Vec<i32> = c.read(dout_i, 5 * N)?;
        let got_f: Vec<f32> = c.read(dout_f, N)?;
        exact(
            "[mix, write_pair x2, pair_sum(make_pair), fib] per element",
            &got_i,
            &want_i,
        )?;
        bits_f32("lerp_rn", &got_f, &want_f)
    })
}
