//! params.cu.

use super::prelude::*;

pub(crate) const CASES: &[Case] = &[Case {
    name: "many_params",
    file: "params",
    kernels: &["many_params"],
    run: many_params,
}];

/// `struct Mixed` of params.cu as the device compiler lays it out
/// (`.param .align 8 .b8 [40]`).
struct Mixed {
    c: i8,
    d: f64,
    s: i16,
    i: i32,
    f: [f32; 3],
}

const MIXED_SIZE: usize = 40;

impl Mixed {
    fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; MIXED_SIZE];
        b[0] = self.c as u8;
        b[8..16].copy_from_slice(&self.d.to_le_bytes());
        b[16..18].copy_from_slice(&self.s.to_le_bytes());
        b[20..24].copy_from_slice(&self.i.to_le_bytes());
        for (k, f) in self.f.iter().enumerate() {
            b[24 + 4 * k..28 + 4 * k].copy_from_slice(&f.to_le_bytes());
        }
        b
    }
}

/// Thirteen parameters of sizes 1, 2, 4, 8 and a 40-byte struct, placed at their
/// natural alignments. Thread 0 echoes every value (sign- or zero-extended, floats
/// as bits); every thread combines several. Exact.
fn many_params(gpu: &mut dyn Gpu, arch: Arch) -> Result<(), CaseError> {
    const N: usize = 100;
    let (c8, s16, i32v, ll, f, d) = (
        -5i8,
        -1234i16,
        -123_456_789i32,
        -1_234_567_890_123i64,
        3.25e-3f32,
        -2.5e100f64,
    );
    let uc = 200u8;
    let us = 65_000u16;
    let st = Mixed {
        c: -7,
        d: 6.02e23,
        s: 31_000,
        i: -77,
        f: [1.5, -2.5, 1e-30],
    };
    let ptr_data = [11i32, 31];
    let want_echo: Vec<u64> = vec![
        i64::from(c8) as u64,
        i64::from(s16) as u64,
        i64::from(i32v) as u64,
        ll as u64,
        u64::from(f.to_bits()),
        d.to_bits(),
        u64::from(uc),
        i64::from(st.c) as u64,
        st.d.to_bits(),
        i64::from(st.s) as u64,
        i64::from(st.i) as u64,
        u64::from(st.f[0].to_bits()),
        u64::from(st.f[1].to_bits()),
        u64::from(st.f[2].to_bits()),
        i64::from(ptr_data[0] + ptr_data[1]) as u64,
        u64::from(us),
    ];
    let want_per: Vec<i64> = (0..N as i64)
        .map(|t| {
            ll * t
                + i64::from(c8)
                + i64::from(s16)
                + i64::from(i32v)
                + i64::from(uc)
                + i64::from(us)
                + i64::from(st.i)
                + i64::from(st.c)
                + i64::from(ptr_data[(t & 1) as usize])
        })
        .collect();
    with_module(gpu, arch, "params", |c| {
        let dptr = c.upload(&ptr_data)?;
        let decho = c.output::<u64>(want_echo.len())?;
        let dper = c.output::<i64>(N)?;
        c.launch(
            "many_params",
            [2, 1, 1],
            [64, 1, 1],
            0,
            &[
                Arg::I8(c8),
                Arg::I16(s16),
                Arg::I32(i32v),
                Arg::I64(ll),
                Arg::F32(f),
                Arg::F64(d),
                Arg::I8(uc as i8),
                Arg::Bytes(st.to_bytes()),
                Arg::Ptr(dptr),
                Arg::I16(us as i16),
                Arg::Ptr(decho),
                Arg::Ptr(dper),
                int(N),
            ],
        )?;
        let echo: Vec<u64> = c.read(decho, want_echo.len())?;
        let per: Vec<i64> = c.read(dper, N)?;
        exact_hex64(
            "echoed [c, s, i, ll, f, d, uc, st.c, st.d, st.s, st.i, st.f0-2, ptr sum, us]",
            &echo,
            &want_echo,
        )?;
        exact("per-thread combination", &per, &want_per)
    })
}
