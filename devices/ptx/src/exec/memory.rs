//! Memory accesses of a worker: its cached views of global memory, the shared, local and
//! parameter windows of generic addresses, and loads and stores in any state space.

use super::*;
use std::sync::atomic::AtomicBool;

/// Stripes of [`VectorLock`].
const VECTOR_LOCK_STRIPES: usize = 64;
/// One lock per stripe of 16-byte-aligned addresses.
static VECTOR_LOCKS: [AtomicBool; VECTOR_LOCK_STRIPES] =
    [const { AtomicBool::new(false) }; VECTOR_LOCK_STRIPES];

/// Makes a vector access of global memory (8 or 16 bytes, `ld.v2.u64` and the like) one access
/// for every other vector access of the same address: the interpreter moves a vector element
/// by element, and a GPU moves an aligned vector at once. CUB's decoupled look-back depends on
/// it: a tile publishes its status and value with one `st.v2.u64` and its successors read both
/// with one `ld.v2.u64` while it runs on another worker; read element by element they saw a
/// new status with an old value (wrong scans, partitions and run-length encodings, now and
/// then). Held for one lane's access; released when dropped.
pub(super) struct VectorLock(&'static AtomicBool);

impl VectorLock {
    pub(super) fn new(addr: u64) -> VectorLock {
        let l = &VECTOR_LOCKS[(addr >> 4) as usize % VECTOR_LOCK_STRIPES];
        while l
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        VectorLock(l)
    }

    /// The lock a vector access of `total` bytes in `n` elements at `addr` in `space` takes.
    pub(super) fn for_access(space: Space, n: u8, total: usize, addr: u64) -> Option<VectorLock> {
        (n > 1 && total >= 8 && matches!(space, Space::Global | Space::Generic))
            .then(|| VectorLock::new(addr))
    }
}

impl Drop for VectorLock {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl<'a> Worker<'a> {
    // ---- global memory -------------------------------------------------------------------

    #[inline]
    pub(super) fn view_index(&mut self, addr: u64) -> Option<usize> {
        if let Some(v) = self.views.get(self.last_view)
            && addr.wrapping_sub(v.0) < v.1
        {
            return Some(self.last_view);
        }
        self.view_slow(addr)
    }

    #[cold]
    pub(super) fn view_slow(&mut self, addr: u64) -> Option<usize> {
        if let Some(i) = self.views.iter().position(|v| addr.wrapping_sub(v.0) < v.1) {
            self.last_view = i;
            return Some(i);
        }
        let (base, buf): (u64, Arc<crate::mem::Buffer>) = self.ctx.memory.lookup(addr)?;
        let len = buf.reach() as u64;
        if addr.wrapping_sub(base) >= len {
            return None;
        }
        if self.views.len() >= MAX_VIEWS {
            self.views.swap_remove(0);
        }
        self.views.push((base, len, buf.kernel_view()));
        self.last_view = self.views.len() - 1;
        Some(self.last_view)
    }

    #[inline]
    pub(super) fn gload(&mut self, addr: u64, w: Width, ord: Ordering) -> Result<u64, AccessError> {
        if addr >= GLOBAL_LIMIT {
            return Err(AccessError::OutOfRange);
        }
        let i = self.view_index(addr).ok_or(AccessError::OutOfRange)?;
        let v = &self.views[i];
        v.2.kernel_load(addr - v.0, w, ord)
    }

    #[inline]
    pub(super) fn gstore(
        &mut self,
        addr: u64,
        w: Width,
        val: u64,
        ord: Ordering,
    ) -> Result<(), AccessError> {
        if addr >= GLOBAL_LIMIT {
            return Err(AccessError::OutOfRange);
        }
        let i = self.view_index(addr).ok_or(AccessError::OutOfRange)?;
        let v = &self.views[i];
        v.2.kernel_store(addr - v.0, w, val, ord)
    }

    pub(super) fn local_range(
        &self,
        warp: WarpRef<'_>,
        lane: u32,
        addr: u64,
        size: usize,
    ) -> Result<usize, AccessError> {
        if addr & (size as u64 - 1) != 0 {
            return Err(AccessError::Misaligned);
        }
        let stride = self.local_stride as u64;
        if addr >= stride || stride - addr < size as u64 {
            return Err(AccessError::OutOfRange);
        }
        let t = u64::from(warp.idx) * 32 + u64::from(lane);
        Ok((t * stride + addr) as usize)
    }

    #[inline]
    pub(super) fn shared_range(&self, addr: u64, size: usize) -> Result<usize, AccessError> {
        if addr & (size as u64 - 1) != 0 {
            return Err(AccessError::Misaligned);
        }
        let len = self.shared.len() as u64;
        if addr >= len || len - addr < size as u64 {
            return Err(AccessError::OutOfRange);
        }
        Ok(addr as usize)
    }

    /// Resolves an address in `space` to a concrete space and offset.
    #[inline]
    pub(super) fn resolve(space: Space, addr: u64) -> Result<(Space, u64), AccessError> {
        match space {
            Space::Generic => {
                if addr < GLOBAL_LIMIT {
                    Ok((Space::Global, addr))
                } else if addr.wrapping_sub(SHARED_WINDOW) < WINDOW_SIZE {
                    Ok((Space::Shared, addr - SHARED_WINDOW))
                } else if addr.wrapping_sub(LOCAL_WINDOW) < WINDOW_SIZE {
                    Ok((Space::Local, addr - LOCAL_WINDOW))
                } else if addr.wrapping_sub(PARAM_WINDOW) < WINDOW_SIZE {
                    Ok((Space::Param, addr - PARAM_WINDOW))
                } else {
                    Err(AccessError::OutOfRange)
                }
            }
            Space::Param => {
                if addr.wrapping_sub(PARAM_WINDOW) < WINDOW_SIZE {
                    Ok((Space::Param, addr - PARAM_WINDOW))
                } else {
                    Ok((Space::Param, addr))
                }
            }
            Space::Const => Ok((Space::Global, addr)),
            s => Ok((s, addr)),
        }
    }

    pub(super) fn load_any(
        &mut self,
        warp: WarpRef<'_>,
        lane: u32,
        space: Space,
        addr: u64,
        size: usize,
        ord: Ordering,
    ) -> Result<u64, AccessError> {
        let (sp, a) = Self::resolve(space, addr)?;
        let w = Width::from_bytes(size).ok_or(AccessError::Misaligned)?;
        match sp {
            Space::Global | Space::Const => self.gload(a, w, ord),
            Space::Shared => {
                let o = self.shared_range(a, size)?;
                Ok(read_le(&self.shared[o..o + size]))
            }
            Space::Local => {
                let o = self.local_range(warp, lane, a, size)?;
                Ok(read_le(&self.local[o..o + size]))
            }
            Space::Param => {
                if a & (size as u64 - 1) != 0 {
                    return Err(AccessError::Misaligned);
                }
                let p = self.ctx.params;
                if a >= p.len() as u64 || (p.len() as u64 - a) < size as u64 {
                    return Err(AccessError::OutOfRange);
                }
                Ok(read_le(&p[a as usize..a as usize + size]))
            }
            Space::Generic => Err(AccessError::OutOfRange),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn store_any(
        &mut self,
        warp: WarpRef<'_>,
        lane: u32,
        space: Space,
        addr: u64,
        size: usize,
        val: u64,
        ord: Ordering,
    ) -> Result<(), AccessError> {
        let (sp, a) = Self::resolve(space, addr)?;
        let w = Width::from_bytes(size).ok_or(AccessError::Misaligned)?;
        match sp {
            Space::Global => self.gstore(a, w, val, ord),
            Space::Shared => {
                let o = self.shared_range(a, size)?;
                write_le(&mut self.shared[o..o + size], val);
                Ok(())
            }
            Space::Local => {
                let o = self.local_range(warp, lane, a, size)?;
                write_le(&mut self.local[o..o + size], val);
                Ok(())
            }
            // Constant memory and kernel parameters are read-only.
            _ => Err(AccessError::OutOfRange),
        }
    }
}
