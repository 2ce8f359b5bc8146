//! Warp matrix instructions of a worker: `wmma.load`, `wmma.store` and `wmma.mma` over the
//! whole warp's fragment registers, and `cvt.rna.tf32.f32`.
//!
//! A fragment's slots are its registers' elements, lane after lane: lane `l`'s slot `e` (element
//! `e % per_register` of register `e / per_register`) is slot `l * E + e` of the warp, where `E`
//! is the slots per lane. Slot `s` holds element `s % (rows * cols)` of the row-major matrix, so
//! a fragment with twice the slots (`.f16` A and B) holds each element twice; reads take the
//! first copy. PTX leaves the assignment unspecified (a program only sees it through
//! element-wise operations on fragments, which any assignment serves), so loads, stores and
//! `mma` agree with each other and with nothing else.

use super::*;
use crate::float;

/// Lanes of a warp.
const LANES: usize = crate::WARP_SIZE as usize;
/// Mantissa bits of an `f32` that TF32 drops.
const TF32_DROPPED_BITS: u32 = 13;

/// The bits of slot `slot` of fragment `frag` (registers of element type `ty`).
fn slot(regs: &[[u64; 32]], frag: &[Reg], ty: MmaTy, slot: usize) -> u64 {
    let per_lane = frag.len() * ty.per_reg();
    let (lane, e) = (slot / per_lane, slot % per_lane);
    let v = regs[frag[e / ty.per_reg()] as usize][lane];
    let bits = ty.bits();
    if bits == 64 {
        v
    } else {
        (v >> ((e % ty.per_reg()) as u32 * bits)) & ((1u64 << bits) - 1)
    }
}

/// The matrix (`total` elements, row-major) fragment `frag` holds.
fn gather(regs: &[[u64; 32]], frag: &[Reg], ty: MmaTy, total: usize) -> Vec<u64> {
    (0..total).map(|n| slot(regs, frag, ty, n)).collect()
}

/// Writes the matrix `vals` (row-major) into every slot of fragment `frag`.
fn scatter(regs: &mut [[u64; 32]], frag: &[Reg], ty: MmaTy, vals: &[u64]) {
    let per = ty.per_reg();
    let per_lane = frag.len() * per;
    let bits = ty.bits();
    let mask = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    for (ri, &r) in frag.iter().enumerate() {
        for lane in 0..LANES {
            let mut v = 0u64;
            for j in 0..per {
                let s = lane * per_lane + ri * per + j;
                v |= (vals[s % vals.len()] & mask) << (j as u32 * bits);
            }
            regs[r as usize][lane] = v;
        }
    }
}

/// An element of a floating-point fragment as an `f32`.
fn to_f32(ty: MmaTy, bits: u64) -> f32 {
    match ty {
        MmaTy::F16 => float::f16_to_f32(bits as u16),
        MmaTy::Bf16 => float::bf16_to_f32(bits as u16),
        // The tensor cores read TF32's 10 mantissa bits of an f32.
        MmaTy::Tf32 => f32::from_bits((bits as u32) & !((1 << TF32_DROPPED_BITS) - 1)),
        _ => f32::from_bits(bits as u32),
    }
}

/// An integer element as a signed value.
fn to_int(ty: MmaTy, bits: u64) -> i64 {
    match ty {
        MmaTy::S8 => i64::from(bits as u8 as i8),
        MmaTy::U8 => i64::from(bits as u8),
        _ => i64::from(bits as u32 as i32),
    }
}

/// `cvt.rna.tf32.f32`: `x` rounded to TF32's 10 mantissa bits, ties away from zero, as an
/// `f32` whose 13 low bits are 0. NaN stays NaN; a value past TF32's largest finite one
/// becomes infinity, as the exponent is an `f32`'s.
pub(super) fn tf32_rna(x: u32) -> u32 {
    let f = f32::from_bits(x);
    if f.is_nan() {
        return f32::NAN.to_bits();
    }
    if f.is_infinite() {
        return x;
    }
    let half = 1u32 << (TF32_DROPPED_BITS - 1);
    (x.wrapping_add(half)) & !((1u32 << TF32_DROPPED_BITS) - 1)
}

impl<'a> Worker<'a> {
    /// Device addresses of the elements of a `wmma.load`'s or `wmma.store`'s matrix, row-major,
    /// from the first active lane's address and stride (PTX requires every lane to give the
    /// same ones).
    fn wmma_addresses(regs: &[[u64; 32]], op: &WmmaMem, lane: usize) -> Vec<u64> {
        let base = regs[op.base as usize][lane].wrapping_add(op.off as u64);
        let (rows, cols) = op.shape.dims(op.frag);
        let stride = if op.stride == NONE {
            (if op.col { rows } else { cols }) as u64
        } else {
            u64::from(regs[op.stride as usize][lane] as u32)
        };
        let bytes = u64::from(op.ty.bits() / 8);
        (0..rows * cols)
            .map(|n| {
                let (r, c) = (n / cols, n % cols);
                let (major, minor) = if op.col { (c, r) } else { (r, c) };
                let index = (major as u64)
                    .wrapping_mul(stride)
                    .wrapping_add(minor as u64);
                base.wrapping_add(index.wrapping_mul(bytes))
            })
            .collect()
    }

    /// `wmma.load`: the warp's fragment from a matrix in memory.
    pub(super) fn wmma_load(
        &mut self,
        w: WarpRef<'_>,
        regs: &mut [[u64; 32]],
        m: u32,
        op: &WmmaMem,
        line: u32,
    ) -> Result<(), Fault> {
        let lane = m.trailing_zeros();
        let size = (op.ty.bits() / 8) as usize;
        let addrs = Self::wmma_addresses(regs, op, lane as usize);
        let mut vals = Vec::with_capacity(addrs.len());
        for a in addrs {
            let v = self
                .load_any(w, lane, op.space, a, size, Ordering::Relaxed)
                .map_err(|e| self.mem_fault(w, lane, line, "wmma.load", a, size, e))?;
            vals.push(v);
        }
        scatter(regs, &op.regs, op.ty, &vals);
        Ok(())
    }

    /// `wmma.store`: the warp's fragment into a matrix in memory.
    pub(super) fn wmma_store(
        &mut self,
        w: WarpRef<'_>,
        regs: &[[u64; 32]],
        m: u32,
        op: &WmmaMem,
        line: u32,
    ) -> Result<(), Fault> {
        let lane = m.trailing_zeros();
        let size = (op.ty.bits() / 8) as usize;
        let addrs = Self::wmma_addresses(regs, op, lane as usize);
        let vals = gather(regs, &op.regs, op.ty, addrs.len());
        for (a, v) in addrs.into_iter().zip(vals) {
            self.store_any(w, lane, op.space, a, size, v, Ordering::Relaxed)
                .map_err(|e| self.mem_fault(w, lane, line, "wmma.store", a, size, e))?;
        }
        Ok(())
    }
}

/// `wmma.mma`: D = A x B + C over the warp's fragments.
pub(super) fn wmma_mma(regs: &mut [[u64; 32]], op: &WmmaMma) {
    let (m, n, k) = (
        usize::from(op.shape.m),
        usize::from(op.shape.n),
        usize::from(op.shape.k),
    );
    let a = gather(regs, &op.regs_a, op.ab, m * k);
    let b = gather(regs, &op.regs_b, op.ab, k * n);
    let c = gather(regs, &op.regs_c, op.c, m * n);
    let mut d = vec![0u64; m * n];
    for i in 0..m {
        for j in 0..n {
            let at = i * n + j;
            d[at] = match op.ab {
                MmaTy::F64 => {
                    let mut acc = f64::from_bits(c[at]);
                    for kk in 0..k {
                        acc = f64::from_bits(a[i * k + kk])
                            .mul_add(f64::from_bits(b[kk * n + j]), acc);
                    }
                    acc.to_bits()
                }
                MmaTy::S8 | MmaTy::U8 => {
                    let mut acc = to_int(op.c, c[at]);
                    for kk in 0..k {
                        acc += to_int(op.ab, a[i * k + kk]) * to_int(op.ab, b[kk * n + j]);
                    }
                    let r = if op.satfinite {
                        acc.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
                    } else {
                        acc as i32
                    };
                    u64::from(r as u32)
                }
                _ => {
                    let mut acc = to_f32(op.c, c[at]);
                    for kk in 0..k {
                        acc = float::fma32(
                            to_f32(op.ab, a[i * k + kk]),
                            to_f32(op.ab, b[kk * n + j]),
                            acc,
                        );
                    }
                    match op.d {
                        MmaTy::F16 => u64::from(float::f32_to_f16(acc, Rnd::Rn)),
                        _ => u64::from(acc.to_bits()),
                    }
                }
            };
        }
    }
    scatter(regs, &op.regs_d, op.d, &d);
}
