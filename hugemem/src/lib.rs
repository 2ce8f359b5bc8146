//! Zeroed anonymous memory in a mapping of its own, 2 MiB aligned and advised to use
//! transparent huge pages (`MADV_HUGEPAGE`).
//!
//! Two users: the simulated GPU keeps its allocations of 2 MiB and more in these, as a GPU maps
//! large allocations with large pages (copies between huge-page guest RAM and device memory
//! then take a TLB miss per 2 MiB instead of per 4 KiB); and the guest shim backs large
//! `cuMemHostAlloc` buffers with them, so that in a guest whose THP mode is `madvise` (Ubuntu's
//! default) an application's pinned buffers are physically contiguous 2 MiB runs, which the
//! virtio-vgpu module hands to the device as few, large descriptors.
//!
//! Pages are faulted in on first touch, in 2 MiB steps where the kernel grants huge pages; where
//! THP is off the advice is ignored and the memory simply uses 4 KiB pages.

use std::ptr::NonNull;

/// One x86-64 / arm64 huge page: the alignment and granularity of a mapping.
pub const HUGE_PAGE: usize = 2 << 20;

/// Where the kernel says whether it has transparent huge pages and in which mode.
pub const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// The selected mode in the text of [`THP_ENABLED`] (`always [madvise] never` → `madvise`).
pub fn thp_mode_of(text: &str) -> Option<&str> {
    let open = text.find('[')?;
    let close = text[open..].find(']')? + open;
    Some(&text[open + 1..close])
}

/// A mapping could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot map {len} bytes of huge-page-advised memory")]
pub struct MapError {
    /// The requested length.
    pub len: usize,
    /// What the kernel said, if it was asked.
    #[source]
    pub source: Option<std::io::Error>,
}

/// Zeroed anonymous memory of its own mapping (see the crate documentation).
#[derive(Debug)]
pub struct HugeMapping {
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes mapped: `len` rounded up to whole huge pages.
    mapped: usize,
}

// SAFETY: the mapping is owned exclusively, like a `Vec<u8>`; shared access is `&[u8]` only.
unsafe impl Send for HugeMapping {}
// SAFETY: as above: `&HugeMapping` gives out nothing but shared slices.
unsafe impl Sync for HugeMapping {}

impl HugeMapping {
    /// Maps `len` zeroed bytes (at least one).
    pub fn new(len: usize) -> Result<HugeMapping, MapError> {
        let fail = |source| MapError { len, source };
        let mapped = len
            .max(1)
            .checked_next_multiple_of(HUGE_PAGE)
            .ok_or_else(|| fail(None))?;
        let start = map_aligned(mapped).map_err(|e| fail(Some(e)))?;
        // Advice only: without THP (or with it disabled) the memory works with 4 KiB pages.
        // SAFETY: `start..start + mapped` is our own mapping; the advice changes no contents.
        unsafe { libc::madvise(start.as_ptr().cast(), mapped, libc::MADV_HUGEPAGE) };
        Ok(HugeMapping {
            ptr: start,
            len,
            mapped,
        })
    }

    /// Maps `len` zeroed bytes (at least one) at `at`, a [`HUGE_PAGE`] boundary the caller
    /// reserved room for, never over an existing mapping (an error where one is there).
    pub fn new_at(len: usize, at: NonNull<u8>) -> Result<HugeMapping, MapError> {
        let fail = |source| MapError { len, source };
        let mapped = len
            .max(1)
            .checked_next_multiple_of(HUGE_PAGE)
            .ok_or_else(|| fail(None))?;
        if !(at.as_ptr() as usize).is_multiple_of(HUGE_PAGE) {
            return Err(fail(Some(std::io::Error::from(
                std::io::ErrorKind::InvalidInput,
            ))));
        }
        // SAFETY: a private anonymous mapping at `at`; MAP_FIXED_NOREPLACE never replaces a
        // mapping, and a kernel that ignores the flag (before Linux 4.17) treats the address as
        // a hint, which the check below catches.
        let raw = unsafe {
            libc::mmap(
                at.as_ptr().cast(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(fail(Some(std::io::Error::last_os_error())));
        }
        if raw != at.as_ptr().cast() {
            // SAFETY: the mapping just made, of `mapped` bytes, used by nobody.
            unsafe { libc::munmap(raw, mapped) };
            return Err(fail(Some(std::io::Error::from(
                std::io::ErrorKind::AddrInUse,
            ))));
        }
        // SAFETY: `at..at + mapped` is our own mapping; the advice changes no contents.
        unsafe { libc::madvise(raw, mapped, libc::MADV_HUGEPAGE) };
        Ok(HugeMapping {
            ptr: at,
            len,
            mapped,
        })
    }

    /// Moves this mapping's pages to a new mapping of the same length without copying them
    /// (`mremap` with `MREMAP_DONTUNMAP`, Linux 5.7+): the new mapping holds the bytes, and this
    /// one stays mapped but reads as zeros afterwards (its pages are gone). The caller makes
    /// sure nothing reads or writes this mapping during the call. Fails, changing nothing,
    /// where the kernel cannot do it.
    pub fn take_pages(&self) -> Result<HugeMapping, MapError> {
        let fail = |source| MapError {
            len: self.len,
            source,
        };
        let to = map_aligned(self.mapped).map_err(|e| fail(Some(e)))?;
        // SAFETY: moves the pages of our own private anonymous mapping `ptr..ptr + mapped` onto
        // `to..to + mapped`, the fresh reservation made above (MREMAP_FIXED replaces it); with
        // MREMAP_DONTUNMAP the old range stays mapped (empty), so `self` keeps a valid mapping.
        let moved = unsafe {
            libc::mremap(
                self.ptr.as_ptr().cast(),
                self.mapped,
                self.mapped,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP,
                to.as_ptr().cast::<libc::c_void>(),
            )
        };
        if moved == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            // SAFETY: the reservation made above, used by nobody.
            unsafe { libc::munmap(to.as_ptr().cast(), self.mapped) };
            return Err(fail(Some(e)));
        }
        // The moved range keeps the old one's advice; repeated in case a kernel does not.
        // SAFETY: `to..to + mapped` is now our own mapping; the advice changes no contents.
        unsafe { libc::madvise(to.as_ptr().cast(), self.mapped, libc::MADV_HUGEPAGE) };
        Ok(HugeMapping {
            ptr: to,
            len: self.len,
            mapped: self.mapped,
        })
    }

    /// The first byte, for owners that manage access to the memory themselves (and never
    /// through this mapping's slices at the same time).
    pub fn as_non_null(&self) -> NonNull<u8> {
        self.ptr
    }
}

/// A fresh private anonymous read-write mapping of `mapped` bytes (a multiple of [`HUGE_PAGE`])
/// starting at a [`HUGE_PAGE`] boundary.
fn map_aligned(mapped: usize) -> Result<NonNull<u8>, std::io::Error> {
    // Over-map by one huge page so that an aligned start exists, then cut off the slack.
    let reserve = mapped
        .checked_add(HUGE_PAGE)
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
    // SAFETY: a fresh private anonymous mapping at an address of the kernel's choosing; it
    // aliases nothing.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            reserve,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let base = raw as usize;
    let start = base.next_multiple_of(HUGE_PAGE);
    let head = start - base;
    let tail = reserve - head - mapped;
    if head > 0 {
        // SAFETY: `base..start` is the front slack of the mapping made above, used by nobody.
        unsafe { libc::munmap(raw, head) };
    }
    if tail > 0 {
        // SAFETY: the `tail` bytes after `start + mapped` are the back slack of the same mapping.
        unsafe { libc::munmap((start + mapped) as *mut libc::c_void, tail) };
    }
    NonNull::new(start as *mut u8).ok_or_else(|| std::io::Error::from(std::io::ErrorKind::Other))
}

impl std::ops::Deref for HugeMapping {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` lies in our mapping and is initialised (anonymous memory reads
        // as zero); it is mutated only through `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for HugeMapping {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HugeMapping {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr + mapped` is the mapping `new` made and nothing else; no slice into it
        // outlives `self`.
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
        debug_assert_eq!(rc, 0, "munmap of a mapping of our own");
    }
}

pub mod testutils;

#[cfg(test)]
mod tests {
    use super::testutils::{advised_huge, range_of, smaps_entry, thp_mode};
    use super::*;

    #[test]
    fn pages_move_to_a_new_mapping_without_a_copy() {
        let len = 2 * HUGE_PAGE + 4096;
        let mut m = HugeMapping::new(len).unwrap();
        for (i, b) in m.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let moved = match m.take_pages() {
            Ok(n) => n,
            // A kernel before 5.7 (no MREMAP_DONTUNMAP): the caller copies instead.
            Err(e) => {
                eprintln!("mremap with MREMAP_DONTUNMAP refused here: {e:?}");
                return;
            }
        };
        assert_eq!(moved.as_ptr() as usize % HUGE_PAGE, 0, "2 MiB aligned");
        assert_ne!(moved.as_ptr(), m.as_ptr());
        assert_eq!(moved.len(), len);
        assert!(moved.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        assert!(
            m.iter().all(|&b| b == 0),
            "the old mapping is empty, still mapped"
        );
    }

    #[test]
    fn a_mapping_is_aligned_zeroed_advised_and_goes_when_dropped() {
        let len = 3 * HUGE_PAGE + 100;
        let mut m = HugeMapping::new(len).unwrap();
        let addr = m.as_ptr() as usize;
        assert_eq!(addr % HUGE_PAGE, 0, "2 MiB aligned");
        assert_eq!(m.len(), len);
        assert!(m.iter().all(|&x| x == 0));
        m[len - 1] = 9;
        assert_eq!(m[len - 1], 9);
        // Its own mapping, rounded up to whole huge pages, advised for THP; the kernel reports it
        // eligible unless the host has THP switched off.
        let entry = smaps_entry(addr).expect("the mapping is listed");
        assert_eq!(
            range_of(&entry),
            Some((addr, addr + 4 * HUGE_PAGE)),
            "{entry}"
        );
        assert!(advised_huge(&entry), "{entry}");
        if thp_mode().is_some_and(|m| m != "never") {
            let eligible = entry
                .lines()
                .find_map(|l| l.strip_prefix("THPeligible:"))
                .map(str::trim);
            assert_eq!(eligible, Some("1"), "{entry}");
        }
        drop(m);
        assert!(
            smaps_entry(addr).is_none_or(|e| range_of(&e) != Some((addr, addr + 4 * HUGE_PAGE))),
            "the mapping goes with the value"
        );
    }

    #[test]
    fn the_thp_mode_is_the_bracketed_word() {
        assert_eq!(thp_mode_of("always [madvise] never\n"), Some("madvise"));
        assert_eq!(thp_mode_of("[always] madvise never"), Some("always"));
        assert_eq!(thp_mode_of("madvise"), None);
    }

    #[test]
    fn a_mapping_goes_where_asked_but_never_over_another() {
        let len = HUGE_PAGE + 1;
        // An aligned address that is free: a mapping's, once dropped. The other tests' threads
        // map memory too and may take it first (the mapping then fails with EEXIST, as it
        // should): take another.
        const TRIES: usize = 16;
        let (at, mut m) = (0..TRIES)
            .find_map(|_| {
                let at = HugeMapping::new(len).unwrap().as_non_null();
                HugeMapping::new_at(len, at).ok().map(|m| (at, m))
            })
            .expect("a freed aligned range stayed free for one of the tries");
        assert_eq!(m.as_non_null(), at);
        assert!(m.iter().all(|&b| b == 0));
        m[len - 1] = 7;
        let entry = smaps_entry(at.as_ptr() as usize).unwrap();
        assert_eq!(
            range_of(&entry),
            Some((at.as_ptr() as usize, at.as_ptr() as usize + 2 * HUGE_PAGE))
        );
        assert!(advised_huge(&entry), "{entry}");
        assert!(
            HugeMapping::new_at(len, at).is_err(),
            "the address is taken"
        );
        let unaligned = NonNull::new(at.as_ptr().wrapping_add(1)).unwrap();
        drop(m);
        assert!(
            HugeMapping::new_at(len, unaligned).is_err(),
            "not a huge page boundary"
        );
    }

    #[test]
    fn absurd_lengths_fail_cleanly() {
        assert!(HugeMapping::new(usize::MAX - 4096).is_err());
        let e = HugeMapping::new(1 << 60).unwrap_err();
        assert!(e.source.is_some(), "the kernel refused it: {e}");
    }
}
