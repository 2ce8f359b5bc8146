//! Atomic operations on global and shared memory, and memory orders.

use super::*;

impl<'a> Worker<'a> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn atomic(
        &mut self,
        w: WarpRef<'_>,
        lane: u32,
        space: Space,
        op: AtomOp,
        ty: Ty,
        addr: u64,
        b: u64,
        c: u64,
    ) -> Result<u64, AccessError> {
        let bytes = ty.bytes();
        if addr & (bytes as u64 - 1) != 0 {
            return Err(AccessError::Misaligned);
        }
        let (sp, a) = Self::resolve(space, addr)?;
        match sp {
            Space::Global => {
                if a >= GLOBAL_LIMIT {
                    return Err(AccessError::OutOfRange);
                }
                let i = self.view_index(a).ok_or(AccessError::OutOfRange)?;
                let v = &self.views[i];
                let off = a - v.0;
                match bytes {
                    2 => {
                        v.2.kernel_update_u16(off, |old| {
                            atom_apply(op, ty, u64::from(old), b, c) as u16
                        })
                        .map(u64::from)
                    }
                    4 if op == AtomOp::Add && ty.is_int() => {
                        v.2.kernel_fetch_add_u32(off, b as u32).map(u64::from)
                    }
                    4 => {
                        v.2.kernel_update_u32(off, |old| {
                            atom_apply(op, ty, u64::from(old), b, c) as u32
                        })
                        .map(u64::from)
                    }
                    _ if op == AtomOp::Add && ty.is_int() => v.2.kernel_fetch_add_u64(off, b),
                    _ => {
                        v.2.kernel_update_u64(off, |old| atom_apply(op, ty, old, b, c))
                    }
                }
            }
            Space::Shared => {
                let o = self.shared_range(a, bytes)?;
                let old = read_le(&self.shared[o..o + bytes]);
                write_le(
                    &mut self.shared[o..o + bytes],
                    atom_apply(op, ty, old, b, c),
                );
                Ok(old)
            }
            Space::Local => {
                let o = self.local_range(w, lane, a, bytes)?;
                let old = read_le(&self.local[o..o + bytes]);
                write_le(&mut self.local[o..o + bytes], atom_apply(op, ty, old, b, c));
                Ok(old)
            }
            _ => Err(AccessError::OutOfRange),
        }
    }
}

pub(super) fn mem_order(o: MemOrd) -> Ordering {
    match o {
        MemOrd::Relaxed => Ordering::Relaxed,
        MemOrd::Acquire => Ordering::Acquire,
        MemOrd::Release => Ordering::Release,
    }
}

pub(super) fn atom_apply(op: AtomOp, ty: Ty, old: u64, b: u64, c: u64) -> u64 {
    let bits = ty.bits();
    let mask = lowmask(bits);
    match (op, ty) {
        (AtomOp::Add, Ty::F32) => {
            let r = ftz32(ftz32(f32::from_bits(old as u32)) + ftz32(f32::from_bits(b as u32)));
            bits32(r)
        }
        (AtomOp::Add, Ty::F64) => bits64(f64::from_bits(old) + f64::from_bits(b)),
        (AtomOp::Add, _) => old.wrapping_add(b) & mask,
        (AtomOp::Min, Ty::S32) => ((old as i32).min(b as i32)) as u32 as u64,
        (AtomOp::Max, Ty::S32) => ((old as i32).max(b as i32)) as u32 as u64,
        (AtomOp::Min, Ty::S64) => ((old as i64).min(b as i64)) as u64,
        (AtomOp::Max, Ty::S64) => ((old as i64).max(b as i64)) as u64,
        (AtomOp::Min, _) => (old & mask).min(b & mask),
        (AtomOp::Max, _) => (old & mask).max(b & mask),
        (AtomOp::And, _) => old & b & mask,
        (AtomOp::Or, _) => (old | b) & mask,
        (AtomOp::Xor, _) => (old ^ b) & mask,
        (AtomOp::Exch, _) => b & mask,
        (AtomOp::Cas, _) => {
            if old & mask == b & mask {
                c & mask
            } else {
                old
            }
        }
        (AtomOp::Inc, _) => {
            let (o, b) = (old as u32, b as u32);
            u64::from(if o >= b { 0 } else { o + 1 })
        }
        (AtomOp::Dec, _) => {
            let (o, b) = (old as u32, b as u32);
            u64::from(if o == 0 || o > b { b } else { o - 1 })
        }
    }
}
