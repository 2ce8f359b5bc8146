//! Per-lane helpers shared by the instruction families: masks, sign extension, byte order,
//! and the lane-wise map/apply forms used with a warp's active mask; `with_int!`.

use super::*;

#[inline]
pub(super) fn lowmask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

#[inline]
pub(super) fn sext_bits(v: u64, bits: u32) -> u64 {
    if bits >= 64 {
        v
    } else {
        let sh = 64 - bits;
        (((v << sh) as i64) >> sh) as u64
    }
}

#[inline]
pub(super) fn read_le(b: &[u8]) -> u64 {
    match b.len() {
        4 => u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        8 => u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        _ => {
            let mut out = [0u8; 8];
            let n = b.len().min(8);
            out[..n].copy_from_slice(&b[..n]);
            u64::from_le_bytes(out)
        }
    }
}

#[inline]
pub(super) fn write_le(b: &mut [u8], v: u64) {
    let n = b.len().min(8);
    b[..n].copy_from_slice(&v.to_le_bytes()[..n]);
}

#[inline(always)]
pub(super) fn write_masked(row: &mut [u64; 32], m: u32, vals: &[u64; 32]) {
    if m == FULL {
        *row = *vals;
    } else {
        for l in 0..32 {
            if m >> l & 1 != 0 {
                row[l] = vals[l];
            }
        }
    }
}

#[inline(always)]
pub(super) fn apply1(row: &mut [u64; 32], av: &[u64; 32], m: u32, f: impl Fn(u64) -> u64) {
    if m == FULL {
        for l in 0..32 {
            row[l] = f(av[l]);
        }
    } else {
        for l in 0..32 {
            if m >> l & 1 != 0 {
                row[l] = f(av[l]);
            }
        }
    }
}

#[inline(always)]
pub(super) fn map1(regs: &mut [[u64; 32]], m: u32, d: Reg, a: Reg, f: impl Fn(u64) -> u64) {
    let (d, a) = (d as usize, a as usize);
    if let Ok([row, av]) = regs.get_disjoint_mut([d, a]) {
        apply1(row, av, m, f);
    } else {
        let av = regs[a];
        apply1(&mut regs[d], &av, m, f);
    }
}

#[inline(always)]
pub(super) fn apply2(
    row: &mut [u64; 32],
    av: &[u64; 32],
    bv: &[u64; 32],
    m: u32,
    f: impl Fn(u64, u64) -> u64,
) {
    if m == FULL {
        for l in 0..32 {
            row[l] = f(av[l], bv[l]);
        }
    } else {
        for l in 0..32 {
            if m >> l & 1 != 0 {
                row[l] = f(av[l], bv[l]);
            }
        }
    }
}

/// d = f(a, b) lane-wise. Rows are borrowed in place when the registers are distinct (the common
/// case), and copied only when the destination aliases a source.
#[inline(always)]
pub(super) fn map2(
    regs: &mut [[u64; 32]],
    m: u32,
    d: Reg,
    a: Reg,
    b: Reg,
    f: impl Fn(u64, u64) -> u64,
) {
    let (d, a, b) = (d as usize, a as usize, b as usize);
    if let Ok([row, av, bv]) = regs.get_disjoint_mut([d, a, b]) {
        apply2(row, av, bv, m, f);
    } else {
        let (av, bv) = (regs[a], regs[b]);
        apply2(&mut regs[d], &av, &bv, m, f);
    }
}

#[inline(always)]
pub(super) fn apply3(
    row: &mut [u64; 32],
    av: &[u64; 32],
    bv: &[u64; 32],
    cv: &[u64; 32],
    m: u32,
    f: impl Fn(u64, u64, u64) -> u64,
) {
    if m == FULL {
        for l in 0..32 {
            row[l] = f(av[l], bv[l], cv[l]);
        }
    } else {
        for l in 0..32 {
            if m >> l & 1 != 0 {
                row[l] = f(av[l], bv[l], cv[l]);
            }
        }
    }
}

#[inline(always)]
pub(super) fn map3(
    regs: &mut [[u64; 32]],
    m: u32,
    d: Reg,
    a: Reg,
    b: Reg,
    c: Reg,
    f: impl Fn(u64, u64, u64) -> u64,
) {
    let (d, a, b, c) = (d as usize, a as usize, b as usize, c as usize);
    if let Ok([row, av, bv, cv]) = regs.get_disjoint_mut([d, a, b, c]) {
        apply3(row, av, bv, cv, m, f);
    } else {
        let (av, bv, cv) = (regs[a], regs[b], regs[c]);
        apply3(&mut regs[d], &av, &bv, &cv, m, f);
    }
}

/// Runs `$body` with `$T` bound to the Rust integer type of PTX type `$ty`.
macro_rules! with_int {
    ($ty:expr, $T:ident, $body:expr) => {
        match $ty {
            Ty::U8 | Ty::B8 => {
                type $T = u8;
                $body
            }
            Ty::U16 | Ty::B16 | Ty::F16 | Ty::Bf16 => {
                type $T = u16;
                $body
            }
            Ty::U32 | Ty::B32 | Ty::F32 | Ty::F16x2 | Ty::Bf16x2 => {
                type $T = u32;
                $body
            }
            Ty::S8 => {
                type $T = i8;
                $body
            }
            Ty::S16 => {
                type $T = i16;
                $body
            }
            Ty::S32 => {
                type $T = i32;
                $body
            }
            Ty::S64 => {
                type $T = i64;
                $body
            }
            _ => {
                type $T = u64;
                $body
            }
        }
    };
}
