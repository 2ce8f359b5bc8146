//! The device heap that kernels' `malloc`, `__nv_aligned_device_malloc` and `free` draw on
//! (CUDA's `cudaLimitMallocHeapSize`, 8 MiB unless the program sets it).
//!
//! The heap is a fixed range of device memory that its owner (the session that launched a
//! kernel calling `malloc`) allocated and charged; this is its bookkeeping, on the host: one bit
//! per granule saying whether it is in use, and one saying whether an allocation starts there.
//! An allocation is a run of used granules from a start bit to the next start bit or free
//! granule, so `free` finds its extent without a header in device memory a kernel could
//! overwrite. The bit maps take at most [`MAX_GRANULES`] bits each: a heap past
//! `MAX_GRANULES` × 16 bytes uses larger granules, so a large heap costs the daemon at most
//! 1 MiB of host memory. Allocation is next fit from where the last one ended, a word of
//! 64 granules at a time past full words.

use std::sync::Mutex;

/// What `malloc` aligns its results to, and the smallest granule (CUDA: 16 bytes).
pub const MALLOC_ALIGN: u64 = 16;
/// The most granules a heap has (its bit maps' length).
pub const MAX_GRANULES: u64 = 1 << 22;
/// Bits per bit-map word.
const WORD_BITS: usize = 64;

/// A kernel's heap calls, as the interpreter makes them ([`crate::LaunchControl::set_heap`]).
pub trait DeviceHeap: Send + Sync + std::fmt::Debug {
    /// At least `size` bytes at a multiple of `align` (a power of two, at least
    /// [`MALLOC_ALIGN`]); 0 when the heap has no such room (C's `NULL`), or `size` is 0.
    fn malloc(&self, size: u64, align: u64) -> u64;
    /// Frees what `malloc` returned at `ptr`; `false` when no allocation starts there.
    fn free(&self, ptr: u64) -> bool;
}

/// A heap over `[base, base + size)` of device memory.
#[derive(Debug)]
pub struct Heap {
    base: u64,
    granule: u64,
    granules: usize,
    state: Mutex<Maps>,
}

#[derive(Debug)]
struct Maps {
    used: Vec<u64>,
    starts: Vec<u64>,
    /// Where the next search begins (just past the last allocation).
    rover: usize,
    /// Granules not in use.
    free: usize,
}

fn bit(map: &[u64], i: usize) -> bool {
    map[i / WORD_BITS] >> (i % WORD_BITS) & 1 != 0
}

fn set(map: &mut [u64], i: usize, on: bool) {
    let m = 1u64 << (i % WORD_BITS);
    if on {
        map[i / WORD_BITS] |= m;
    } else {
        map[i / WORD_BITS] &= !m;
    }
}

impl Heap {
    /// The bookkeeping of a heap in the `size` bytes at `base`; bytes before the first and
    /// past the last whole granule are not used.
    pub fn new(base: u64, size: u64) -> Heap {
        let mut granule = MALLOC_ALIGN;
        while size / granule > MAX_GRANULES {
            granule *= 2;
        }
        let start = base.next_multiple_of(granule);
        let size = size.saturating_sub(start - base);
        let base = start;
        let granules = (size / granule) as usize;
        let words = granules.div_ceil(WORD_BITS);
        Heap {
            base,
            granule,
            granules,
            state: Mutex::new(Maps {
                used: vec![0; words],
                starts: vec![0; words],
                rover: 0,
                free: granules,
            }),
        }
    }

    /// Its granule: allocations are rounded up to multiples of it.
    pub fn granule(&self) -> u64 {
        self.granule
    }

    /// Bytes not in use.
    pub fn free_bytes(&self) -> u64 {
        self.maps().free as u64 * self.granule
    }

    fn maps(&self) -> std::sync::MutexGuard<'_, Maps> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The first run of `n` free granules at or after `from` whose address is a multiple of
    /// `align`, ending by `end`.
    fn find(&self, m: &Maps, n: usize, align: u64, from: usize, end: usize) -> Option<usize> {
        // The base is a multiple of the granule, so aligned granules are every `step`th from
        // the first aligned one.
        let step = (align / self.granule).max(1) as usize;
        let first = ((align - self.base % align) % align / self.granule) as usize;
        let up = |i: usize| first + i.saturating_sub(first).div_ceil(step) * step;
        let mut i = up(from);
        while i.checked_add(n)? <= end {
            let f = up(next_bit(&m.used, i, end, false));
            if f.checked_add(n)? > end {
                return None;
            }
            let taken = next_bit(&m.used, f, f + n, true);
            if taken == f + n {
                return Some(f);
            }
            i = taken + 1;
        }
        None
    }
}

/// The first index in `from..end` whose bit in `map` is `value`; `end` when none is.
fn next_bit(map: &[u64], from: usize, end: usize, value: bool) -> usize {
    let mut i = from;
    while i < end {
        let w = map[i / WORD_BITS];
        let bits = (if value { w } else { !w }) >> (i % WORD_BITS);
        if bits != 0 {
            return (i + bits.trailing_zeros() as usize).min(end);
        }
        i = (i / WORD_BITS + 1) * WORD_BITS;
    }
    end
}

impl DeviceHeap for Heap {
    fn malloc(&self, size: u64, align: u64) -> u64 {
        if size == 0 || !align.is_power_of_two() {
            return 0;
        }
        let align = align.max(MALLOC_ALIGN);
        let Ok(n) = usize::try_from(size.div_ceil(self.granule)) else {
            return 0;
        };
        let mut m = self.maps();
        if n > m.free {
            return 0;
        }
        let rover = m.rover.min(self.granules);
        let Some(at) = self
            .find(&m, n, align, rover, self.granules)
            .or_else(|| self.find(&m, n, align, 0, (rover + n).min(self.granules)))
        else {
            return 0;
        };
        for j in at..at + n {
            set(&mut m.used, j, true);
        }
        set(&mut m.starts, at, true);
        m.free -= n;
        m.rover = at + n;
        self.base + at as u64 * self.granule
    }

    fn free(&self, ptr: u64) -> bool {
        let Some(off) = ptr.checked_sub(self.base) else {
            return false;
        };
        if off % self.granule != 0 || off / self.granule >= self.granules as u64 {
            return false;
        }
        let at = (off / self.granule) as usize;
        let mut m = self.maps();
        if !bit(&m.starts, at) {
            return false;
        }
        set(&mut m.starts, at, false);
        let mut j = at;
        while j < self.granules && bit(&m.used, j) && (j == at || !bit(&m.starts, j)) {
            set(&mut m.used, j, false);
            j += 1;
        }
        m.free += j - at;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x7000_0000;

    #[test]
    fn allocations_are_aligned_disjoint_and_come_back_when_freed() {
        let h = Heap::new(BASE, 4096);
        assert_eq!(h.granule(), MALLOC_ALIGN);
        let a = h.malloc(1, 16);
        let b = h.malloc(100, 16);
        let c = h.malloc(16, 16);
        assert!([a, b, c].iter().all(|&p| p != 0 && p % 16 == 0));
        assert!(b >= a + 16 && c >= b + 112, "{a:#x} {b:#x} {c:#x}");
        assert_eq!(h.free_bytes(), 4096 - 16 - 112 - 16);
        assert!(h.free(b));
        assert!(!h.free(b), "a second free of the same pointer");
        assert!(!h.free(b + 16), "inside an allocation");
        assert!(!h.free(0) && !h.free(BASE + 4096) && !h.free(BASE + 8));
        assert_eq!(h.free_bytes(), 4096 - 32);
        // Freeing one allocation leaves its neighbours whole.
        assert!(h.free(a) && h.free(c));
        assert_eq!(h.free_bytes(), 4096);
    }

    #[test]
    fn a_full_heap_answers_null_and_a_freed_hole_is_found_again() {
        let h = Heap::new(BASE, 1024);
        let all: Vec<u64> = (0..1024 / 64).map(|_| h.malloc(64, 16)).collect();
        assert!(all.iter().all(|&p| p != 0));
        assert_eq!(h.malloc(1, 16), 0, "full");
        assert_eq!(h.malloc(0, 16), 0, "zero bytes");
        assert!(h.free(all[3]));
        assert_eq!(h.malloc(65, 16), 0, "the hole is 64 bytes");
        assert_eq!(
            h.malloc(64, 16),
            all[3],
            "found past the end, from the start"
        );
        assert_eq!(h.malloc(u64::MAX, 16), 0);
    }

    #[test]
    fn adjacent_allocations_free_separately() {
        let h = Heap::new(BASE, 1 << 12);
        let a = h.malloc(32, 16);
        let b = h.malloc(32, 16);
        assert_eq!(b, a + 32);
        assert!(h.free(a));
        assert_eq!(h.free_bytes(), (1 << 12) - 32, "b is still in use");
        assert!(h.free(b));
        assert_eq!(h.free_bytes(), 1 << 12);
    }

    #[test]
    fn aligned_allocations_honour_their_alignment() {
        let h = Heap::new(BASE + 16, 1 << 16);
        let _ = h.malloc(16, 16);
        for align in [32, 256, 4096] {
            let p = h.malloc(48, align);
            assert!(p != 0 && p % align == 0, "{p:#x} at {align}");
        }
        assert_eq!(h.malloc(16, 3), 0, "not a power of two");
    }

    #[test]
    fn large_heaps_keep_their_bit_maps_bounded() {
        let size = 64u64 << 30;
        let h = Heap::new(BASE, size);
        assert!(size / h.granule() <= MAX_GRANULES);
        let p = h.malloc(1, 16);
        assert!(p != 0 && p.is_multiple_of(h.granule()));
        assert_eq!(h.free_bytes(), size - h.granule());
    }

    #[test]
    fn many_threads_never_share_an_allocation() {
        let h = std::sync::Arc::new(Heap::new(BASE, 1 << 20));
        let got: Vec<Vec<u64>> = std::thread::scope(|s| {
            let ts: Vec<_> = (0..4)
                .map(|_| {
                    let h = &h;
                    s.spawn(move || (0..500).map(|_| h.malloc(48, 16)).collect::<Vec<_>>())
                })
                .collect();
            ts.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let mut all: Vec<u64> = got.into_iter().flatten().collect();
        all.sort_unstable();
        assert!(all[0] != 0);
        assert!(all.windows(2).all(|w| w[1] >= w[0] + 48));
    }
}
