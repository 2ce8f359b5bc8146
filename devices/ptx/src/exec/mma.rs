//! Warp matrix instructions of a worker: `wmma.load`, `wmma.store` and `wmma.mma` over the
//! whole warp's fragment registers, `cvt.rna.tf32.f32`, and `mma.sync`, `ldmatrix`,
//! `stmatrix` and `movmatrix`, whose fragments the PTX ISA lays out.
//!
//! A fragment's slots are its registers' elements, lane after lane: lane `l`'s slot `e` (element
//! `e % per_register` of register `e / per_register`) is slot `l * E + e` of the warp, where `E`
//! is the slots per lane. Slot `s` holds element `s % (rows * cols)` of the row-major matrix, so
//! a fragment with twice the slots (`.f16` A and B) holds each element twice; reads take the
//! first copy. PTX leaves the assignment unspecified (a program only sees it through
//! element-wise operations on fragments, which any assignment serves), so loads, stores and
//! `mma` agree with each other and with nothing else.
//!
//! The other instructions place elements as the PTX ISA's fragment figures do. Lane `4g + t`
//! (group `g`, thread `t` in the group) holds, of `mma.sync`'s A, rows `g` (and `g + 8` in
//! 16-row shapes, odd registers) and the columns from `p * t` that its register holds (`p`
//! elements per register), a register pair further `4p` columns on; of B, the same rows as A's
//! columns, in column `g`; of C and D, row `g` (`g + 8` from the third element) and columns
//! `2t` and `2t + 1`. The 16-bit 8x8 matrices of `ldmatrix`, `stmatrix` and `movmatrix` put
//! row `g`'s columns `2t` and `2t + 1` in lane `4g + t`.

use super::*;
use crate::float;

/// Lanes of a warp.
const LANES: usize = crate::WARP_SIZE as usize;
/// Lanes that share a row of an `mma.sync` fragment (a group).
const GROUP: usize = 4;
/// Rows of an `mma.sync` fragment one register set covers; 16-row shapes have two.
const ROWS_PER_SET: usize = 8;
/// Rows and columns of an `ldmatrix`, `stmatrix` or `movmatrix` matrix.
const MATRIX_DIM: usize = 8;
/// Matrices one `ldmatrix` or `stmatrix` moves at most (`.x4`).
const MAX_MATRICES: usize = 4;
/// Bytes of one of its rows (eight 16-bit elements), which must be aligned to as many.
const MATRIX_ROW_BYTES: u64 = 16;
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
    /// A warp matrix instruction (`wmma`, `mma.sync`, `ldmatrix`, `stmatrix`, `movmatrix`) for
    /// the lanes in `m` (not empty).
    #[inline(never)]
    pub(super) fn matrix_op(
        &mut self,
        w: WarpRef<'_>,
        regs: &mut [[u64; 32]],
        m: u32,
        op: &Op,
        line: u32,
    ) -> Result<(), Fault> {
        match op {
            Op::WmmaLoad(op) => self.wmma_load(w, regs, m, op, line),
            Op::WmmaStore(op) => self.wmma_store(w, regs, m, op, line),
            Op::WmmaMma(op) => {
                wmma_mma(regs, op);
                Ok(())
            }
            Op::MmaSync(op) => {
                mma_sync(regs, m, op);
                Ok(())
            }
            Op::LdMatrix(op) => self.ldmatrix(w, regs, m, op, line),
            Op::StMatrix(op) => self.stmatrix(w, regs, op, line),
            Op::MovMatrix { d, a } => {
                movmatrix(regs, m, *d, *a);
                Ok(())
            }
            _ => Ok(()),
        }
    }

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
pub(super) fn wmma_mma(regs: &mut [[u64; 32]], op: &Mma) {
    let (m, n, k) = (
        usize::from(op.shape.m),
        usize::from(op.shape.n),
        usize::from(op.shape.k),
    );
    let a = gather(regs, &op.regs_a, op.a, m * k);
    let b = gather(regs, &op.regs_b, op.b, k * n);
    let c = gather(regs, &op.regs_c, op.c, m * n);
    let d = multiply(op, &a, &b, &c);
    scatter(regs, &op.regs_d, op.d, &d);
}

/// D = A x B + C in `op`'s shape and types over row-major matrices of element bits; integer
/// sums saturate with `.satfinite`.
fn multiply(op: &Mma, a: &[u64], b: &[u64], c: &[u64]) -> Vec<u64> {
    let (shape, t, satfinite) = (op.shape, op, op.satfinite);
    let (m, n, k) = (
        usize::from(shape.m),
        usize::from(shape.n),
        usize::from(shape.k),
    );
    let mut d = vec![0u64; m * n];
    for i in 0..m {
        for j in 0..n {
            let at = i * n + j;
            d[at] = match t.a {
                MmaTy::F64 => {
                    let mut acc = f64::from_bits(c[at]);
                    for kk in 0..k {
                        acc = f64::from_bits(a[i * k + kk])
                            .mul_add(f64::from_bits(b[kk * n + j]), acc);
                    }
                    acc.to_bits()
                }
                MmaTy::S8 | MmaTy::U8 => {
                    let mut acc = to_int(t.c, c[at]);
                    for kk in 0..k {
                        acc += to_int(t.a, a[i * k + kk]) * to_int(t.b, b[kk * n + j]);
                    }
                    let r = if satfinite {
                        acc.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
                    } else {
                        acc as i32
                    };
                    u64::from(r as u32)
                }
                _ => {
                    let mut acc = to_f32(t.c, c[at]);
                    for kk in 0..k {
                        acc = float::fma32(
                            to_f32(t.a, a[i * k + kk]),
                            to_f32(t.b, b[kk * n + j]),
                            acc,
                        );
                    }
                    match t.d {
                        MmaTy::F16 => u64::from(float::f32_to_f16(acc, Rnd::Rn)),
                        _ => u64::from(acc.to_bits()),
                    }
                }
            };
        }
    }
    d
}

/// Row and column of element `e` (register `e / p`, part `e % p` of `p` per register) of lane
/// `lane`'s share of `mma.sync` fragment `frag`.
fn sync_position(
    shape: MmaShape,
    frag: MmaFrag,
    ty: MmaTy,
    lane: usize,
    e: usize,
) -> (usize, usize) {
    let (g, t) = (lane / GROUP, lane % GROUP);
    let p = ty.per_reg();
    let (reg, part) = (e / p, e % p);
    match frag {
        MmaFrag::A => {
            let (row, set) = if usize::from(shape.m) > ROWS_PER_SET {
                (g + ROWS_PER_SET * (reg % 2), reg / 2)
            } else {
                (g, reg)
            };
            (row, p * t + part + GROUP * p * set)
        }
        MmaFrag::B => (p * t + part + GROUP * p * reg, g),
        MmaFrag::C => (g + ROWS_PER_SET * (e / 2), 2 * t + e % 2),
    }
}

/// The bits of element `e` of lane `lane`'s registers `frag` (elements of type `ty`).
fn element(regs: &[[u64; 32]], frag: &[Reg], ty: MmaTy, lane: usize, e: usize) -> u64 {
    let per = ty.per_reg();
    let v = regs[frag[e / per] as usize][lane];
    let bits = ty.bits();
    if bits == 64 {
        v
    } else {
        (v >> ((e % per) as u32 * bits)) & ((1u64 << bits) - 1)
    }
}

/// The row-major matrix `mma.sync` fragment `frag` (registers `regs_f`) holds.
fn sync_gather(
    regs: &[[u64; 32]],
    regs_f: &[Reg],
    shape: MmaShape,
    frag: MmaFrag,
    ty: MmaTy,
) -> Vec<u64> {
    let (rows, cols) = shape.dims(frag);
    let mut out = vec![0u64; rows * cols];
    let per_lane = regs_f.len() * ty.per_reg();
    for lane in 0..LANES {
        for e in 0..per_lane {
            let (r, c) = sync_position(shape, frag, ty, lane, e);
            out[r * cols + c] = element(regs, regs_f, ty, lane, e);
        }
    }
    out
}

/// `mma.sync`: D = A x B + C over fragments laid out as the PTX ISA specifies; lanes outside
/// `mask` keep their registers.
pub(super) fn mma_sync(regs: &mut [[u64; 32]], mask: u32, op: &Mma) {
    let a = sync_gather(regs, &op.regs_a, op.shape, MmaFrag::A, op.a);
    let b = sync_gather(regs, &op.regs_b, op.shape, MmaFrag::B, op.b);
    let c = sync_gather(regs, &op.regs_c, op.shape, MmaFrag::C, op.c);
    let d = multiply(op, &a, &b, &c);
    let cols = usize::from(op.shape.n);
    let per = op.d.per_reg();
    let bits = op.d.bits();
    let mask_bits = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    for lane in (0..LANES).filter(|l| mask & (1 << l) != 0) {
        for (ri, &r) in op.regs_d.iter().enumerate() {
            let mut v = 0u64;
            for part in 0..per {
                let (row, col) = sync_position(op.shape, MmaFrag::C, op.d, lane, ri * per + part);
                v |= (d[row * cols + col] & mask_bits) << (part as u32 * bits);
            }
            regs[r as usize][lane] = v;
        }
    }
}

/// An 8x8 matrix of 16-bit elements, row-major.
type Matrix16 = [[u16; MATRIX_DIM]; MATRIX_DIM];

/// The lane and the half of its register holding element (`r`, `c`) of an 8x8 16-bit matrix
/// fragment.
fn matrix_holder(r: usize, c: usize) -> (usize, u32) {
    (GROUP * r + c / 2, (c % 2) as u32 * 16)
}

/// The 8x8 matrix fragment register `reg` holds across the warp.
fn matrix_of(regs: &[[u64; 32]], reg: Reg) -> Matrix16 {
    let mut m = [[0u16; MATRIX_DIM]; MATRIX_DIM];
    for (r, row) in m.iter_mut().enumerate() {
        for (c, v) in row.iter_mut().enumerate() {
            let (lane, shift) = matrix_holder(r, c);
            *v = (regs[reg as usize][lane] >> shift) as u16;
        }
    }
    m
}

/// Writes matrix `m` (transposed when `trans`) into fragment register `reg` of the lanes in
/// `mask`.
fn set_matrix(regs: &mut [[u64; 32]], reg: Reg, mask: u32, m: &Matrix16, trans: bool) {
    let at = |r: usize, c: usize| if trans { m[c][r] } else { m[r][c] };
    for lane in (0..LANES).filter(|l| mask & (1 << l) != 0) {
        let (r, c) = (lane / GROUP, 2 * (lane % GROUP));
        regs[reg as usize][lane] = u64::from(at(r, c)) | (u64::from(at(r, c + 1)) << 16);
    }
}

/// `movmatrix.sync.aligned.m8n8.trans.b16`.
pub(super) fn movmatrix(regs: &mut [[u64; 32]], mask: u32, d: Reg, a: Reg) {
    let m = matrix_of(regs, a);
    set_matrix(regs, d, mask, &m, true);
}

impl<'a> Worker<'a> {
    /// The address of row `row` of matrix `j` of an `ldmatrix` or `stmatrix`: lane
    /// `8 * j + row`'s.
    fn matrix_row_address(regs: &[[u64; 32]], op: &MatrixMem, j: usize, row: usize) -> (u32, u64) {
        let lane = j * MATRIX_DIM + row;
        (
            lane as u32,
            regs[op.base as usize][lane].wrapping_add(op.off as u64),
        )
    }

    /// `ldmatrix`: the lanes in `mask` receive one register of each matrix.
    pub(super) fn ldmatrix(
        &mut self,
        w: WarpRef<'_>,
        regs: &mut [[u64; 32]],
        mask: u32,
        op: &MatrixMem,
        line: u32,
    ) -> Result<(), Fault> {
        const WORD: usize = 8;
        // At most four matrices (`.x4`): read them all before writing any register.
        let mut mats = [[[0u16; MATRIX_DIM]; MATRIX_DIM]; MAX_MATRICES];
        for (j, m) in mats.iter_mut().enumerate().take(op.regs.len()) {
            for (i, row) in m.iter_mut().enumerate() {
                let (lane, a) = Self::matrix_row_address(regs, op, j, i);
                let fault = |this: &Self, e| {
                    this.mem_fault(w, lane, line, "ldmatrix", a, MATRIX_ROW_BYTES as usize, e)
                };
                if a % MATRIX_ROW_BYTES != 0 {
                    return Err(fault(self, AccessError::Misaligned));
                }
                for (h, half) in row.chunks_mut(WORD / 2).enumerate() {
                    let v = self
                        .load_any(
                            w,
                            lane,
                            op.space,
                            a + (h * WORD) as u64,
                            WORD,
                            Ordering::Relaxed,
                        )
                        .map_err(|e| fault(self, e))?;
                    for (q, x) in half.iter_mut().enumerate() {
                        *x = (v >> (16 * q)) as u16;
                    }
                }
            }
        }
        for (&r, m) in op.regs.iter().zip(&mats) {
            set_matrix(regs, r, mask, m, op.trans);
        }
        Ok(())
    }

    /// `stmatrix`: each matrix's rows from the warp's registers to the lanes' addresses.
    pub(super) fn stmatrix(
        &mut self,
        w: WarpRef<'_>,
        regs: &[[u64; 32]],
        op: &MatrixMem,
        line: u32,
    ) -> Result<(), Fault> {
        const WORD: usize = 8;
        for (j, &reg) in op.regs.iter().enumerate() {
            let m = matrix_of(regs, reg);
            for i in 0..MATRIX_DIM {
                let (lane, a) = Self::matrix_row_address(regs, op, j, i);
                let fault = |this: &Self, e| {
                    this.mem_fault(w, lane, line, "stmatrix", a, MATRIX_ROW_BYTES as usize, e)
                };
                if a % MATRIX_ROW_BYTES != 0 {
                    return Err(fault(self, AccessError::Misaligned));
                }
                let row: [u16; MATRIX_DIM] =
                    std::array::from_fn(|c| if op.trans { m[c][i] } else { m[i][c] });
                for (h, half) in row.chunks(WORD / 2).enumerate() {
                    let v = half
                        .iter()
                        .enumerate()
                        .fold(0u64, |v, (q, &x)| v | (u64::from(x) << (16 * q)));
                    self.store_any(
                        w,
                        lane,
                        op.space,
                        a + (h * WORD) as u64,
                        WORD,
                        v,
                        Ordering::Relaxed,
                    )
                    .map_err(|e| fault(self, e))?;
                }
            }
        }
        Ok(())
    }
}
