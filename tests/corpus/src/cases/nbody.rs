//! nbody.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[Case {
    name: "nbody_step",
    file: "nbody",
    kernels: &["nbody_step"],
    run: nbody,
}];

const N: usize = 200;
const DT: f64 = 0.01;
const EPS2: f64 = 0.01;
/// Relative error allowed per 1/sqrt: CUDA's double rsqrt() compiles to bare
/// rsqrt.approx.f64, whose error bound the PTX ISA does not pin down to an ulp
/// count; 2^-40 is far looser than hardware and far tighter than any real bug
/// (a single-precision approximation is off by ~2^-23).
const RSQRT_REL: f64 = 1.0 / (1u64 << 40) as f64;

/// Acceleration error <= sum|term| * (3*RSQRT_REL + (N + 16)*u) (each term has
/// ~16 roundings including the cubed rsqrt, the sum adds N); the velocity and
/// position updates add dt-scaled error plus two roundings each.
fn nbody(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    let mut rng = Rng::for_case("nbody_step");
    let mut pos = Vec::with_capacity(4 * N);
    for _ in 0..N {
        pos.extend([
            rng.range_f64(-1.0, 1.0),
            rng.range_f64(-1.0, 1.0),
            rng.range_f64(-1.0, 1.0),
        ]);
        pos.push(rng.range_f64(0.5, 1.5));
    }
    let vel: Vec<f64> = (0..3 * N).map(|_| rng.range_f64(-0.1, 0.1)).collect();

    let (mut want_pos, mut tol_pos) = (vec![0.0; 4 * N], vec![0.0; 4 * N]);
    let (mut want_vel, mut tol_vel) = (vec![0.0; 3 * N], vec![0.0; 3 * N]);
    let per_term = 3.0 * RSQRT_REL + (N as f64 + 16.0) * U64;
    for i in 0..N {
        let mut acc = [0.0f64; 3];
        let mut acc_abs = [0.0f64; 3];
        for j in 0..N {
            let d = [0, 1, 2].map(|k| pos[4 * j + k] - pos[4 * i + k]);
            let d2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + EPS2;
            let s = pos[4 * j + 3] / (d2 * d2.sqrt());
            for k in 0..3 {
                acc[k] += d[k] * s;
                acc_abs[k] += (d[k] * s).abs();
            }
        }
        for k in 0..3 {
            let v = vel[3 * i + k] + acc[k] * DT;
            let tv = DT * acc_abs[k] * per_term
                + 2.0 * U64 * (vel[3 * i + k].abs() + (acc[k] * DT).abs());
            want_vel[3 * i + k] = v;
            tol_vel[3 * i + k] = tv;
            want_pos[4 * i + k] = pos[4 * i + k] + v * DT;
            tol_pos[4 * i + k] = DT * tv + 2.0 * U64 * (pos[4 * i + k].abs() + (v * DT).abs());
        }
        want_pos[4 * i + 3] = pos[4 * i + 3];
    }
    with_module(gpu, arch, "nbody", |c| {
        let dpos = c.upload(&pos)?;
        let dvel = c.upload(&vel)?;
        let dnew_pos = c.output::<f64>(4 * N)?;
        let dnew_vel = c.output::<f64>(3 * N)?;
        c.launch_1d(
            "nbody_step",
            N,
            64,
            &[
                Arg::Ptr(dpos),
                Arg::Ptr(dvel),
                Arg::Ptr(dnew_pos),
                Arg::Ptr(dnew_vel),
                int(N),
                Arg::F64(DT),
                Arg::F64(EPS2),
            ],
        )?;
        let got_vel: Vec<f64> = c.read(dnew_vel, 3 * N)?;
        let got_pos: Vec<f64> = c.read(dnew_pos, 4 * N)?;
        within("new velocities", &got_vel, &want_vel, &tol_vel)?;
        within("new positions and masses", &got_pos, &want_pos, &tol_pos)
    })
}
