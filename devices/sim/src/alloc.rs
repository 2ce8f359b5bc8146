//! The simulated device's address space: a next-fit allocator of device
//! virtual addresses with coalescing free ranges, bounded by the device's
//! memory size.

use std::collections::BTreeMap;

/// First device address handed out. Kernels see global allocations in
/// `[VA_BASE, VA_END)`; the interpreter's shared/local windows lie above 2^48.
pub const VA_BASE: u64 = 0x0000_0200_0000_0000;
/// End of the device address range.
pub const VA_END: u64 = 0x0000_7fff_ffff_0000;
/// Alignment of every allocation's size, and the least of its address (CUDA guarantees 256
/// bytes).
pub const ALLOC_ALIGN: u64 = 256;
/// Where a `cuMemAlloc` allocation starts: a multiple of the texture alignment the device
/// reports (`CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT`), as on NVIDIA GPUs, so that programs may
/// make a texture over memory they allocated.
pub const BASE_ALIGN: u64 = 512;

/// Free ranges of the device address space.
#[derive(Debug)]
pub struct AddressSpace {
    free: BTreeMap<u64, u64>,
    cursor: u64,
}

impl Default for AddressSpace {
    fn default() -> Self {
        let mut free = BTreeMap::new();
        free.insert(VA_BASE, VA_END - VA_BASE);
        Self {
            free,
            cursor: VA_BASE,
        }
    }
}

/// Size rounded up to the allocation alignment.
pub fn aligned(size: u64) -> Option<u64> {
    size.checked_add(ALLOC_ALIGN - 1)
        .map(|s| s & !(ALLOC_ALIGN - 1))
}

impl AddressSpace {
    /// Reserves `size` bytes (already aligned); next-fit from the last
    /// allocation so freed addresses are not reused at once, which makes
    /// use-after-free in guests fail loudly instead of aliasing.
    pub fn reserve(&mut self, size: u64) -> Option<u64> {
        let pick = self
            .free
            .range(self.cursor..)
            .chain(self.free.range(..self.cursor))
            .find(|(_, len)| **len >= size)
            .map(|(s, l)| (*s, *l))?;
        let (start, len) = pick;
        self.free.remove(&start);
        if len > size {
            self.free.insert(start + size, len - size);
        }
        self.cursor = start + size;
        Some(start)
    }

    /// Reserves `size` bytes (already aligned to [`ALLOC_ALIGN`]) at a multiple of `align` (a
    /// power of two), next-fit like [`AddressSpace::reserve`].
    pub fn reserve_aligned(&mut self, size: u64, align: u64) -> Option<u64> {
        if align <= ALLOC_ALIGN {
            return self.reserve(size);
        }
        let fit = |s: u64, l: u64| -> Option<u64> {
            let a = s.checked_add(align - 1)? & !(align - 1);
            let end = a.checked_add(size)?;
            (end <= s + l).then_some(a)
        };
        let (start, len, at) = self
            .free
            .range(self.cursor..)
            .chain(self.free.range(..self.cursor))
            .find_map(|(s, l)| fit(*s, *l).map(|a| (*s, *l, a)))?;
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        let end = at + size;
        if start + len > end {
            self.free.insert(end, start + len - end);
        }
        self.cursor = end;
        Some(at)
    }

    /// Returns a reserved range, merging it with free neighbours.
    pub fn release(&mut self, start: u64, size: u64) {
        let mut s = start;
        let mut l = size;
        if let Some((&ps, &pl)) = self.free.range(..start).next_back()
            && ps + pl == start
        {
            self.free.remove(&ps);
            s = ps;
            l += pl;
        }
        if let Some(&nl) = self.free.get(&(start + size)) {
            self.free.remove(&(start + size));
            l += nl;
        }
        self.free.insert(s, l);
    }

    /// Number of free fragments (for tests and diagnostics).
    pub fn fragments(&self) -> usize {
        self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_aligned_disjoint_and_not_reused_at_once() {
        let mut a = AddressSpace::default();
        let x = a.reserve(aligned(100).unwrap()).unwrap();
        let y = a.reserve(aligned(1).unwrap()).unwrap();
        assert_eq!(x % ALLOC_ALIGN, 0);
        assert_eq!(y, x + 256);
        a.release(x, 256);
        let z = a.reserve(256).unwrap();
        assert_ne!(z, x, "freed address reused immediately");
    }

    #[test]
    fn freed_ranges_coalesce() {
        let mut a = AddressSpace::default();
        let v: Vec<u64> = (0..4).map(|_| a.reserve(256).unwrap()).collect();
        a.release(v[1], 256);
        a.release(v[3], 256);
        a.release(v[2], 256);
        a.release(v[0], 256);
        assert_eq!(a.fragments(), 1);
    }

    #[test]
    fn aligned_reservations_split_the_free_range() {
        let mut a = AddressSpace::default();
        let x = a.reserve(256).unwrap();
        let y = a.reserve_aligned(8192, 4096).unwrap();
        assert_eq!(y % 4096, 0);
        assert!(y > x);
        a.release(y, 8192);
        a.release(x, 256);
        assert_eq!(a.fragments(), 1);
    }

    #[test]
    fn exhaustion_returns_none() {
        let mut a = AddressSpace::default();
        assert!(a.reserve(VA_END - VA_BASE + 256).is_none());
        assert_eq!(aligned(u64::MAX), None);
    }
}
