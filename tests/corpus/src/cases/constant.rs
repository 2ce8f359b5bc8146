//! constant.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[
    Case {
        name: "const_conv",
        file: "constant",
        kernels: &["const_conv"],
        run: conv,
    },
    Case {
        name: "const_table",
        file: "constant",
        kernels: &["const_table"],
        run: table,
    },
];

const TAPS: usize = 9;
/// The static initializer of `c_table` in constant.cu (an input, not an expected output).
const CONST_TABLE: [i32; 16] = [3, -1, 4, -1, 5, -9, 2, 6, -5, 3, 5, -8, 9, 7, -9, 3];

/// Taps written into `__constant__ float c_coeffs[9]` through cuModuleGetGlobal +
/// HtoD. Tolerance: 9-term dot product, 2*9*u*sum|c||x| (as in matmul).
fn conv(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 2_000;
    let mut rng = Rng::for_case("const_conv");
    let coeffs: Vec<f32> = (0..TAPS).map(|_| rng.range_f32(-1.0, 1.0)).collect();
    let input: Vec<f32> = (0..N).map(|_| rng.range_f32(-10.0, 10.0)).collect();
    let (mut want, mut tol) = (vec![0.0; N], vec![0.0; N]);
    for i in 0..N {
        for (k, &cf) in coeffs.iter().enumerate() {
            let Some(&x) = (i + k).checked_sub(4).and_then(|j| input.get(j)) else {
                continue;
            };
            let p = f64::from(cf) * f64::from(x);
            want[i] += p;
            tol[i] += 2.0 * TAPS as f64 * U32 * p.abs();
        }
    }
    with_module(gpu, arch, "constant", |c| {
        let dcoeffs = c.global("c_coeffs", TAPS * 4)?;
        c.write(dcoeffs, &coeffs)?;
        let din = c.upload(&input)?;
        let dout = c.output::<f32>(N)?;
        c.launch_1d(
            "const_conv",
            N,
            128,
            &[Arg::Ptr(din), Arg::Ptr(dout), int(N)],
        )?;
        let got: Vec<f32> = c.read(dout, N)?;
        within("9-tap convolution (2*9*u*sum|c||x|)", &got, &want, &tol)
    })
}

/// The statically initialised `c_table` reads back as written in the source
/// (its PTX initializer omits trailing zero bytes); data-dependent lookups are
/// exact; the `__device__ g_counter` global, zeroed through its address, ends at n.
fn table(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 3_000;
    let mut rng = Rng::for_case("const_table");
    let input: Vec<u32> = (0..N).map(|_| rng.next_u32() >> 8).collect();
    let want: Vec<i32> = input
        .iter()
        .map(|&v| {
            CONST_TABLE[(v & 15) as usize] * (v >> 4) as i32 + CONST_TABLE[((v >> 8) & 15) as usize]
        })
        .collect();
    with_module(gpu, arch, "constant", |c| {
        let dtable = c.global("c_table", 16 * 4)?;
        let table: Vec<i32> = c.read(dtable, 16)?;
        exact("c_table static initializer", &table, &CONST_TABLE)?;
        let dcounter = c.global("g_counter", 4)?;
        c.write(dcounter, &[0u32])?;
        let din = c.upload(&input)?;
        let dout = c.output::<i32>(N)?;
        c.launch_1d(
            "const_table",
            N,
            256,
            &[Arg::Ptr(din), Arg::Ptr(dout), int(N)],
        )?;
        let got: Vec<i32> = c.read(dout, N)?;
        exact("table lookups", &got, &want)?;
        let counter: Vec<u32> = c.read(dcounter, 1)?;
        exact("g_counter", &counter, &[N as u32])
    })
}
